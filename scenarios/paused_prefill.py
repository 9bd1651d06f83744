"""paused-prefill: the prefill pauses three times, each for one heartbeat interval; no room fails.

A room ``held`` waits at WaitingForInput and a room ``moving`` has its first chunk written
when the prefill's processes are stopped (SIGSTOP) for one heartbeat interval (2 s, the
harness's SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL), thawed, and left 3 s to answer, three
times: a long GC pause or a busy host.  A probe sent in a pause may go unanswered, but two in
a row cannot (the next is due an interval later, after the thaw), and a decode fails a
prefill's rooms only after max failures (2 here) missed probes in a row (R-HB-1).  The pauses
start at three phases of the probe clock, 1 s apart, so whatever the decode's probe timeout,
some pause catches a probe.  Then both rooms are sent to the end and must reach Success on
both sides with every byte in place, and a new room must too.
"""

from __future__ import annotations

from dataclasses import replace

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import AwaitStatus, FreezeRole, InitSender, SendChunk, Sleep, StartRoles, ThawRole
from scenarios._flows import (LAYOUT, RoomAllocator, await_done, full_room, open_and_request, pair_healthy,
                              room_succeeds, send_all, verify)

PAUSE_S = 2.0  # one heartbeat interval (harness.target.role_context.ROLE_ENV): at most one probe in it goes unanswered
ANSWER_S = 3.0  # after each thaw: more than an interval, so an answered probe resets the misses
PAUSES = 3
ROOMY = replace(LAYOUT, num_pages=12, aux_slots=4)


def _plan(seed: int):
    planner = RoomAllocator(seed, ROOMY)
    return planner.room(), planner.room(chunks=3), planner.room()


def steps(seed: int):
    held, moving, new = _plan(seed)
    pauses = []
    for _ in range(PAUSES):
        pauses += [FreezeRole("prefill"), Sleep(PAUSE_S), ThawRole("prefill"), Sleep(ANSWER_S)]
    return [
        StartRoles(layout=ROOMY),
        *open_and_request(held),
        *open_and_request(moving),
        InitSender(moving.room, len(moving.src), moving.aux_src),
        SendChunk(moving.room, moving.chunks[0]),
        AwaitStatus(moving.room, "prefill", (KVPoll.Transferring, KVPoll.Success, KVPoll.Failed), timeout_s=2.0,
                    must_come=False),
        AwaitStatus(held.room, "decode", (KVPoll.WaitingForInput,), timeout_s=5.0, must_come=False),
        *pauses,
        AwaitStatus(held.room, "decode", (KVPoll.WaitingForInput,), timeout_s=0.0, label="held-after-pauses",
                    must_come=False),
        *send_all(held),
        *[SendChunk(moving.room, chunk) for chunk in moving.chunks[1:]],
        *await_done(held), *await_done(moving),
        *full_room(new),
        verify([held, moving, new]),
    ]


def checks(seed: int):
    held, moving, new = _plan(seed)
    return [
        c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
        c.Check("held-room-survives-pauses", "R-HB-1", c.status_at("held-after-pauses", (KVPoll.WaitingForInput,))),
        *room_succeeds(held, "R-HB-1", "held"),
        *room_succeeds(moving, "R-HB-1", "moving"),
        *room_succeeds(new, "R-HB-1", "new"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="paused-prefill",
        title="The prefill pauses three times for one heartbeat interval: no room fails, all succeed with their bytes",
        steps=steps,
        checks=checks,
        timeout_s=120.0,
    )
)
