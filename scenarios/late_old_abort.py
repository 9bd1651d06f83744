"""late-old-abort: an ABORT of a room's ended lifecycle that reaches the prefill after the
room number was reused changes nothing in the new lifecycle (R-REUSE-1).

Lifecycle 1 of the room is aborted by the decode; the ABORT its own code sent is
captured (CaptureFrames: ``abort_frames`` after the abort, so with the generation the
decode armed for it).  Both sides clear, the prefill opens lifecycle 2's sender, and a
copy of the old ABORT is delivered again (InjectCaptured), where the control socket's
per-connection order allows an ABORT held up on the network to arrive (before the
decode's new registration, which would follow it on the same connection).  The original
was delivered on time; a side that remembers the ended generation (R-REUSE-1 allows it)
drops the copy as it would drop the held-up original.  The new
sender must still be Bootstrapping, then serve lifecycle 2 to Success with its bytes.
The late STATUS at the decode is scenario late-old-status.
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import (Abort, AwaitStatus, CaptureFrames, Clear, InjectCaptured, OpenRoom, OpenSender,
                                RequestKV, Sleep, StartRoles)
from scenarios._flows import (ANY_STATUS, DONE, LATE_SETTLE_S, LAYOUT, await_done, open_and_request, pair_healthy,
                              reused_room, room_succeeds, send_all, verify)


def steps(seed: int):
    first, second = reused_room(seed)
    room = first.room
    return [
        StartRoles(layout=LAYOUT),
        *open_and_request(first),
        Abort(room, "decode"),
        AwaitStatus(room, "decode", DONE, label="first-aborted-decode"),
        AwaitStatus(room, "prefill", DONE, timeout_s=5.0, label="first-aborted-prefill", must_come=False),
        CaptureFrames("old-abort", "decode", room, kind="abort"),
        Clear(room, "decode"),
        Clear(room, "prefill"),
        OpenSender(room),  # lifecycle 2 on the prefill: no registration yet
        InjectCaptured("old-abort", "prefill"),
        Sleep(LATE_SETTLE_S),
        AwaitStatus(room, "prefill", ANY_STATUS, timeout_s=0.0, label="after-late-abort-prefill", must_come=False),
        OpenRoom(room, open_sender=False),
        RequestKV(room, second.dst, second.aux_dst),
        AwaitStatus(room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)),
        *send_all(second),
        *await_done(second),
        verify([second]),
    ]


def checks(seed: int):
    _, second = reused_room(seed)
    return [
        c.Check("old-lifecycle-aborted", "R-ABORT-1", c.status_at("first-aborted-decode", (KVPoll.Failed,))),
        c.Check("prefill-ignores-late-abort", "R-REUSE-1",
                c.status_at("after-late-abort-prefill", (KVPoll.Bootstrapping,))),
        *room_succeeds(second, "R-REUSE-1", "second-lifecycle"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="late-old-abort",
        title="A late ABORT of a room's ended lifecycle does not fail the reused room on the prefill",
        steps=steps,
        checks=checks,
        timeout_s=60.0,
    )
)
