"""The transport contract of each real engine, measured: the questions sglang's tracking issue
#34510 (RFC #33861 step 2) asks of every KV transfer backend, answered by running the engine.

1. Does submit block?  (:func:`does_submit_block`)
2. Does "done" mean the bytes are readable on the remote side at that moment?  (:func:`is_done_visible`)
3. What does poll return before submit, during, after completion and after release?  (:func:`poll_states`)
4. How does a failure surface?  (:func:`failure_surface`)
5. How does a remote disconnect surface?  (:func:`disconnect_surface`)

Each function returns a small dict: ``id``, ``question``, ``answer`` (one line; a capability
the engine lacks is ``UNSUPPORTED: <reason>``, never guessed) and ``evidence`` (times in
seconds, states as the engine returned them).  :func:`run_contract` answers them for one
engine and adds the facts of the run (versions, sizes, machine, date).

Setup
    As the engine benchmark (harness.bench.engines), whose child processes and setup it
    reuses: a *source* child (a prefill: the engine as sglang's manager drives it, a buffer
    of random bytes) and a *destination* child (a decode: its own engine instance and a
    registered buffer, followed by an unregistered guard), each in a private loopback-only
    network when this machine allows one.  A transfer writes source block ``i`` to
    destination block ``perm[i]``.  An engine's contract sides are ``SIDES`` of its package's
    ``contract`` module (harness.bench.contract_sides says what they provide), found through
    the implementation registry: the ``engine_contract`` tool of its entry, else the module
    next to its adapter.  Every transfer whose bytes can be checked is checked (CRC-32 of the
    destination against the expected image).  The processes are harness.bench.contract_session's;
    the answers in tables and Markdown, harness.bench.contract_report's.

Bounds
    Every wait on a child is bounded (``timeout_s`` for a transfer; ``disconnect_limit_s``
    for the answer to a disconnect, after which the answer is "no answer within N s"); a child
    that does not answer is killed, and every child is ended (asked, then killed) when the
    run ends, however it ends (question 2's busy loop too).  The children's UDP sockets and
    engines die with them; their logs are unlinked temporary files.

Errors: ValueError for bad arguments, :class:`harness.bench.engines.EngineUnavailable` when
the engine cannot load here, :class:`harness.bench.engines.EngineBenchError` when a child
fails or does not answer.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
from typing import Any

from harness.bench.contract_session import ContractSession, contract_sides, engines, StarvedDestination
from harness.bench.contract_sides import stamp
from harness.target.version import sglang_version

QUESTIONS = {
    "Q1": "Does submit block?",
    "Q2": 'Does "done" mean the bytes are readable on the remote side at that moment?',
    "Q3": "What does poll return before submit, during, after completion and after release?",
    "Q4": "How does a failure surface?",
    "Q5": "How does a remote disconnect surface?",
}
DEFAULT_TOTAL_BYTES = 128 << 20  # 128 MiB: tens of milliseconds on loopback, long enough to kill a peer mid-way
DEFAULT_BLOCK_BYTES = 128 << 10  # 1024 blocks: one Mooncake batch (MOONCAKE_MAX_BATCH_ENTRIES)
DEFAULT_DONE_REPEATS = 20
DEFAULT_SUBMIT_REPEATS = 5
DISCONNECT_LIMIT_S = 30.0
TIMEOUT_S = 30.0
DEFAULT_STARVED_REPEATS = 5
DEFAULT_STARVED_BLOCKS = 32  # 4 MiB of 128 KiB blocks: one to four seconds each with the receiver starved
SETTLE_S = 1.0  # how long question 2 watches a destination that was not complete at "done"


# --------------------------------------------------------------------------- the questions


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


def does_submit_block(session: ContractSession, repeats: int = DEFAULT_SUBMIT_REPEATS) -> dict:
    """Question 1: time each submit call the engine offers against the transfer's completion.

    A call *blocks* when its median return time is at least half the median time to
    completion.  Evidence per call: ``submit_s`` and ``done_s`` (seconds, each of ``repeats``
    verified transfers; for a synchronous call both are the call), their medians, whether
    sglang makes that call, what it returned."""
    calls, parts = [], []
    for api in session.src.call("submit_apis", session.timeout_s):
        runs = [session.transfer(api) for _ in range(repeats)]
        submit, done = _median([r["submit_s"] for r in runs]), _median([r["done_s"] for r in runs])
        blocks = submit >= 0.5 * done
        inline = sum(r["submit_s"] >= 0.9 * r["done_s"] for r in runs)  # the submit call carried the transfer
        calls.append({"api": api, "sglang_calls_it": runs[0]["sglang_calls_it"], "blocks": blocks,
                      "submit_carried_transfer": inline, "max_submit_s": max(r["submit_s"] for r in runs),
                      "median_submit_s": submit, "median_done_s": done,
                      "submit_s": [r["submit_s"] for r in runs], "done_s": [r["done_s"] for r in runs],
                      "returned": runs[-1]["returned"], "verified_runs": sum(r["verified"] for r in runs),
                      **({"median_prep_s": _median([r["prep_s"] for r in runs])} if "prep_s" in runs[0] else {})})
        said = "blocks until done" if blocks else "returns before done"
        if not blocks and inline:
            said += f" (but in {inline} of {repeats} runs the submit call itself carried the transfer)"
        parts.append(f"{api}{' (sglang)' if runs[0]['sglang_calls_it'] else ''}: {said}, median "
                     f"{_ms(submit)} of {_ms(done)}")
    sglang = [c for c in calls if c["sglang_calls_it"]]
    lead = ("yes" if sglang[0]["blocks"] else "no") if sglang else "-"
    return {"id": "Q1", "question": QUESTIONS["Q1"], "answer": f"{lead}: " + "; ".join(parts),
            "evidence": {"calls": calls, "total_bytes": session.total_bytes}}


def _done_runs(session: ContractSession, repeats: int, settle_s: float, blocks: int | None) -> list[dict]:
    """``repeats`` transfers (of the first ``blocks`` blocks; None: all), each checked by the
    destination the moment the source's engine says "done" (see :func:`is_done_visible`)."""
    port, t = session.dst.call("arm", session.timeout_s), session.timeout_s
    if blocks is None:
        sentinels, crc = session.sentinels, session.expected_crc
    else:
        expected = session.src.call("expected_prefix", t, blocks=blocks)
        sentinels, crc = expected["sentinels"], expected["crc"]
    runs = []
    for _ in range(repeats):
        session.dst.call("clear", t)
        session.dst.send("check_on_signal", sentinels=sentinels, expected_crc=crc, timeout_s=t + 5, settle_s=settle_s)
        sent = session.src.call("done_and_signal", t + 5, port=port, timeout_s=t, blocks=blocks)
        seen = session.dst.reply("check_on_signal", t + settle_s + 10)
        complete = bool(sent["ok"] and seen["signalled"] and seen["crc_ok"] and seen["blocks_incomplete"] == 0)
        runs.append({"engine_ok": sent["ok"], "transfer_s": sent["transfer_s"], "complete_at_done": complete,
                     "done_means": sent["done_means"],
                     **{k: seen.get(k) for k in ("lag_s", "read_s", "blocks_incomplete", "crc_ok",
                                                 "complete_after_s")}})
    return runs


