"""decode-first: the decode registers a room before the prefill has a sender for it.

In service the two schedulers run apart, so a decode often sends its pages for a room the
prefill has not scheduled yet (sglang's deferred bootstrap keeps such early registrations).
Scripts that open the sender first never produce it.  Room ``early``: the decode's receiver
is made and its pages sent (on a decode of several ranks, every rank's); the prefill opens
its sender GAP_S later, then sends the room in two chunks: both sides must reach Success with
every byte in place (R-XFER-1, R-XFER-2, R-LAYOUT-1).  Room ``cancelled``: the decode
registers, then aborts, all before the prefill opens its sender; the sender opened after
must never bind that registration (R-ABORT-1: an ABORT for a room the prefill does not hold
guarantees that this generation's registration never starts a transfer): it never reads
WaitingForInput, Transferring or Success, and the decode's pages for it stay untouched.
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import Abort, AwaitStatus, OpenRoom, OpenSender, RequestKV, Sleep, StartRoles
from scenarios._flows import LAYOUT, RoomAllocator, await_done, pair_healthy, room_succeeds, send_all, verify

GAP_S = 1.0  # from the decode's registration to the prefill's sender
WATCH_S = 2.0  # how long the cancelled room's late sender is watched


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(4, chunks=2), planner.room(2, chunks=1)


def steps(seed: int):
    early, cancelled = _plan(seed)
    return [
        StartRoles(layout=LAYOUT),
        OpenRoom(early.room, open_sender=False),
        RequestKV(early.room, early.dst, early.aux_dst),
        OpenRoom(cancelled.room, open_sender=False),
        RequestKV(cancelled.room, cancelled.dst, cancelled.aux_dst),
        Abort(cancelled.room, "decode"),
        Sleep(GAP_S),
        OpenSender(early.room),
        OpenSender(cancelled.room),
        AwaitStatus(early.room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)),
        *send_all(early),
        *await_done(early),
        AwaitStatus(cancelled.room, "prefill", (KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success),
                    timeout_s=WATCH_S, label="cancelled-sender", must_come=False),
        verify([early]),  # the cancelled room's pages are checked untouched with the rest
    ]


def checks(seed: int):
    early, _ = _plan(seed)
    return [
        *room_succeeds(early, "R-XFER-1", "early-registered-room"),
        c.Check("cancelled-registration-never-binds", "R-ABORT-1",
                c.status_at("cancelled-sender", (KVPoll.Bootstrapping, KVPoll.Failed))),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="decode-first",
        title="The decode registers before the prefill has a sender: the room succeeds; an aborted early one never binds",
        steps=steps,
        checks=checks,
        timeout_s=120.0,
    )
)
