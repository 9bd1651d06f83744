"""Judging the independently drawn layout pairs (harness.spec.layout_pairs, R-LAYOUT-2): what
each pair's real transfer came to, against what the spec's planner says of it.

Pure functions of the history: each pair's events lie between its ``layout-pair`` marker
(args: ``index``, ``spec``, ``prefill``, ``decode``, ``expected``) and the next marker.

A *refusal* is what told a scheduler that the pair will not be served, the first of:

* an explicit error: a scheduler call of the pair's room (open the sender or the receiver,
  request the KV, init the sender, send the chunk) that raised, on either side.  sglang's
  bootstrap checks raise there (``try_ensure_parallel_info``: "Page size mismatch ... Both
  servers must use the same --page-size value", while the decode opens its receiver);
* the decode's room Failed with a reason (the side whose pages are at stake is told).

A refusal is *visible* only when it came before the decode's waiting timeout (counted from
the decode's request for the KV, as sglang's ``init_time``) and its reason is not a timeout:
a room that only ran out of time was never refused, it was left to hang.  A write before
the refusal shows in the byte check, which no refused pair may fail.
"""

from __future__ import annotations

import re

from harness.judge import checks
from harness.spec.history import Event, Op, completions
from harness.spec.layout_pairs import ENV as PAIR_ENV
from harness.spec.protocol import KVPoll, kvpoll_name

RIGHT, WRONG, REFUSED_VISIBLY, REFUSED_SILENTLY = "right", "wrong", "refused visibly", "refused silently"
UNVERIFIED = "not verified"  # the pair's byte check did not run or failed to: no outcome can be told
ERROR = "error"  # the harness could not start the pair's roles: nothing of the backend was seen
UNSUPPORTED = "unsupported"  # the engine refused a step on this machine (an adapter's Unsupported): not judged here
OUTCOMES = (RIGHT, WRONG, REFUSED_VISIBLY, REFUSED_SILENTLY, UNVERIFIED, ERROR, UNSUPPORTED)
#: the outcomes that say something went wrong in the backend: worth a shrink, and a FAIL
BROKEN = (WRONG, REFUSED_VISIBLY, REFUSED_SILENTLY)

#: the scheduler calls of a pair's room whose explicit error is a refusal (either side)
REFUSING_OPS = (Op.OPEN_SENDER, Op.OPEN_RECEIVER, Op.REQUEST_KV, Op.INIT_SENDER, Op.SEND_CHUNK)
#: a reason that says time ran out (sglang's "timed out after ...", "Timed out waiting for
#: prefill completion", pdconform's "gave no parallel info within", a call that got no answer)
TIMEOUT_WORDS = re.compile(r"time[sd]?[ -]?out|no answer within|no parallel info within", re.I)
DETAIL_CHARS = 200  # of one pair's detail: what sglang said is cut here (the history keeps it whole)
LISTED_MISMATCHES = 2  # byte mismatches named per wrong pair; the rest are counted


def pairs(events: list[dict]) -> list[tuple[dict, list[dict]]]:
    """Each pair's marker event and the events of its transfer, in order."""
    marks = [i for i, e in enumerate(events) if e["op"] == Op.LAYOUT_PAIR and e["type"] == Event.INFO]
    return [(events[i], events[i + 1:j]) for i, j in zip(marks, marks[1:] + [len(events)])]


def _last(events: list[dict], op: str, role: str) -> dict | None:
    found = list(completions(events, op=op, role=role))
    return found[-1] if found else None


def _waiting_timeout_s(events: list[dict], decode: str) -> float:
    """The decode's waiting timeout (seconds): what its manager reported when it started
    (``waiting_timeout_s``), else the pair roles' setting (harness.spec.layout_pairs.ENV)."""
    started = next((e for e in events if e["op"] == Op.START_DECODE and e["type"] == Event.OK
                    and e.get("role") == decode), None)
    reported = ((started or {}).get("value") or {}).get("waiting_timeout_s")
    return float(reported) if reported is not None else float(dict(PAIR_ENV)["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"])


def refusal(events: list[dict], prefill: str, decode: str) -> dict | None:
    """The pair's refusal (module docstring): ``{"how": "raised" | "failed", "role", "op",
    "reason", "t"}`` (``t``: seconds since the cell started, when it was first recorded), or
    None when no scheduler was told anything.  Only the first failed call counts: one that
    fails because an earlier one did (a request for the KV of a receiver that never opened)
    says nothing new, and one that got no answer (a hang) keeps its own words, which
    :func:`_visible` reads as a timeout."""
    raised = next((e for e in events if e["type"] == Event.FAIL and e["op"] in REFUSING_OPS
                   and e.get("role") in (prefill, decode)), None)
    failed = next((e for e in events if e["op"] == Op.AWAIT_STATUS and e["type"] == Event.OK
                   and e.get("role") == decode and (e.get("value") or {}).get("status") == KVPoll.Failed), None)
    found = [x for x in (raised, failed) if x is not None]
    if not found:
        return None
    first = min(found, key=lambda e: e["seq"])
    if first is raised:
        return {"how": "raised", "role": first["role"], "op": first["op"], "reason": str(first.get("error", "")),
                "t": first.get("t")}
    return {"how": "failed", "role": decode, "op": Op.AWAIT_STATUS,
            "reason": str((first.get("value") or {}).get("failure_reason") or ""), "t": first.get("t")}