def _done_summary(runs: list[dict], blocks: int) -> tuple[str, dict]:
    ok = [r for r in runs if r["engine_ok"]]
    complete = sum(r["complete_at_done"] for r in ok)
    lags, reads = [r["lag_s"] for r in ok if r["lag_s"] is not None], [r["read_s"] for r in ok if r["read_s"]]
    late = [r for r in ok if not r["complete_at_done"]]
    said = f"{complete}/{len(ok)} complete (read {_ms(_median(lags))} after done, median)"
    unsignalled = sum(1 for r in late if r["lag_s"] is None)
    if unsignalled:
        said += f", {unsignalled} never signalled to the destination"
    if len(late) > unsignalled:
        said += f", {len(late)} with up to {max(r['blocks_incomplete'] or 0 for r in late)} of {blocks} blocks missing"
    return said, {"runs": len(runs), "engine_ok": len(ok), "complete_at_done": complete, "blocks": blocks,
                  "median_lag_s": _median(lags), "max_lag_s": max(lags, default=None),
                  "median_read_s": _median(reads), "max_read_s": max(reads, default=None),
                  "median_transfer_s": _median([r["transfer_s"] for r in ok]), "incomplete_runs": late}


def is_done_visible(session: ContractSession, repeats: int = DEFAULT_DONE_REPEATS, settle_s: float = SETTLE_S,
                    starved_repeats: int = DEFAULT_STARVED_REPEATS,
                    starved_blocks: int = DEFAULT_STARVED_BLOCKS) -> dict:
    """Question 2: at the engine's first "done" (the completion sglang waits for) the source
    signals the destination directly (UDP on loopback), which reads its buffer at once, no
    sleep (harness.bench.contract_sides.ContractDestination.check_on_signal): every block's
    sentinels, then the CRC-32 of the whole buffer.  ``repeats`` whole transfers as they come;
    then ``starved_repeats`` transfers of the first ``starved_blocks`` blocks with the
    destination's engine threads starved (:class:`StarvedDestination`), so that a "done"
    given before the receiving side has stored the bytes would be caught however short the
    destination's read lag.  Evidence per phase: runs complete at "done", read lag
    (``lag_s``: destination wake-up after "done"; ``read_s``: until the CRC was read)
    medians and maxima, transfer seconds, and every run that was not complete."""
    normal_runs = _done_runs(session, repeats, settle_s, None)
    normal, normal_ev = _done_summary(normal_runs, session.blocks)
    answer_ok = normal_ev["complete_at_done"] == normal_ev["engine_ok"] > 0
    evidence = {"done_means": normal_runs[0]["done_means"], "as_is": normal_ev}
    with StarvedDestination(session) as starved:
        if starved.reason is None and starved_repeats:
            blocks = min(starved_blocks, session.blocks)
            said, evidence["starved"] = _done_summary(_done_runs(session, starved_repeats, settle_s, blocks), blocks)
            answer_ok = answer_ok and evidence["starved"]["complete_at_done"] == evidence["starved"]["engine_ok"] > 0
            starved_said = f"; receiver's engine threads starved: {said}"
        else:
            evidence["starved"] = f"UNSUPPORTED: {starved.reason or 'starved_repeats is 0'}"
            starved_said = f"; starved receiver: {evidence['starved']}"
    answer = f"{'yes' if answer_ok else 'NO'}: at {evidence['done_means']}: as is {normal}{starved_said}"
    return {"id": "Q2", "question": QUESTIONS["Q2"], "answer": answer, "evidence": evidence}


