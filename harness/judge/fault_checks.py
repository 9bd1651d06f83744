"""Checks of a room's end after an injected fault (a kill, a network partition, a lossy
link): pure functions of a cell's history, as harness.judge.checks's are."""

from __future__ import annotations

import math
import re

from harness.judge.checks import (Checker, _first_failed_after, _last_poll, first_event, pools_exact, seen_at,
                                  timing_bound)
from harness.spec.history import Event, Op, completions, fact
from harness.spec.protocol import KVPoll, kvpoll_name


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

    return timing_bound(fn)


def failed_after_kill(room: int, decode: str, dead: str, slack_s: float, op: str = Op.KILL) -> Checker:
    """``room`` on ``decode`` became Failed within the decode's heartbeat window plus
    ``slack_s`` seconds of ``dead``'s first nemesis ``op`` (its kill, or a network fault
    recorded under its name), with a reason naming ``dead``'s bootstrap address (R-HB-1)."""

    def fn(events: list[dict]) -> tuple[bool, str]:
        fault = next((e for e in events if e["type"] == Event.NEMESIS and e["op"] == op and e["role"] == dead
                      and not (e.get("args") or {}).get("heal")), None)  # a heal is no fault
        if fault is None:
            return False, f"{dead} never had {op}"
        window = fact(events, decode, "heartbeat_window_s")
        if isinstance(window, bool) or not isinstance(window, (int, float)) or not math.isfinite(window):
            window = None  # not a number of seconds: as if none was reported
        addr = fact(events, dead, "bootstrap_addr")
        failed, last = _first_failed_after(events, decode, room, fault["seq"])
        if failed is None:
            return False, f"{decode} room {room} did not become Failed after {dead}'s {op} (last: {last})", \
                _last_poll(events, decode, room)
        latency = seen_at(failed) - fault["t"]
        reason = failed["value"].get("failure_reason") or ""
        bound = (window or 0) + slack_s
        problems = []
        if window is None:
            problems.append(f"{decode} reported no heartbeat window")
        elif latency > bound:
            problems.append(f"took {latency:.1f} s, more than heartbeat window {window:.1f} s + {slack_s:.0f} s")
        if not addr or not names(reason, str(addr)):
            problems.append(f"reason {reason!r} does not name {dead} ({addr})")
        if problems:
            return False, f"{decode} room {room}: " + "; ".join(problems), failed["seq"]
        return True, f"{decode} room {room} Failed {latency:.1f} s after {dead}'s {op} (window {window:.1f} s): " \
            f"{reason!r}", failed["seq"]

    return timing_bound(fn)


def exact_or_failed(room: int, decode: str, which: int) -> Checker:
    """R-XFER-2 under a fault: the last poll of ``room`` on ``decode`` saw Success and the ``which``-th pool
    verification (the one for this room alone) found its bytes exact, or it saw Failed with
    a failure reason; anything else (Success with a wrong byte, no terminal status, Failed
    without a reason) fails it."""
    exact = pools_exact(decode, which)

    def fn(events: list[dict]):
        polls = [e for e in completions(events, op=Op.AWAIT_STATUS, role=decode, room=room) if e["type"] == Event.OK]
        if not polls:
            return False, f"{decode} room {room} was never polled"
        # the first terminal status judges the room: a Success read once had to have its bytes,
        # whatever a later read says (R-TERM-1 judges the flip)
        first = next((e for e in polls if e["value"]["status"] in (KVPoll.Success, KVPoll.Failed)), polls[-1])
        status, reason = first["value"]["status"], first["value"].get("failure_reason")
        if status == KVPoll.Failed:
            visible = isinstance(reason, str) and reason.strip()
            return (True, f"{decode} room {room} Failed visibly: {reason!r}", first["seq"]) if visible else \
                (False, f"{decode} room {room} Failed without a failure reason ({reason!r})", first["seq"])
        if status != KVPoll.Success:
            return False, f"{decode} room {room} never concluded (last status {status})", first["seq"]
        ok, said, *at = exact(events)
        return (ok, f"{decode} room {room} reached Success; {said}", *at)

    return fn


def names(reason: str, addr: str) -> bool:
    """Whether failure ``reason`` names ``addr`` (host:port) as a whole: not as the start of a
    longer port or address (``10.0.0.1:80`` is not named by ``10.0.0.1:8080``)."""
    return re.search(rf"(?<![\w.:]){re.escape(addr)}(?![\w.])", reason) is not None