def _visible(events: list[dict], found: dict, decode: str) -> str | None:
    """Why refusal ``found`` is not visible (no reason, a timeout, after the waiting timeout),
    or None when it is."""
    if not found["reason"]:
        return "the decode's room Failed with no reason"
    if TIMEOUT_WORDS.search(found["reason"]):
        return f"only a timeout: {found['reason'][:DETAIL_CHARS]}"
    asked = next((e for e in events if e["op"] == Op.REQUEST_KV and e["type"] == Event.INVOKE
                  and e.get("role") == decode), None)
    anchor = (asked or next((e for e in events if e["type"] == Event.INVOKE and e["op"] in REFUSING_OPS), {})).get("t")
    bound = _waiting_timeout_s(events, decode)
    if anchor is not None and found["t"] is not None and found["t"] - anchor > bound:
        return (f"refused {found['t'] - anchor:.1f} s after the decode asked for the KV, past its {bound:g} s waiting "
                f"timeout: {found['reason'][:DETAIL_CHARS]}")
    return None


def _wrong_pages(verify: dict) -> str:
    """``N page(s) wrong: first; second (+M more)``: the mismatches named and the rest counted."""
    value = verify["value"]
    named = value["mismatches"][:LISTED_MISMATCHES]
    more = max(0, value["mismatch_pages"] - len(named))
    return f"{value['mismatch_pages']} page(s) wrong: " + "; ".join(named) + (f" (+{more} more)" if more else "")


def classify(marker: dict, events: list[dict]) -> tuple[str, str]:
    """(outcome, what happened) of one pair, the first that holds of:

    * UNSUPPORTED: a step was one the engine cannot take on this machine (the adapter's
      Unsupported, say NIXL's refusal of DRAM KV, harness.role.adapter.Refusal): not judged
      here, whatever died of it;
    * ERROR: the harness could not start the pair's roles (never a refusal: the backend was
      not asked);
    * WRONG: a byte landed where the spec puts none (a refused pair written to, a served one
      misplaced), or a pair the spec refuses reached Success on a side;
    * REFUSED_SILENTLY: a thread of the pair's roles died, or a role could not be observed;
    * UNVERIFIED: the pools were never checked (the check failed to run, or the transfer was
      cut short): no outcome can be told;
    * a refusal (:func:`refusal`): RIGHT when the spec refuses the pair and the refusal is
      visible (before the waiting timeout, not a timeout, with a reason), REFUSED_VISIBLY
      when the spec serves the pair and the refusal is visible, else REFUSED_SILENTLY;
    * no refusal: RIGHT for a served pair that reached Success on both sides (its bytes
      checked above), else REFUSED_SILENTLY (a hang, a one-sided or reasonless end)."""
    args = marker["args"]
    prefill, decode, served = args["prefill"], args["decode"], args["expected"] == "serve"
    cut = next((e for e in events if e["type"] == Event.FAIL and e.get("unsupported")), None)
    if cut is not None:  # the first step refused on this machine (the pair's end is marked so too)
        return UNSUPPORTED, f"not judged here: {_cut(str(cut.get('error', '')).removeprefix('transfer cut short: '))}"
    start = next((e for e in events if e["op"] == Op.LAYOUT_START and e["type"] == Event.FAIL), None)
    if start is not None:  # the roles did not start: a harness failure, whatever the spec says of the pair
        return ERROR, f"the pair's roles did not start: {str(start.get('error', ''))[:DETAIL_CHARS]}"
    verify = _last(events, Op.VERIFY, decode)
    status = {role: ((_last(events, Op.AWAIT_STATUS, role) or {}).get("value") or {}) for role in (prefill, decode)}
    seen = {role: v.get("status") for role, v in status.items()}
    dead = [f"{e['role']}: {d['thread']} died: {d['exception']}" for e in events
            if e["op"] == Op.OBSERVE and e["type"] == Event.OK for d in (e["value"] or {}).get("dead_threads", [])]
    dead += [e.get("error", f"{e['role']} could not be observed") for e in events
             if e["op"] == Op.OBSERVE and e["type"] == Event.FAIL]
    said = f"prefill {_name(seen[prefill])}, decode {_name(seen[decode])}"
    aborted = next((e for e in events if e["op"] == Op.LAYOUT_PAIR and e["type"] == Event.FAIL), None)
    if verify is not None and verify["type"] == Event.OK and not verify["value"]["ok"]:
        return WRONG, f"{said}; {_wrong_pages(verify)}"
    if not served and KVPoll.Success in seen.values():
        return WRONG, f"{said}: a pair the spec refuses ({args.get('reason', '')}) was served"
    if dead:
        return REFUSED_SILENTLY, f"{said}; " + "; ".join(dead[:2])
    if aborted is not None or verify is None or verify["type"] != Event.OK:  # the bytes were never judged
        why = aborted.get("error") if aborted else (verify or {}).get("error", "the pools were never verified")
        return UNVERIFIED, f"{said}; {str(why)[:DETAIL_CHARS]}"
    found = refusal(events, prefill, decode)
    if found is None:
        if served and seen[prefill] == seen[decode] == KVPoll.Success:
            return RIGHT, f"{said}; every byte where the spec puts it"
        return REFUSED_SILENTLY, f"{said}, no failure reason, no error within the pair's bounds"
    hidden = _visible(events, found, decode)
    if hidden is not None:
        return REFUSED_SILENTLY, f"{said}; {hidden}"
    told = f"{found['role']}.{found['op']} raised" if found["how"] == "raised" else "the decode's reason"
    return (REFUSED_VISIBLY if served else RIGHT), f"{said}; refused: {told}: {_cut(found['reason'])}"


