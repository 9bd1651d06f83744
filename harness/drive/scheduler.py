"""The cell scheduler: runs a matrix of cells ``jobs`` at a time, each through harness.drive.runner.

It starts the fork servers the run needs (one for the implementations whose roles
import sglang, one for the rest, started together so the second's cells need not
wait for sglang's imports), gives every running cell its own block of loopback ports,
starts the longest cells first (a duration hint) and, on an interrupt, kills every
running cell and starts no other.  It returns what ran (:class:`harness.drive.runner.CellRun`);
it judges nothing.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness import nofollow
from harness.drive import kept_servers
from harness.drive.fork_servers import close_fork_servers, fork_group, start_fork_servers
from harness.drive.contain import become_subreaper, children, kill_descendants
from harness.drive.forkserver_client import ForkServer, ForkServerError
from harness.drive.ports import PortBlocks
from harness.drive.runner import CellRun, kill_running_cells, run_cell_isolated
from harness.drive.warm import WarmPairs
from harness.judge.results import alone_dir, cell_dir, on_pair_dir, reference_for_diff_dir
from harness.spec import history as hist
from harness.judge.verdict import Verdict
from harness.spec.protocol import REFERENCE
from harness.spec.scenario import Scenario
from harness.spec.steps import STEP_TIMEOUT_S
from harness.target.role_context import BIND_ENV
from harness.target.sglang import SglangTarget

MIN_IDLE_PAIRS = 4  # idle warm pairs a run keeps at least (harness.drive.warm), whatever its --jobs
INTERRUPT_GRACE_S = 10.0  # how long an interrupted run keeps killing cells its workers start


@dataclass
class Callbacks:
    """Progress of a run (called from worker threads when ``jobs`` > 1).

    ``on_start(i, total, impl, scenario)`` when a reported cell starts; ``on_cell(done,
    total, cell_run)`` when one ends; ``on_event(event)`` for each history event of the
    reported cells as it is recorded (use with one job); ``on_note(text)`` for what the
    user should know (a fork server that could not start); ``skip(impl, scenario id)``,
    asked just before a reported cell would start (or run once more alone): True leaves it
    unrun for now and asked again after the round (harness.drive.scheduler._rounds): out of the
    result if it never wants it, or as first run (``pdconform mutants`` once the cell's
    mutant was caught, or while a provisional catch of it waits for its rerun); ``on_alone(cell_run)`` when a cell run once more alone ends;
    ``confirm(cell_run)``, asked of a reported cell that ran on a warm role pair
    (harness.drive.warm): True when its result is not the expected one, so that it runs once
    more in a fresh isolated cell, which is what is reported (the pair's run is kept under
    ``OUT/on-pair/``)."""

    on_start: Callable[[int, int, str, Scenario], None] | None = None
    on_cell: Callable[[int, int, CellRun], None] | None = None
    on_event: Callable[[dict], None] | None = None
    on_note: Callable[[str], None] | None = None
    skip: Callable[[str, str], bool] | None = None
    on_alone: Callable[[CellRun], None] | None = None
    confirm: Callable[[CellRun], bool] | None = None


class _Gate:
    """Cells of a scenario marked ``alone`` run with no other cell; the others run together.
    A waiting alone cell goes first: no other cell starts until it has run.  Cells may carry
    a weight (:func:`cell_weight`): one starts only while the running cells' weights leave room
    for its own within ``capacity`` (a cell always starts when none runs).  Every wait ends
    when the run is stopping (checked every half second)."""

    def __init__(self, stopping: threading.Event, capacity: float = math.inf):
        self.cond = threading.Condition()
        self.stopping = stopping
        self.capacity, self.used = capacity, 0.0
        self.running = 0
        self.alone = False
        self.waiting_alone = 0

    def enter(self, alone: bool, weight: float = 0.0) -> None:
        with self.cond:
            if alone:
                self.waiting_alone += 1
                while (self.running or self.alone) and not self.stopping.is_set():
                    self.cond.wait(0.5)
                self.waiting_alone -= 1
                self.alone = True
            else:
                while (self.alone or self.waiting_alone or (self.running and self.used + weight > self.capacity)) \
                        and not self.stopping.is_set():
                    self.cond.wait(0.5)
                self.running += 1
                self.used += weight

    def leave(self, alone: bool, weight: float = 0.0) -> None:
        with self.cond:
            if alone:
                self.alone = False
            else:
                self.running -= 1
                self.used -= weight
            self.cond.notify_all()


CELL_BUSY_S = 1.0  # seconds a cell works beyond its steps (its roles start, are observed, end): cell_weight
MIN_WEIGHT = 0.25  # the least share of a job a weighed cell takes: at most 4 cells a job


def cell_weight(scenario: Scenario, seed: int) -> float:
    """The share of one job a cell of ``scenario`` takes where a run weighs its cells
    (Schedule.weigh): the part of its expected seconds (Scenario.expected_s, plus
    :data:`CELL_BUSY_S`) not spent in its own sleeps and timeouts (Scenario.inherent_wait_s),
    from :data:`MIN_WEIGHT` to 1: a cell that mostly waits on a timer leaves most of its core
    to others.  Pure."""
    expected = scenario.expected_s(seed) + CELL_BUSY_S
    return max(MIN_WEIGHT, min(1.0, (expected - scenario.inherent_wait_s(seed)) / expected))


@dataclass(frozen=True)
class _Task:
    scenario: Scenario
    impl: str
    workdir: Path
    reported: bool
    isolated: bool = False  # never on a warm pair (a rerun alone)


@dataclass
class Schedule:
    """One run's cells and how to run them: ``target`` (the sglang), ``seed``, ``jobs``
    at a time, ``fork`` (from fork servers) or fresh interpreters, ``full_waits``
    (harness.spec.steps.STALL_CUT_S), ``duration_hint`` (seconds per (scenario, impl):
    longest first; default the scenarios' inherent waits), ``priority`` (per (scenario,
    impl), default 0: lower starts first, then longest first), ``pairs`` (cells on warm role
    pairs where they can be, harness.drive.warm; False: every cell isolated), ``weigh`` (``jobs``
    counts cells by :func:`cell_weight`, so up to 1 / MIN_WEIGHT times as many that mostly wait
    run at once), ``alone_jobs``
    (reruns alone at once, :func:`run_alone`; ``pdconform mutants`` runs two a core, as such
    cells mostly wait on timers and one that waited for a core confirms nothing)."""

    target: SglangTarget
    seed: int = 0
    jobs: int = 1
    fork: bool = True
    full_waits: bool = False
    duration_hint: dict[tuple[str, str], float] = field(default_factory=dict)
    priority: dict[tuple[str, str], int] = field(default_factory=dict)
    pairs: bool = False
    alone_jobs: int = 1
    weigh: bool = False


def expected_durations(scenarios: list[Scenario], impls: list[str], seed: int,
                       expected_verdict: Callable[[str, str], str]) -> dict[tuple[str, str], float]:
    """A duration hint (seconds per (scenario, impl)) for a run with no earlier results: the
    scenario's expected seconds (Scenario.expected_s: its waits and steps), plus one step bound for a cell expected to FAIL or ERROR
    (``expected_verdict(impl, scenario)``), since such cells wait out a status that never
    comes.  Only the order of the cells depends on it."""
    hint = {}
    for sc in scenarios:
        inherent = sc.expected_s(seed)  # steps(seed) may sample: once per scenario
        for impl in impls:
            stuck = Verdict(expected_verdict(impl, sc.id)) >= Verdict.FAIL
            hint[(sc.id, impl)] = inherent + (STEP_TIMEOUT_S if stuck else 0.0)
    return hint


def duration_hint(previous: Path, scenarios: list[Scenario], impls: list[str], seed: int,
                  expectations=None) -> dict[tuple[str, str], float]:
    """Which cells start first: the cell durations of an earlier run (its results.json at
    ``previous``), else :func:`expected_durations` from ``expectations``
    (harness.judge.expectations.Expectations: the cells expected to fail first); {} with neither."""
    from harness.judge.results import load_run

    try:
        return {(c.scenario, c.impl): c.duration_s for c in load_run(previous).cells}
    except (OSError, ValueError):  # no earlier run, or not a readable one
        pass
    if expectations is None:
        return {}
    return expected_durations(scenarios, impls, seed, expectations.verdict_for)


def tasks_for(impls: list[str], scenarios: list[Scenario], out_dir: Path, diff: bool) -> list[_Task]:
    """Every reported (scenario, impl) cell, then the reference cells that only serve the
    behaviour diff (when the reference is not among ``impls``; not for self-test scenarios)."""
    tasks = [_Task(sc, impl, cell_dir(out_dir, sc.id, impl), True) for sc in scenarios for impl in impls]
    if diff and REFERENCE not in impls:
        tasks += [_Task(sc, REFERENCE, reference_for_diff_dir(out_dir, sc.id), False)
                  for sc in scenarios if not sc.test_only]
    return tasks


class _Run:
    """The state of one scheduled run: fork servers, port blocks, counters, the stop flag."""

    def __init__(self, tasks: list[_Task], schedule: Schedule, out_dir: Path, callbacks: Callbacks):
        self.tasks, self.schedule, self.out_dir, self.cb = tasks, schedule, out_dir, callbacks
        self.reported = sum(t.reported for t in tasks)
        self.fork_servers: dict[str, ForkServer] = {}
        self.ports = PortBlocks(schedule.target.env.get(BIND_ENV))
        self.lock = threading.Lock()
        self.started = self.done = 0
        self.noted: set[str] = set()
        self.stopping = threading.Event()
        self.gate = _Gate(self.stopping, schedule.jobs if schedule.weigh else math.inf)
        # what ``skip`` left unrun this round (task indices; reruns alone): asked again after it (_rounds)
        self.declined, self.declined_alone = [], []
        # idle pairs at most: one per cell at once (at least MIN_IDLE_PAIRS), so a run holds about twice its cells' roles
        self.warm = (WarmPairs(schedule.target, out_dir, self.stopping, max(schedule.jobs, MIN_IDLE_PAIRS))
                     if schedule.pairs else None)
        if self.warm is not None:  # a pair starts only where a later cell can reuse it
            self.warm.expect([(t.impl, t.scenario) for t in tasks], schedule.seed)

    def note(self, text: str) -> None:
        if self.cb.on_note:
            self.cb.on_note(text)

    def start_fork_servers(self) -> None:
        """One per group, started together and not waited for (the cells wait for theirs)."""
        self.fork_servers = start_fork_servers(sorted({t.impl for t in self.tasks}), self.schedule.target,
                                               self.out_dir, self.note, kept=True)

    def zygote_for(self, impl: str) -> ForkServer | None:
        """The ready fork server of ``impl``'s group (waits while it imports); None: fresh interpreters."""
        group = fork_group(impl)
        fork_server = self.fork_servers.get(group)
        if fork_server is None:
            return None
        try:
            fork_server.wait_ready()
            return fork_server
        except ForkServerError as exc:
            if self.stopping.is_set():  # closed by an interrupt: nothing to note, work() starts nothing
                return None
            with self.lock:
                if group not in self.noted:
                    self.note(f"{group} cells start as fresh interpreters: {exc}")
                self.noted.add(group)
            return None

    def skips(self, impl: str, scenario_id: str) -> bool:
        """Whether the callbacks' ``skip`` leaves ``impl``'s cell (or rerun) of ``scenario_id`` unrun now."""
        return self.cb.skip is not None and self.cb.skip(impl, scenario_id)

    def declines(self, task: _Task) -> bool:
        """Whether :meth:`skips` leaves reported ``task`` unrun now."""
        return task.reported and self.skips(task.impl, task.scenario.id)

    def in_pool(self, calls: list[Callable[[], None]], workers: int, name: str) -> None:
        """Run ``calls`` on ``workers`` threads and wait for them all; an interrupt stops every
        running cell now and starts no other (the fork servers are closed, so a worker waiting
        on one that still imports gives up at once)."""
        pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=name)
        futures = []
        try:
            futures = [pool.submit(call) for call in calls]
            for future in futures:
                future.result()
        except BaseException:
            self.stopping.set()
            close_fork_servers(self.fork_servers, interrupted=True)
            _stop_workers(futures)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def held_back(self, task: _Task, i: int | None) -> bool:
        """Whether ``task`` (task ``i`` of the run, None: a rerun alone) is not to start now: the
        run is stopping, or ``skip`` declines it (task ``i`` is then noted as declined)."""
        if self.stopping.is_set():
            return True
        if self.declines(task):
            if i is not None:
                with self.lock:
                    self.declined.append(i)
            return True
        return False

    def work(self, task: _Task, i: int | None = None) -> CellRun | None:
        """Run one cell (task ``i`` of the run, None: a rerun alone); None when the run is being
        interrupted or ``skip`` said so (nothing was started): asked before the fork server's
        wait and again once the gate lets it in (it may have waited there while its mutant was caught)."""
        if self.held_back(task, i):
            return None
        fork_server = self.zygote_for(task.impl)
        if self.stopping.is_set():  # interrupted while the fork server imported: start nothing
            return None
        alone = bool(task.scenario.alone)
        weight = cell_weight(task.scenario, self.schedule.seed) if self.schedule.weigh else 0.0
        self.gate.enter(alone, weight)
        if self.held_back(task, i):
            self.gate.leave(alone, weight)
            return None
        if task.reported and self.cb.on_start:
            with self.lock:
                self.started += 1
                self.cb.on_start(self.started, self.reported, task.impl, task.scenario)
        base = self.ports.acquire()
        try:
            if not self.execute(task, fork_server, base):
                return None
        finally:
            self.ports.release(base)
            self.gate.leave(alone, weight)
        cell = CellRun(task.scenario.id, task.impl, task.workdir, task.reported)
        if task.reported and self.cb.on_cell:
            with self.lock:
                self.done += 1
                self.cb.on_cell(self.done, self.reported, cell)
        return cell

    def execute(self, task: _Task, fork_server: ForkServer | None, base: int) -> bool:
        """Run ``task``'s cell on a warm pair when it can (and confirm it isolated when its
        result is not the expected one), else isolated on port block ``base``; False when the
        run stopped before a pair could start."""
        on_event = self.cb.on_event if task.reported else None
        seed = self.schedule.seed

        def isolated() -> None:
            run_cell_isolated(task.impl, task.scenario, seed, task.workdir, target=self.schedule.target,
                              on_event=on_event, fork_server=fork_server, base_port=base,
                              full_waits=self.schedule.full_waits)

        if (self.warm is None or task.isolated or self.warm.why_isolated(task.scenario, seed)
                or not self.warm.claim(task.impl, task.scenario, seed)):
            isolated()
            return True
        try:
            self.warm.run(task.impl, task.scenario, seed, task.workdir, self.schedule.full_waits, fork_server)
        except KeyboardInterrupt:
            if self.stopping.is_set():  # the run was interrupted before the pair started
                return False
            raise
        if on_event is not None:  # a pair's cell is followed once it has ended
            for event in hist.load(task.workdir / "history.jsonl"):
                on_event(event)
        if task.reported and self.cb.confirm and not self.stopping.is_set() and self.cb.confirm(
                CellRun(task.scenario.id, task.impl, task.workdir, True)):
            confirmed = on_pair_dir(self.out_dir, task.scenario.id, task.impl)
            shutil.rmtree(confirmed, ignore_errors=True)
            confirmed.parent.mkdir(parents=True, exist_ok=True)
            task.workdir.rename(confirmed)
            isolated()
        return True

    def priority(self, i: int) -> int:
        """Task ``i``'s ``Schedule.priority`` (lower starts first; 0 when not given)."""
        return self.schedule.priority.get((self.tasks[i].scenario.id, self.tasks[i].impl), 0)

    def order(self, indices: list[int]) -> list[int]:
        """Task ``indices``: by priority, then longest expected first."""
        hint, seed = self.schedule.duration_hint, self.schedule.seed

        def key(i: int) -> tuple[int, float]:
            task = self.tasks[i]
            return self.priority(i), -hint.get((task.scenario.id, task.impl), task.scenario.expected_s(seed))

        return sorted(indices, key=key)

    def run_parallel(self, indices: list[int], results: list[CellRun | None]) -> None:
        """Run tasks ``indices`` into ``results``, ``jobs`` at a time; an interrupt kills the running
        cells and starts no other."""
        pending = self.order(indices)

        def next_task() -> int | None:
            """The longest pending cell an idle warm pair can serve; else the longest whose fork
            server is ready; else the longest of all."""
            with self.lock:
                if self.stopping.is_set() or not pending:
                    return None
                warm = self.warm
                for i in pending if warm is not None else ():
                    task = self.tasks[i]
                    if warm.idle_for(warm.key(task.impl, task.scenario, self.schedule.seed)):
                        pending.remove(i)
                        return i
                for i in pending:
                    z = self.fork_servers.get(fork_group(self.tasks[i].impl))
                    if z is None or z.ready_now():
                        pending.remove(i)
                        return i
                return pending.pop(0)

        def worker() -> None:
            while (i := next_task()) is not None:
                results[i] = self.work(self.tasks[i], i)

        per_job = round(1 / MIN_WEIGHT) if self.schedule.weigh else 1  # the gate holds weighed cells to jobs
        workers = min(self.schedule.jobs * per_job, len(indices))  # no thread without a cell to run
        self.in_pool([worker] * workers, workers, "pdconform-cell")


