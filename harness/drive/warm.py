"""Matrix cells on warm role pairs: the roles' start paid once per implementation and StartRoles.

Almost all of a cell's CPU is the start of its roles: forking them, sglang's ServerArgs and
managers, the transfer engines.  A real server pays that once and serves many requests, each
in a bootstrap room of its own; :class:`WarmPairs` does the same for a run's cells.  It keeps,
per implementation and StartRoles step (the whole step: topology, layouts, environment), idle
long-lived role pairs (harness.drive.pair.RolePair); a cell takes one (or starts one), runs on
it with its rooms moved to ones no earlier cell of the pair used (harness.drive.room_shift),
and gives it back only when the pair can vouch for its roles afterwards
(harness.drive.pair.kept, retires_pair and held_writes: no kill, restart, interleaving point,
network fault, freeze, injected frame or failed engine write, every role process the same and
alive, no dead loop or thread, no write an engine fault held still in flight); otherwise the
pair ends with the cell, and a cell that would end its pair starts none.  A failing check does
not end a pair: half of the default set's cells are known non-PASS.

Each cell's history reads like an isolated cell's (the same events, its own rooms, a
``pair`` entry in its cell-start).  The scheduler (harness.drive.scheduler) confirms every
cell whose result is not the expected one in a fresh isolated cell before it is reported;
``run --isolated`` (and ``repro``) runs every cell isolated.
"""

from __future__ import annotations

import collections
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.drive.pair import RolePair, retires_pair
from harness.drive.remote import HOSTS_ENV
from harness.drive.room_shift import shiftable
from harness.spec import steps as s
from harness.spec.scenario import Scenario

#: steps a cell on a pair cannot take: roles of their own (generated layouts, layout pairs, a
#: second StartRoles) or a network between hosts
UNPAIRED_STEPS = (s.StartRoles, s.TransferLayouts, s.TransferPairs, s.NetworkFault)
PAIRS_DIR = "pairs"  # RUN/pairs/IMPL-N/: each pair process's own log (cell.log)