def _cut(reason: str) -> str:
    """What a refusal said, from the exception on (``ROLE.OP raised TYPE: message`` keeps ``TYPE: message``)."""
    return reason.split(" raised ", 1)[-1][:DETAIL_CHARS]


def _name(status) -> str:
    return kvpoll_name(status) if status is not None else "never polled"


def _tag(marker: dict) -> str:
    """The pair's tag (``P3``) from its prefill role's name (``prefill-P3``)."""
    return str(marker["args"].get("prefill", "")).removeprefix("prefill-") or f"#{marker['seq']}"


def pairs_as_specified():
    """R-LAYOUT-2 over every drawn pair: each went as the spec says (:func:`classify`).  The
    detail counts the outcomes, then lists every pair that did not go right (its tag, outcome,
    layout and what happened, a wrong pair with its mismatched pages named up to
    :data:`LISTED_MISMATCHES` and the rest counted), then the shrunk pair of each way pairs
    went wrong.  False when a pair went wrong (:data:`BROKEN`), None (cannot tell) when none
    did but a pair could not be started or verified, UNSUPPORTED (harness.judge.checks) when
    the only pairs not right are ones the engine cannot take on this machine, True when every
    pair went right."""
    def fn(events: list[dict]):
        judged = [(marker, *classify(marker, own)) for marker, own in pairs(events) if not marker["args"].get("shrink")]
        if not judged:
            return False, "no layout pair was transferred"
        counts = {o: sum(1 for _, got, _ in judged if got == o) for o in OUTCOMES}
        refused_right = sum(1 for m, got, _ in judged if got == RIGHT and m["args"]["expected"] != "serve")
        line = (f"{len(judged)} pairs drawn side by side: {counts[RIGHT]} right ({refused_right} of them refusals "
                f"the spec asks for), {counts[WRONG]} wrong, {counts[REFUSED_VISIBLY]} refused visibly though the "
                f"spec serves them, {counts[REFUSED_SILENTLY]} refused silently"
                + (f", {counts[UNVERIFIED]} not verified" if counts[UNVERIFIED] else "")
                + (f", {counts[ERROR]} not started (harness error)" if counts[ERROR] else "")
                + (f", {counts[UNSUPPORTED]} not judged here (the engine cannot take them on this machine)"
                   if counts[UNSUPPORTED] else ""))
        if counts[RIGHT] == len(judged):
            return True, line
        listed = [f"{_tag(m)} [{got}] {m['args'].get('layout', '')}: {detail}" for m, got, detail in judged if got != RIGHT]
        shrunk = [e for e in events if e["op"] == Op.LAYOUT_PAIR_SHRINK]
        examples = [f"[{e['value']['outcome']}] {e['value']['layout']}: {e['value']['detail']}" for e in shrunk]
        text = line + "; " + "; ".join(listed) + ("; shrunk: " + "; ".join(examples) if examples else "")
        broken = [m for m, got, _ in judged if got in BROKEN]
        if broken:
            return False, text, broken[0]["seq"]
        unknown = [m for m, got, _ in judged if got in (ERROR, UNVERIFIED)]
        if unknown:  # nothing seen wrong, but not everything seen
            return None, text, unknown[0]["seq"]
        # nothing wrong, and what was not right is what this machine cannot run (as draft-kv-layout's skips)
        return checks.UNSUPPORTED, text, next(m for m, got, _ in judged if got == UNSUPPORTED)["seq"]

    return fn
