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
control sockets received was whole (harness.role.message_loss.whole).  The time from a room's
last chunk to its decode's Success read is each backend's control-path time per room under
load (harness.bench.rooms; docs/performance.md).
"""

from __future__ import annotations

import random

from harness.judge import checks as c
from harness.judge import fault_checks as fc
from harness.spec.protocol import KVPoll, Layout
from harness.spec.rooms import RoomAllocator
from harness.spec.scenario import Scenario, register
from harness.spec.steps import Abort, AwaitStatus, InitSender, OpenRoom, RequestKV, SendChunk, StartRoles, VerifyPools
from scenarios._flows import DONE, pair_healthy

ENV = (("SGLANG_DISAGGREGATION_QUEUE_SIZE", "4"), ("SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", "8"))
ABORT_ONE_IN = 8


def _layout(rooms: int) -> Layout:
    """Pools for ``rooms`` rooms of up to 3 pages each and an aux slot each, every byte checkable."""
    return Layout(num_layers=2, num_pages=3 * rooms, page_size=2, page_bytes=64, aux_slots=rooms, aux_bytes=16)


def _plan(seed: int, rooms: int):
    rng = random.Random(seed)
    planner = RoomAllocator(seed, _layout(rooms))
    plans = [planner.room(num_pages=rng.randint(1, 3), chunks=rng.randint(1, 3)) for _ in range(rooms)]
    aborted = {p.room for p in plans if rng.randrange(ABORT_ONE_IN) == 0}
    chunks = [(p, i) for p in plans if p.room not in aborted for i in range(len(p.chunks))]
    rng.shuffle(chunks)
    # a room's chunks go in their own order: the k-th of a room's draws sends its k-th chunk
    sent: dict[int, int] = {}
    order = []
    for p, _ in chunks:
        order.append((p, sent.get(p.room, 0)))
        sent[p.room] = sent.get(p.room, 0) + 1
    return plans, aborted, order


def steps(seed: int, rooms: int):
    plans, aborted, order = _plan(seed, rooms)
    out = [StartRoles(layout=_layout(rooms), env=ENV)]
    for p in plans:
        out += [OpenRoom(p.room), RequestKV(p.room, p.dst, p.aux_dst)]
    out += [AwaitStatus(p.room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)) for p in plans]
    out += [Abort(p.room, "decode") for p in plans if p.room in aborted]
    out += [InitSender(p.room, len(p.src), p.aux_src) for p in plans if p.room not in aborted]
    out += [SendChunk(p.room, p.chunks[i]) for p, i in order]
    last = list(dict.fromkeys(p.room for p, _ in reversed(order)))[::-1]  # rooms by their last chunk
    by_room = {p.room: p for p in plans}
    for room in [*last, *sorted(aborted)]:
        out += [AwaitStatus(room, "decode", DONE, timeout_s=30.0), AwaitStatus(room, "prefill", DONE, timeout_s=30.0)]
    done = [by_room[r] for r in last]
    out.append(VerifyPools(tuple(m for p in done for m in p.kv_moves), tuple((p.aux_src, p.aux_dst) for p in done),
                           unchecked_kv=tuple(x for r in sorted(aborted) for x in by_room[r].dst),
                           unchecked_aux=tuple(by_room[r].aux_dst for r in sorted(aborted))))
    return out


def checks(seed: int, rooms: int):
    plans, aborted, _ = _plan(seed, rooms)
    served = tuple(p.room for p in plans if p.room not in aborted)
    return [
        c.Check("every-room-succeeds", "R-LOAD-1", fc.all_rooms_reached(served, ("decode", "prefill"), (KVPoll.Success,))),
        c.Check("aborted-rooms-end", "R-LOAD-1", fc.all_rooms_reached(tuple(sorted(aborted)), ("decode", "prefill"),
                                                                      DONE)),
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