def _stop_workers(futures: list) -> None:
    """Kill running cells until every worker of ``futures`` has returned (at most
    INTERRUPT_GRACE_S seconds): a worker past its ``stopping`` check when the interrupt
    came may still start one cell, which the next round kills."""
    deadline = time.monotonic() + INTERRUPT_GRACE_S
    while futures and time.monotonic() < deadline:
        kill_running_cells()
        if not futures_wait(futures, timeout=0.05).not_done:
            return


def run_alone(run: _Run, keys: list[tuple[str, str]]) -> None:
    """Run each ``(scenario, impl)`` of ``keys`` once more (every other cell of the round has
    ended), into ``OUT/alone/SCENARIO--IMPL/``; not reported as cells of the run: one after the
    other in the listed order, or ``Schedule.alone_jobs`` at a time, the longest first (such cells
    mostly wait on their timers).  One the callbacks' ``skip`` does not want when it would start is left out
    (and noted in ``run.declined_alone``); ``on_alone`` hears of each that ran."""
    by_id = {t.scenario.id: t.scenario for t in run.tasks}

    def one(key: tuple[str, str]) -> None:
        scenario_id, impl = key
        if run.skips(impl, scenario_id):  # an earlier rerun settled what this one would
            with run.lock:
                run.declined_alone.append(key)
            return
        cell = run.work(_Task(by_id[scenario_id], impl, alone_dir(run.out_dir, scenario_id, impl), False, isolated=True))
        if cell is not None and run.cb.on_alone:
            run.cb.on_alone(cell)

    workers = min(run.schedule.alone_jobs, len(keys))
    if workers <= 1:
        for key in keys:
            one(key)
        return
    longest_first = sorted(keys, key=lambda k: -by_id[k[0]].expected_s(run.schedule.seed))
    run.in_pool([functools.partial(one, key) for key in longest_first], workers, "pdconform-alone")


