"""A deterministic simulator for the reference cores: virtual clock, seeded network.

One seed reproduces one run.  A run drives one :class:`PrefillCore` and one
:class:`DecodeCore` through a workload of rooms (open, request, chunks, some
ABORTs, clear) over a simulated network that delays, drops, duplicates and
reorders messages and can be partitioned for a while, an engine that delays and fails writes, and an optional
crash of the prefill.  It checks the protocol's invariants while it runs and
at the end (docs/protocol.md):

* R-TERM-1: a room's terminal status never changes within its lifecycle;
* R-STALE-1 / R-ABORT-2: no write lands in decode pages after the decode
  released them, and ABORT_ACK comes at most once per generation;
* R-TIMEOUT-1/2, R-HB-1: every room is terminal once faults stop and timeouts pass;
* R-RESIDUE-1: after clear() on both sides and quiescence no per-room state remains.

The trace (every event delivered, with its virtual time) is the step list that
replays a failing seed.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from backends.reference import decode_core as dc
from backends.reference import prefill_core as pc
from harness.spec.protocol import KVPoll

#: the planted bugs a simulation may run with (test-only: backends.reference.prefill_core.PrefillCore)
PLANTED_BUGS = pc.PrefillCore.PLANTED_BUGS

P, D = "prefill-0", "decode-0"


@dataclass(frozen=True)
class SimConfig:
    """Knobs of one simulated run (seconds are virtual)."""

    rooms: int = 3
    max_pages: int = 6
    net_delay: tuple[float, float] = (0.001, 0.05)
    drop_p: float = 0.05
    dup_p: float = 0.05
    write_delay: tuple[float, float] = (0.001, 0.2)
    write_fail_p: float = 0.05
    abort_p: float = 0.3
    crash_p: float = 0.15
    partition_p: float = 0.2  # chance of one partition (every message both ways lost) ...
    partition_s: tuple[float, float] = (0.2, 3.0)  # ... lasting this long, inside the fault window
    fault_window_s: float = 5.0  # faults (drops, crash) happen before this time
    bootstrap_timeout_s: float = 8.0
    waiting_timeout_s: float = 10.0
    heartbeat_interval_s: float = 2.0
    heartbeat_max_failures: int = 2
    tick_s: float = 0.5
    horizon_s: float = 40.0
    planted_bug: str | None = None  # test-only: see PrefillCore


@dataclass
class SimResult:
    seed: int
    ok: bool
    violations: list[str]
    trace: list[str]
    events: int
    rooms_success: int = 0
    rooms_failed: int = 0


@dataclass(order=True)
class _Item:
    time: float
    seq: int
    target: str = field(compare=False)  # "P", "D", or "X" (simulator's own)
    event: object = field(compare=False)


class Simulation:
    """One seeded run.  ``run()`` returns a :class:`SimResult`."""

    def __init__(self, seed: int, config: SimConfig | None = None):
        self.seed = seed
        self.cfg = config or SimConfig()
        self.rng = random.Random(seed)
        self.prefill = pc.PrefillCore(self.cfg.bootstrap_timeout_s, deferred_release=True,
                                      planted_bug=self.cfg.planted_bug)
        self.decode = dc.DecodeCore(self.cfg.waiting_timeout_s, self.cfg.heartbeat_interval_s,
                                    self.cfg.heartbeat_max_failures, deferred_release=True)
        self.queue: list[_Item] = []
        self.seq = 0
        self.now = 0.0
        self.prefill_alive = True
        self.trace: list[str] = []
        self.violations: list[str] = []
        self.terminal: dict[tuple[str, int], int] = {}
        self.released: set[int] = set()  # decode rooms whose pages may be reused
        self.acks: set[tuple[int, int]] = set()
        self.outcome: dict[int, int] = {}
        self.writes_in_flight: dict[int, int] = {}  # write id -> room
        self.partition: tuple[float, float] = (0.0, 0.0)

    # ---- scheduling ----------------------------------------------------------
    def at(self, time: float, target: str, event: object) -> None:
        self.seq += 1
        heapq.heappush(self.queue, _Item(time, self.seq, target, event))

    def send(self, target: str, event: object) -> None:
        """Network: seeded delay (so reordering), drop and duplication inside the fault window."""
        faulty = self.now < self.cfg.fault_window_s
        if self.partition[0] <= self.now < self.partition[1]:
            self.trace.append(f"t={self.now:.3f} net partition {target}<-{event}")
            return
        if faulty and self.rng.random() < self.cfg.drop_p:
            self.trace.append(f"t={self.now:.3f} net drop {target}<-{event}")
            return
        copies = 2 if faulty and self.rng.random() < self.cfg.dup_p else 1
        for _ in range(copies):
            self.at(self.now + self.rng.uniform(*self.cfg.net_delay), target, event)

    def violate(self, message: str) -> None:
        self.violations.append(f"t={self.now:.3f} {message}")

    # ---- workload --------------------------------------------------------------
    def _workload(self) -> None:
        for room in range(1, self.cfg.rooms + 1):
            t = self.rng.uniform(0, 2)
            pages = self.rng.randint(1, self.cfg.max_pages)
            self.at(t, "D", dc.OpenReceiver(room, P, t))
            self.at(t + self.rng.uniform(0, 0.3), "P", pc.OpenSender(room, t))
            self.at(t + 0.1, "X", ("request", room, pages))
            self.at(t + 0.4, "X", ("send", room, pages))
            if self.rng.random() < self.cfg.abort_p:
                self.at(t + self.rng.uniform(0.1, 3), "D", dc.Abort(room))
        if self.rng.random() < self.cfg.partition_p:
            start = self.rng.uniform(0, self.cfg.fault_window_s)
            self.partition = (start, start + self.rng.uniform(*self.cfg.partition_s))
            self.trace.append(f"partition from t={self.partition[0]:.3f} to t={self.partition[1]:.3f}")
        if self.rng.random() < self.cfg.crash_p:
            self.at(self.rng.uniform(0.5, self.cfg.fault_window_s), "X", ("crash",))
        tick = 0.0
        # ticks go on past clear-all so that tombstones and pending registrations expire
        while tick < self.cfg.horizon_s + self.cfg.bootstrap_timeout_s + 2:
            tick += self.cfg.tick_s
            self.at(tick, "X", ("tick",))
        self.at(self.cfg.horizon_s, "X", ("clear-all",))

    # ---- delivery --------------------------------------------------------------
    def _to_prefill(self, event) -> None:
        if not self.prefill_alive:
            return
        if isinstance(event, pc.WriteDone) and event.ok:
            self._land(event)
        for action in self.prefill.handle(event):
            self._prefill_action(action)

    def _land(self, done: pc.WriteDone) -> None:
        room = self.writes_in_flight.pop(done.write_id, done.room)
        if room in self.released:
            self.violate(f"write {done.write_id} landed in room {room}'s pages after the decode released them")

    def _prefill_action(self, a) -> None:
        if isinstance(a, pc.StartWrite):
            self.writes_in_flight[a.write_id] = a.room
            ok = self.rng.random() >= self.cfg.write_fail_p
            self.at(self.now + self.rng.uniform(*self.cfg.write_delay), "P",
                    pc.WriteDone(a.room, a.write_id, ok, "" if ok else "injected engine error"))
        elif isinstance(a, pc.SendStatus):
            self.send("D", dc.StatusReceived(a.room, P, a.status, a.reason, a.generation))
        elif isinstance(a, pc.SendAbortAck):
            key = (a.room, a.generation)
            if key in self.acks and a.room in self.prefill.rooms:
                self.violate(f"second ABORT_ACK for room {a.room} generation {a.generation}")
            self.acks.add(key)
            self.send("D", dc.AbortAckReceived(a.room, a.generation))
        elif isinstance(a, pc.StatusChanged):
            self._status("prefill", a.room, a.status)

    def _to_decode(self, event) -> None:
        for action in self.decode.handle(event):
            if isinstance(action, dc.SendRegistration):
                self.send("P", pc.DecodeRegistered(action.room, D, action.dst_pages, action.aux_slot,
                                                   action.generation))
            elif isinstance(action, dc.SendAbort):
                self.send("P", pc.AbortReceived(action.room, D, action.generation))
            elif isinstance(action, dc.ProbeHealth):
                self.at(self.now + 0.01, "D", dc.HeartbeatResult(action.prefill, self.prefill_alive, self.now))
            elif isinstance(action, dc.ReleaseSafe):
                self.released.add(action.room)
            elif isinstance(action, dc.StatusChanged):
                self._status("decode", action.room, action.status)
                if action.status in (KVPoll.Success, KVPoll.Failed):
                    self.outcome[action.room] = action.status

    def _status(self, side: str, room: int, status: int) -> None:
        key = (side, room)
        old = self.terminal.get(key)
        if old is not None and old != status:
            self.violate(f"{side} room {room} changed from terminal {old} to {status}")
        if status in (KVPoll.Success, KVPoll.Failed):
            self.terminal[key] = status

    def _own(self, event: tuple) -> None:
        kind = event[0]
        if kind == "tick":
            self._to_decode(dc.Tick(self.now))
            self._to_prefill(pc.Tick(self.now))
        elif kind == "request":
            _, room, pages = event
            dst = tuple(self.rng.sample(range(64), pages))
            self._to_decode(dc.RequestKV(room, dst, 0, self.now))
        elif kind == "send":  # like sglang's scheduler: only once the sender is WaitingForInput
            _, room, pages = event
            status = self.prefill.status(room) if self.prefill_alive else None
            if status == KVPoll.WaitingForInput:
                self._to_prefill(pc.InitSender(room, pages, 0))
                split = self.rng.randint(0, pages)
                self._to_prefill(pc.SendChunk(room, tuple(range(split)), last=False))
                self._to_prefill(pc.SendChunk(room, tuple(range(split, pages)), last=True))
            elif status not in (None, KVPoll.Success, KVPoll.Failed):
                self.at(self.now + self.cfg.tick_s, "X", event)  # try again later
        elif kind == "crash":
            self.prefill_alive = False
            deadline = self.cfg.heartbeat_interval_s * (self.cfg.heartbeat_max_failures + 1) + self.cfg.tick_s + 1
            self.at(self.now + deadline, "X", ("heartbeat-deadline",))
        elif kind == "heartbeat-deadline":  # R-HB-1: the dead prefill's rooms are Failed by now
            for room, r in self.decode.rooms.items():
                if r.status not in (KVPoll.Success, KVPoll.Failed):
                    self.violate(f"decode room {room} still {r.status} after the dead prefill's heartbeat window")
        elif kind == "clear-all":
            self._clear_all()

    def _clear_all(self) -> None:
        faultless = (self.cfg.drop_p == 0 and self.partition == (0.0, 0.0) and self.prefill_alive)
        for room, r in list(self.decode.rooms.items()):
            if faultless and r.awaiting_ack:  # ABORT_ACK liveness when no message was lost
                self.violate(f"decode room {room} never got its ABORT_ACK")
        for room in list(self.decode.rooms):
            if self.decode.status(room) not in (KVPoll.Success, KVPoll.Failed):
                self.violate(f"decode room {room} still {self.decode.status(room)} after every timeout passed")
            self._to_decode(dc.Clear(room))
        if self.prefill_alive:
            for room in list(self.prefill.rooms):
                if self.prefill.status(room) not in (KVPoll.Success, KVPoll.Failed):
                    self.violate(f"prefill room {room} still {self.prefill.status(room)} after every timeout passed")
                self._to_prefill(pc.Clear(room))

    # ---- run -------------------------------------------------------------------
    def run(self) -> SimResult:
        self._workload()
        delivered = 0
        while self.queue:
            item = heapq.heappop(self.queue)
            self.now = item.time
            delivered += 1
            if item.target != "X" or item.event[0] != "tick":
                self.trace.append(f"t={self.now:.3f} {item.target}<-{item.event}")
            if item.target == "P":
                self._to_prefill(item.event)
            elif item.target == "D":
                self._to_decode(item.event)
            else:
                self._own(item.event)
        if self.decode.residue():
            self.violate(f"decode residue after clear and quiescence: {self.decode.residue()}")
        if self.prefill_alive and self.prefill.residue():
            self.violate(f"prefill residue after clear and quiescence: {self.prefill.residue()}")
        return SimResult(self.seed, not self.violations, self.violations, self.trace, delivered,
                         rooms_success=sum(1 for s in self.outcome.values() if s == KVPoll.Success),
                         rooms_failed=sum(1 for s in self.outcome.values() if s == KVPoll.Failed))


def simulate(seed: int, config: SimConfig | None = None) -> SimResult:
    """Run one seeded simulation."""
    return Simulation(seed, config).run()
