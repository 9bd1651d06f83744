"""waiting-timeout: a receiver that sent its metadata but never sees the transfer
fails after the waiting timeout, with a reason; the pair then serves a new room.

Two scenarios, one per setting of ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``:
``waiting-timeout`` at 3 s and ``waiting-timeout-2s`` at 2 s, so a timer that ignores the
knob or scales it wrongly shows in one of them.  Room ``stalled`` is opened, and its
destination pages are sent GAP_S later (a clock started at the receiver's creation shows);
the prefill never sends a chunk, and the decode's status is first read GAP_S after the
pages were sent (a clock started at the first poll shows).  The decode must mark it Failed
no earlier than the timeout after the pages were requested and no later than 20 % plus 1 s
after it (issue 36, 1a), with a reason naming the timeout (R-TIMEOUT-2, R-REASON-1); a room
opened afterwards completes on both sides with exact bytes, and the stalled
room's pages stay untouched (R-XFER-1, R-LAYOUT-1).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, OpenRoom, RequestKV, Sleep, StartRoles
from scenarios._flows import LAYOUT, RoomAllocator, full_room, pair_healthy, room_succeeds, verify
from scenarios.bootstrap_timeout import GAP_S, window

TIMEOUT_S = 3


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(), planner.room()


def steps(seed: int, timeout_s: float = TIMEOUT_S):
    stalled, later = _plan(seed)
    return [
        StartRoles(layout=LAYOUT, env=(("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", f"{timeout_s:g}"),)),
        OpenRoom(stalled.room),
        Sleep(GAP_S),
        RequestKV(stalled.room, stalled.dst, stalled.aux_dst),
        Sleep(GAP_S),
        AwaitStatus(stalled.room, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=window(timeout_s)[1] + 5),
        *full_room(later),
        verify([later]),  # the stalled room's pages are checked untouched with the rest
    ]


def checks(seed: int, timeout_s: float = TIMEOUT_S):
    stalled, later = _plan(seed)
    return [
        c.Check("stalled-receiver-failed", "R-TIMEOUT-2",
                c.failed_within(stalled.room, "decode", "request_kv", "decode", *window(timeout_s))),
        c.Check("reason-names-timeout", "R-REASON-1",
                c.failed_within(stalled.room, "decode", "request_kv", "decode", 0, 1e9, ("timeout", "timed out"))),
        *room_succeeds(later, "R-XFER-1", "later-room"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="waiting-timeout",
        title="A receiver whose prefill never sends fails after the waiting timeout; a later room completes",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
        timeout_wait_s=TIMEOUT_S,
    )
)
SHORT = register(
    Scenario(
        id="waiting-timeout-2s",
        title="waiting-timeout at a second setting (2 s): the deadline follows the knob",
        steps=lambda seed: steps(seed, 2),
        checks=lambda seed: checks(seed, 2),
        timeout_s=150.0,
        timeout_wait_s=2,
    )
)