def _rounds(run: _Run, again: Callable[[list[CellRun]], list[tuple[str, str]]] | None) -> list[CellRun | None]:
    """Every task in rounds: a round runs its tasks, then the reruns alone its cells call for
    (``again``); the tasks and reruns ``skip`` declined are asked again after it, and those it
    now wants make the next round (``pdconform mutants`` defers a mutant's cells while a
    starved catch waits for its rerun alone, harness.mutants.EarlyStop).  Each round runs only
    what an earlier one declined, so the rounds end."""
    results: list[CellRun | None] = [None] * len(run.tasks)
    indices, keys, before = list(range(len(run.tasks))), [], None
    while (indices or keys) and (indices, keys) != before and not run.stopping.is_set():  # a round that ran
        before, run.declined, run.declined_alone = (indices, keys), [], []  # nothing ends them (a skip unchanged)
        if run.schedule.jobs <= 1:  # (run_cell_isolated itself kills an interrupted cell's group)
            for i in sorted(indices, key=run.priority):  # one at a time: listed order within a priority
                results[i] = run.work(run.tasks[i], i)
        else:
            run.run_parallel(indices, results)
        if again is not None:
            ran = [results[i] for i in indices if run.tasks[i].reported and results[i] is not None]
            run_alone(run, keys + (again(ran) if ran else []))
        indices = [i for i in run.declined if not run.declines(run.tasks[i])]
        keys = [(sid, impl) for sid, impl in run.declined_alone if not run.skips(impl, sid)]
    return results


