"""late-old-status: a STATUS of a room's ended lifecycle that reaches the decode after the
room number was reused changes nothing in the new lifecycle (R-REUSE-1).

Lifecycle 1 of the room completes; the Success STATUS the prefill's own code builds for
it is captured (CaptureFrames: ``status_frames``, the backend's own encoder).  Both sides
clear, the decode opens and requests lifecycle 2, and a copy of the old Success is
delivered again (InjectCaptured) before the prefill has opened lifecycle 2, so before
anything of lifecycle 2 on the prefill's connection: where a Success held up on the
network could arrive (the original was delivered on time).  The decode
must still be WaitingForInput (a Success there would hand the request pages nothing was
written to), then complete lifecycle 2 with its own bytes.  Where an implementation cannot
build its status message (sglang 0.5.17 here), the cell is UNSUPPORTED with the reason.
The late ABORT at the prefill is scenario late-old-abort.

late-old-failed-status is the same with a Failed STATUS of the ended lifecycle, built by the
prefill's own encoder for it (a lifecycle that failed, whose Failed status was held up on
the network): the reused room must not fail of it.  Late copies of every message kind of an
ended lifecycle, not only the one kind a backend happens to guard.
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, CaptureFrames, Clear, InjectCaptured, OpenRoom, OpenSender, RequestKV, \
    Sleep, StartRoles
from scenarios._flows import (ANY_STATUS, LATE_SETTLE_S, LAYOUT, await_done, full_room, pair_healthy, reused_room,
                              room_succeeds, send_all, verify)


def steps(seed: int, status: int = KVPoll.Success):
    first, second = reused_room(seed)
    room = first.room
    return [
        StartRoles(layout=LAYOUT),
        *full_room(first),
        CaptureFrames("old-status", "prefill", room, kind="status", status=status),
        Clear(room, "prefill"),
        Clear(room, "decode"),
        OpenRoom(room, open_sender=False),  # lifecycle 2 on the decode first
        RequestKV(room, second.dst, second.aux_dst),
        AwaitStatus(room, "decode", (KVPoll.WaitingForInput, KVPoll.Failed), label="second-opened-decode"),
        InjectCaptured("old-status", "decode"),
        Sleep(LATE_SETTLE_S),
        AwaitStatus(room, "decode", ANY_STATUS, timeout_s=0.0, label="after-late-status-decode", must_come=False),
        OpenSender(room),
        AwaitStatus(room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)),
        *send_all(second),
        *await_done(second),
        verify([first, second]),
    ]


def checks(seed: int):
    _, second = reused_room(seed)
    return [
        c.Check("decode-ignores-late-status", "R-REUSE-1",
                c.status_at("after-late-status-decode", (KVPoll.WaitingForInput,))),
        *room_succeeds(second, "R-REUSE-1", "second-lifecycle"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="late-old-status",
        title="A late Success STATUS of a room's ended lifecycle is not the reused room's Success on the decode",
        steps=steps,
        checks=checks,
        timeout_s=60.0,
    )
)

FAILED_SCENARIO = register(
    Scenario(
        id="late-old-failed-status",
        title="A late Failed STATUS of a room's ended lifecycle does not fail the reused room on the decode",
        steps=lambda seed: steps(seed, KVPoll.Failed),
        checks=checks,
        timeout_s=60.0,
    )
)
