"""transfer-never-completes: the engine accepts a write and never completes it.

The roles run with ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT`` = 4 s (and
Mooncake's engine with ``MC_TRANSFER_TIMEOUT`` = 6 s).  After room ``stuck`` is
registered, the prefill's engine is told to accept transfers and never complete
them (harness.role.faults: a posted transfer that stays in progress; Mooncake's
synchronous call returns -1 at its own transfer timeout, as the real engine does
with a batch that does not finish); the room's chunks are sent.  Both
sides must mark the room Failed within the waiting timeout plus 5 s of the first
chunk, the decode with a reason (R-TIMEOUT-3, R-TIMEOUT-2; a prefill that fails it
on the decode's ABORT may carry no reason of its own: R-REASON-1, SHOULD).  The engine is then healthy
again and a new room on the same pair must complete: the stuck write may not hold
the transfer worker (R-TIMEOUT-3, R-LIVE-2); each side of it gets 15 s.
"""

from __future__ import annotations

from dataclasses import replace

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, EngineFaults, StartRoles
from scenarios._flows import (
    LAYOUT,
    RoomAllocator,
    full_room,
    open_and_request,
    pair_healthy,
    room_succeeds,
    send_all,
    verify,
)

TIMEOUT_S = 4
SLACK_S = 5.0
ENGINE_TIMEOUT_S = 6  # Mooncake's own limit for a synchronous batch (MC_TRANSFER_TIMEOUT); others ignore it
ENV = (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(TIMEOUT_S)), ("MC_TRANSFER_TIMEOUT", str(ENGINE_TIMEOUT_S)))


def _plan(seed: int):
    planner = RoomAllocator(seed)
    stuck, after = planner.room(4, chunks=2), planner.room()
    # The next room takes the stuck room's path: on DP engines (room mod DP, R-DP-1) the same
    # engine for any DP size dividing 12; another engine would dodge the stuck worker.
    return stuck, replace(after, room=after.room - (after.room - stuck.room) % 12 or after.room + 12)


def steps(seed: int):
    stuck, after = _plan(seed)
    bound = TIMEOUT_S + SLACK_S + 2
    return [
        StartRoles(layout=LAYOUT, env=ENV),
        *open_and_request(stuck),
        EngineFaults("prefill", never_complete=True),
        *send_all(stuck),
        AwaitStatus(stuck.room, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=bound),
        AwaitStatus(stuck.room, "prefill", (KVPoll.Failed, KVPoll.Success), timeout_s=bound),
        EngineFaults("prefill"),  # healthy again: only the stuck writes stay stuck
        *full_room(after),
        verify([after], unchecked_kv=stuck.dst, unchecked_aux=(stuck.aux_dst,)),
    ]


def checks(seed: int):
    stuck, after = _plan(seed)
    window = (0, TIMEOUT_S + SLACK_S)
    return [
        c.Check("decode-failed-in-bound", "R-TIMEOUT-3",
                c.failed_within(stuck.room, "decode", "send_chunk", "prefill", *window)),
        # the prefill may learn it from the decode's ABORT: its reason is R-REASON-1's business
        c.Check("prefill-failed-in-bound", "R-TIMEOUT-3",
                c.failed_within(stuck.room, "prefill", "send_chunk", "prefill", *window, need_reason=False)),
        c.Check("prefill-reason", "R-REASON-1",
                c.failed_within(stuck.room, "prefill", "send_chunk", "prefill", 0, 1e9)),
        *room_succeeds(after, "R-TIMEOUT-3", "next-room-served"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="transfer-never-completes",
        title="A write the engine never completes fails its room on both sides in bounded time; the next room is served",
        steps=steps,
        checks=checks,
        timeout_s=180.0,
        timeout_wait_s=TIMEOUT_S,
    )
)
