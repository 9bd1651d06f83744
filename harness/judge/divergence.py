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
"""

from __future__ import annotations

from typing import Any

from harness.spec.history import Event, Op

# ops whose outcome says nothing about the protocol (process start-up, bookkeeping)
# and fault bookkeeping copied in at the end of a cell, whose counts depend on how an engine batches
_SKIP_OPS = {Op.LAUNCH, Op.OBSERVE, Op.ENGINE_FAULT, Op.POINT_HIT, Op.UNSUPPORTED_LAYOUT, Op.LAYOUT_TRANSFER,
             Op.ABORT_ACKS, Op.CELL_START, Op.CELL_END, Op.CELL_EXIT}


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
              Op.INJECT_ABORT, Op.ABORT_FRAMES):
        return "done"
    if op == Op.ENGINE_FAULT:
        return f"{value.get('fault')} transfer {value.get('transfer')}"
    if op == Op.POINT_HIT:
        return f"{value.get('point')} {value.get('action')}"
    if op == Op.LAYOUT_SHRINK:
        return f"{len(value.get('shrunk', []))} kind(s) of difference"
    return "ok"


def normalize(events: list[dict]) -> list[dict]:
    """The protocol-relevant events of a history, in order, without run-specific values."""
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
                    "role": event.get("role"), "value": _project(event)})
    return out


def first_divergence(reference: list[dict], observed: list[dict], checks: list[dict]) -> dict | None:
    """The first normalized event where ``observed`` differs from ``reference``
    (both raw histories), or None when they agree event for event."""
    ref, obs = normalize(reference), normalize(observed)
    failing = next((c for c in checks if c.get("ok") is False), None)
    requirement = failing["requirement"] if failing else None
    for index in range(max(len(ref), len(obs))):
        a = ref[index] if index < len(ref) else None
        b = obs[index] if index < len(obs) else None
        if a is not None and b is not None and a == b:
            continue
        where = b or a
        return {"step": where["step"], "step_name": where["step_name"], "op": where["op"], "role": where["role"],
                "requirement": requirement,
                "reference": _side(a, b), "observed": _side(b, a)}
    return None


def _side(mine: dict | None, other: dict | None) -> str:
    if mine is None:
        return "(no such event: the history ended)"
    if other is not None and (mine["op"], mine["role"], mine["step"]) != (other["op"], other["role"], other["step"]):
        return f"{mine['op']} on {mine['role']} at step {mine['step']}: {mine['value']}"
    return str(mine["value"])


def describe(divergence: dict | None) -> str:
    """One line: ``step 7 AwaitStatus await_status on decode: reference Failed, observed WaitingForInput``."""
    if not divergence:
        return ""
    d = divergence
    req = f" [{d['requirement']}]" if d.get("requirement") else ""
    return (f"first divergence at step {d['step']} {d['step_name']} ({d['op']} on {d['role']}){req}: "
            f"reference {d['reference']}, observed {d['observed']}")
