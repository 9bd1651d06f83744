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


def pair_healthy(bytes_exact: bool = True) -> list[c.Check]:
    """The checks closing most scenarios: the decode's pools byte-exact (R-LAYOUT-1),
    every role and loop alive at the end and no thread dead (R-LIVE-2)."""
    return ([c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact())] if bytes_exact else []) + [
        c.Check("loops-alive", "R-LIVE-2", c.loops_alive()),
        c.Check("no-dead-thread", "R-LIVE-2", c.no_dead_threads()),
    ]


__all__ = ["pair_healthy", "LAYOUT", "DONE", "ANY_STATUS", "LATE_SETTLE_S", "RoomPlan", "RoomAllocator", "reused_room",
           "open_and_request", "send_all", "await_done", "full_room", "verify", "room_succeeds"]
