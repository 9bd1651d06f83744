"""waiting-timeout: a receiver that sent its metadata but never sees the transfer
fails after the waiting timeout, with a reason; the pair then serves a new room.

The roles run with ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT`` = 3 s.  Room
``stalled`` is opened and its destination pages sent; the prefill never sends a
chunk.  The decode must mark it Failed no earlier than the timeout and within 5 s
after it, with a reason naming the timeout (R-TIMEOUT-2, R-REASON-1); a room
opened afterwards completes on both sides with exact bytes, and the stalled
room's pages stay untouched (R-XFER-1, R-LAYOUT-1).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, StartRoles
from scenarios._flows import LAYOUT, RoomAllocator, full_room, open_and_request, pair_healthy, room_succeeds, verify

TIMEOUT_S = 3
SLACK_S = 5.0
ENV = (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(TIMEOUT_S)),)


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(), planner.room()


def steps(seed: int):
    stalled, later = _plan(seed)
    return [
        StartRoles(layout=LAYOUT, env=ENV),
        *open_and_request(stalled),
        AwaitStatus(stalled.room, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=TIMEOUT_S + SLACK_S + 2),
        *full_room(later),
        verify([later]),  # the stalled room's pages are checked untouched with the rest
    ]


def checks(seed: int):
    stalled, later = _plan(seed)
    return [
        c.Check("stalled-receiver-failed", "R-TIMEOUT-2",
                c.failed_within(stalled.room, "decode", "request_kv", "decode", TIMEOUT_S, TIMEOUT_S + SLACK_S)),
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
