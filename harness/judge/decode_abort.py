"""R-ABORT-1's decode half in every cell: a room the decode's scheduler aborted reads Failed there.

The decode scheduler calls ``abort()`` on a request it gives up (its client went away, a
timeout) and frees the request's pages right after; a receiver that later reports Success (the
prefill, never told, finished the transfer) or keeps waiting would hand the scheduler a request
it no longer holds.  So from the decode's ``abort()`` of a room that had not read Success on a
rank, every later read of that room on that rank, until the room is cleared there or the role
restarts, is Failed (a rank that had read Success keeps it: R-TERM-1).  This holds whether or
not the ABORT message ever reaches the prefill (R-LOSS-1: a lost ABORT may not keep the decode
room alive).
"""

from __future__ import annotations

from harness.spec.history import Event, Op, rank_reads
from harness.spec.protocol import KVPoll, kvpoll_name

_ENDS = (Op.CLEAR, Op.RESTART, Op.START_DECODE)  # a lifecycle of the room on that role ends


def _reads(e: dict) -> dict[str, list[int]]:
    """Each rank's statuses in a completed AwaitStatus: its trail (names) turned back into KVPoll
    values, and the status it ended on."""
    out = {}
    for name, r in rank_reads(e).items():
        trail = [KVPoll[s] for s in r.get("trail") or () if s in KVPoll.__members__]
        out[name] = trail + ([r["status"]] if isinstance(r.get("status"), int) else [])
    return out


def decode_abort_fails_room(events: list[dict]) -> tuple[bool, str, int | None]:
    """See the module docstring: each decode ``abort()`` (a completed ``abort`` call on a decode
    role) of a room, then every later read of that room on that role's ranks."""
    succeeded: dict[tuple[str, int], bool] = {}  # (rank, room) -> read Success in this lifecycle
    aborted: dict[tuple[str, int], int] = {}  # (role, room) -> seq of its abort() in this lifecycle
    wrong, judged, at = [], 0, None
    for e in events:
        role, room = str(e.get("role") or ""), (e.get("args") or {}).get("room")
        if not role.startswith("decode") or e["type"] not in (Event.OK, Event.NEMESIS):
            continue
        if e["op"] in _ENDS:
            ended = [key for key in (*aborted, *succeeded) if key[0].split(".")[0] == role.split(".")[0]
                     and (room is None or key[1] == room)]
            for key in ended:
                aborted.pop(key, None)
                succeeded.pop(key, None)
        elif e["op"] == Op.ABORT and isinstance(room, int):
            aborted.setdefault((role, room), e["seq"])
        elif e["op"] == Op.AWAIT_STATUS and isinstance(room, int):
            for rank, statuses in _reads(e).items():
                if (role, room) in aborted and not succeeded.get((rank, room)):
                    judged += 1
                    off = [s for s in statuses if s != KVPoll.Failed]
                    if off:
                        wrong.append(f"{rank} room {room} read {kvpoll_name(off[-1])} after the decode's abort()")
                        at = e["seq"] if at is None else at
                if KVPoll.Success in statuses:
                    succeeded[(rank, room)] = True
    if wrong:
        return False, "a room the decode aborted did not read Failed there: " + "; ".join(dict.fromkeys(wrong[:4])), at
    return True, f"all {judged} read(s) of rooms after the decode's abort() were Failed", None
