"""The engine transport contract's results in words (harness.bench.contract): one row per
question (id, question, answer, the evidence's key figures), a Markdown table per engine, and
the JSON document ``pdconform engine-contract --out`` writes.

Figures: seconds are printed as ``ms``/``us`` (milliseconds, microseconds), sizes as MiB/KiB.
"""

from __future__ import annotations

import json
from typing import Any


def _ms(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def _q1(ev: dict) -> str:
    return "; ".join(f"{c['api']}: " + (f"initialize_xfer {_ms(c['median_prep_s'])}, " if "median_prep_s" in c else "")
                     + f"submit {_ms(c['median_submit_s'])} (max {_ms(c['max_submit_s'])}), done "
                     f"{_ms(c['median_done_s'])} (medians of {len(c['submit_s'])}, {c['verified_runs']} verified)"
                     for c in ev["calls"])


def _q2_phase(name: str, ev: Any) -> str:
    if isinstance(ev, str):
        return f"{name}: {ev}"
    return (f"{name}: {ev['complete_at_done']}/{ev['engine_ok']} complete at done, {ev['blocks']} blocks, "
            f"read lag median {_ms(ev['median_lag_s'])} / max {_ms(ev['max_lag_s'])}, "
            f"transfer {_ms(ev['median_transfer_s'])}")


def _q3(ev: dict) -> str:
    during = ev.get("during") or []
    submit = ev.get("at_submit") or {}
    said = f"submit call {_ms(submit.get('seconds'))}"
    if during:
        last = during[-1]
        said += (f"; {sum(d['polls'] for d in during)} polls, {last['state']!r} first seen {_ms(last['at_s'])} after "
                 f"submit; longest single poll {_ms(last.get('longest_poll_s'))}")
    status = (ev.get("batch_api") or {}).get("get_batch_transfer_status")
    if status:
        said += f"; get_batch_transfer_status blocked {_ms(status.get('seconds'))}"
    return said


def _q4(ev: dict) -> str:
    parts = []
    for case in ev["cases"]:
        answer = case["sglang"]
        took = _ms(answer.get("seconds")) if answer.get("answered") else "no answer"
        guard = case["guard_bytes_written"]
        parts.append(f"{case['case']}: {took}, guard {'-' if guard is None else guard} B written, "
                     f"destination {'alive' if case['destination_alive'] else 'DIED'}")
    return "; ".join(parts)


def _q5(ev: dict) -> str:
    parts = []
    for v in ev["variants"]:
        again = v["next_submit"]
        parts.append(f"{v['variant']}: killed {_ms(v['killed_after_submit_s'])} after submit (reaped "
                     f"{_ms(v['reaped_after_kill_s'])} later), answer "
                     f"{_ms(v['answer_after_kill_s']) if v['answered'] else 'none'} after the kill, next submit "
                     f"{_ms(again.get('seconds')) if again.get('answered') else 'no answer'}")
    return "; ".join(parts)


def evidence_line(answer: dict) -> str:
    """The key figures of one question's evidence, in a line."""
    ev = answer["evidence"]
    if answer["id"] == "Q1":
        return _q1(ev)
    if answer["id"] == "Q2":
        return f"{_q2_phase('as is', ev['as_is'])}; {_q2_phase('starved receiver', ev['starved'])}"
    if answer["id"] == "Q3":
        return _q3(ev)
    return _q4(ev) if answer["id"] == "Q4" else _q5(ev)


def rows(result: dict) -> list[tuple[str, str, str, str]]:
    """``(id, question, answer, evidence)`` for each question answered for one engine."""
    return [(a["id"], a["question"], a["answer"], evidence_line(a)) for a in result["answers"]]


def heading(result: dict) -> str:
    """One line on what ran: the engine, real or stand-in, its version and transport, the sizes."""
    kind = "REAL engine" if result["kind"] == "real" else "STAND-IN engine (pdconform's, not the real one)"
    return (f"{result['engine']}: {kind}, {result['version']}, {result['transport']}; {_size(result['total_bytes'])} "
            f"in {result['blocks']} blocks of {_size(result['block_bytes'])}; {result['seconds']:.0f} s")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: list[dict]) -> str:
    """A Markdown section per engine: what ran, when, on what, and the table of answers."""
    out = []
    for r in results:
        if "answers" not in r:
            out.append(f"### {r['engine']}\n\nNot measured: {r.get('unavailable') or r.get('error')}\n")
            continue
        m = r["machine"]
        out.append(f"### {r['engine']} ({'real' if r['kind'] == 'real' else 'stand-in'})\n\n{_cell(heading(r))}.  "
                   f"Measured {r['date']} on {m['cores']} cores ({m['platform']}), Python {m['python']}, sglang "
                   f"{m['sglang']}.  Setup: {_cell(r['setup'])}.\n")
        out.append("| | Question | Answer | Evidence |\n|---|---|---|---|")
        out.extend(f"| {q} | {_cell(question)} | {_cell(answer)} | {_cell(evidence)} |"
                   for q, question, answer, evidence in rows(r))
        out.append("")
    return "\n".join(out)


def document(results: list[dict], command: str) -> bytes:
    """The JSON ``--out`` file: the command that made it and every engine's result."""
    return (json.dumps({"command": command, "results": results}, indent=1, default=repr) + "\n").encode()
