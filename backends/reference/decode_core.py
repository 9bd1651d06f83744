"""The reference decode side of the Common protocol, as a sans-I/O state machine.

Events in, actions out, time as ``now`` (seconds) on events.  Requirements
implemented (docs/protocol.md): R-XFER-1 (decode half), R-TERM-1, R-TIMEOUT-2,
R-HB-1, R-ABORT-2 (decode half: release only on the ACK of the current
generation), R-REUSE-1, R-RESIDUE-1, R-REASON-1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from backends.reference.shared_events import Clear, StatusChanged, Tick
from harness.spec.protocol import KVPoll

# ---- events ---------------------------------------------------------------------

@dataclass(frozen=True)
class OpenReceiver:
    """The scheduler created a receiver for ``room`` bound to prefill ``prefill``, a
    prefill of ``stages`` pipeline stages (each reports its own status)."""
    room: int
    prefill: str
    now: float
    stages: int = 1


@dataclass(frozen=True)
class RequestKV:
    """The receiver sends its destination pages and aux slot; the waiting deadline starts."""
    room: int
    dst_pages: tuple[int, ...]
    aux_slot: int
    now: float


@dataclass(frozen=True)
class StatusReceived:
    """Pipeline ``stage`` of the prefill reported a terminal status for ``room``."""
    room: int
    prefill: str
    status: int
    reason: str = ""
    generation: int = 0
    stage: int = 0


@dataclass(frozen=True)
class HeartbeatResult:
    """The health probe of ``prefill`` answered (``ok``) or not."""
    prefill: str
    ok: bool
    now: float


@dataclass(frozen=True)
class Abort:
    room: int


@dataclass(frozen=True)
class AbortAckReceived:
    room: int
    generation: int
    stage: int = 0


DecodeEvent = Union[OpenReceiver, RequestKV, StatusReceived, HeartbeatResult, Abort, AbortAckReceived, Clear, Tick]


# ---- actions --------------------------------------------------------------------

@dataclass(frozen=True)
class SendRegistration:
    room: int
    prefill: str
    dst_pages: tuple[int, ...]
    aux_slot: int
    generation: int


@dataclass(frozen=True)
class SendAbort:
    room: int
    prefill: str
    generation: int


@dataclass(frozen=True)
class ProbeHealth:
    prefill: str


@dataclass(frozen=True)
class ReleaseSafe:
    """Every write to the room's destination pages has drained: they may be reused."""
    room: int


DecodeAction = Union[SendRegistration, SendAbort, ProbeHealth, StatusChanged, ReleaseSafe]


@dataclass
class _Room:
    prefill: str
    generation: int
    status: int = KVPoll.Bootstrapping
    waiting_since: float | None = None
    awaiting_ack: bool = False
    reason: str = ""
    stages: int = 1  # the prefill's pipeline stages: Success needs each one's, so does the release
    succeeded: set = field(default_factory=set)
    acked: set = field(default_factory=set)


