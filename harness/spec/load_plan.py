"""Many rooms in flight at once (R-LOAD-1): the plan of one burst, shared by the ``load-64`` and
``load-256`` scenarios (scenarios/load.py) and explore's load programs (harness.explore.program).

A burst of ``rooms`` rooms: every room opened and registered first, then one room in
:data:`ABORT_ONE_IN` aborted by the decode's scheduler, then the chunks of the rest sent
interleaved across rooms in a seeded random order (each room cut into 1 to 3 chunks of 1 to 3
pages, its own chunks in their order), through several transfer workers (:data:`ENV`: 4 queues
of 2 threads, sglang's own settings), then every room polled to its end on both sides in the
order its last chunk went, and the decode's pools checked.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from harness.spec.protocol import KVPoll, Layout
from harness.spec.rooms import DONE, RoomAllocator, RoomPlan
from harness.spec.steps import Abort, AwaitStatus, InitSender, OpenRoom, RequestKV, SendChunk, Step, VerifyPools

#: several transfer workers: SGLANG_DISAGGREGATION_QUEUE_SIZE queues sharing THREAD_POOL_SIZE threads
ENV = (("SGLANG_DISAGGREGATION_QUEUE_SIZE", "4"), ("SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", "8"))
ABORT_ONE_IN = 8
CONCLUDE_S = 30.0  # each room's conclusion poll: a burst of 256 rooms through busy workers takes seconds


def layout(rooms: int) -> Layout:
    """Pools for ``rooms`` rooms of up to 3 pages each and an aux slot each, every byte checkable."""
    return Layout(num_layers=2, num_pages=3 * rooms, page_size=2, page_bytes=64, aux_slots=rooms, aux_bytes=16)


@dataclass(frozen=True)
class Burst:
    """One burst's plan: its ``rooms`` (RoomPlan, in the order they open), the ids the decode
    aborts, and the chunks in the order they go, as ``(room plan, its chunk index)``."""

    rooms: tuple[RoomPlan, ...]
    aborted: frozenset[int]
    order: tuple[tuple[RoomPlan, int], ...]

    @property
    def served(self) -> tuple[int, ...]:
        """The ids of the rooms not aborted, in the order they open."""
        return tuple(p.room for p in self.rooms if p.room not in self.aborted)

    @property
    def by_last_chunk(self) -> tuple[int, ...]:
        """The served rooms in the order their last chunk went."""
        return tuple(dict.fromkeys(p.room for p, _ in reversed(self.order)))[::-1]


def plan(seed: int, rooms: int, pools: Layout | None = None) -> Burst:
    """The burst of ``rooms`` rooms drawn from ``seed``, in ``pools`` (default :func:`layout`)."""
    rng = random.Random(seed)
    planner = RoomAllocator(seed, pools or layout(rooms))
    plans = [planner.room(num_pages=rng.randint(1, 3), chunks=rng.randint(1, 3)) for _ in range(rooms)]
    aborted = frozenset(p.room for p in plans if rng.randrange(ABORT_ONE_IN) == 0)
    chunks = [(p, i) for p in plans if p.room not in aborted for i in range(len(p.chunks))]
    rng.shuffle(chunks)
    sent: dict[int, int] = {}  # a room's chunks go in their own order: its k-th draw sends its k-th chunk
    order = []
    for p, _ in chunks:
        order.append((p, sent.get(p.room, 0)))
        sent[p.room] = sent.get(p.room, 0) + 1
    return Burst(tuple(plans), aborted, tuple(order))


def steps(burst: Burst, labels: dict[int, str] | None = None, verify: bool = True) -> list[Step]:
    """The steps of ``burst`` (see the module docstring); ``labels``: each room's label for its
    conclusion polls (explore's lifecycles); ``verify``: end with the pool check."""
    labels = labels or {}
    out: list[Step] = []
    for p in burst.rooms:
        out += [OpenRoom(p.room), RequestKV(p.room, p.dst, p.aux_dst)]
    out += [AwaitStatus(p.room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed)) for p in burst.rooms]
    out += [Abort(p.room, "decode") for p in burst.rooms if p.room in burst.aborted]
    out += [InitSender(p.room, len(p.src), p.aux_src) for p in burst.rooms if p.room not in burst.aborted]
    out += [SendChunk(p.room, p.chunks[i]) for p, i in burst.order]
    for room in (*burst.by_last_chunk, *sorted(burst.aborted)):
        label = labels.get(room, "")
        out += [AwaitStatus(room, side, DONE, timeout_s=CONCLUDE_S, label=label) for side in ("decode", "prefill")]
    if verify:
        by_room = {p.room: p for p in burst.rooms}
        done = [by_room[r] for r in burst.by_last_chunk]
        out.append(VerifyPools(tuple(m for p in done for m in p.kv_moves), tuple((p.aux_src, p.aux_dst) for p in done),
                               unchecked_kv=tuple(x for r in sorted(burst.aborted) for x in by_room[r].dst),
                               unchecked_aux=tuple(by_room[r].aux_dst for r in sorted(burst.aborted))))
    return out


__all__ = ["ABORT_ONE_IN", "Burst", "CONCLUDE_S", "ENV", "layout", "plan", "steps"]