class WarmPairs:
    """The idle pairs of one run, shared by its worker threads (see the module docstring).

    ``target``: the sglang and cell environment; ``out_dir``: the run folder (pairs' logs go
    under ``pairs/``); ``stopping``: set when the run is interrupted (a pair then starts no
    process); ``max_idle``: idle pairs kept at most, the least recently used ended first
    (each holds its role processes)."""

    def __init__(self, target, out_dir: Path, stopping: threading.Event, max_idle: int):
        self.target, self.out_dir, self.stopping, self.max_idle = target, out_dir, stopping, max(1, max_idle)
        self.lock = threading.Lock()
        self.idle: list[tuple[tuple[str, str], RolePair]] = []  # (key, pair), least recently used first
        self.numbers = itertools.count()
        self._steps: dict[tuple[str, int], list] = {}
        self.started = self.reused = 0  # pairs started, cells served on a pair that served one before
        self.demand: collections.Counter = collections.Counter()  # per key: its cells not started yet (expect)

    def expect(self, cells: list[tuple[str, Scenario]], seed: int) -> None:
        """The run's cells (implementation, scenario) that a pair may serve: per key, how many
        are still to start.  Without it every cell that may runs on a pair."""
        for impl, scenario in cells:
            if not self.why_isolated(scenario, seed):
                self.demand[self.key(impl, scenario, seed)] += 1

    def claim(self, impl: str, scenario: Scenario, seed: int) -> bool:
        """As a cell of an expected key starts: whether it runs on a pair, i.e. an idle pair of its
        key waits or another cell of its key is still to start (which may reuse the pair started
        now) and this cell does not retire the pair (harness.drive.pair.retires_pair).  A pair no
        later cell can reuse costs more than an isolated cell: its own process, and its roles held
        while idle (measured, docs/performance.md)."""
        key = self.key(impl, scenario, seed)
        retires = retires_pair(self.steps(scenario, seed)) is not None  # no later cell could reuse its pair
        with self.lock:
            idle = any(k == key for k, _ in self.idle)
            if key not in self.demand:
                return idle or not retires  # not expected (expect was not called)
            self.demand[key] -= 1
            return idle or (self.demand[key] > 0 and not retires)

    def why_isolated(self, scenario: Scenario, seed: int) -> str:
        """Why ``scenario``'s cell runs isolated rather than on a pair ("" when a pair may serve it)."""
        if scenario.alone:
            return "it runs with no other cell"
        if HOSTS_ENV in self.target.env:
            return "its roles run on other hosts"
        steps = self.steps(scenario, seed)
        if not steps or not isinstance(steps[0], s.StartRoles):
            return "it does not start with StartRoles"
        if steps[0].arm:  # a pair's managers start once: a later cell would never reach such a point
            return "its StartRoles arms points in the managers' constructors"
        odd = next((step for step in steps[1:] if isinstance(step, UNPAIRED_STEPS)), None)
        if odd is not None:
            return f"its step {type(odd).__name__} starts roles or a network of its own"
        if not shiftable({step.room for step in steps if isinstance(getattr(step, "room", None), int)}):
            return "a room of it is too short to move unambiguously (harness.drive.room_shift)"
        return ""

    def steps(self, scenario: Scenario, seed: int) -> list:
        """``scenario.steps(seed)``, computed once per run (steps may sample)."""
        key = (scenario.id, seed)
        with self.lock:
            if key not in self._steps:
                self._steps[key] = scenario.steps(seed)
            return self._steps[key]

    def key(self, impl: str, scenario: Scenario, seed: int) -> tuple[str, str]:
        """Which pairs may serve ``impl``'s cell of ``scenario``: its implementation and StartRoles step."""
        steps = self.steps(scenario, seed)
        return impl, repr(steps[0]) if steps else ""

    def run(self, impl: str, scenario: Scenario, seed: int, workdir: Path, full_waits: bool, fork_server) -> dict:
        """Run ``impl``'s cell of ``scenario`` into ``workdir`` on an idle pair of its key, or a
        new one (forked from ``fork_server`` when given); its history ends with cell-exit as an
        isolated cell's does.  The pair's reply (``kept``, ``why``).  KeyboardInterrupt when the
        run is stopping before a new pair started."""
        key = self.key(impl, scenario, seed)
        pair = self._take(key)
        if pair is None:
            number = next(self.numbers)
            pair = RolePair(impl, self.out_dir / PAIRS_DIR / f"{impl}-{number}", self.target, fork_server,
                            stopping=self.stopping)
            with self.lock:
                self.started += 1
        reply = pair.run(scenario.id, workdir, scenario.timeout_s, seed=seed, full_waits=full_waits, matrix=True)
        if reply.get("kept"):
            self._give_back(key, pair)
        return reply  # a pair that serves no more closed itself (RolePair.run)

    def _take(self, key: tuple[str, str]) -> RolePair | None:
        with self.lock:
            for i, (k, pair) in enumerate(self.idle):
                if k == key:
                    del self.idle[i]
                    self.reused += 1
                    return pair
        return None

    def _give_back(self, key: tuple[str, str], pair: RolePair) -> None:
        with self.lock:
            done = key in self.demand and self.demand[key] <= 0  # no cell of its key is left to start
            if not done:
                self.idle.append((key, pair))
            evicted = self.idle[:-self.max_idle] if len(self.idle) > self.max_idle else []
            del self.idle[:len(evicted)]
        for old in [p for _, p in evicted] + ([pair] if done else []):
            old.close()

    def idle_for(self, key: tuple[str, str]) -> bool:
        """Whether an idle pair of ``key`` ((impl, repr(StartRoles))) waits now."""
        with self.lock:
            return any(k == key for k, _ in self.idle)

    def close(self) -> None:
        """End every idle pair (their process groups killed, their socket folders removed)."""
        with self.lock:
            idle, self.idle = self.idle, []
        if idle:  # each is asked to stop its roles and given STOP_WAIT_S: all at once, not one after another
            with ThreadPoolExecutor(max_workers=len(idle), thread_name_prefix="pdconform-pair-close") as pool:
                list(pool.map(RolePair.close, [pair for _, pair in idle]))


__all__ = ["WarmPairs", "UNPAIRED_STEPS", "PAIRS_DIR"]
