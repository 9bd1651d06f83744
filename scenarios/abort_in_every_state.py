"""abort-in-every-state: the decode aborts bound rooms at two points of their lifecycle, on
every deployment shape.

The abort scenarios with delayed writes (abort-mid-transfer, abort-ack-after-drain,
clear-then-abort) run on one prefill rank and one decode rank only: their delays are timed
for one transfer per chunk.  Here no engine fault is set, so nothing depends on how many
transfers a chunk becomes, and the scenario runs on every shape, where a room has several
decode ranks, prefill TP ranks, PP stages or DP engines:

* Room ``bound``: registered and bound (the prefill WaitingForInput), nothing sent; the
  decode's scheduler aborts it.
* Room ``half``: the first of its two chunks sent and given time to land; then aborted.

Both must read Failed on the decode, and on the prefill within 2 s of the abort
(R-ABORT-1).  With deferred KV release (sglang's default, and the reference's) every decode
rank that sent an ABORT is owed its ABORT_ACK, which the generic every-abort-answered judges
rank by rank (R-ABORT-2).  A new room then completes with every byte in place.
"""

from __future__ import annotations

from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import Abort, AwaitStatus, InitSender, SendChunk, Sleep, StartRoles
from scenarios._flows import (LAYOUT, RoomAllocator, aborted_rooms_fail, full_room, open_and_request, pair_healthy,
                              room_succeeds, verify)

PROMPT_S = 2.0  # an ABORT fails the prefill's room within this (R-ABORT-1)
LAND_S = 0.5  # the first chunk's writes complete on an idle pair well within this


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(2, chunks=1), planner.room(4, chunks=2), planner.room()


def _aborted(room) -> list:
    return [
        Abort(room.room, "decode"),
        AwaitStatus(room.room, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=PROMPT_S, must_come=False),
        AwaitStatus(room.room, "prefill", (KVPoll.Failed, KVPoll.Success), timeout_s=PROMPT_S + 3, must_come=False),
    ]


def steps(seed: int):
    bound, half, after = _plan(seed)
    return [
        StartRoles(layout=LAYOUT),
        *open_and_request(bound),
        *_aborted(bound),
        *open_and_request(half),
        InitSender(half.room, len(half.src), half.aux_src),
        SendChunk(half.room, half.chunks[0]),
        Sleep(LAND_S),
        *_aborted(half),
        *full_room(after),
        verify([after], unchecked_kv=bound.dst + half.dst, unchecked_aux=(bound.aux_dst, half.aux_dst)),
    ]


def checks(seed: int):
    bound, half, after = _plan(seed)
    return [*aborted_rooms_fail({"bound": bound, "half": half}, PROMPT_S), *room_succeeds(after, "R-ABORT-1", "room-after-aborts"), *pair_healthy()]


SCENARIO = register(
    Scenario(
        id="abort-in-every-state",
        title="ABORT of a bound room and of a half-sent one, on every shape: Failed on both sides, "
              "every decode rank answered",
        steps=steps,
        checks=checks,
        timeout_s=120.0,
    )
)
