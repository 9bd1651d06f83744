"""dead-prefill: one of two prefills dies; only its rooms fail, promptly, naming it.

Prefill A has served a room to the end and both sides cleared it; the decode then holds
a room bound to A in every other state: Bootstrapping (its receiver made, its pages not yet
requested), WaitingForInput, Transferring (its first chunk was sent) and concluded (Success
on both sides, not yet cleared), and one room bound to prefill B.  One more room of A ends
and is cleared on both sides while those are bound to A (clearing one room must not stop the
heartbeat of a prefill other rooms are still bound to).  A's process is killed
(SIGKILL: no goodbye).  A's open rooms must become Failed within the
decode's heartbeat window plus 5 s, with a reason naming A (R-HB-1, R-REASON-1), the
Bootstrapping one too, and whatever clearing the first room did to A's bookkeeping;
B's room is untouched and completes, and a new room to B succeeds (R-HB-1).  A's concluded
room stays Success on every later read, fresh reads of the manager's table included (R-TERM-1,
the generic every-trail-terminal), and its bytes stay in place.

``frozen-prefill`` is the same with A frozen (SIGSTOP) instead of killed: its sockets stay
open and its health endpoint accepts connections but never answers, so each probe waits
out its own timeout, and R-HB-1 allows 10 s of slack instead of 5.  A is thawed at the end,
after the pools were verified: what it then sends for its failed rooms must not change them
(R-TERM-1), its threads must be alive (R-LIVE-2), and a new room to A must succeed with its
bytes in place: a prefill that answers again is served again (R-HB-1).
"""

from __future__ import annotations

from dataclasses import replace

from harness.judge import checks as c
from harness.judge.fault_checks import failed_after_kill
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.history import Op
from harness.spec.steps import (AwaitStatus, Clear, FreezeRole, InitSender, KillRole, OpenRoom, SendChunk, Sleep,
                                StartRoles, ThawRole)
from scenarios._flows import LAYOUT, RoomAllocator, await_done, full_room, open_and_request, send_all, verify

WIDE = replace(LAYOUT, num_pages=27, aux_slots=9)  # nine rooms, each its own pages and aux slot
A, B = "prefill-a", "prefill-b"
SLACK_S = 5.0  # after a kill: the probes are refused at once
FROZEN_SLACK_S = 10.0  # after a freeze: each probe first waits out its own timeout (R-HB-1)
WAIT_S = 40.0  # polling bound; the check judges the latency against the window


def _plan(seed: int):
    planner = RoomAllocator(seed, WIDE)
    return (planner.room(prefill=A), planner.room(prefill=A, chunks=2), planner.room(prefill=B),
            planner.room(prefill=B), planner.room(prefill=A), planner.room(prefill=A), planner.room(prefill=A),
            planner.room(prefill=A), planner.room(prefill=A))


