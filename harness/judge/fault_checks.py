"""Checks of a room's end after an injected fault (a network partition): pure functions of a
cell's history, as harness.judge.checks's are."""

from __future__ import annotations

from harness.judge.checks import Checker, _first_failed_after, _last_poll, first_event, seen_at


def failed_after(room: int, role: str, op: str, op_role: str, high_s: float) -> Checker:
    """``room`` on ``role`` was first seen Failed, with a failure reason, at most ``high_s``
    seconds after ``op_role``'s first ``op`` event of any room (a nemesis event such as a
    network partition); a Success instead, or no terminal status, fails it."""

    def fn(events: list[dict]):
        start = first_event(events, op, op_role)
        if start is None:
            return False, f"{op_role} never recorded {op}"
        failed, last = _first_failed_after(events, role, room, start["seq"])
        if failed is None:
            return False, f"{role} room {room} never became Failed after {op} (last: {last})", _last_poll(events, role,
                                                                                                      room)
        latency = seen_at(failed) - start["t"]
        reason = failed["value"].get("failure_reason") or ""
        if latency > high_s or not reason:
            said = f"only {latency:.1f} s after {op} (allowed up to {high_s:g} s)" if latency > high_s else \
                "without a failure reason"
            return False, f"{role} room {room} Failed {said}", failed["seq"]
        return True, f"{role} room {room} Failed {latency:.1f} s after {op}: {reason!r}", failed["seq"]

    return fn
