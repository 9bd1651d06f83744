"""abort-unguarded: the decode aborts with the plain Common ABORT frames.

The ABORT for a registered room is built by the decode's own implementation in
the plain Common form (``[ABORT, room, decode_ip, decode_port]``, no backend
guard frame; the reference's own ABORT for the reference) and pushed into the
prefill's control socket.  The prefill room must become Failed within 2 s
(R-ABORT-1).  Then an ABORT for a room the prefill never held arrives; it must
be harmless; and one for a room already concluded (Success on both sides, not yet
cleared), which must stay Success (R-TERM-1, the generic every-trail-terminal: the room is
read again after it, and afresh at the end); that room is then aborted by each side's own
scheduler (``abort()`` on the prefill, then on the decode: an abort in the last state a room
can be in) and must still read Success on both sides.  Neither may be logged as malformed (R-ABORT-1, R-LIVE-1), the
prefill's loops must survive, and a new room completes (R-LIVE-2, R-XFER-1).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import Abort, AwaitStatus, InjectAbort, Observe, StartRoles
from scenarios._flows import LAYOUT, RoomAllocator, full_room, open_and_request, pair_healthy, room_succeeds, verify

PROMPT_S = 2.0
LABEL = "after both ABORTs"
# a record that calls an ABORT bad (Common's AbortNotification warnings, a guard-frame check, ...)
BAD = r"(malformed|invalid|incomplete|unparsable|parse|unknown|unexpected|too few|bad)"
MALFORMED = rf"{BAD}[^\n]*\babort|\babort[^\n]*{BAD}"


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(), planner.room(), planner.room(), planner.room()


def steps(seed: int):
    target, stranger, after, concluded = _plan(seed)
    return [
        StartRoles(layout=LAYOUT),
        *full_room(concluded),
        *open_and_request(target),
        InjectAbort(target.room),
        AwaitStatus(target.room, "prefill", (KVPoll.Failed, KVPoll.Success), timeout_s=PROMPT_S + 3, must_come=False),
        InjectAbort(stranger.room, known=False),
        InjectAbort(concluded.room),
        AwaitStatus(concluded.room, "prefill", (KVPoll.Success,), timeout_s=0.0, label="concluded-after-abort",
                    must_come=False),  # read again: R-TERM-1 (every-trail-terminal) judges it
        Observe(("prefill",), settle_s=0.5, label=LABEL),
        Abort(concluded.room, "prefill"),
        Abort(concluded.room, "decode"),
        *[AwaitStatus(concluded.room, role, (KVPoll.Success,), timeout_s=0.5, label=f"concluded-after-{role}-abort",
                      must_come=False) for role in ("prefill", "decode")],
        *full_room(after),
        verify([concluded, after]),  # the aborted room's pages stay untouched
    ]


def checks(seed: int):
    target, stranger, after, _ = _plan(seed)
    return [
        c.Check("aborted-room-failed-promptly", "R-ABORT-1",
                c.failed_within(target.room, "prefill", "inject-abort", "prefill", 0, PROMPT_S,
                                need_reason=False)),
        c.Check("reason-names-abort", "R-REASON-1",
                c.failed_within(target.room, "prefill", "inject-abort", "prefill", 0, 1e9, ("abort",))),
        c.Check("not-logged-as-malformed", "R-ABORT-1", c.no_log_matching("prefill", MALFORMED)),
        c.Check("loops-alive-after-aborts", "R-LIVE-1", c.loops_alive_at(LABEL, ("prefill",))),
        *[c.Check(f"concluded-stays-success-{role}", "R-TERM-1",
                  c.status_at(f"concluded-after-{role}-abort", (KVPoll.Success,))) for role in ("prefill", "decode")],
        *room_succeeds(after, "R-XFER-1", "room-after-aborts"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="abort-unguarded",
        title="A plain Common ABORT (no guard frame) fails the room within 2 s; one for an unknown room is harmless",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
    )
)
