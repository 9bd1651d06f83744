"""abort-then-release: the decode's scheduler aborts a room whose write is in flight and
releases it at once, as sglang's does without deferred KV release
(``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=0``; with it, the release waits for the
ABORT_ACK, which clear-then-abort and abort-ack-after-drain judge).

Both sides read the room Failed and clear it while the prefill's engine still holds its
write, so the write outlives every manager's record of the room:

* Room ``late``: its first write completes 3 s late (EngineFaults ``slow_nth``: one write,
  so an engine that runs a chunk as several transfers, or one after another, is not held
  longer); the decode aborts 0.2 s after the first chunk and both sides clear, well inside
  the 3 s even on a loaded machine.  The write then completes and its bytes (and whatever
  the backend sends with them) reach a decode that no longer holds the room: no loop or
  worker of either side may die of it (R-LIVE-2), and once it has landed no state of the
  room may remain (R-RESIDUE-1).  A new room then completes.
* Room ``stuck``: its first write is held far beyond the cell (``SLOW_S``); aborted and
  cleared on both sides while held.  The cell then waits out the transfer timeout plus
  slack: a write that has not completed by then is lost (R-TIMEOUT-3), so no state of the
  cleared room may remain either (R-RESIDUE-1's quiescence), whether or not the backend
  still holds the room.

The scenario judges both rooms' residue itself (``released-rooms-left-nothing``, as the
generic no-residue-after-clear does for every cleared room) and the threads (no-dead-thread);
its other checks say that the aborts failed both rooms on both sides and that the pair
still serves a room.  The roles run with the waiting timeout of
one-write-never-completes (4 s), which is also the reference's transfer timeout, and
``MC_TRANSFER_TIMEOUT`` 6 s, Mooncake's engine's own limit for a batch.
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import Abort, AwaitStatus, Clear, EngineFaults, InitSender, SendChunk, Sleep, StartRoles
from scenarios._flows import (LAYOUT, RoomAllocator, aborted_rooms_fail, full_room, open_and_request, pair_healthy,
                              room_succeeds, verify)
from scenarios.one_write_never_completes import SLACK_S, TIMEOUT_S

# Mooncake's engine gives up on the held batch at its own timeout, inside the wait below
ENV = (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(TIMEOUT_S)), ("MC_TRANSFER_TIMEOUT", "6"),
       ("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", "0"))

DELAY_S = 3.0  # room late's first write completes this long after it was issued: after both clears
SLOW_S = 60.0  # room stuck's held write completes long after the cell has ended
PROMPT_S = 2.0  # an ABORT fails the prefill's room within this (R-ABORT-1)


def _plan(seed: int):
    planner = RoomAllocator(seed)
    return planner.room(4, chunks=2), planner.room(), planner.room(4, chunks=2)


def _abort_and_release(room) -> list:
    """The first chunk in the engine, the decode's abort, both sides Failed, both cleared."""
    return [
        *open_and_request(room),
        InitSender(room.room, len(room.src), room.aux_src),
        SendChunk(room.room, room.chunks[0]),
        Sleep(0.2),  # the write is in the engine
        Abort(room.room, "decode"),
        AwaitStatus(room.room, "decode", (KVPoll.Failed, KVPoll.Success), timeout_s=PROMPT_S, must_come=False),
        AwaitStatus(room.room, "prefill", (KVPoll.Failed, KVPoll.Success), timeout_s=PROMPT_S + 3, must_come=False),
        Clear(room.room, "decode"),  # the decode's scheduler frees the request's pages at once
        Clear(room.room, "prefill"),
    ]


def steps(seed: int):
    late, after, stuck = _plan(seed)
    return [
        StartRoles(layout=LAYOUT, env=ENV),
        EngineFaults("prefill", slow_nth=1, slow_s=DELAY_S),
        *_abort_and_release(late),
        Sleep(DELAY_S + 1.0),  # the delayed write lands at a decode that cleared the room
        EngineFaults("prefill"),
        *full_room(after),
        verify([after], unchecked_kv=late.dst + stuck.dst, unchecked_aux=(late.aux_dst, stuck.aux_dst)),
        # last: a held write may keep an engine worker busy, and no room comes after it
        EngineFaults("prefill", slow_nth=1, slow_s=SLOW_S),
        *_abort_and_release(stuck),
        Sleep(TIMEOUT_S + SLACK_S),  # the held write is lost by now (R-TIMEOUT-3); residue is judged at the end
    ]


def checks(seed: int):
    late, after, stuck = _plan(seed)
    return [*aborted_rooms_fail({"late": late, "stuck": stuck}, PROMPT_S), *room_succeeds(after, "R-LIVE-2", "room-after-late-write"),
            c.Check("released-rooms-left-nothing", "R-RESIDUE-1",
                    c.no_residue(("prefill", "decode"), rooms=(late.room, stuck.room))),
            *pair_healthy()]


SCENARIO = register(
    Scenario(
        id="abort-then-release",
        title="ABORT and release at once while the write is in flight: a late or stuck write of a cleared room "
              "kills nothing and leaves no state",
        steps=steps,
        checks=checks,
        timeout_s=120.0,
        topologies=(("p1-d1",), "its delayed and held writes are timed for one transfer per chunk; head-sliced "
                                "TP writes are several, so a held one need not be the first chunk's"),
    )
)