class DecodeCore:
    """Decode side state machine.  ``handle(event)`` returns the actions to perform.

    ``waiting_timeout_s``: a room that sent its metadata and got no terminal
    status this long after becomes Failed (R-TIMEOUT-2).  ``heartbeat_interval_s``
    and ``heartbeat_max_failures``: a prefill whose probe failed that many times
    in a row fails its rooms (R-HB-1).  ``deferred_release``: after an ABORT the
    pages are released only on the ACK of the current generation.
    """

    def __init__(self, waiting_timeout_s: float = 300.0, heartbeat_interval_s: float = 2.0,
                 heartbeat_max_failures: int = 2, deferred_release: bool = True):
        self.waiting_timeout_s = waiting_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_max_failures = heartbeat_max_failures
        self.deferred_release = deferred_release
        self.rooms: dict[int, _Room] = {}
        self.failures: dict[str, int] = {}
        self.last_probe: dict[str, float] = {}
        self._generation = 0

    def _set(self, room: int, r: _Room, status: int, reason: str = "") -> list[DecodeAction]:
        if r.status in (KVPoll.Success, KVPoll.Failed) or r.status == status:
            return []  # R-TERM-1
        r.status = status
        if status == KVPoll.Failed:
            r.reason = reason
        return [StatusChanged(room, status, reason)]

    def handle(self, event: DecodeEvent) -> list[DecodeAction]:
        return getattr(self, f"_on_{type(event).__name__}")(event)

    def _on_OpenReceiver(self, e: OpenReceiver) -> list[DecodeAction]:
        if e.room in self.rooms:
            return []
        self._generation += 1
        self.rooms[e.room] = _Room(e.prefill, self._generation, stages=max(1, e.stages))
        self.last_probe.setdefault(e.prefill, e.now)
        return [StatusChanged(e.room, KVPoll.Bootstrapping)]

    def _on_RequestKV(self, e: RequestKV) -> list[DecodeAction]:
        r = self.rooms.get(e.room)
        if r is None or r.status != KVPoll.Bootstrapping:
            return []
        r.waiting_since = e.now
        return self._set(e.room, r, KVPoll.WaitingForInput) + [
            SendRegistration(e.room, r.prefill, e.dst_pages, e.aux_slot, r.generation)]

    def _on_StatusReceived(self, e: StatusReceived) -> list[DecodeAction]:
        r = self.rooms.get(e.room)
        if r is None or r.prefill != e.prefill or r.waiting_since is None or e.generation != r.generation:
            return []  # a late message of an old lifecycle, or for another prefill (R-REUSE-1)
        if e.status == KVPoll.Success:
            r.succeeded.add(e.stage)
            if len(r.succeeded) < r.stages:  # a stage's layers landed; the others' are still due
                return []
            return self._set(e.room, r, KVPoll.Success) + ([ReleaseSafe(e.room)] if r.status == KVPoll.Success else [])
        if e.status == KVPoll.Failed:
            return self._set(e.room, r, KVPoll.Failed, e.reason or f"prefill {e.prefill} reported a failure")
        return []

    def _on_HeartbeatResult(self, e: HeartbeatResult) -> list[DecodeAction]:
        if not any(r.prefill == e.prefill for r in self.rooms.values()):
            return []  # a probe answered after the prefill's last room was cleared
        if e.ok:
            self.failures[e.prefill] = 0
            return []
        self.failures[e.prefill] = self.failures.get(e.prefill, 0) + 1
        if self.failures[e.prefill] < self.heartbeat_max_failures:
            return []
        actions: list[DecodeAction] = []
        for room, r in self.rooms.items():
            if r.prefill == e.prefill:
                actions += self._set(room, r, KVPoll.Failed,
                                     f"prefill {e.prefill} stopped answering its health endpoint")  # R-HB-1
        return actions

    def _on_Abort(self, e: Abort) -> list[DecodeAction]:
        r = self.rooms.get(e.room)
        if r is None:
            return []
        actions = self._set(e.room, r, KVPoll.Failed, "aborted")
        if r.status == KVPoll.Failed and not r.awaiting_ack and r.waiting_since is not None:
            actions.append(SendAbort(e.room, r.prefill, r.generation))
            if self.deferred_release:
                r.awaiting_ack = True
            else:
                actions.append(ReleaseSafe(e.room))
        return actions

    def _on_AbortAckReceived(self, e: AbortAckReceived) -> list[DecodeAction]:
        r = self.rooms.get(e.room)
        if r is None or not r.awaiting_ack or e.generation != r.generation:
            return []  # an ACK of another lifecycle (R-REUSE-1)
        r.acked.add(e.stage)
        if len(r.acked) < r.stages:  # every stage drains its own writes (R-ABORT-2)
            return []
        r.awaiting_ack = False
        return [ReleaseSafe(e.room)]

    def _on_Clear(self, e: Clear) -> list[DecodeAction]:
        r = self.rooms.pop(e.room, None)
        if r is not None and not any(x.prefill == r.prefill for x in self.rooms.values()):
            self.failures.pop(r.prefill, None)
            self.last_probe.pop(r.prefill, None)
        return []

    def _on_Tick(self, e: Tick) -> list[DecodeAction]:
        actions: list[DecodeAction] = []
        for room, r in self.rooms.items():
            if r.status == KVPoll.WaitingForInput and r.waiting_since is not None \
                    and e.now - r.waiting_since >= self.waiting_timeout_s:
                actions += self._set(room, r, KVPoll.Failed,
                                     f"no transfer result from prefill {r.prefill} within the waiting timeout "
                                     f"of {self.waiting_timeout_s:g} s")  # R-TIMEOUT-2
        for prefill, last in list(self.last_probe.items()):
            if e.now - last >= self.heartbeat_interval_s:
                self.last_probe[prefill] = e.now
                actions.append(ProbeHealth(prefill))
        return actions

    def status(self, room: int) -> int | None:
        r = self.rooms.get(room)
        return r.status if r else None

    def residue(self) -> dict[str, list]:
        found = {"rooms": sorted(self.rooms), "prefills": sorted(set(self.failures) | set(self.last_probe))}
        return {k: v for k, v in found.items() if v}
