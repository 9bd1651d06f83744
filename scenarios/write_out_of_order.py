"""write-out-of-order: the room's first KV write completes a second after the writes issued
after it.

On one host an engine completes writes in the order they were issued, so a backend that
takes a later write's completion for the earlier ones' is never caught.  Here the prefill's
engine holds its first transfer ``SLOW_S`` seconds (EngineFaults ``slow_nth=1``), while the
writes issued after it go on where the engine runs them concurrently: the reference's
writes, NIXL's posted handles and the Mori stand-in's queue complete them first; Mooncake's
synchronous batch call makes its worker wait instead, so there the order holds.  The room is
sent in three chunks with its aux.  Only the prefill's last process lags (``rank=-1``): on a
prefill of several PP stages or TP ranks the others complete first, so a decode that takes
one stage's or rank's Success for the room's is caught too (on p1-d1 it is the prefill itself).

Both sides must reach Success, and Success only once every byte of the room is in place
(R-XFER-2: the generic bytes-in-place-at-success judges the decode's rows as they were at
its first Success read); the pools are byte-exact at the end (R-LAYOUT-1).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.spec.scenario import Scenario, register
from harness.spec.topology import TOPOLOGIES
from harness.spec.steps import EngineFaults, StartRoles
from scenarios._flows import LAYOUT, RoomAllocator, await_done, open_and_request, pair_healthy, room_succeeds, \
    send_all, verify

SLOW_S = 1.0  # far above the milliseconds the later writes take


def _last_rank_writes(t) -> bool:
    """Whether the prefill's last process writes the room on topology ``t`` (harness.judge.fired:
    else the slow write never fires)."""
    p = t.prefill
    return p.dp == 1 and not (p.tp > 1 and (t.model.attention == "MLA" or t.model.kv_heads < p.tp))


def _room(seed: int):
    return RoomAllocator(seed).room(4, chunks=3)


def steps(seed: int):
    room = _room(seed)
    return [
        StartRoles(layout=LAYOUT),
        EngineFaults("prefill", slow_nth=1, slow_s=SLOW_S, rank=-1),
        *open_and_request(room),
        *send_all(room),
        *await_done(room, timeout_s=SLOW_S + 10),
        verify([room]),
    ]


def checks(seed: int):
    return [
        c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
        *room_succeeds(_room(seed), "R-XFER-2", "room"),
        *pair_healthy(),
    ]


SCENARIO = register(
    Scenario(
        id="write-out-of-order",
        title="The first write completes a second after the later ones: Success only once every byte is in place",
        steps=steps,
        checks=checks,
        timeout_s=120.0,
        topologies=(tuple(name for name, t in TOPOLOGIES.items() if _last_rank_writes(t)),
                    "its slow write is on the prefill's last process, which must write the room: not a prefill DP "
                    "engine other than the room's, nor an MLA or replicated-head TP rank the decode does not read"),
    )
)
