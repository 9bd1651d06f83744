"""Generic post-conditions: checks the judge adds to every scenario's own.

Some requirements hold in every cell, whatever the scenario sets out to show, so no
scenario has to remember them (a scenario that forgets one lets a broken backend pass):

* ``every-trail-terminal`` (R-TERM-1): over every recorded poll of every room on every
  role (each wait's whole trail of statuses, not only the status it ended on), once a room
  was seen Success or Failed every later read in that lifecycle says the same; a lifecycle
  ends at ``clear`` of the room on that role, or when the role was started again;
* ``every-failure-has-reason`` (R-REASON-1): every read that saw Failed, on any role and
  any decode rank, came with a failure reason;
* ``no-dead-thread`` (R-LIVE-2): no thread of any role died (only when the scenario does
  not already judge it under that name).

A scenario opts out of one only with a stated reason (harness.spec.scenario.Scenario
``opt_out``, in the scenario's source; no scenario opts out today).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.history import Event, Op
from harness.spec.protocol import KVPoll, kvpoll_name

TERMINAL = (kvpoll_name(KVPoll.Success), kvpoll_name(KVPoll.Failed))
# a role's lifecycle starts again (its rooms are new) when it is started or restarted
_RESTARTS = (Op.START_PREFILL, Op.START_DECODE, Op.RESTART)


def trails(events: list[dict]) -> dict[tuple[str, int], list[list[str]]]:
    """Each ``(role, room)``'s lifecycles, in order, each the statuses read in it (KVPoll
    names, consecutive repeats kept once) from every AwaitStatus that completed."""
    out: dict[tuple[str, int], list[list[str]]] = {}
    for e in events:
        if e["type"] not in (Event.OK, Event.FAIL, Event.NEMESIS):  # a restart is a nemesis event
            continue
        role, room = e.get("role"), (e.get("args") or {}).get("room")
        if e["op"] in _RESTARTS:
            for key, lives in out.items():
                if key[0] == role and lives[-1]:
                    lives.append([])
        elif e["op"] == Op.CLEAR and e["type"] == Event.OK and room is not None:
            lives = out.get((role, room))
            if lives and lives[-1]:
                lives.append([])
        elif e["op"] == Op.AWAIT_STATUS and e["type"] == Event.OK and room is not None:
            life = out.setdefault((role, room), [[]])[-1]
            for status in (e.get("value") or {}).get("trail") or []:
                if not life or life[-1] != status:
                    life.append(status)
    return out


def every_trail_terminal(events: list[dict]) -> tuple[bool, str]:
    """R-TERM-1 over every read of every room: see the module docstring."""
    flips, rooms = [], trails(events)
    for (role, room), lives in rooms.items():
        for life in lives:
            first = next((i for i, s in enumerate(life) if s in TERMINAL), None)
            if first is not None and len(life) > first + 1:
                flips.append(f"{role} room {room}: {' -> '.join(life[first:])}")
    if flips:
        return False, "a terminal status changed between reads: " + "; ".join(flips[:3])
    return True, f"every terminal status held on every later read ({len(rooms)} room(s) on their roles)"


def every_failure_has_reason(events: list[dict]) -> tuple[bool, str]:
    """R-REASON-1 on every role and decode rank: each wait that ended Failed has a reason."""
    missing, failed = [], 0
    for e in events:
        if e["op"] != Op.AWAIT_STATUS or e["type"] != Event.OK:
            continue
        value = e.get("value") or {}
        if value.get("status") != KVPoll.Failed:
            continue
        failed += 1
        if value.get("failure_reason_error"):
            missing.append(f"{e.get('role')} room {e['args'].get('room')} (its reason could not be read: "
                           f"{value['failure_reason_error'][:120]})")
        elif not (value.get("failure_reason") or "").strip():
            missing.append(f"{e.get('role')} room {e['args'].get('room')}")
    if missing:
        return False, f"Failed without a failure reason: {', '.join(dict.fromkeys(missing))}"
    return True, f"all {failed} Failed read(s) came with a reason"


GENERIC = (
    ("every-trail-terminal", "R-TERM-1", lambda: every_trail_terminal),
    ("every-failure-has-reason", "R-REASON-1", lambda: every_failure_has_reason),
    ("no-dead-thread", "R-LIVE-2", c.no_dead_threads),
)


def checks_of(scenario, seed: int) -> list[c.Check]:
    """``scenario``'s own checks for ``seed``, then each generic post-condition it neither
    declares (by name) nor opts out of."""
    own = list(scenario.checks(seed))
    names = {check.name for check in own}
    skip = dict(scenario.opt_out)
    return own + [c.Check(name, requirement, make()) for name, requirement, make in GENERIC
                  if name not in names and name not in skip]
