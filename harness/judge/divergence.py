"""Behaviour diff: a cell's history against the reference's for the same scenario and seed.

Histories are normalized first: timestamps, sequence numbers, ports, endpoints,
process ids, thread names and free-text messages are dropped; what remains per
event is what the protocol fixes (step, op, role, outcome, status reached, bytes
verified, loops alive, faults fired).  The first event where the two normalized
histories differ is the cell's ``divergence``::

    {"step": 7, "step_name": "AwaitStatus", "op": "await_status", "role": "decode",
     "requirement": "R-HB-1", "reference": "Failed", "observed": "WaitingForInput"}

``requirement`` is that of the cell's first failing check (None if no check failed:
a divergence on its own is behaviour, not a verdict).

A cell may hold several independent cases (two rooms, two prefills).  Each event
belongs to a case: its room, or, for an event without one, its role.  A failing check
points at a case: the case of the event it was decided on (its ``at``,
harness.judge.checks.CheckResult), else the cases its detail names (a room id, else a
role name).  In that case the divergence is looked for at the step the check was decided
on first (a room reused in a later step is not blamed on its first lifecycle), else from
the case's start.  The cell's divergence is the one of the check its verdict's reason
names (the first failing MUST, else the first failing check); ``cases`` lists every
failing check's divergence, with the checks that point at it, when they are more than one
or not the history's first; ``seq`` is the observed event's, for the cell page to pin.
So it never points at an unrelated, passing case.  Without a failing check that points
anywhere, it is the history's first divergence.
"""

from __future__ import annotations

from typing import Any

from harness.spec.history import Event, Op

# ops whose outcome says nothing about the protocol (process start-up, bookkeeping)
# and fault bookkeeping copied in at the end of a cell, whose counts depend on how an engine batches
_SKIP_OPS = {Op.LAUNCH, Op.OBSERVE, Op.ENGINE_FAULT, Op.MESSAGE_LOST, Op.MESSAGE_AUDIT, Op.POINT_HIT, Op.UNSUPPORTED_LAYOUT, Op.LAYOUT_TRANSFER,
             Op.ABORT_ACKS, Op.ABORTS_SENT, Op.CELL_START, Op.CELL_END, Op.CELL_EXIT}


def _project(event: dict) -> Any:
    """The part of an event's value that two conforming implementations share."""
    op, value = event["op"], event.get("value")
    if event["type"] == Event.FAIL:
        return "raised"
    if op == Op.AWAIT_STATUS:
        return value["status_name"] if value else None
    if op == Op.VERIFY:
        return "bytes exact" if value and value.get("ok") else f"{(value or {}).get('mismatch_pages')} page(s) wrong"
    if op == Op.OBSERVE_MID:
        dead = sorted({d["exception"] for d in value.get("dead_threads", [])}) if value else []
        return "loops alive" if not dead and all((value or {}).get("loops", {}).values()) else f"died: {dead}"
    if op == Op.AWAIT_POINT:
        return "reached"
    if op in (Op.KILL, Op.FREEZE, Op.THAW, Op.INJECT, Op.ARM_POINT, Op.RELEASE_POINT, Op.ENGINE_FAULTS, Op.RESTART,
              Op.INJECT_ABORT, Op.ABORT_FRAMES, Op.LOSE_MESSAGES):
        return "done"
    if op == Op.ENGINE_FAULT:
        return f"{value.get('fault')} transfer {value.get('transfer')}"
    if op == Op.POINT_HIT:
        return f"{value.get('point')} {value.get('action')}"
    if op == Op.LAYOUT_SHRINK:
        return f"{len(value.get('shrunk', []))} kind(s) of difference"
    return "ok"


def normalize(events: list[dict]) -> list[dict]:
    """The protocol-relevant events of a history, in order, without run-specific values
    (``seq`` is kept to point back at the raw event; it is never compared)."""
    out = []
    step_names: dict[int, str] = {}
    for event in events:
        if event["op"] == Op.STEP:
            step_names[event["step"]] = (event.get("args") or {}).get("step", "")
            continue
        if event["type"] not in (Event.OK, Event.FAIL, Event.NEMESIS) and event["op"] != Op.LAYOUT_SHRINK:
            continue
        if event["op"] in _SKIP_OPS:
            continue
        out.append({"step": event["step"], "step_name": step_names.get(event["step"], ""), "op": event["op"],
                    "role": event.get("role"), "value": _project(event), "case": _case(event),
                    "seq": event.get("seq")})
    return out


def _case(event: dict) -> str:
    room = (event.get("args") or {}).get("room")
    return f"room {room}" if isinstance(room, int) else f"role {event.get('role')}"


def _first(ref: list[dict], obs: list[dict]) -> tuple[int, dict] | None:
    """The index and divergence of the first event where ``obs`` differs from ``ref``
    (normalized), or None when they agree event for event.  ``seq``: the observed event's
    (None when the observed history has no such event)."""
    for index in range(max(len(ref), len(obs))):
        a = ref[index] if index < len(ref) else None
        b = obs[index] if index < len(obs) else None
        if a is not None and b is not None and _same(a, b):
            continue
        where = b or a
        return index, {"step": where["step"], "step_name": where["step_name"], "op": where["op"],
                       "role": where["role"], "reference": _side(a, b), "observed": _side(b, a),
                       "seq": b["seq"] if b is not None else None}
    return None


