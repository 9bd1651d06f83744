"""stale-chunk-after-clear: a chunk that outlives its room is dropped, quietly.

(a) A chunk for room R is queued; the prefill's transfer worker is paused at
``worker-take-chunk`` with it in hand; R is cleared on the prefill; the worker
goes on.  (b) Room S reaches Success; a delayed chunk for S (other source pages)
is queued afterwards.  Either way the chunk is dropped (R-STALE-1): nothing is
written (the decode's pages for R stay untouched, S's still hold S's pages), no
exception escapes, is logged at ERROR or is caught and logged at any level, no state is left for R, S stays Success
(R-TERM-1), and the worker lives on: a new room N completes.
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import (
    ArmPoint,
    AwaitPoint,
    AwaitStatus,
    Clear,
    InitSender,
    Observe,
    ReleasePoint,
    SendChunk,
    Sleep,
    StartRoles,
)
from scenarios._flows import DONE, LAYOUT, RoomAllocator, full_room, open_and_request, room_succeeds, verify

POINT = "worker-take-chunk"


def _plan(seed: int):
    planner = RoomAllocator(seed)
    r, s, n = planner.room(chunks=1), planner.room(chunks=1), planner.room()
    late = tuple(p for p in range(LAYOUT.num_pages) if p not in s.src)[: len(s.src)]
    return r, s, n, late


def steps(seed: int):
    r, s, n, late = _plan(seed)
    return [
        StartRoles(layout=LAYOUT),
        # (a) cleared while its chunk is in the worker's hands
        *open_and_request(r),
        InitSender(r.room, len(r.src), r.aux_src),
        ArmPoint("prefill", POINT, action="pause", hold_s=20.0),
        SendChunk(r.room, r.src),
        AwaitPoint("prefill", POINT),
        Clear(r.room, "prefill"),
        ReleasePoint("prefill", POINT),
        Observe(("prefill",), settle_s=0.5, label="after the stale chunk"),
        # (b) a delayed chunk for a room that already concluded
        *full_room(s),
        SendChunk(s.room, late),
        Sleep(0.5),
        AwaitStatus(s.room, "prefill", DONE, timeout_s=0.0, must_come=False),
        AwaitStatus(s.room, "decode", DONE, timeout_s=0.0, must_come=False),
        # the worker still serves rooms
        *full_room(n),
        verify([s, n]),
    ]


def _no_state_for(room: int, role: str):
    def fn(events):
        observed, problems = c.observations(events)
        if role not in observed:
            return None, "; ".join(problems) or f"{role} was not observed"
        left = observed[role]["rooms"].get(str(room)) or observed[role]["rooms"].get(room)
        if left:
            return False, f"{role} still holds room {room} in: {', '.join(left)}"
        if observed[role].get("residue_incomplete"):
            return None, f"{role}'s residue walk did not see everything: {observed[role]['residue_incomplete']}"
        return True, f"{role} holds no state for room {room}"
    return fn


def _nothing_raised(role: str):
    def fn(events):
        observed, problems = c.observations(events)
        if role not in observed:
            return None, "; ".join(problems) or f"{role} was not observed"
        bad = c.raised_in(role, observed[role])
        if bad:
            return False, "; ".join(bad[:3])
        if observed[role].get("log_records_dropped"):
            return None, c.dropped_records(role, observed[role])
        return True, f"{role} raised nothing: no thread died, no error and no caught exception was logged"
    return fn


def checks(seed: int):
    r, s, n, _ = _plan(seed)
    return [
        c.Check("steps-complete", "R-STALE-1", c.steps_completed()),
        c.Check("no-exception", "R-STALE-1", _nothing_raised("prefill")),
        c.Check("no-write", "R-STALE-1", c.pools_exact()),
        c.Check("no-state-for-cleared-room", "R-STALE-1", _no_state_for(r.room, "prefill")),
        c.Check("concluded-room-stays-success", "R-TERM-1", c.stays_terminal(s.room, ("prefill", "decode"))),
        c.Check("concluded-room-success", "R-TERM-1", c.reached_status(s.room, "decode", KVPoll.Success)),
        *room_succeeds(n, "R-STALE-1", "worker-serves-new-room"),
        c.Check("loops-alive", "R-LIVE-2", c.loops_alive()),
    ]


SCENARIO = register(
    Scenario(
        id="stale-chunk-after-clear",
        title="A chunk whose room was cleared (or already succeeded) is dropped: no write, no error, no state",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
    )
)
