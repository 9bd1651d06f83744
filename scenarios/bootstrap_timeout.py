"""bootstrap-timeout: a sender whose decode never registers fails after the
bootstrap timeout, with a reason; a registered room outlives that deadline.

The roles run with ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` = 3 s (the
reference reads the same knob).  Room ``orphan`` gets a prefill sender and no
decode at all; room ``held`` is registered by the decode at the same time and is
left WaitingForInput past the deadline before the prefill sends it.  ``orphan``
must become Failed no earlier than the timeout and within 5 s after it, with a
reason naming the timeout (R-TIMEOUT-1, R-REASON-1); ``held`` must still be
WaitingForInput after the deadline (the deadline applies only while
Bootstrapping) and then complete (R-TIMEOUT-1, R-XFER-1).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, OpenSender, Sleep, StartRoles
from scenarios._flows import (
    LAYOUT,
    RoomAllocator,
    await_done,
    open_and_request,
    pair_healthy,
    room_succeeds,
    send_all,
    verify,
)

TIMEOUT_S = 3
SLACK_S = 5.0
ENV = (("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", str(TIMEOUT_S)),)


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(), planner.room()


def steps(seed: int):
    orphan, held = _plan(seed)
    return [
        StartRoles(layout=LAYOUT, env=ENV),
        OpenSender(orphan.room),
        *open_and_request(held),
        AwaitStatus(orphan.room, "prefill", (KVPoll.Failed, KVPoll.Success), timeout_s=TIMEOUT_S + SLACK_S + 2),
        Sleep(1.0),  # held has now waited past the bootstrap deadline too
        AwaitStatus(held.room, "prefill", (KVPoll.WaitingForInput,), timeout_s=0.0, label="held-past-deadline",
                    must_come=False),
        *send_all(held),
        *await_done(held),
        verify([held]),
    ]


def checks(seed: int):
    orphan, held = _plan(seed)
    return [
        c.Check("orphan-sender-failed", "R-TIMEOUT-1",
                c.failed_within(orphan.room, "prefill", "open_sender", "prefill", TIMEOUT_S, TIMEOUT_S + SLACK_S)),
        c.Check("reason-names-timeout", "R-REASON-1",
                c.failed_within(orphan.room, "prefill", "open_sender", "prefill", 0, 1e9, ("timeout", "timed out"))),
        c.Check("registered-room-outlives-deadline", "R-TIMEOUT-1",
                c.status_at("held-past-deadline", (KVPoll.WaitingForInput,))),
        *room_succeeds(held, "R-XFER-1", "registered-room"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="bootstrap-timeout",
        title="A sender whose decode never registers fails after the bootstrap timeout; a registered one does not",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
        timeout_wait_s=TIMEOUT_S,
    )
)