def _states(during: list[dict]) -> str:
    if not during:
        return "no poll (the submit call itself ended the transfer)"
    return " -> ".join(f"{d['state']}" + (f" x{d['polls']}" if d["polls"] > 1 else "") for d in during)


def _short(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        return _short(next(iter(value.values())))
    if isinstance(value, dict) and ("returned" in value or "raised" in value):
        took = f" after {_ms(value['seconds'])}" if "seconds" in value else ""
        return _raised(value["raised"]) if "raised" in value else f"{value['returned']!r}{took}"
    if isinstance(value, list):
        return ", ".join(_short(v) for v in value)
    return repr(value)


def poll_states(session: ContractSession) -> dict:
    """Question 3: one transfer through the engine's pollable API, every poll's answer recorded
    (run-length: state, seconds since submit when first seen, polls in a row) before submit,
    at submit, during, after completion and after release of the handle."""
    session.dst.call("clear", session.timeout_s)
    seen = session.src.call("poll_states", session.timeout_s + 5, timeout_s=session.timeout_s)
    seen["verified"] = session.verified(seen["layout"])
    answer = (f"{seen['api']}: before submit: {_short(seen['before'])}; at submit: {_short(seen['at_submit'])}; "
              f"during: {_states(seen['during'])}; after done: {_short(seen['after_done'])}; "
              f"after release: {_short(seen['after_release'])}")
    return {"id": "Q3", "question": QUESTIONS["Q3"], "answer": answer, "evidence": seen}


def _first_line(text: str, width: int = 110) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def _raised(raised: dict) -> str:
    return f"raises {raised['type']}: {_first_line(raised['message'], 90)}"


def _value(value: Any) -> str:
    """One engine answer in words: a return code, a state, NIXL's steps, Mori's statuses."""
    if isinstance(value, dict) and "prepare" in value:  # NIXL: prepare / transfer / polls / release
        for step, call in (("prepare", "initialize_xfer"), ("transfer", "transfer()")):
            if "raised" in value.get(step, {}):
                return f"{call} {_raised(value[step]['raised'])}"
        polls = f", then {_states(value['polls'])}" if value.get("polls") else ""
        return f"transfer() returns {value['transfer']['returned']!r}{polls}"
    if isinstance(value, dict) and "final" in value:  # Mori: statuses at submit and at the end
        first = value["final"][0] if value["final"] else {}
        at_submit = f"{value['at_submit'][0]['code']} at submit, " if value.get("at_submit") else ""
        return f"status {at_submit}{first.get('code')} ({_first_line(first.get('message', ''), 80) or 'no message'})"
    if isinstance(value, dict) and "raised_by" in value:
        return f"{value['raised_by']} {_raised(value)}"
    if isinstance(value, dict) and "final_state" in value:
        return f"submit returns {value['submitted']!r}, then the poll {value['final_state']!r}"
    return f"returns {value!r}"


def _outcome(answer: dict) -> str:
    """A bounded engine call's answer (contract_sides.bounded / Background.wait) in words."""
    if not answer.get("answered"):
        return f"no answer within {answer.get('waited_s', 0):.0f} s"
    if "raised" in answer:
        return (f"{answer['raised_by']} " if "raised_by" in answer else "") + _raised(answer["raised"])
    return _value(answer.get("value"))


def failure_surface(session: ContractSession, timeout_s: float = 10.0) -> dict:
    """Question 4: each failure case the source offers (a write into the destination's
    unregistered guard, one running past the end of the registered region, a zero and a
    negative length, an unregistered local buffer, an unknown peer), made through the call
    sglang makes (bounded by ``timeout_s`` seconds).  Evidence per case: what the call
    returned or raised and its seconds, whether the destination survived, and how many bytes
    landed in the guard (unregistered memory the engine should never write)."""
    cases, parts = [], []
    for name in session.src.call("failure_cases", session.timeout_s):
        if not session.dst_alive():
            session.respawn_destination()
        case = session.src.call("failure_case", timeout_s + 10, name=name, timeout_s=timeout_s)
        alive = session.dst_alive()
        written = session.dst.call("guard_report", session.timeout_s)["guard_bytes_written"] if alive else None
        case.update(case=name, destination_alive=alive, guard_bytes_written=written)
        cases.append(case)
        said = _outcome(case["sglang"])
        if "engine" in case:
            said += f" (the engine itself: {_outcome(case['engine'])})"
        if written:
            said += f"; WROTE {written} bytes into the unregistered guard"
        if not alive:
            said += f"; the destination DIED (exit {session.dst.proc.returncode})"
        parts.append(f"{name}: {said}")
    return {"id": "Q4", "question": QUESTIONS["Q4"], "answer": "; ".join(parts), "evidence": {"cases": cases}}


def disconnect_surface(session: ContractSession, limit_s: float = DISCONNECT_LIMIT_S) -> dict:
    """Question 5: start a transfer of the whole buffer, SIGKILL the destination at once (the
    transfer in flight), then wait at most ``limit_s`` seconds for the source's call or poll to
    say something, and make one more submit to the dead peer.  Evidence per variant (each
    submit API the source offers, each on a fresh destination): seconds from submit to kill,
    from kill to the answer, the states seen, the answer, and the next submit's answer."""
    variants, parts, t = [], [], session.timeout_s
    for variant in session.src.call("disconnect_variants", t):
        if not session.dst_alive():
            session.respawn_destination()
        started = session.src.call("disconnect_start", t + 5, variant=variant, timeout_s=t, limit_s=limit_s)
        killed, gone = session.kill_destination()
        waited = session.src.call("disconnect_wait", limit_s + 15, limit_s=limit_s)
        again = session.src.call("disconnect_resubmit", limit_s + 15, variant=variant, limit_s=min(limit_s, 10.0))
        after = waited["at"] - killed if waited.get("answered") else None
        row = {"variant": variant, "call": started.get("call"), "started": started,
               "killed_after_submit_s": killed - started["t_submit"], "reaped_after_kill_s": gone - killed,
               "answered": bool(waited.get("answered")),
               "answer_after_kill_s": after, "wait": waited, "next_submit": again,
               "in_flight_at_kill": after is None or after > 0}
        variants.append(row)
        if after is not None and after <= 0:
            said = f"ended before the kill ({_outcome(waited)}): not measured, rerun with a larger --total-mib"
        elif after is None:
            said = f"no answer within {limit_s:.0f} s"
        else:
            final = (waited.get("final") or [{}])[0].get("message")
            said = f"{_outcome(waited)}{f' ({_first_line(final, 80)})' if final else ''} {after:.3f} s after the kill"
        said += f"; next submit: {_outcome(again)}" + (f" in {again['seconds']:.3f} s" if again.get("answered") else "")
        parts.append(f"{variant}: {said}")
    return {"id": "Q5", "question": QUESTIONS["Q5"], "answer": "; ".join(parts), "evidence": {"variants": variants}}


# --------------------------------------------------------------------------- one engine


def _check(engine: str, total_bytes: int, block_bytes: int, questions: list[str], counts: dict,
           starved_repeats: int = 0) -> None:
    known = engines()
    if engine not in known:
        raise ValueError(f"engine must be one of {', '.join(known)}, got {engine!r}")
    for name, value in {"total_bytes": total_bytes, "block_bytes": block_bytes, **counts}.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a number > 0, got {value!r}")
    if block_bytes < 4096 or block_bytes % 16 or total_bytes % block_bytes:
        raise ValueError(f"block_bytes ({block_bytes}) must be a multiple of 16, at least 4096, "
                         f"and divide total_bytes ({total_bytes})")
    if isinstance(starved_repeats, bool) or not isinstance(starved_repeats, int) or starved_repeats < 0:
        raise ValueError(f"starved_repeats must be an int >= 0, got {starved_repeats!r}")
    unknown = [q for q in questions if q not in QUESTIONS]
    if unknown:
        raise ValueError(f"unknown question {', '.join(unknown)} (known: {', '.join(QUESTIONS)})")


def machine() -> dict:
    """What the figures were measured on."""
    return {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "sglang": sglang_version()}


def run_contract(engine: str, *, total_bytes: int = DEFAULT_TOTAL_BYTES, block_bytes: int = DEFAULT_BLOCK_BYTES,
                 questions: list[str] | None = None, done_repeats: int = DEFAULT_DONE_REPEATS,
                 submit_repeats: int = DEFAULT_SUBMIT_REPEATS, starved_repeats: int = DEFAULT_STARVED_REPEATS,
                 disconnect_limit_s: float = DISCONNECT_LIMIT_S, timeout_s: float = TIMEOUT_S) -> dict:
    """Answer ``questions`` (default: all, in order; "Q1".."Q5") for ``engine`` on one session
    (transfers of ``total_bytes`` bytes in blocks of ``block_bytes``).  Returns ``engine``,
    ``kind`` ("real" or "standin"), ``version``, ``transport``, ``completion`` (what "done"
    is), ``setup``, ``total_bytes``, ``block_bytes``, ``blocks``, ``answers`` (one dict per
    question), ``seconds`` (wall), ``destinations_started``, ``isolated_network``,
    ``machine`` and ``date`` (UTC, ISO 8601).  Errors: see the module docstring."""
    questions = list(questions or QUESTIONS)
    _check(engine, total_bytes, block_bytes, questions, {"done_repeats": done_repeats, "submit_repeats":
           submit_repeats, "disconnect_limit_s": disconnect_limit_s, "timeout_s": timeout_s}, starved_repeats)
    run = {"Q1": lambda s: does_submit_block(s, submit_repeats),
           "Q2": lambda s: is_done_visible(s, done_repeats, starved_repeats=starved_repeats),
           "Q3": poll_states, "Q4": failure_surface, "Q5": lambda s: disconnect_surface(s, disconnect_limit_s)}
    start = stamp()
    session = ContractSession(engine, total_bytes, block_bytes, timeout_s)
    try:
        answers = [run[q](session) for q in sorted(set(questions), key=list(QUESTIONS).index)]
        respawns, isolated, facts = session.respawns, session.isolated, session.facts
    finally:
        session.close()
    return {**facts, "setup": contract_sides(engine).setup, "total_bytes": total_bytes, "block_bytes": block_bytes,
            "blocks": total_bytes // block_bytes, "answers": answers, "seconds": stamp() - start,
            "destinations_started": 1 + respawns, "isolated_network": isolated, "machine": machine(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
