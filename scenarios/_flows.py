"""Building blocks shared by scenarios: room plans and the step runs that open,
finish and verify rooms.  Registers no scenario."""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.rooms import (ANY_STATUS, DONE, LATE_SETTLE_S, LAYOUT, RoomAllocator, RoomPlan, await_done,
                                full_room, open_and_request, reused_room, send_all, verify)


def room_succeeds(p: RoomPlan, requirement: str, name: str) -> list[c.Check]:
    """Both sides of ``p`` reached Success."""
    return [c.Check(f"{name}-prefill-success", requirement, c.reached_status(p.room, p.prefill, KVPoll.Success)),
            c.Check(f"{name}-decode-success", requirement, c.reached_status(p.room, p.decode, KVPoll.Success))]


def aborted_rooms_fail(rooms: dict[str, RoomPlan], prompt_s: float) -> list[c.Check]:
    """Each room of ``rooms`` (name -> plan), aborted by the decode's scheduler: Failed on the
    decode, and on the prefill within ``prompt_s`` seconds of the abort (R-ABORT-1)."""
    out = []
    for name, p in rooms.items():
        out += [c.Check(f"{name}-decode-failed", "R-ABORT-1", c.reached_status(p.room, p.decode, KVPoll.Failed)),
                c.Check(f"{name}-prefill-failed-promptly", "R-ABORT-1",
                        c.failed_within(p.room, p.prefill, "abort", p.decode, 0, prompt_s, need_reason=False))]
    return out


def pair_healthy(bytes_exact: bool = True) -> list[c.Check]:
    """The checks closing most scenarios: the decode's pools byte-exact (R-LAYOUT-1),
    every role and loop alive at the end and no thread dead (R-LIVE-2)."""
    return ([c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact())] if bytes_exact else []) + [
        c.Check("loops-alive", "R-LIVE-2", c.loops_alive()),
        c.Check("no-dead-thread", "R-LIVE-2", c.no_dead_threads()),
    ]


__all__ = ["aborted_rooms_fail", "pair_healthy", "LAYOUT", "DONE", "ANY_STATUS", "LATE_SETTLE_S", "RoomPlan", "RoomAllocator", "reused_room",
           "open_and_request", "send_all", "await_done", "full_room", "verify", "room_succeeds"]
