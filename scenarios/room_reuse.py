"""room-reuse: a bootstrap room number is reused while its old lifecycle's writes
are still finishing; the new lifecycle starts fresh and ignores the old one.

The prefill's engine delays every write 2 s from lifecycle 1's send until lifecycle 2
is open.  Lifecycle 1 of room R registers and its whole request (two chunks) is sent;
while its first write is in flight the decode aborts R (as it does when it gives up on
a request) and both schedulers release R (``clear``).  Lifecycle 2 then opens the same
room number with other destination pages.  Its first polls must not show anything of
lifecycle 1 (R-REUSE-1).  Then lifecycle 1's writes complete and the prefill concludes
lifecycle 1 by its own code (its late status, its ABORT_ACK, or, where it goes on with
lifecycle 1's queued chunk, that chunk's writes and conclusion): lifecycle 2 must still
be WaitingForInput on both sides afterwards (R-REUSE-1), and then complete with its own
bytes while lifecycle 1's pages are left unjudged (R-XFER-1, R-LAYOUT-1).

No step races a write's start or end: the abort comes at once where the prefill reports
lifecycle 1 Transferring, else PROBE_S (1 s) after the send, 1 s inside the first write
and 1 s before a worker that runs lifecycle 1's chunks one after another can take the
second; the delay ends before that second chunk starts; the polls after the sleep come
1 s after the slowest old lifecycle seen has concluded (SETTLE_S).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import Abort, AwaitStatus, Clear, EngineFaults, OpenRoom, RequestKV, Sleep, StartRoles
from scenarios._flows import (DONE, LAYOUT, await_done, open_and_request, pair_healthy, reused_room, send_all, verify)

LATE_S = 2.0  # each write the prefill starts before lifecycle 2 opens waits this long in its engine
# How long the driver waits for the prefill to report lifecycle 1 Transferring before it
# aborts.  An implementation that reports Transferring answers at once; one that never
# does (Mooncake's prefill goes from WaitingForInput to Success) is aborted after this
# bound, in the middle of its first delayed write.  Half the delay keeps 1 s between the
# abort and the write's start and end: with a bound equal to the delay the abort raced
# the end of the first write, and whether Mooncake's worker had taken the second chunk
# before the ABORT arrived (milliseconds either way) decided the verdict.
PROBE_S = LATE_S / 2
DONE_BOUND_S = 5.0  # the bound of decode poll 0 and prefill poll 2 (lifecycle 1 concluded)
# The sleep between lifecycle 2's first polls and its next ones.  The slowest old
# lifecycle seen: Mori 0.5.17 on its stand-in engine.  Its prefill does not fail the
# room on ABORT (docs/sglang-bugs.md C1), so it is cleared and reopened only when
# prefill poll 2 runs out (DONE_BOUND_S after the abort); the stand-in runs the six
# block writes of lifecycle 1's first chunk (3 layers, K and V) one after another, 2 s
# each, so the worker takes the second chunk 12 s after the send and concludes it at
# once (no delay any more).  8 s after the reopen is 1 s after that.  (Mooncake, aborted
# PROBE_S after the send, concludes its queued second chunk 2 s after the send.)
SETTLE_S = 6 * LATE_S - DONE_BOUND_S + 1.0
ANY = (KVPoll.WaitingForInput, KVPoll.Success, KVPoll.Failed)  # stop at a stale terminal status too


def steps(seed: int):
    first, second = reused_room(seed)
    room = first.room
    return [
        StartRoles(layout=LAYOUT),
        *open_and_request(first),  # prefill poll 0
        EngineFaults("prefill", delay_s=LATE_S),
        *send_all(first),
        AwaitStatus(room, "prefill", (KVPoll.Transferring, KVPoll.Success, KVPoll.Failed), timeout_s=PROBE_S,
                    label="first-in-flight", must_come=False),
        Abort(room, "decode"),
        AwaitStatus(room, "decode", DONE, timeout_s=DONE_BOUND_S, label="first-aborted-decode", must_come=False),
        Clear(room, "decode"),
        AwaitStatus(room, "prefill", DONE, timeout_s=DONE_BOUND_S, label="first-aborted-prefill", must_come=False),
        Clear(room, "prefill"),
        # lifecycle 2, while lifecycle 1's writes are still in the engine
        OpenRoom(room),
        RequestKV(room, second.dst, second.aux_dst),
        AwaitStatus(room, "prefill", ANY, timeout_s=5.0, label="second-opened-prefill", must_come=False),
        AwaitStatus(room, "decode", ANY, timeout_s=5.0, label="second-opened-decode", must_come=False),
        # writes the prefill starts from now on (lifecycle 1's queued rest, lifecycle 2's)
        # are not delayed: the writes in flight at the abort are the late ones
        EngineFaults("prefill"),
        # lifecycle 1's writes complete and the prefill concludes it; the polls below come
        # 1 s after the slowest old lifecycle seen ends (see SETTLE_S)
        Sleep(SETTLE_S),
        AwaitStatus(room, "decode", DONE, timeout_s=0.0, label="after-old-conclusion-decode", must_come=False),
        AwaitStatus(room, "prefill", DONE, timeout_s=0.0, label="after-old-conclusion-prefill", must_come=False),
        *send_all(second),
        # Mori's stand-in engine may still run lifecycle 1's first-chunk writes (one after
        # another until 12 s after the send) that lifecycle 2's writes queue behind
        *await_done(second, timeout_s=15.0),
        verify([second], unchecked_kv=first.dst, unchecked_aux=(first.aux_dst,)),
    ]


def checks(seed: int):
    first, second = reused_room(seed)
    room = first.room
    return [
        c.Check("first-lifecycle-aborted", "R-ABORT-1", c.status_at("first-aborted-decode", (KVPoll.Failed,))),
        c.Check("prefill-starts-fresh", "R-REUSE-1", c.status_at("second-opened-prefill", (KVPoll.WaitingForInput,))),
        c.Check("decode-starts-fresh", "R-REUSE-1", c.status_at("second-opened-decode", (KVPoll.WaitingForInput,))),
        c.Check("decode-ignores-old-conclusion", "R-REUSE-1",
                c.status_at("after-old-conclusion-decode", (KVPoll.WaitingForInput,))),
        c.Check("prefill-ignores-old-conclusion", "R-REUSE-1",
                c.status_at("after-old-conclusion-prefill", (KVPoll.WaitingForInput,))),
        c.Check("second-lifecycle-prefill-success", "R-REUSE-1", c.reached_status(room, "prefill", KVPoll.Success)),
        c.Check("second-lifecycle-decode-success", "R-REUSE-1", c.reached_status(room, "decode", KVPoll.Success)),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="room-reuse",
        title="A room number reused while the old lifecycle's writes finish starts fresh and ignores the old conclusion",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
        topologies=(("p1-d1", "p1-d1dp2", "p1dp2-d1"), "the old lifecycle's delayed writes are timed to land after the reuse for one transfer per chunk; head-sliced TP writes and PP stages are several"),
    )
)
