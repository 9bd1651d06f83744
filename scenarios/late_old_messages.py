"""late-old-messages: a message of a room's ended lifecycle that arrives after the room
number was reused changes nothing in the new lifecycle (R-REUSE-1).

Each message is the one the implementation's own code builds for the old lifecycle,
captured while that lifecycle is current (CaptureFrames) and delivered after both sides
cleared it and the new lifecycle opened (InjectCaptured): what a peer's message held up
on the network delivers.  Each is delivered where the per-connection order of the
control sockets still allows it, so nothing is delivered that a real network could not:

* a late ABORT at the prefill: lifecycle 1 of room B is aborted by the decode (the
  ABORT it sent is captured), both sides clear, the prefill opens lifecycle 2's sender,
  and the old ABORT arrives before the decode's new registration (which would follow it
  on the same connection).  The new sender must still be Bootstrapping, then serve
  lifecycle 2 to Success;
* a late STATUS at the decode: lifecycle 1 of room A completes (the prefill's Success
  STATUS for it is captured), both sides clear, the decode opens and requests lifecycle
  2, and the old Success arrives before the prefill has opened lifecycle 2 (so before
  anything of lifecycle 2 on the prefill's connection).  The decode must still be
  WaitingForInput (a Success there would hand the request pages nothing was written
  to), then complete lifecycle 2 with its own bytes.

Where an implementation cannot build one of the messages (sglang 0.5.17 rebuilds no
status message here), the cell is UNSUPPORTED with the reason.
"""

from __future__ import annotations

from dataclasses import replace

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import (Abort, AwaitStatus, CaptureFrames, Clear, InjectCaptured, OpenRoom, OpenSender,
                                RequestKV, Sleep, StartRoles)
from scenarios._flows import DONE, LAYOUT, RoomAllocator, await_done, full_room, open_and_request, pair_healthy, \
    room_succeeds, send_all, verify

SETTLE_S = 0.5  # after an injection, before the new lifecycle is read (its handling takes milliseconds)
ANY = (KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed)


def _plan(seed: int):
    planner = RoomAllocator(seed)
    b1, a1 = planner.room(), planner.room()
    return b1, replace(planner.room(), room=b1.room), a1, replace(planner.room(), room=a1.room)


def _late_abort(b1, b2) -> list:
    room = b1.room
    return [
        *open_and_request(b1),
        Abort(room, "decode"),
        AwaitStatus(room, "decode", DONE, label="b1-aborted-decode"),
        AwaitStatus(room, "prefill", DONE, timeout_s=5.0, label="b1-aborted-prefill", must_come=False),
        CaptureFrames("old-abort", "decode", room, kind="abort"),
        Clear(room, "decode"),
        Clear(room, "prefill"),
        OpenSender(room),  # lifecycle 2 on the prefill: no registration yet
        InjectCaptured("old-abort", "prefill"),
        Sleep(SETTLE_S),
        AwaitStatus(room, "prefill", ANY, timeout_s=0.0, label="b2-after-late-abort-prefill", must_come=False),
        OpenRoom(room, open_sender=False),
        RequestKV(room, b2.dst, b2.aux_dst),
        AwaitStatus(room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)),
        *send_all(b2),
        *await_done(b2),
    ]


def _late_status(a1, a2) -> list:
    room = a1.room
    return [
        *full_room(a1),
        CaptureFrames("old-status", "prefill", room, kind="status", status=KVPoll.Success),
        Clear(room, "prefill"),
        Clear(room, "decode"),
        OpenRoom(room, open_sender=False),  # lifecycle 2 on the decode first
        RequestKV(room, a2.dst, a2.aux_dst),
        AwaitStatus(room, "decode", (KVPoll.WaitingForInput, KVPoll.Failed), label="a2-opened-decode"),
        InjectCaptured("old-status", "decode"),
        Sleep(SETTLE_S),
        AwaitStatus(room, "decode", ANY, timeout_s=0.0, label="a2-after-late-status-decode", must_come=False),
        OpenSender(room),
        AwaitStatus(room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)),
        *send_all(a2),
        *await_done(a2),
    ]


def steps(seed: int):
    b1, b2, a1, a2 = _plan(seed)
    return [StartRoles(layout=LAYOUT), *_late_abort(b1, b2), *_late_status(a1, a2), verify([b2, a1, a2])]


def checks(seed: int):
    b1, b2, a1, a2 = _plan(seed)
    return [
        c.Check("old-lifecycle-aborted", "R-ABORT-1", c.status_at("b1-aborted-decode", (KVPoll.Failed,))),
        c.Check("prefill-ignores-late-abort", "R-REUSE-1",
                c.status_at("b2-after-late-abort-prefill", (KVPoll.Bootstrapping,))),
        *room_succeeds(b2, "R-REUSE-1", "after-late-abort"),
        c.Check("decode-ignores-late-status", "R-REUSE-1",
                c.status_at("a2-after-late-status-decode", (KVPoll.WaitingForInput,))),
        *room_succeeds(a2, "R-REUSE-1", "after-late-status"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="late-old-messages",
        title="A late ABORT or STATUS of a room's ended lifecycle changes nothing in the reused room",
        steps=steps,
        checks=checks,
        timeout_s=90.0,
    )
)
