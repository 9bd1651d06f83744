"""room-reuse: a bootstrap room number is reused while its old lifecycle's writes
are still finishing; the new lifecycle starts fresh and ignores the old one.

Every prefill transfer of lifecycle 1 is delayed 2 s.  Lifecycle 1 of room R
registers and its whole request (two chunks) is sent; while its first write is in
flight the decode aborts R (as it does when it gives up on a request) and both
schedulers release R (``clear``).  Lifecycle 2 then opens the same room number with
other destination pages.  Its first polls must not show anything of lifecycle 1
(R-REUSE-1).  Then lifecycle 1's writes complete and the prefill concludes
lifecycle 1 by its own code (its late status, its ABORT_ACK): lifecycle 2 must still
be WaitingForInput on both sides afterwards (R-REUSE-1), and then complete with its
own bytes while lifecycle 1's pages are left unjudged (R-XFER-1, R-LAYOUT-1).

The abort comes at once where the prefill reports lifecycle 1 Transferring, else
1 s after the send (PROBE_S): 1 s after the first write began and 1 s before it
ends, so lifecycle 2 is open and registered before a worker that runs lifecycle 1's
writes one after another can take the second chunk.  The sleep lets such a worker
finish all three of lifecycle 1's writes (chunk, chunk, aux: 6 s after the send)
1 s before lifecycle 2's next polls.  No step races a write's start or end.  (A
stand-in engine that runs lifecycle 1's writes in turn may still be writing them
then; lifecycle 2's transfers wait behind them.)
"""

from __future__ import annotations

from dataclasses import replace

from harness import checks as c
from harness.adapter import FAILED, SUCCESS, TRANSFERRING, WAITING_FOR_INPUT
from harness.scenario import Scenario, register
from harness.steps import Abort, AwaitStatus, Clear, EngineFaults, OpenRoom, RequestKV, Sleep, StartRoles
from scenarios._flows import DONE, LAYOUT, Planner, await_done, open_and_request, pair_healthy, send_all, verify

LATE_S = 2.0  # each of lifecycle 1's transfers waits this long in the prefill's engine
# How long the driver waits for the prefill to report lifecycle 1 Transferring before it
# aborts.  An implementation that reports Transferring answers at once; one that never
# does (Mooncake's prefill goes from WaitingForInput to Success) is aborted after this
# bound, in the middle of its first delayed write.  Half the delay keeps 1 s between the
# abort and the write's start and end: with a bound equal to the delay the abort raced
# the end of the first write, and whether Mooncake's worker had taken the second chunk
# before the ABORT arrived (milliseconds either way) decided the verdict.
PROBE_S = LATE_S / 2
# Lifecycle 1's writes one after another on one transfer worker (Mooncake's, which goes
# on with a queued chunk of the old lifecycle): its two chunks and its aux.
OLD_WRITES_S = 3 * LATE_S
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
        AwaitStatus(room, "prefill", (TRANSFERRING, SUCCESS, FAILED), timeout_s=PROBE_S),  # prefill poll 1
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
        # lifecycle 1's writes complete and the prefill concludes it: for a prefill aborted
        # after PROBE_S, the polls below come 1 s after its last write of lifecycle 1 ended
        Sleep(OLD_WRITES_S - PROBE_S + 1.0),
        AwaitStatus(room, "decode", (SUCCESS, FAILED), timeout_s=0.0),  # decode poll 2
        AwaitStatus(room, "prefill", (SUCCESS, FAILED), timeout_s=0.0),  # prefill poll 4
        EngineFaults("prefill"),
        *send_all(second),
        # a stand-in engine may still run lifecycle 1's writes (2 s each, one after another)
        # that the second lifecycle's writes queue behind: allow them to drain
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
