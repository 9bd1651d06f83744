"""The reference prefill side of the Common protocol, as a sans-I/O state machine.

Events in, actions out: no sockets, threads, clocks or randomness.  Time comes
in as ``now`` (seconds) on events; drivers (a real one with ZMQ and threads, a
deterministic simulator) turn actions into I/O and feed results back as events.

Requirements implemented (docs/protocol.md): R-XFER-1, R-TERM-1, R-TIMEOUT-1,
R-STALE-1, R-ABORT-1, R-ABORT-2, R-REUSE-1, R-RESIDUE-1, R-FANOUT-1, R-PEER-1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from backends.reference.shared_events import Clear, Log, StatusChanged, Tick
from harness.spec.protocol import KVPoll

#: residue entries that are the bounded memory of ended generations R-REUSE-1 allows
#: (they expire at the bootstrap timeout), not leftover state of a live room
ENDED_GENERATION_MEMORY = frozenset({"acked", "tombstones", "retired"})

# ---- events ---------------------------------------------------------------------

@dataclass(frozen=True)
class OpenSender:
    """The scheduler created a sender for ``room`` at time ``now`` (s); the room has
    ``destinations`` decode ranks (more than one when the decode's attention TP is
    wider than the prefill's; 0 for a TP rank no decode rank takes KV from, MLA's extra
    prefill ranks: the room waits for no registration and concludes when its last chunk
    is sent, writing nothing, as sglang's dummy registrations let such a rank)."""
    room: int
    now: float
    destinations: int = 1


@dataclass(frozen=True)
class DecodeRegistered:
    """The decode sent its destination ``dst_pages`` and ``aux_slot`` for ``room``."""
    room: int
    decode: str
    dst_pages: tuple[int, ...]
    aux_slot: int
    generation: int = 0  # the decode's room lifecycle, echoed in status messages


@dataclass(frozen=True)
class InitSender:
    room: int
    num_pages: int
    aux_slot: int


@dataclass(frozen=True)
class SendChunk:
    """The scheduler sends source ``pages``; ``last`` also sends the aux slot."""
    room: int
    pages: tuple[int, ...]
    last: bool


@dataclass(frozen=True)
class WriteDone:
    """The engine finished write ``write_id`` (``ok`` False: it failed, ``reason`` says why)."""
    room: int
    write_id: int
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class DecodeLost:
    """The engine lost ``decode`` (its control endpoint): the connection to it closed, or it
    refuses connections, as when its process was killed.  Every write to it that has not
    completed has failed (``reason`` says how the loss was seen), as an RDMA engine fails the
    work outstanding on a broken connection; the driver makes sure none of them lands (the
    reference's closes the connection, dropping what is queued on it).  R-PEER-1: a prefill
    learns of its decode's death only through its writes, so a write to a dead decode must fail,
    not wait out the transfer timeout after its room has ended and been cleared (R-RESIDUE-1)."""
    decode: str
    reason: str = ""


@dataclass(frozen=True)
class AbortReceived:
    """An ABORT from ``decode`` for the decode's room lifecycle ``generation``."""
    room: int
    decode: str
    generation: int


@dataclass(frozen=True)
class LocalAbort:
    """The prefill's scheduler aborts the request (sglang ``CommonKVSender.abort``)."""
    room: int


PrefillEvent = Union[OpenSender, DecodeRegistered, InitSender, SendChunk, WriteDone, DecodeLost, AbortReceived,
                     LocalAbort, Clear, Tick]


# ---- actions --------------------------------------------------------------------

@dataclass(frozen=True)
class StartWrite:
    """Write source pages (or the aux slot when ``aux``) into the decode's destinations."""
    room: int
    write_id: int
    decode: str
    src: tuple[int, ...]
    dst: tuple[int, ...]
    aux: bool = False
    generation: int = 0  # the destination's room lifecycle


@dataclass(frozen=True)
class SendStatus:
    """Tell the decode the room's terminal status (Success or Failed, with a reason),
    for the decode's lifecycle ``generation``."""
    room: int
    decode: str
    status: int
    reason: str = ""
    generation: int = 0


@dataclass(frozen=True)
class SendAbortAck:
    room: int
    decode: str
    generation: int


PrefillAction = Union[StartWrite, SendStatus, SendAbortAck, StatusChanged, Log]


# ---- state ------------------------------------------------------------------------

@dataclass
class _Dest:
    """One decode rank of a room: where its pages go, and its lifecycle."""
    dst_pages: tuple[int, ...]
    dst_aux: int
    generation: int


@dataclass
class _Room:
    opened_at: float
    destinations: int = 1
    status: int = KVPoll.Bootstrapping
    dests: dict[str, _Dest] = field(default_factory=dict)
    num_pages: int | None = None
    src_aux: int | None = None
    sent: int = 0  # pages handed to the engine so far
    last_sent: bool = False
    outstanding: set[int] = field(default_factory=set)
    reason: str = ""

    @property
    def dst_pages(self) -> tuple[int, ...]:
        """The shortest destination page list (every destination gets every chunk)."""
        return min((d.dst_pages for d in self.dests.values()), key=len, default=())


@dataclass
class _Drain:
    """What is left of a room that was cleared or failed with writes still in flight."""
    outstanding: set[int]
    ack_to: list[tuple[str, int]] = field(default_factory=list)  # (decode, generation) owed an ABORT_ACK


class PrefillCore:
    """Prefill side state machine.  ``handle(event)`` returns the actions to perform.

    ``bootstrap_timeout_s``: a room still Bootstrapping this long after it was
    opened becomes Failed (R-TIMEOUT-1).  ``deferred_release``: ABORT is answered
    with one ABORT_ACK once the room's writes have drained (R-ABORT-2).
    ``transfer_timeout_s``: a write the engine has not completed this long after it
    was issued is declared lost: its room becomes Failed (R-TIMEOUT-3) and a drain
    stops waiting for it, so the driver must make sure a lost write never lands
    (the reference's driver cancels it) (None: writes are waited for forever).
    ``planted_bug``: test-only switch that breaks one rule on purpose, so tests
    can show the stateful test and the simulator find it (``"ack-before-drain"``:
    answer ABORT at once, with writes still in flight).
    """

    PLANTED_BUGS = ("ack-before-drain",)

    def __init__(self, bootstrap_timeout_s: float = 30.0, deferred_release: bool = True,
                 planted_bug: str | None = None, transfer_timeout_s: float | None = None):
        if planted_bug is not None and planted_bug not in self.PLANTED_BUGS:
            raise ValueError(f"unknown planted bug {planted_bug!r} (known: {', '.join(self.PLANTED_BUGS)})")
        self.bootstrap_timeout_s = bootstrap_timeout_s
        self.transfer_timeout_s = transfer_timeout_s
        self.deferred_release = deferred_release
        self.planted_bug = planted_bug
        self.rooms: dict[int, _Room] = {}
        # Registrations that arrived before the sender, and ABORTed generations of rooms
        # not held yet (a late registration of one must not start a transfer into pages
        # the decode already reused).  Both expire after the bootstrap timeout.
        # Times are None until the first event that carries one (drivers use any clock).
        self.registrations: dict[int, dict[str, tuple[DecodeRegistered, float | None]]] = {}
        self.tombstones: dict[tuple[int, str, int], float | None] = {}  # ABORTed and answered
        # Generations of cleared rooms: a late duplicate registration of one is refused.
        self.retired: dict[tuple[int, str, int], float | None] = {}
        self.clock: float | None = None  # latest time seen on an event
        self.draining: dict[int, _Drain] = {}
        self.acked: set[tuple[int, str, int]] = set()  # (room, decode, generation) answered, until clear
        # write id -> (room, time issued, the decode written to), until it completes or is declared lost
        self.issued: dict[int, tuple[int, float | None, str]] = {}
        self._next_write = 0

    # -- helpers -------------------------------------------------------------------
    def _set(self, room: int, r: _Room, status: int, reason: str = "") -> list[PrefillAction]:
        if r.status in (KVPoll.Success, KVPoll.Failed) or r.status == status:
            return []  # terminal until clear (R-TERM-1)
        r.status = status
        r.reason = reason if status == KVPoll.Failed else r.reason
        actions: list[PrefillAction] = [StatusChanged(room, status, reason)]
        if status in (KVPoll.Success, KVPoll.Failed):  # every destination hears it (R-FANOUT-1)
            actions += [SendStatus(room, decode, status, reason, d.generation) for decode, d in r.dests.items()]
        return actions

    def _write(self, room: int, r: _Room, decode: str, src: tuple[int, ...], dst: tuple[int, ...],
               aux: bool) -> StartWrite:
        self._next_write += 1
        r.outstanding.add(self._next_write)
        self.issued[self._next_write] = (room, self.clock, decode)
        return StartWrite(room, self._next_write, decode, src, dst, aux, r.dests[decode].generation)

    def _expiry(self) -> float | None:
        return None if self.clock is None else self.clock + self.bootstrap_timeout_s

    def _see(self, now: float) -> None:
        self.clock = now if self.clock is None else max(self.clock, now)

    def _maybe_success(self, room: int, r: _Room) -> list[PrefillAction]:
        if r.status == KVPoll.Transferring and r.last_sent and not r.outstanding:
            return self._set(room, r, KVPoll.Success)
        return []

    def _bind(self, room: int, r: _Room, reg: DecodeRegistered) -> list[PrefillAction]:
        r.dests[reg.decode] = _Dest(reg.dst_pages, reg.aux_slot, reg.generation)
        if len(r.dests) < r.destinations:
            return []
        return self._set(room, r, KVPoll.WaitingForInput)

    # -- events --------------------------------------------------------------------
    def handle(self, event: PrefillEvent) -> list[PrefillAction]:
        return getattr(self, f"_on_{type(event).__name__}")(event)

    def _on_OpenSender(self, e: OpenSender) -> list[PrefillAction]:
        if e.room in self.rooms:
            return [Log("warning", f"room {e.room} opened twice; keeping the first sender")]
        self._see(e.now)
        r = self.rooms[e.room] = _Room(opened_at=e.now, destinations=max(0, e.destinations))
        actions: list[PrefillAction] = [StatusChanged(e.room, KVPoll.Bootstrapping)]
        if r.destinations == 0:  # a TP rank no decode rank takes KV from (MLA): nothing to wait for
            return actions + self._set(e.room, r, KVPoll.WaitingForInput)
        for reg, _ in self.registrations.pop(e.room, {}).values():
            actions += self._bind(e.room, r, reg)
        return actions

    def _on_DecodeRegistered(self, e: DecodeRegistered) -> list[PrefillAction]:
        key = (e.room, e.decode, e.generation)
        if key in self.tombstones or key in self.retired:  # R-REUSE-1, R-ABORT-2
            return [Log("info", f"room {e.room}: registration of ended generation {e.generation} from {e.decode} dropped")]
        r = self.rooms.get(e.room)
        if r is None:  # the decode may be faster than the scheduler
            self.registrations.setdefault(e.room, {})[e.decode] = (e, self.clock)
            return []
        if r.status != KVPoll.Bootstrapping:
            return [Log("warning", f"room {e.room}: registration while {r.status}; dropped")]
        return self._bind(e.room, r, e)

    def _on_InitSender(self, e: InitSender) -> list[PrefillAction]:
        r = self.rooms.get(e.room)
        if r is None:
            return [Log("warning", f"room {e.room}: init for an unknown room; dropped")]
        r.num_pages, r.src_aux = e.num_pages, e.aux_slot
        return []

    def _on_SendChunk(self, e: SendChunk) -> list[PrefillAction]:
        r = self.rooms.get(e.room)
        if r is None or r.status in (KVPoll.Success, KVPoll.Failed):
            why = "unknown or cleared" if r is None else "concluded"
            return [Log("debug", f"room {e.room}: chunk for a {why} room dropped")]  # R-STALE-1
        if r.status == KVPoll.Bootstrapping or r.num_pages is None:
            return self._set(e.room, r, KVPoll.Failed, "chunk sent before the decode registered or init")
        end = r.sent + len(e.pages)
        if (r.dests and end > len(r.dst_pages)) or end > r.num_pages:
            return self._set(e.room, r, KVPoll.Failed,
                             f"chunk ends at page {end}, past the decode's {len(r.dst_pages)} destination pages")
        if e.last and end != r.num_pages:
            return self._set(e.room, r, KVPoll.Failed, f"last chunk ends at page {end} of {r.num_pages}")
        actions = self._set(e.room, r, KVPoll.Transferring)
        for decode, d in r.dests.items():
            if e.pages:
                actions.append(self._write(e.room, r, decode, e.pages, d.dst_pages[r.sent:end], aux=False))
            if e.last and r.src_aux is not None:
                actions.append(self._write(e.room, r, decode, (r.src_aux,), (d.dst_aux,), aux=True))
        r.sent = end
        if e.last:
            r.last_sent = True
            actions += self._maybe_success(e.room, r)
        return actions

    def _on_WriteDone(self, e: WriteDone) -> list[PrefillAction]:
        self.issued.pop(e.write_id, None)
        drain = self.draining.get(e.room)
        if drain is not None and e.write_id in drain.outstanding:
            drain.outstanding.discard(e.write_id)
            return self._finish_drain(e.room, drain)
        r = self.rooms.get(e.room)
        if r is None or e.write_id not in r.outstanding:
            return [Log("debug", f"room {e.room}: completion of unknown write {e.write_id} dropped")]
        r.outstanding.discard(e.write_id)
        if not e.ok:  # every destination is told at once (R-FANOUT-1)
            return self._set(e.room, r, KVPoll.Failed, f"write {e.write_id} failed: {e.reason}")
        return self._maybe_success(e.room, r)

    def _on_DecodeLost(self, e: DecodeLost) -> list[PrefillAction]:
        """Every write to the lost decode that has not completed fails (see :class:`DecodeLost`):
        its room, if still held, becomes Failed with the reason (R-PEER-1, R-REASON-1); a room
        cleared or failed already stops draining it (R-ABORT-3: a failed write counts as drained)."""
        why = e.reason or "its connection closed"
        actions: list[PrefillAction] = []
        for write_id, (room, _, decode) in list(self.issued.items()):
            if decode == e.decode:
                actions += self.handle(WriteDone(room, write_id, False, f"decode {e.decode} lost: {why}"))
        return actions

    def _finish_drain(self, room: int, drain: _Drain) -> list[PrefillAction]:
        if drain.outstanding:
            return []
        del self.draining[room]
        actions: list[PrefillAction] = []
        for decode, generation in drain.ack_to:
            actions += self._ack(room, decode, generation)
        return actions

    def _ack(self, room: int, decode: str, generation: int) -> list[PrefillAction]:
        key = (room, decode, generation)
        if not self.deferred_release or key in self.acked or key in self.tombstones:
            return []  # answered already (a tombstone records an ACK sent for a room not held)
        if room in self.rooms:  # remember within the room's lifecycle; clear forgets (R-REUSE-1)
            self.acked.add(key)
        return [SendAbortAck(room, decode, generation)]

    def _on_AbortReceived(self, e: AbortReceived) -> list[PrefillAction]:
        """An ABORT ends the lifecycle it names (R-ABORT-1): the room if this decode's
        registration of that generation is bound to it; otherwise the generation is
        tombstoned so its registration can never start a transfer, and the room (a
        newer lifecycle, or one that has not heard from this decode) is left alone."""
        r = self.rooms.get(e.room)
        bound = r.dests.get(e.decode) if r is not None else None
        if bound is not None and bound.generation != e.generation:
            return [Log("info", f"room {e.room}: ABORT of old generation {e.generation} from {e.decode} ignored")]
        held = bound is not None
        actions = self._set(e.room, r, KVPoll.Failed, f"aborted by decode {e.decode}") if held else []
        if held and r.outstanding and self.planted_bug != "ack-before-drain":  # drain first
            self.draining.setdefault(e.room, _Drain(set())).outstanding |= r.outstanding
            r.outstanding.clear()
        drain = self.draining.get(e.room)
        if drain is not None:  # ACK once the writes drain (R-ABORT-2)
            if (e.decode, e.generation) not in drain.ack_to:
                drain.ack_to.append((e.decode, e.generation))
            return actions
        if not held:
            pending = self.registrations.get(e.room, {})
            if e.decode in pending and pending[e.decode][0].generation == e.generation:
                del pending[e.decode]
                if not pending:
                    del self.registrations[e.room]
            actions.append(Log("info", f"ABORT for room {e.room} generation {e.generation} not bound here: "
                                       "nothing of it was written"))
            actions += self._ack(e.room, e.decode, e.generation)
            self.retired.pop((e.room, e.decode, e.generation), None)
            self.tombstones.setdefault((e.room, e.decode, e.generation), self._expiry())
            return actions
        return actions + self._ack(e.room, e.decode, e.generation)

    def _on_LocalAbort(self, e: LocalAbort) -> list[PrefillAction]:
        r = self.rooms.get(e.room)
        if r is None:
            return [Log("info", f"abort of room {e.room} that is not held: nothing to do")]
        return self._set(e.room, r, KVPoll.Failed, "aborted by the prefill")

    def _on_Clear(self, e: Clear) -> list[PrefillAction]:
        r = self.rooms.pop(e.room, None)
        self.registrations.pop(e.room, None)
        for decode, d in (r.dests.items() if r is not None else ()):
            key = (e.room, decode, d.generation)
            # an answered ABORT stays answered; any other ended generation is only retired
            (self.tombstones if key in self.acked else self.retired).setdefault(key, self._expiry())
        self.acked = {key for key in self.acked if key[0] != e.room}
        if r is not None and r.outstanding:
            drain = self.draining.setdefault(e.room, _Drain(set()))
            drain.outstanding |= r.outstanding
        return []

    def _on_Tick(self, e: Tick) -> list[PrefillAction]:
        self._see(e.now)
        for memory in (self.tombstones, self.retired):
            for key, expiry in list(memory.items()):
                if expiry is None:  # created before any time was known
                    memory[key] = e.now + self.bootstrap_timeout_s
                elif e.now >= expiry:
                    del memory[key]
        for room, pending in list(self.registrations.items()):
            for decode, (reg, arrived) in list(pending.items()):
                if arrived is None:
                    pending[decode] = (reg, e.now)
                elif e.now - arrived >= self.bootstrap_timeout_s:
                    del pending[decode]
            if not pending:
                del self.registrations[room]
        actions: list[PrefillAction] = self._expire_writes(e.now)
        for room, r in list(self.rooms.items()):
            if r.status == KVPoll.Bootstrapping and e.now - r.opened_at >= self.bootstrap_timeout_s:
                actions += self._set(room, r, KVPoll.Failed,
                                     f"decode did not register within the bootstrap timeout of {self.bootstrap_timeout_s:g} s")
        return actions

    def _expire_writes(self, now: float) -> list[PrefillAction]:
        """Declare writes older than the transfer timeout lost (R-TIMEOUT-3)."""
        if self.transfer_timeout_s is None:
            return []
        actions: list[PrefillAction] = []
        for write_id, (room, issued, decode) in list(self.issued.items()):
            if issued is None:
                self.issued[write_id] = (room, now, decode)
                continue
            if now - issued < self.transfer_timeout_s:
                continue
            del self.issued[write_id]
            drain = self.draining.get(room)
            if drain is not None and write_id in drain.outstanding:
                drain.outstanding.discard(write_id)
                actions += self._finish_drain(room, drain)
            r = self.rooms.get(room)
            if r is not None and write_id in r.outstanding:
                r.outstanding.discard(write_id)
                actions += self._set(room, r, KVPoll.Failed, f"write {write_id} did not complete within the transfer "
                                                      f"timeout of {self.transfer_timeout_s:g} s")
        return actions

    # -- observation ---------------------------------------------------------------
    def status(self, room: int) -> int | None:
        r = self.rooms.get(room)
        return r.status if r else None

    def residue(self) -> dict[str, list[int]]:
        """Per-room state held anywhere (empty after clear and quiescence, R-RESIDUE-1)."""
        found = {"rooms": sorted(self.rooms), "registrations": sorted(self.registrations),
                 "draining": sorted(self.draining), "writes": sorted({room for room, *_ in self.issued.values()}),
                 "acked": sorted({key[0] for key in self.acked}),
                 "tombstones": sorted({key[0] for key in self.tombstones}),
                 "retired": sorted({key[0] for key in self.retired})}
        return {k: v for k, v in found.items() if v}
