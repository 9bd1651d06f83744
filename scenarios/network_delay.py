"""network-delay: a slow, lossy network between prefill and decode that TCP rides out.

Needs roles on two hosts (``run --hosts netns:2``; UNSUPPORTED otherwise).  Every packet
between the prefill's host and the decode's host, both ways, is delayed 150 +/- 50 ms,
2 % are lost, 2 % duplicated and 10 % reordered: far below what TCP gives up on and
below the decode's heartbeat window (R-HB-1).  Two rooms register through it; the decode's
heartbeat probes the prefill through it for two windows while they wait; then both
transfer (one in three chunks).  Nothing may fail: both rooms reach Success on both sides
with every byte in place (R-NET-2).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.scenario import Scenario, register
from harness.spec.steps import NetworkFault, Sleep, StartRoles
from scenarios._flows import LAYOUT, RoomAllocator, await_done, open_and_request, pair_healthy, room_succeeds, \
    send_all, verify
from scenarios.network_partition import NETWORK_CELL

BAD_LINK = NetworkFault("prefill", "decode", delay_ms=150, jitter_ms=50, loss_pct=2, duplicate_pct=2, reorder_pct=10)


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(6, chunks=3), planner.room(3)


def steps(seed: int):
    long, short = _plan(seed)
    return [
        StartRoles(layout=LAYOUT),
        BAD_LINK,
        *open_and_request(long),
        *open_and_request(short),
        Sleep(8.5),  # the heartbeat window twice over, probing through the bad link: no room may fail of it
        *send_all(long),
        *send_all(short),
        *await_done(long, timeout_s=20.0),
        *await_done(short, timeout_s=20.0),
        NetworkFault("prefill", "decode"),
        verify([long, short]),
    ]


def checks(seed: int):
    long, short = _plan(seed)
    return [
        c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
        *room_succeeds(long, "R-NET-2", "long-room"),
        *room_succeeds(short, "R-NET-2", "short-room"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="network-delay",
        title="Delay, jitter, loss, duplication and reordering between prefill and decode: every room still succeeds",
        steps=steps,
        checks=checks,
        **NETWORK_CELL,
        topologies=(("p1-d1",), "the bad link is between the one prefill host and the one decode host"),
    )
)