def run_matrix(impls: list[str], scenarios: list[Scenario], out_dir: Path, schedule: Schedule,
               callbacks: Callbacks | None = None, diff: bool = True,
               again: Callable[[list[CellRun]], list[tuple[str, str]]] | None = None) -> tuple[list[CellRun], float]:
    """Run every (scenario, impl) cell into ``out_dir``; return the reported cells in
    (scenario, impl) order, whatever ``schedule.jobs`` is, and the run's wall seconds.

    With ``diff``, when the reference is not among ``impls``, its cells run anyway under
    ``OUT/reference-for-diff/`` (for the behaviour diff) and are not returned.  Fork servers
    that cannot start leave their cells to fresh interpreters (``on_note`` says why).  An
    interrupt (KeyboardInterrupt) propagates after every running cell was killed.

    ``again``: given the reported cells of a round once they have all run, the ``(scenario,
    impl)`` keys to run once more with no other cell running (one at a time, or
    ``Schedule.alone_jobs`` reruns at once: :func:`run_alone`), into ``OUT/alone/`` (the caller
    decides which: harness.judge.load.needs_alone; this module judges nothing); on the same
    fork servers, so no import is paid twice.  Cells ``skip`` declined may run in later rounds
    (:func:`_rounds`)."""
    started = time.monotonic()
    os.close(nofollow.open_dir(out_dir, create=True))  # no link followed on the way (harness.nofollow)
    tasks = tasks_for(impls, scenarios, out_dir, diff)
    run = _Run(tasks, schedule, out_dir, callbacks or Callbacks())
    ours_before = set(children())
    become_subreaper()  # what a dead cell's roles left behind comes back here, and is ended below
    try:
        if schedule.fork:
            run.start_fork_servers()
        results = _rounds(run, again)
    except BaseException:
        run.stopping.set()  # an interrupt: the kept fork servers it used are closed too (one may still import)
        raise
    finally:
        if run.warm is not None:
            run.warm.close()
        close_fork_servers(run.fork_servers, interrupted=run.stopping.is_set())
        for stray in kill_descendants(keep=ours_before | kept_servers.pids()):
            run.note(f"ended a process a cell left behind: {stray}")
    cells = [cell for task, cell in zip(tasks, results) if task.reported and cell is not None]
    return cells, round(time.monotonic() - started, 3)