def steps(seed: int, freeze: bool = False):
    a_waiting, a_transferring, b_held, b_new, a_done, a_cleared, a_bootstrapping, a_late_cleared, a_thawed = _plan(seed)
    return [
        StartRoles(prefills=(A, B), layout=WIDE),
        *full_room(a_cleared), Clear(a_cleared.room, A), Clear(a_cleared.room, "decode"),  # ended before the rest
        *full_room(a_done),  # concluded before the kill, never cleared
        OpenRoom(a_bootstrapping.room, prefill=A),  # receiver made, pages never requested: Bootstrapping
        *open_and_request(a_waiting),
        *open_and_request(a_transferring),
        InitSender(a_transferring.room, len(a_transferring.src), a_transferring.aux_src, prefill=A),
        SendChunk(a_transferring.room, a_transferring.chunks[0], prefill=A),
        AwaitStatus(a_transferring.room, A, (KVPoll.Transferring, KVPoll.Success, KVPoll.Failed), timeout_s=2.0,
                    must_come=False),
        *open_and_request(b_held),
        AwaitStatus(b_held.room, "decode", (KVPoll.WaitingForInput,), timeout_s=5.0, must_come=False),
        # ends and is cleared while the others are bound to A: A must stay watched
        *full_room(a_late_cleared), Clear(a_late_cleared.room, A), Clear(a_late_cleared.room, "decode"),
        Sleep(0.3),  # the first chunk's write lands before the kill
        AwaitStatus(a_bootstrapping.room, "decode", (KVPoll.Bootstrapping,), timeout_s=0.0,
                    label="bootstrapping-before-kill", must_come=False),  # a record of the state it dies in
        FreezeRole(A) if freeze else KillRole(A),
        AwaitStatus(a_waiting.room, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=WAIT_S),
        AwaitStatus(a_transferring.room, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=WAIT_S),
        AwaitStatus(a_bootstrapping.room, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=WAIT_S),
        AwaitStatus(b_held.room, "decode", (KVPoll.WaitingForInput,), timeout_s=0.0, label="b-room-after-kill",
                    must_come=False),
        AwaitStatus(a_done.room, "decode", (KVPoll.Success,), timeout_s=0.0, label="concluded-room-after-kill",
                    must_come=False),  # read again: R-TERM-1 (every-trail-terminal) judges it
        *send_all(b_held), *await_done(b_held),
        *full_room(b_new),
        verify([a_cleared, a_done, b_held, b_new, a_late_cleared], unchecked_kv=a_transferring.dst),
        *([ThawRole(A), Sleep(1.0)] if freeze else []),
        *([AwaitStatus(r.room, "decode", (KVPoll.Failed,), timeout_s=0.0, label=f"{name}-after-thaw", must_come=False)
           for name, r in (("waiting", a_waiting), ("transferring", a_transferring))] if freeze else []),
        *([*full_room(a_thawed), verify([a_cleared, a_done, b_held, b_new, a_late_cleared, a_thawed],
                                        unchecked_kv=a_transferring.dst)] if freeze else []),
    ]


def checks(seed: int, freeze: bool = False):
    a_waiting, a_transferring, b_held, b_new, _, _, a_bootstrapping, _, a_thawed = _plan(seed)
    slack, op = (FROZEN_SLACK_S, Op.FREEZE) if freeze else (SLACK_S, Op.KILL)
    return [
        c.Check("waiting-room-failed", "R-HB-1", failed_after_kill(a_waiting.room, "decode", A, slack, op)),
        c.Check("transferring-room-failed", "R-HB-1",
                failed_after_kill(a_transferring.room, "decode", A, slack, op)),
        c.Check("bootstrapping-room-failed", "R-HB-1",
                failed_after_kill(a_bootstrapping.room, "decode", A, slack, op)),
        c.Check("other-prefill-room-untouched", "R-HB-1",
                c.status_at("b-room-after-kill", (KVPoll.WaitingForInput,))),
        c.Check("other-prefill-room-completes", "R-HB-1", c.reached_status(b_held.room, "decode", KVPoll.Success)),
        c.Check("new-room-to-live-prefill", "R-HB-1", c.reached_status(b_new.room, "decode", KVPoll.Success)),
        c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact()),
        c.Check("survivors-alive", "R-LIVE-2", c.loops_alive()),
        c.Check("no-dead-thread", "R-LIVE-2", c.no_dead_threads()),
        *([c.Check(f"{name}-stays-failed-after-thaw", "R-TERM-1", c.status_at(f"{name}-after-thaw", (KVPoll.Failed,)))
           for name in ("waiting", "transferring")] if freeze else []),
        *([c.Check("new-room-after-thaw", "R-HB-1", c.reached_status(a_thawed.room, "decode", KVPoll.Success))]
          if freeze else []),
    ]


SCENARIO = register(
    Scenario(
        id="dead-prefill",
        title="Prefill A is killed: its WaitingForInput and Transferring rooms fail naming A, prefill B's rooms go on",
        steps=steps,
        checks=checks,
        timeout_s=180.0,
        timeout_wait_s=4.0,  # the decode heartbeat window: 2 s x 2 misses (harness.target.role_context.ROLE_ENV)
    )
)
FROZEN = register(
    Scenario(
        id="frozen-prefill",
        title="Prefill A is frozen: its rooms fail naming A within the window plus 10 s, prefill B's rooms go on",
        steps=lambda seed: steps(seed, freeze=True),
        checks=lambda seed: checks(seed, freeze=True),
        timeout_s=180.0,
        timeout_wait_s=4.0,
    )
)
