"""room-reuse: a bootstrap room number is reused after Success and clear().

Lifecycle 1 of room R completes and is cleared on both sides.  Lifecycle 2 opens
the same room number with other destination pages.  Its first polls must not
show the old Success (R-REUSE-1).  While it waits for its KV, the decode
receives a late Success status of lifecycle 1 (built by the decode's own
implementation in the form its prefill sends, naming lifecycle 1 where the wire
names lifecycles at all); lifecycle 2 must ignore it and still be
WaitingForInput (R-REUSE-1).  Lifecycle 2 then completes, and both lifecycles'
pages hold their own bytes (R-XFER-1, R-LAYOUT-1).
"""

from __future__ import annotations

from dataclasses import replace

from harness import checks as c
from harness.adapter import FAILED, SUCCESS, WAITING_FOR_INPUT
from harness.scenario import Scenario, register
from harness.steps import AwaitStatus, Clear, InjectStatus, Sleep, StartRoles
from scenarios._flows import LAYOUT, Planner, await_done, full_room, open_and_request, send_all, verify, pair_healthy

LATE_SETTLE_S = 0.5


def _plan(seed: int):
    planner = Planner(seed)
    first = planner.room()
    second = replace(planner.room(), room=first.room)
    return first, second


def steps(seed: int):
    first, second = _plan(seed)
    return [
        StartRoles(layout=LAYOUT),
        *full_room(first),
        Clear(first.room, "prefill"),
        Clear(first.room, "decode"),
        *open_and_request(second),  # prefill poll #2
        AwaitStatus(second.room, "decode", (WAITING_FOR_INPUT, SUCCESS, FAILED), timeout_s=5.0),  # decode poll #1
        InjectStatus(second.room, SUCCESS),
        Sleep(LATE_SETTLE_S),
        AwaitStatus(second.room, "decode", (SUCCESS, FAILED), timeout_s=0.0),  # decode poll #2
        *send_all(second),
        *await_done(second),
        verify([first, second]),
    ]


def checks(seed: int):
    first, second = _plan(seed)
    return [
        c.Check("first-lifecycle-succeeds", "R-XFER-1", "MUST", c.nth_status(first.room, "decode", 0, (SUCCESS,))),
        c.Check("prefill-starts-fresh", "R-REUSE-1", "MUST",
                c.nth_status(second.room, "prefill", 2, (WAITING_FOR_INPUT,))),
        c.Check("decode-starts-fresh", "R-REUSE-1", "MUST",
                c.nth_status(second.room, "decode", 1, (WAITING_FOR_INPUT,))),
        c.Check("late-success-ignored", "R-REUSE-1", "MUST",
                c.nth_status(second.room, "decode", 2, (WAITING_FOR_INPUT,))),
        c.Check("second-lifecycle-prefill-success", "R-REUSE-1", "MUST",
                c.reached_status(second.room, "prefill", SUCCESS)),
        c.Check("second-lifecycle-decode-success", "R-REUSE-1", "MUST",
                c.reached_status(second.room, "decode", SUCCESS)),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="room-reuse",
        title="A room number reused after Success and clear starts fresh; a late Success of the old lifecycle is ignored",
        requirements=("R-REUSE-1", "R-XFER-1", "R-LAYOUT-1", "R-LIVE-2"),
        steps=steps,
        checks=checks,
        timeout_s=150.0,
    )
)
