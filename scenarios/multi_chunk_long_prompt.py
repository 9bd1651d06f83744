"""multi-chunk-long-prompt: a prompt many chunks long, pages scattered over the pool.

A 128-page pool; one room of 48 source pages drawn at random (not contiguous) is
sent in 12 chunks of uneven size to 48 scattered decode pages, with a second,
shorter room interleaved chunk by chunk on the same pair.  Every chunk must
arrive, both rooms reach Success on both sides, and every byte of the decode
pools is where it belongs (R-XFER-1, R-LAYOUT-1).
"""

from __future__ import annotations

from dataclasses import replace

from harness.judge import checks as c
from harness.judge.topology_checks import served_on_room_engine
from harness.spec.scenario import Scenario, register
from harness.spec.steps import Clear, InitSender, SendChunk, StartRoles
from scenarios._flows import LAYOUT, RoomAllocator, await_done, open_and_request, pair_healthy, room_succeeds, verify

POOL = replace(LAYOUT, num_pages=128)
LONG_PAGES, LONG_CHUNKS = 48, 12
SHORT_PAGES, SHORT_CHUNKS = 10, 5


def _plan(seed: int):
    planner = RoomAllocator(seed, POOL)
    long, short = planner.room(LONG_PAGES, LONG_CHUNKS), planner.room(SHORT_PAGES, SHORT_CHUNKS)
    # the two rooms on different DP engines (room mod DP, R-DP-1) for any DP size dividing 12
    # but 1, so on a DP topology each engine serves one while the other interleaves
    return long, replace(short, room=short.room - (short.room - long.room - 1) % 12)


def steps(seed: int):
    long, short = _plan(seed)
    interleaved = []
    for i in range(max(len(long.chunks), len(short.chunks))):
        for p in (long, short):
            if i < len(p.chunks):
                interleaved.append(SendChunk(p.room, p.chunks[i]))
    return [
        StartRoles(layout=POOL),
        *open_and_request(long),
        *open_and_request(short),
        InitSender(long.room, len(long.src), long.aux_src),
        InitSender(short.room, len(short.src), short.aux_src),
        *interleaved,
        *await_done(long),
        *await_done(short),
        verify([long, short]),
        # released on both sides, as after any Success: no-residue-after-clear judges what is left
        *[Clear(p.room, role) for p in (long, short) for role in ("prefill", "decode")],
    ]


def checks(seed: int):
    long, short = _plan(seed)
    return [
        *room_succeeds(long, "R-XFER-1", "long-room"),
        *room_succeeds(short, "R-XFER-1", "interleaved-room"),
        *(c.Check(f"{name}-{side}-served-on-room-engine", "R-DP-1", served_on_room_engine(p.room, side))
          for name, p in (("long-room", long), ("interleaved-room", short)) for side in ("prefill", "decode")),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="multi-chunk-long-prompt",
        title="A 48-page prompt in 12 chunks, pages scattered, interleaved with a second room: every byte lands",
        steps=steps,
        checks=checks,
        timeout_s=150.0,
    )
)