def _same(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k not in ("case", "seq")} == \
        {k: v for k, v in b.items() if k not in ("case", "seq")}


def _named_cases(detail: str, cases: list[str]) -> list[str]:
    """The cases a check's detail names: the rooms whose id it mentions, else the roles it
    mentions (the longest name first, so ``prefill-init`` is not taken for ``prefill``)."""
    import re

    rooms = [c for c in cases if c.startswith("room ") and re.search(rf"(?<!\d){c[5:]}(?!\d)", detail)]
    if rooms:
        return rooms
    roles = sorted((c for c in cases if c.startswith("role ") and c != "role None"), key=len, reverse=True)
    for case in roles:
        if re.search(rf"(?<![\w-]){re.escape(case[5:])}(?![\w-])", detail):
            return [case]
    return []


def _check_divergences(check: dict, ref: list[dict], obs: list[dict], keys: list[str]) -> list[dict]:
    """The divergences one failing check points at, each ``{"case", ...divergence}``.  Its
    case: that of the event it was decided on (its ``at``), else the cases its detail names.
    In each case, the divergence at the step the check was decided on when the histories
    differ there, else the case's first divergence."""
    at = next((e for e in obs if check.get("at") is not None and e["seq"] == check["at"]), None)
    cases = [at["case"]] if at is not None else _named_cases(check.get("detail") or "", keys)
    out = []
    for case in cases:
        ref_case, obs_case = [e for e in ref if e["case"] == case], [e for e in obs if e["case"] == case]
        found = None
        if at is not None:
            found = _first([e for e in ref_case if e["step"] == at["step"]],
                           [e for e in obs_case if e["step"] == at["step"]])
        found = found or _first(ref_case, obs_case)
        if found is not None:
            out.append({"case": case, **found[1]})
    return out


def first_divergence(reference: list[dict], observed: list[dict], checks: list[dict]) -> dict | None:
    """The cell's first divergence (see the module docstring; both histories raw), with
    ``cases`` when the failing checks point at other cases or steps than the history's first
    divergence; None when the histories agree."""
    ref, obs = normalize(reference), normalize(observed)
    overall = _first(ref, obs)
    if overall is None:
        return None
    failing = [c for c in checks if c.get("ok") is False]
    # the check the verdict's reason names first (harness.judge.judge.verdict_of: a MUST before a SHOULD)
    failing.sort(key=lambda c: c.get("level") != "MUST")
    requirement = failing[0]["requirement"] if failing else None
    keys = list(dict.fromkeys(e["case"] for e in ref + obs))
    found: dict[tuple, dict] = {}  # (case, step, op, role) -> divergence with the checks that point at it
    for check in failing:
        for d in _check_divergences(check, ref, obs, keys):
            entry = found.setdefault((d["case"], d["step"], d["op"], d["role"]),
                                     {**d, "checks": [], "requirement": check["requirement"]})
            entry["checks"].append(check["name"])
    if not found:
        return {**{k: v for k, v in overall[1].items()}, "requirement": requirement}
    entries = list(found.values())  # the reason's check's divergence first
    out = {k: v for k, v in entries[0].items() if k not in ("case", "checks")}
    out["check"] = entries[0]["checks"][0]
    overall_case = _case_of(overall, ref, obs)
    if len(entries) > 1 or (entries[0]["case"], entries[0]["step"]) != (overall_case, overall[1]["step"]):
        out["cases"] = sorted(entries, key=lambda e: e["step"] if e["step"] is not None else -1)
    return out


def _case_of(found: tuple[int, dict], ref: list[dict], obs: list[dict]) -> str | None:
    index = found[0]
    event = obs[index] if index < len(obs) else ref[index] if index < len(ref) else None
    return event["case"] if event else None


def _side(mine: dict | None, other: dict | None) -> str:
    if mine is None:
        return "(no such event: the history ended)"
    if other is not None and (mine["op"], mine["role"], mine["step"]) != (other["op"], other["role"], other["step"]):
        return f"{mine['op']} on {mine['role']} at step {mine['step']}: {mine['value']}"
    return str(mine["value"])


def describe(divergence: dict | None) -> str:
    """One line: ``step 7 AwaitStatus await_status on decode: reference Failed, observed WaitingForInput``;
    with several failing cases, one such line per case, each naming its case and checks."""
    head, cases = describe_parts(divergence)
    return "; ".join(cases) if cases else head


def describe_parts(divergence: dict | None) -> tuple[str, list[str]]:
    """The cell's divergence as (its one line, with its requirement; a line per failing
    case, each naming its case and checks, when there are several)."""
    if not divergence:
        return "", []
    d = divergence
    head = _line(d, (f" [{d['requirement']}]" if d.get("requirement") else "")
                 + (f", where {d['check']} failed" if d.get("check") else ""))
    cases = d.get("cases") or []
    return head, [f"{c['case']} ({', '.join(c['checks'])}): " + _line(c) for c in cases] if len(cases) > 1 else []


def _line(d: dict, requirement: str = "") -> str:
    return (f"first divergence at step {d['step']} {d['step_name']} ({d['op']} on {d['role']}){requirement}: "
            f"reference {d['reference']}, observed {d['observed']}")
