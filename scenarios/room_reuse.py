"""room-reuse: a bootstrap room number is reused while its old lifecycle's writes
are still finishing; the new lifecycle starts fresh and ignores the old one.

Every prefill transfer is delayed 2 s.  Lifecycle 1 of room R registers and its
whole request is sent; while the writes are in flight the decode aborts R (as it
does when it gives up on a request) and both schedulers release R (``clear``).
Lifecycle 2 then opens the same room number with other destination pages.  Its
first polls must not show anything of lifecycle 1 (R-REUSE-1).  Then lifecycle
1's writes complete and the prefill concludes lifecycle 1 by its own code (its
late status, its ABORT_ACK): lifecycle 2 must still be WaitingForInput on both
sides afterwards (R-REUSE-1), and then complete with its own bytes while lifecycle
1's pages are left unjudged (R-XFER-1, R-LAYOUT-1).
"""

from __future__ import annotations

from dataclasses import replace

from harness import checks as c
from harness.adapter import FAILED, SUCCESS, TRANSFERRING, WAITING_FOR_INPUT
from harness.scenario import Scenario, register
from harness.steps import Abort, AwaitStatus, Clear, EngineFaults, OpenRoom, RequestKV, Sleep, StartRoles
from scenarios._flows import DONE, LAYOUT, Planner, await_done, open_and_request, pair_healthy, send_all, verify

LATE_S = 2.0
ANY = (WAITING_FOR_INPUT, SUCCESS, FAILED)  # stop at a stale terminal status too


def _plan(seed: int):
    planner = Planner(seed)
    first = planner.room()
    second = replace(planner.room(), room=first.room)
    return first, second


def steps(seed: int):
    first, second = _plan(seed)
    room = first.room
    return [
        StartRoles(layout=LAYOUT),
        *open_and_request(first),  # prefill poll 0
        EngineFaults("prefill", delay_s=LATE_S),
        *send_all(first),
        AwaitStatus(room, "prefill", (TRANSFERRING, SUCCESS, FAILED), timeout_s=2.0),  # prefill poll 1
        Abort(room, "decode"),
        AwaitStatus(room, "decode", DONE, timeout_s=5.0),  # decode poll 0
        Clear(room, "decode"),
        AwaitStatus(room, "prefill", DONE, timeout_s=5.0),  # prefill poll 2
        Clear(room, "prefill"),
        # lifecycle 2, while lifecycle 1's writes are still in the engine
        OpenRoom(room),
        RequestKV(room, second.dst, second.aux_dst),
        AwaitStatus(room, "prefill", ANY, timeout_s=5.0),  # prefill poll 3
        AwaitStatus(room, "decode", ANY, timeout_s=5.0),  # decode poll 1
        Sleep(LATE_S + 1.0),  # lifecycle 1's writes complete and the prefill concludes it
        AwaitStatus(room, "decode", (SUCCESS, FAILED), timeout_s=0.0),  # decode poll 2
        AwaitStatus(room, "prefill", (SUCCESS, FAILED), timeout_s=0.0),  # prefill poll 4
        EngineFaults("prefill"),
        *send_all(second),
        # lifecycle 1's writes (2 s each, one after another on an engine worker) may still
        # hold the worker the second lifecycle's writes queue behind: allow them to drain
        *await_done(second, timeout_s=15.0),
        verify([second], unchecked_kv=first.dst, unchecked_aux=(first.aux_dst,)),
    ]


def checks(seed: int):
    first, second = _plan(seed)
    room = first.room
    return [
        c.Check("first-lifecycle-aborted", "R-ABORT-1", "MUST", c.nth_status(room, "decode", 0, (FAILED,))),
        c.Check("prefill-starts-fresh", "R-REUSE-1", "MUST", c.nth_status(room, "prefill", 3, (WAITING_FOR_INPUT,))),
        c.Check("decode-starts-fresh", "R-REUSE-1", "MUST", c.nth_status(room, "decode", 1, (WAITING_FOR_INPUT,))),
        c.Check("decode-ignores-old-conclusion", "R-REUSE-1", "MUST",
                c.nth_status(room, "decode", 2, (WAITING_FOR_INPUT,))),
        c.Check("prefill-ignores-old-conclusion", "R-REUSE-1", "MUST",
                c.nth_status(room, "prefill", 4, (WAITING_FOR_INPUT,))),
        c.Check("second-lifecycle-prefill-success", "R-REUSE-1", "MUST", c.reached_status(room, "prefill", SUCCESS)),
        c.Check("second-lifecycle-decode-success", "R-REUSE-1", "MUST", c.reached_status(room, "decode", SUCCESS)),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="room-reuse",
        title="A room number reused while the old lifecycle's writes finish starts fresh and ignores the old conclusion",
        requirements=("R-REUSE-1", "R-ABORT-1", "R-XFER-1", "R-LAYOUT-1", "R-LIVE-2"),
        steps=steps,
        checks=checks,
        timeout_s=150.0,
    )
)
