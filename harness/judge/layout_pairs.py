"""Judging the independently drawn layout pairs (harness.spec.layout_pairs, R-LAYOUT-2): what
each pair's real transfer came to, against what the spec's planner says of it.

Pure functions of the history: each pair's events lie between its ``layout-pair`` marker
(args: ``index``, ``spec``, ``prefill``, ``decode``, ``expected``) and the next marker.
"""

from __future__ import annotations

from harness.spec.history import Event, Op, completions
from harness.spec.protocol import KVPoll, kvpoll_name

RIGHT, WRONG, REFUSED_VISIBLY, REFUSED_SILENTLY = "right", "wrong", "refused visibly", "refused silently"
UNVERIFIED = "not verified"  # the pair's byte check did not run or failed to: no outcome can be told
OUTCOMES = (RIGHT, WRONG, REFUSED_VISIBLY, REFUSED_SILENTLY, UNVERIFIED)


def pairs(events: list[dict]) -> list[tuple[dict, list[dict]]]:
    """Each pair's marker event and the events of its transfer, in order."""
    marks = [i for i, e in enumerate(events) if e["op"] == Op.LAYOUT_PAIR and e["type"] == Event.INFO]
    return [(events[i], events[i + 1:j]) for i, j in zip(marks, marks[1:] + [len(events)])]


def _last(events: list[dict], op: str, role: str) -> dict | None:
    found = list(completions(events, op=op, role=role))
    return found[-1] if found else None


def classify(marker: dict, events: list[dict]) -> tuple[str, str]:
    """(outcome, what happened) of one pair: RIGHT when it went as the spec says (served
    byte-exact, or refused with a Failed room and a reason on the decode and a Failed room on
    the prefill); WRONG when a byte landed where the spec says none may (a refused pair
    written to, a served one misplaced) or a refused pair reached Success; REFUSED_VISIBLY
    when a pair the spec serves failed with a reason; REFUSED_SILENTLY for a hang, a
    refusal on one side only, a Failed room with no reason, a thread that died or a role that
    could not be observed; UNVERIFIED when the pools were never checked (the check failed to
    run, or the pair's transfer was cut short), which no outcome can be told from."""
    args = marker["args"]
    prefill, decode, served = args["prefill"], args["decode"], args["expected"] == "serve"
    start = next((e for e in events if e["op"] == Op.LAYOUT_START and e["type"] == Event.FAIL), None)
    if start is not None:  # a manager refused the layout while starting: an error, on the side that raised
        return (REFUSED_VISIBLY if served else RIGHT), f"refused while starting: {start.get('error', '')[:200]}"
    verify = _last(events, Op.VERIFY, decode)
    status = {role: ((_last(events, Op.AWAIT_STATUS, role) or {}).get("value") or {}) for role in (prefill, decode)}
    seen = {role: v.get("status") for role, v in status.items()}
    dead = [f"{e['role']}: {d['thread']} died: {d['exception']}" for e in events
            if e["op"] == Op.OBSERVE and e["type"] == Event.OK for d in (e["value"] or {}).get("dead_threads", [])]
    dead += [e.get("error", f"{e['role']} could not be observed") for e in events
             if e["op"] == Op.OBSERVE and e["type"] == Event.FAIL]
    written_wrong = verify is not None and verify["type"] == Event.OK and not verify["value"]["ok"]
    said = f"prefill {_name(seen[prefill])}, decode {_name(seen[decode])}"
    aborted = next((e for e in events if e["op"] == Op.LAYOUT_PAIR and e["type"] == Event.FAIL), None)
    if written_wrong:
        return WRONG, f"{said}; {verify['value']['mismatch_pages']} page(s) wrong: " + \
            "; ".join(verify["value"]["mismatches"][:2])
    if not served and KVPoll.Success in seen.values():
        return WRONG, f"{said}: a pair the spec refuses ({args.get('reason', '')}) was served"
    if dead:
        return REFUSED_SILENTLY, f"{said}; " + "; ".join(dead[:2])
    if aborted is not None or verify is None or verify["type"] != Event.OK:  # the bytes were never judged
        why = aborted.get("error") if aborted else (verify or {}).get("error", "the pools were never verified")
        return UNVERIFIED, f"{said}; {str(why)[:200]}"
    reason = status[decode].get("failure_reason")
    if seen[prefill] == KVPoll.Failed and seen[decode] == KVPoll.Failed and reason:
        return (REFUSED_VISIBLY if served else RIGHT), f"{said}; the decode's reason: {reason[:200]}"
    if served and seen[prefill] == seen[decode] == KVPoll.Success:
        return RIGHT, f"{said}; every byte where the spec puts it"
    return REFUSED_SILENTLY, f"{said}{'' if reason else ', no failure reason'} within the pair's bounds"


def _name(status) -> str:
    return kvpoll_name(status) if status is not None else "never polled"


def pairs_as_specified():
    """R-LAYOUT-2 over every drawn pair: each went as the spec says (:func:`classify`); the
    detail counts the four outcomes and names the shrunk pair of each way it went wrong."""
    def fn(events: list[dict]):
        judged = [(marker, *classify(marker, own)) for marker, own in pairs(events) if not marker["args"].get("shrink")]
        if not judged:
            return False, "no layout pair was transferred"
        counts = {o: sum(1 for _, got, _ in judged if got == o) for o in OUTCOMES}
        refused_right = sum(1 for m, got, _ in judged if got == RIGHT and m["args"]["expected"] != "serve")
        line = (f"{len(judged)} pairs drawn side by side: {counts[RIGHT]} right ({refused_right} of them refusals "
                f"the spec asks for), {counts[WRONG]} wrong, {counts[REFUSED_VISIBLY]} refused visibly though the "
                f"spec serves them, {counts[REFUSED_SILENTLY]} refused silently"
                + (f", {counts[UNVERIFIED]} not verified" if counts[UNVERIFIED] else ""))
        shrunk = [e for e in events if e["op"] == Op.LAYOUT_PAIR_SHRINK]
        examples = [f"[{e['value']['outcome']}] {e['value']['layout']}: {e['value']['detail']}" for e in shrunk]
        if counts[RIGHT] == len(judged):
            return True, line
        first = next(m for m, got, _ in judged if got != RIGHT)
        if counts[RIGHT] + counts[UNVERIFIED] == len(judged):  # nothing seen wrong, but not everything seen
            return None, line, first["seq"]
        return False, line + ("; shrunk: " + "; ".join(examples) if examples else ""), first["seq"]

    return fn