def concluded_within(room: int, role: str, since_op: str, since_role: str, high_s: float) -> Checker:
    """R-LOSS-1: ``room`` on ``role`` was first seen terminal (Success or Failed) at most
    ``high_s`` seconds after ``since_role``'s first ``since_op`` for the room, and a Failed read
    carried a reason.  Whether a Success had its bytes is :func:`exact_or_failed`'s."""

    def fn(events: list[dict]):
        start = first_event(events, since_op, since_role, room)
        if start is None:
            return False, f"{since_role} never completed {since_op} for room {room}"
        polls = [e for e in completions(events, op=Op.AWAIT_STATUS, role=role, room=room)
                 if e["type"] == Event.OK and e["seq"] > start["seq"]]
        ended = next((e for e in polls if e["value"]["status"] in (KVPoll.Success, KVPoll.Failed)), None)
        if ended is None:
            last = kvpoll_name(polls[-1]["value"]["status"]) if polls else "never polled"
            return False, f"{role} room {room} never concluded (last: {last})", _last_poll(events, role, room)
        latency, value = seen_at(ended) - start["t"], ended["value"]
        said = f"{role} room {room} {kvpoll_name(value['status'])} {latency:.1f} s after {since_op}"
        if latency > high_s:
            return False, f"{said}: later than the {high_s:g} s allowed", ended["seq"]
        if value["status"] == KVPoll.Failed and not (value.get("failure_reason") or "").strip():
            return False, f"{said}, without a failure reason", ended["seq"]
        return True, said + (f": {value.get('failure_reason')!r}" if value["status"] == KVPoll.Failed else ""), \
            ended["seq"]

    return timing_bound(fn)


def all_rooms_reached(rooms: tuple[int, ...], roles: tuple[str, ...], statuses: tuple[int, ...]) -> Checker:
    """The last poll of each of ``rooms`` on each of ``roles`` saw one of ``statuses``: many rooms
    judged as one check, each room that did not named (R-LOAD-1; reasons are R-REASON-1's)."""

    def fn(events: list[dict]):
        last: dict[tuple[str, int], dict] = {}
        for e in completions(events, op=Op.AWAIT_STATUS):
            if e["role"] in roles and (e.get("args") or {}).get("room") in rooms:
                last[(e["role"], e["args"]["room"])] = e
        wrong = []
        for role in roles:
            for room in rooms:
                e = last.get((role, room))
                status = ((e or {}).get("value") or {}).get("status") if e and e["type"] == Event.OK else None
                if status not in statuses:
                    wrong.append(f"{role} room {room}: {kvpoll_name(status) if e else 'never polled'}")
        if wrong:
            return False, f"{len(wrong)} of {len(rooms) * len(roles)} room ends not as due: " + "; ".join(wrong[:6])
        return True, f"all {len(rooms)} room(s) ended {'/'.join(kvpoll_name(s) for s in statuses)} on " \
            f"{', '.join(roles)}"

    return fn


#: the driver's own pushes into a role's control sockets: what they deliver need not be whole
_INJECTIONS = (Op.INJECT, Op.INJECT_ABORT, Op.INJECT_CAPTURED)


def messages_whole(uninjected: bool = False) -> Checker:
    """R-LOAD-1: every message each role's control sockets received was one whole message
    (harness.role.message_loss.whole: no frames of two messages interleaved), by the roles'
    receive audits recorded at the end of the cell; no audit at all is "cannot tell".
    ``uninjected`` (the generic post-condition, for any cell): a role the cell pushed frames
    into (InjectFrames, an injected or replayed message) is not judged, since the cell's own
    frames may be malformed on purpose; the messages its peers sent are all it can judge."""

    def fn(events: list[dict]):
        injected = {str(e.get("role") or "").split(".")[0] for e in events if e["op"] in _INJECTIONS} if uninjected \
            else set()
        audits = {e["role"]: e.get("value") or {} for e in events if e["op"] == Op.MESSAGE_AUDIT
                  and str(e["role"]).split(".")[0] not in injected}
        if not audits:  # the generic check has nothing to judge in a cell without audits (a selftest)
            return (True if uninjected else None), ("no role's receive audit was recorded" if not injected else
                                                    "only roles the cell pushed frames into were audited")
        broken = {role: a for role, a in audits.items() if a.get("not_whole")}
        if broken:
            return False, "; ".join(f"{role} received {a['not_whole']} of {a.get('received')} messages not whole, e.g. "
                                    f"{(a.get('examples') or ['?'])[0]}" for role, a in sorted(broken.items()))
        return True, f"all {sum(a.get('received', 0) for a in audits.values())} received messages whole in " \
            f"{len(audits)} role(s)"

    return fn
