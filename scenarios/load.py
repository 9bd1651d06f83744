"""load-64, load-256: many rooms in flight at once through several transfer workers (R-LOAD-1).

sglang #29984: with many concurrent requests and several transfer workers, frames from two
threads interleaved on one shared socket (Mooncake).  Scenarios hold a handful of rooms; these
hold 64 or 256 at once (both in ``make matrix``: a few seconds a cell):

1. every room is opened and registered (the prefill's senders wait with all of them);
2. their chunks go out interleaved across rooms, in a seeded random order, each room cut into
   1 to 3 chunks at random, so the backend's transfer workers (4 queues of 2 threads here:
   ``SGLANG_DISAGGREGATION_QUEUE_SIZE``, ``SGLANG_DISAGGREGATION_THREAD_POOL_SIZE``) all run
   at once and their status messages race on the same sockets; one room in eight is aborted
   by the decode's scheduler before its chunks go;
3. every room is polled to its end on both sides, in the order its last chunk went, then the
   decode's pools are checked.

Every room concludes (Success on both sides; an aborted one Failed on the decode and ended on
the prefill), every byte of the rooms not aborted is in place, and every message each role's
control sockets received was whole (harness.role.message_loss.whole).  The plan is
harness.spec.load_plan's, which explore's load programs draw too.  The time from a room's
last chunk to its decode's Success read is each backend's control-path time per room under
load (harness.bench.rooms; docs/performance.md).
"""

from __future__ import annotations

from harness.judge import checks as c
from harness.judge import fault_checks as fc
from harness.spec import load_plan
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario, register
from harness.spec.steps import StartRoles
from scenarios._flows import DONE, pair_healthy

ENV = load_plan.ENV


def steps(seed: int, rooms: int):
    return [StartRoles(layout=load_plan.layout(rooms), env=ENV), *load_plan.steps(load_plan.plan(seed, rooms))]


def checks(seed: int, rooms: int):
    burst = load_plan.plan(seed, rooms)
    return [
        c.Check("every-room-succeeds", "R-LOAD-1", fc.all_rooms_reached(burst.served, ("decode", "prefill"),
                                                                        (KVPoll.Success,))),
        c.Check("aborted-rooms-end", "R-LOAD-1", fc.all_rooms_reached(tuple(sorted(burst.aborted)),
                                                                      ("decode", "prefill"), DONE)),
        c.Check("every-message-whole", "R-LOAD-1", fc.messages_whole()),
        *pair_healthy(),
    ]


def _scenario(rooms: int) -> Scenario:
    return register(Scenario(
        id=f"load-{rooms}",
        title=f"{rooms} rooms in flight at once through several transfer workers: every room ends, every message whole",
        steps=lambda seed: steps(seed, rooms),
        checks=lambda seed: checks(seed, rooms),
        timeout_s=240.0,
        topologies=(("p1-d1",), "the load is on one prefill's workers and one decode's sockets"),
    ))


LOAD_64 = _scenario(64)
LOAD_256 = _scenario(256)
