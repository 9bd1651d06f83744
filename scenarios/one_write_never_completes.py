"""one-write-never-completes: the room's first KV write never completes, while every write
issued after it does.

transfer-never-completes stops the engine as a whole; a backend that watches only the last
handle of a room (or takes a later write's completion for the earlier ones': completions in
issue order) still fails that room, since no write completes.  Here only the first transfer
is held (EngineFaults ``slow_nth=1``, ``SLOW_S`` far beyond the timeouts): the other chunks
and the aux complete at once where the engine runs writes concurrently (the reference's
writes, NIXL's posted handles, the Mori stand-in's queue; Mooncake's synchronous batch call
makes its worker wait instead).  The roles run with ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``
= 4 s.

Both sides must end the room Failed, never Success, within the waiting timeout plus 5 s of
the first chunk (R-TIMEOUT-3: a write not complete within the transfer timeout fails its
room, whichever writes completed after it; R-XFER-2: Success needs every byte).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, EngineFaults, StartRoles
from scenarios._flows import LAYOUT, RoomAllocator, open_and_request, pair_healthy, send_all

TIMEOUT_S = 4
SLACK_S = 5.0
SLOW_S = 40.0  # the held write completes long after the cell has judged the room
# Mooncake's engine fails a batch at MC_TRANSFER_TIMEOUT (backends/mooncake/adapter.py): past the cell's
# bound, so the held write is held, not failed, while the room is judged
ENV = (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(TIMEOUT_S)), ("MC_TRANSFER_TIMEOUT", "20"))


def _room(seed: int):
    return RoomAllocator(seed).room(4, chunks=3)


def steps(seed: int):
    room = _room(seed)
    bound = TIMEOUT_S + SLACK_S + 2
    return [
        StartRoles(layout=LAYOUT, env=ENV),
        EngineFaults("prefill", slow_nth=1, slow_s=SLOW_S),
        *open_and_request(room),
        *send_all(room),
        AwaitStatus(room.room, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=bound),
        AwaitStatus(room.room, "prefill", (KVPoll.Failed, KVPoll.Success), timeout_s=bound),
    ]


def checks(seed: int):
    room = _room(seed)
    window = (0, TIMEOUT_S + SLACK_S)
    return [
        c.Check("decode-failed-in-bound", "R-TIMEOUT-3",
                c.failed_within(room.room, "decode", "send_chunk", "prefill", *window)),
        # the prefill may learn it from the decode's ABORT: its reason is R-REASON-1's business
        c.Check("prefill-failed-in-bound", "R-TIMEOUT-3",
                c.failed_within(room.room, "prefill", "send_chunk", "prefill", *window, need_reason=False)),
        *pair_healthy(bytes_exact=False),  # the held write may still land: no settled pools to judge
    ]


SCENARIO = register(
    Scenario(
        id="one-write-never-completes",
        title="One write never completes while the later ones do: the room fails on both sides in bounded time",
        steps=steps,
        checks=checks,
        timeout_s=120.0,
        timeout_wait_s=TIMEOUT_S,
    )
)
