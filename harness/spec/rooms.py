"""Room plans and the step runs that open, finish and verify rooms: the building blocks
of the scripted scenarios (scenarios/_flows.py re-exports them) and of generated programs
(harness.explore.program)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from harness.spec.protocol import KVPoll, Layout
from harness.spec.steps import AwaitStatus, InitSender, OpenRoom, RequestKV, SendChunk, VerifyPools

LAYOUT = Layout(num_layers=3, num_pages=16, page_size=4, page_bytes=256, aux_slots=4, aux_bytes=64)
DONE = (KVPoll.Success, KVPoll.Failed)
ANY_STATUS = tuple(KVPoll)  # a poll that reads whatever the room says now
#: a room moved for a long-lived role pair (harness.drive.pair) moves by multiples of this: 840 is
#: divisible by every DP size up to 8, so each room keeps its DP engine (R-DP-1)
ROOM_STRIDE = 840 * 2**21
MAX_SHIFTS = (2**62 - 1) // ROOM_STRIDE  # rooms below 2^62 stay below 2^63 when moved
LATE_SETTLE_S = 0.5  # after a late message is delivered, before the room is read (its handling takes milliseconds)


@dataclass(frozen=True)
class RoomPlan:
    """One room: its id, prefill source pages, decode destination pages (same order),
    aux slots and its chunks (slices of ``src``)."""

    room: int
    src: tuple[int, ...]
    dst: tuple[int, ...]
    aux_src: int
    aux_dst: int
    chunks: tuple[tuple[int, ...], ...]
    prefill: str = "prefill"
    decode: str = "decode"

    @property
    def kv_moves(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.src, self.dst))


class RoomAllocator:
    """Hands out rooms with disjoint decode pages and aux slots inside one cell,
    drawn from ``seed``; ValueError when the layout has no room left."""

    def __init__(self, seed: int, layout: Layout = LAYOUT):
        self.rng = random.Random(seed)
        self.layout = layout
        self.free_pages = self.rng.sample(range(layout.num_pages), layout.num_pages)
        self.free_aux = self.rng.sample(range(layout.aux_slots), layout.aux_slots)

    def room(self, num_pages: int = 3, chunks: int = 2, prefill: str = "prefill", decode: str = "decode") -> RoomPlan:
        if num_pages > len(self.free_pages) or not self.free_aux:
            raise ValueError("the layout has no free decode pages or aux slots left for another room")
        src = tuple(sorted(self.rng.sample(range(self.layout.num_pages), num_pages)))
        dst = tuple(self.free_pages[:num_pages])
        del self.free_pages[:num_pages]
        cuts = sorted(self.rng.sample(range(1, num_pages), min(chunks, num_pages) - 1)) if chunks > 1 else []
        bounds = [0, *cuts, num_pages]
        parts = tuple(src[a:b] for a, b in zip(bounds, bounds[1:]))
        return RoomPlan(self.rng.randrange(1, 2**62), src, dst, self.rng.randrange(self.layout.aux_slots),
                        self.free_aux.pop(), parts, prefill, decode)


def reused_room(seed: int) -> tuple[RoomPlan, RoomPlan]:
    """Two lifecycles of one room number, with disjoint decode pages and aux slots (the
    second is what a reuse of the number after ``clear`` brings)."""
    planner = RoomAllocator(seed)
    first = planner.room()
    return first, replace(planner.room(), room=first.room)


def open_and_request(p: RoomPlan) -> list:
    """Sender and receiver created, the decode's pages sent; waits for the prefill
    to be WaitingForInput."""
    return [OpenRoom(p.room, prefill=p.prefill, decode=p.decode),
            RequestKV(p.room, p.dst, p.aux_dst, decode=p.decode),
            AwaitStatus(p.room, p.prefill, (KVPoll.WaitingForInput, KVPoll.Failed))]


def send_all(p: RoomPlan) -> list:
    return [InitSender(p.room, len(p.src), p.aux_src, prefill=p.prefill),
            *[SendChunk(p.room, chunk, prefill=p.prefill) for chunk in p.chunks]]


def await_done(p: RoomPlan, timeout_s: float | None = None) -> list:
    """Await a terminal status on the decode, then the prefill (``timeout_s``: each;
    default harness.spec.steps.STEP_TIMEOUT_S).  The decode first, as a decode scheduler
    polls its receivers without waiting for the prefill: its first Success is read while
    the prefill's other ranks or stages may still be writing, which is when the generic
    bytes-in-place-at-success (R-XFER-2) copies the room's rows."""
    bound = {} if timeout_s is None else {"timeout_s": timeout_s}
    return [AwaitStatus(p.room, p.decode, DONE, **bound), AwaitStatus(p.room, p.prefill, DONE, **bound)]


def full_room(p: RoomPlan) -> list:
    """A whole room from creation to Success on both sides."""
    return open_and_request(p) + send_all(p) + await_done(p)


def verify(rooms: list[RoomPlan], decode: str = "decode", unchecked_kv: tuple[int, ...] = (),
           unchecked_aux: tuple[int, ...] = ()) -> VerifyPools:
    """Every byte of the decode's pools: these rooms' pages and aux slots landed, the rest untouched."""
    return VerifyPools(tuple(m for p in rooms for m in p.kv_moves), tuple((p.aux_src, p.aux_dst) for p in rooms),
                       decode=decode, unchecked_kv=unchecked_kv, unchecked_aux=unchecked_aux)
