"""abort-mid-transfer: the decode aborts while the room's writes are in flight.

Every prefill transfer is delayed 1 s by the engine fault layer, so the first
chunk's write is still in flight when the decode's scheduler aborts the room
(``receiver.abort()``, which sends the implementation's own ABORT).  The prefill
room must become Failed within 2 s (R-ABORT-1) and stay Failed, as must the
decode's (R-TERM-1).  The prefill's scheduler then sends the rest of the
request (the remaining chunks and the aux slot), as a scheduler racing the
abort would: none of it may land, so after the in-flight write has drained every
decode page except the first chunk's, and the aux slot, are checked untouched
(R-STALE-1).  A new room on the same pair then completes (R-LIVE-2, R-XFER-1).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import Abort, AwaitStatus, EngineFaults, InitSender, SendChunk, Sleep, StartRoles
from scenarios._flows import LAYOUT, RoomAllocator, full_room, open_and_request, pair_healthy, room_succeeds, verify

DELAY_S = 1.0
PROMPT_S = 2.0


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(6, chunks=3), planner.room()


def steps(seed: int):
    room, after = _plan(seed)
    first, *rest = room.chunks
    return [
        StartRoles(layout=LAYOUT),
        *open_and_request(room),
        EngineFaults("prefill", delay_s=DELAY_S),
        InitSender(room.room, len(room.src), room.aux_src),
        SendChunk(room.room, first),
        AwaitStatus(room.room, "prefill", (KVPoll.Transferring, KVPoll.Success, KVPoll.Failed),
                    timeout_s=2.0, must_come=False),
        Sleep(0.2),  # the first write is in the engine now
        Abort(room.room, "decode"),
        # the decode's own abort is read at once, so a later flip of it shows (R-TERM-1)
        AwaitStatus(room.room, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=PROMPT_S, must_come=False),
        AwaitStatus(room.room, "prefill", (KVPoll.Failed, KVPoll.Success), timeout_s=PROMPT_S + 3, must_come=False),
        *[SendChunk(room.room, chunk) for chunk in rest],
        Sleep(DELAY_S * 3),  # whatever was in flight drains
        AwaitStatus(room.room, "prefill", (KVPoll.Failed,), timeout_s=0.0, must_come=False),
        AwaitStatus(room.room, "decode", (KVPoll.Failed,), timeout_s=2.0, must_come=False),
        EngineFaults("prefill"),  # no more delays
        *full_room(after),
        verify([after], unchecked_kv=room.dst[:len(first)]),
    ]


def checks(seed: int):
    room, after = _plan(seed)
    return [
        c.Check("prefill-failed-promptly", "R-ABORT-1",
                c.failed_within(room.room, "prefill", "abort", "decode", 0, PROMPT_S,
                                need_reason=False)),
        c.Check("reason-names-abort", "R-REASON-1",
                c.failed_within(room.room, "prefill", "abort", "decode", 0, 1e9, ("abort",))),
        c.Check("decode-failed", "R-ABORT-1", c.reached_status(room.room, "decode", KVPoll.Failed)),
        c.Check("stays-failed", "R-TERM-1", c.stays_terminal(room.room, ("prefill", "decode"))),
        c.Check("no-write-after-abort", "R-STALE-1", c.pools_exact()),
        *room_succeeds(after, "R-XFER-1", "room-after-abort"),
        *pair_healthy(bytes_exact=False),
    ]


SCENARIO = register(
    Scenario(
        id="abort-mid-transfer",
        title="ABORT while writes are in flight: Failed within 2 s, stays Failed, nothing sent afterwards lands",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
        topologies=(("p1-d1",), "its abort lands while delayed writes are in flight, timed for one transfer per chunk; head-sliced TP writes are several, so the delays reach the next room"),
    )
)
