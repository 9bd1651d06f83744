"""Runs a matrix of cells, each isolated in its own process group with a deadline.

sglang keeps process-global state and starts daemon threads that never exit, so
every cell runs in a fresh ``python -m harness.drive.cell`` process whose roles are
its own children.  At the cell's deadline the runner kills the whole process
group and reports ERROR with the last step the history recorded; the next cell
starts clean.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import replace
from pathlib import Path
from typing import Callable

from harness import ROOT
from harness.judge import history as hist
from harness.judge.diff import first_divergence
from harness.target.role_context import DEFAULT_NIXL_PROGRESS_DELAY_US, NIXL_PROGRESS_DELAY_ENV
from harness.judge.results import CellResult, RunResult, cell_dir, load_cell, reference_for_diff_dir
from harness.target.sglang import SglangTarget, installed_target
from harness.drive.forkserver import ZYGOTE_ENV, ForkedProcess, Zygote, ZygoteError
from harness.spec.scenario import Scenario

REFERENCE = "reference"

PORT_BLOCK = 8


def free_port_block(size: int = PORT_BLOCK, rng: random.Random | None = None) -> int:
    """First port of ``size`` consecutive loopback TCP ports that are free now."""
    rng = rng or random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - size)
        if _block_free(base, size):
            return base
    raise RuntimeError("no block of free loopback ports found")


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (SIGCONT first: a frozen role still dies)."""
    try:
        os.killpg(pid, signal.SIGCONT)
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _killpg(process) -> None:
    """Kill the process group led by ``process`` (a Popen or a zygote's ForkedProcess); wait at most 10 s."""
    _kill_group(process.pid)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _last_step(workdir: Path) -> str:
    events = hist.load(workdir / "history.jsonl")
    if not events:
        return "before the first step"
    last = events[-1]
    steps = [e for e in events if e["op"] == "step"]
    step = f"in step {steps[-1]['step']} {steps[-1]['args']['step']}" if steps else "before the first step"
    if last["op"] == "step":
        return step
    return f"{step}, last event: {last['op']} on {last.get('role')} ({last['type']})"


_RUNNING: set = set()  # cell processes running now (Popen or ForkedProcess), for kill_running_cells
_RUNNING_LOCK = threading.Lock()


def kill_running_cells() -> None:
    """SIGKILL the process group of every cell running now (an interrupted run)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for process in running:
        _kill_group(process.pid)


class _HistoryFollower:
    """Hands each complete new line of a growing history.jsonl to ``on_event``."""

    def __init__(self, path: Path, on_event: Callable[[dict], None]):
        self.path, self.on_event, self.offset = path, on_event, 0

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # a torn last line waits for the next poll
        self.offset += end
        for line in data[:end].splitlines():
            try:
                self.on_event(json.loads(line))
            except json.JSONDecodeError:
                continue


def run_cell_isolated(impl: str, scenario: Scenario, seed: int, workdir: Path,
                      timeout_s: float | None = None, target: SglangTarget | None = None,
                      on_event: Callable[[dict], None] | None = None, zygote: Zygote | None = None,
                      base_port: int | None = None, full_waits: bool = False) -> CellResult:
    """Run one cell in a new process group; kill it at ``timeout_s`` (default: the scenario's).

    ``target``: the sglang to run against (harness.target.sglang; default the installed one).
    ``on_event``: called with each history event (harness.judge.history) as the cell records it.
    ``zygote``: fork the cell (and its roles) from this fork server instead of starting
    fresh interpreters.  ``base_port``: first of the cell's PORT_BLOCK loopback ports
    (default: a free block picked now).  ``full_waits``: see harness.drive.cell.run_cell.
    """
    target = target or installed_target()
    workdir = workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)  # logs and history of an earlier run
    workdir.mkdir(parents=True)
    deadline = timeout_s if timeout_s is not None else scenario.timeout_s
    args = ["--impl", impl, "--scenario", scenario.id, "--seed", str(seed), "--workdir", str(workdir),
            "--base-port", str(base_port if base_port is not None else free_port_block())]
    if full_waits:
        args.append("--full-waits")
    cmd = [target.python, "-m", "harness.drive.cell", *args]
    start = time.monotonic()
    with open(workdir / "cell.log", "wb") as log:
        process = None
        if zygote is not None:
            try:
                process = zygote.wait_ready().fork("cell", args, workdir / "cell.log",
                                             env={ZYGOTE_ENV: zygote.socket_path})
            except ZygoteError as exc:  # the fork server is gone: this cell starts a fresh interpreter
                log.write(f"pdconform: fork server unusable ({exc}); fresh interpreter\n".encode())
                log.flush()
        if process is None:
            process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       process_group=0, env=target.cell_env(), cwd=str(ROOT))
        with _RUNNING_LOCK:
            _RUNNING.add(process)
        follower = _HistoryFollower(workdir / "history.jsonl", on_event) if on_event else None
        try:
            if follower is None:
                process.wait(timeout=deadline)
            else:
                while process.poll() is None:
                    if time.monotonic() - start > deadline:
                        raise subprocess.TimeoutExpired(cmd, deadline)
                    follower.poll()
                    time.sleep(0.1)
                follower.poll()
        except subprocess.TimeoutExpired:
            _killpg(process)
            if follower:
                follower.poll()
            return CellResult(
                impl=impl, scenario=scenario.id, verdict="ERROR", duration_s=round(time.monotonic() - start, 3),
                reason=f"cell exceeded its deadline of {deadline:.0f} s and was killed ({_last_step(workdir)})",
                workdir=str(workdir),
            )
        finally:
            # the cell's roles are in its process group: none may outlive it
            with _RUNNING_LOCK:
                _RUNNING.discard(process)
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    try:
        result = load_cell(workdir / "cell.json")
    except (OSError, ValueError) as exc:
        tail = "\n".join((workdir / "cell.log").read_text(errors="replace").splitlines()[-15:])
        return CellResult(
            impl=impl, scenario=scenario.id, verdict="ERROR", duration_s=round(time.monotonic() - start, 3),
            reason=f"cell process exited with code {process.returncode} without a result ({exc}): {tail}",
            workdir=str(workdir),
        )
    if isinstance(process, ForkedProcess):
        result.cpu_s = process.group_cpu_s()
    return result


class PortBlocks:
    """Hands out blocks of PORT_BLOCK loopback ports to concurrent cells: never the same
    block to two running cells, each free when handed out, all below the kernel's
    ephemeral range (where the roles' own random ports come from)."""

    LOW, HIGH = 20000, 32000

    def __init__(self):
        self._lock = threading.Lock()
        self._in_use: set[int] = set()
        self._rng = random.Random()  # not the run's seed: two runs at once must not draw the same blocks

    def acquire(self) -> int:
        with self._lock:
            for _ in range(500):
                base = self.LOW + PORT_BLOCK * self._rng.randrange((self.HIGH - self.LOW) // PORT_BLOCK)
                if base not in self._in_use and _block_free(base):
                    self._in_use.add(base)
                    return base
        raise RuntimeError("no block of free loopback ports found")

    def release(self, base: int) -> None:
        with self._lock:
            self._in_use.discard(base)


def _block_free(base: int, size: int = PORT_BLOCK) -> bool:
    sockets = []
    try:
        for port in range(base, base + size):
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for s in sockets:
            s.close()


def expected_durations(scenarios: list[Scenario], impls: list[str], seed: int,
                       expected_verdict: Callable[[str, str], str]) -> dict[tuple[str, str], float]:
    """A duration hint (seconds per (scenario, impl)) for a run with no earlier results: the
    scenario's inherent waits, plus one step bound for a cell expected to FAIL or ERROR
    (``expected_verdict(impl, scenario)``), since such cells wait out a status that never
    comes.  Only the order of the cells depends on it."""
    from harness.spec.steps import STEP_TIMEOUT_S

    hint = {}
    for sc in scenarios:
        inherent = sc.inherent_wait_s(seed)  # steps(seed) may sample: once per scenario
        for impl in impls:
            stuck = expected_verdict(impl, sc.id) in ("FAIL", "ERROR")
            hint[(sc.id, impl)] = inherent + (STEP_TIMEOUT_S if stuck else 0.0)
    return hint


def _group_of(impl: str) -> str:
    """Which fork server starts ``impl``'s cells: "reference" (no sglang import) or "sglang"."""
    return "reference" if impl == REFERENCE else "sglang"


def _zygote_groups(impls: list[str]) -> dict[str, list[str]]:
    """The fork servers a run needs: group name -> the implementations it preloads."""
    groups: dict[str, list[str]] = {}
    for impl in impls:
        groups.setdefault(_group_of(impl), []).append(impl)
    return groups


def default_jobs() -> int:
    """The default number of cells run at once: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def run_matrix(impls: list[str], scenarios: list[Scenario], seed: int, out_dir: Path,
               on_cell: Callable[[int, int, CellResult], None] | None = None,
               on_start: Callable[[int, int, str, Scenario], None] | None = None,
               diff: bool = True, target: SglangTarget | None = None,
               on_event: Callable[[dict], None] | None = None, jobs: int = 1, fork: bool = True,
               on_note: Callable[[str], None] | None = None,
               duration_hint: dict[tuple[str, str], float] | None = None,
               nixl_progress_delay_us: int = DEFAULT_NIXL_PROGRESS_DELAY_US,
               full_waits: bool = False) -> RunResult:
    """Run every (scenario, impl) cell, ``jobs`` at a time; return the run's result tree.

    Cells are reported in (scenario, impl) order whatever ``jobs`` is.
    ``on_start(i, total, impl, scenario)`` and ``on_cell(done, total, result)`` report
    progress (from worker threads when ``jobs`` > 1).  With ``diff``, each backend cell
    of a non-test scenario gets its first divergence from the reference's history for
    the same scenario and seed (:mod:`harness.judge.diff`); when the reference is not among
    ``impls``, its cell runs anyway, under ``OUT/reference-for-diff/``, and is not
    reported.  ``target``: the sglang the cells import (default: the installed one).
    ``on_event``: each history event of the reported cells as it is recorded (use with
    ``jobs=1``).  ``fork``: start cells and roles from a harness.drive.forkserver fork server
    (sglang imported once per run); if it cannot start, fresh interpreters are used and
    ``on_note`` says why.  With ``jobs`` > 1 the longest cells start first (seconds per
    (scenario, impl) from ``duration_hint``, e.g. an earlier run or :func:`expected_durations`;
    else the scenario's inherent waits), which shortens the run's tail; the reported order
    does not change.
    ``nixl_progress_delay_us``: the NIXL roles' progress-thread sleep (microseconds; 0 is
    sglang's busy loop; backends/nixl/adapter.py); recorded in ``engine_settings``.
    ``full_waits``: no fail-fast cut of waits after a stuck step (harness.spec.steps.STALL_CUT_S).
    """
    target = target or installed_target()
    target = replace(target, env={**target.env, NIXL_PROGRESS_DELAY_ENV: str(nixl_progress_delay_us)})
    started = time.monotonic()
    run = RunResult(sglang=target.info, seed=seed, engine_settings={"nixl_progress_delay_us": nixl_progress_delay_us},
                    full_waits=full_waits,
                    started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    cells = [(scenario, impl) for scenario in scenarios for impl in impls]
    hidden = []  # reference cells that only serve the diff
    if diff and REFERENCE not in impls:
        hidden = [(scenario, REFERENCE) for scenario in scenarios if not scenario.test_only]
    tasks = [(sc, impl, cell_dir(out_dir, sc.id, impl), True) for sc, impl in cells]
    tasks += [(sc, impl, reference_for_diff_dir(out_dir, sc.id), False) for sc, impl in hidden]
    inherent_s: dict[str, float] = {}  # per scenario, filled once the fork servers are starting
    ports = PortBlocks()
    lock = threading.Lock()
    counters = {"started": 0, "done": 0}

    out_dir.mkdir(parents=True, exist_ok=True)
    zygotes: dict[str, Zygote] = {}  # started in the try below, whose finally closes them
    noted: set[str] = set()

    def zygote_for(impl: str) -> Zygote | None:
        """The ready fork server of ``impl``'s group (waits while it imports); None: fresh interpreters."""
        group = _group_of(impl)
        zygote = zygotes.get(group)
        if zygote is None:
            return None
        try:
            zygote.wait_ready()
            return zygote
        except ZygoteError as exc:
            if stopping.is_set():  # closed by an interrupt: nothing to note, work() starts nothing
                return None
            with lock:
                if group not in noted and on_note:
                    on_note(f"{group} cells start as fresh interpreters: {exc}")
                noted.add(group)
            return None

    stopping = threading.Event()

    def work(task) -> CellResult:
        scenario, impl, workdir, reported = task
        if stopping.is_set():
            return CellResult(impl=impl, scenario=scenario.id, verdict="ERROR", reason="run interrupted")
        zygote = zygote_for(impl)
        if stopping.is_set():  # interrupted while the fork server imported: start nothing
            return CellResult(impl=impl, scenario=scenario.id, verdict="ERROR", reason="run interrupted")
        if reported and on_start:
            with lock:
                counters["started"] += 1
                on_start(counters["started"], len(cells), impl, scenario)
        base = ports.acquire()
        try:
            result = run_cell_isolated(impl, scenario, seed, workdir, target=target,
                                       on_event=on_event if reported else None, zygote=zygote, base_port=base,
                                       full_waits=full_waits)
        finally:
            ports.release(base)
        result.inherent_wait_s = inherent_s[scenario.id]
        if reported and on_cell:
            with lock:
                counters["done"] += 1
                on_cell(counters["done"], len(cells), result)
        return result

    results: list[CellResult | None] = [None] * len(tasks)
    try:
        # Two fork servers, started together: the reference's imports take seconds, sglang's
        # several more, and the reference's cells need not wait for them.
        for group, names in (_zygote_groups(sorted({impl for _, impl, _, _ in tasks})) if fork else {}).items():
            try:
                zygotes[group] = Zygote(target.python, target.cell_env(), log_dir=out_dir, impls=names,
                                        wait=False, log_name=f"zygote-{group}.log")
            except (ZygoteError, OSError) as exc:
                if on_note:
                    on_note(f"{group} cells start as fresh interpreters: {exc}")
        # while they import: each scenario's steps(seed) (some sample with hypothesis), once
        inherent_s.update((sc.id, sc.inherent_wait_s(seed)) for sc in scenarios)
        if jobs <= 1:
            results = [work(task) for task in tasks]
        else:
            hint = duration_hint or {}
            pending = sorted(range(len(tasks)), key=lambda i: -hint.get((tasks[i][0].id, tasks[i][1]),
                                                                       inherent_s[tasks[i][0].id]))

            def next_task() -> int | None:
                """The longest pending cell whose fork server is ready; else the longest of all."""
                with lock:
                    if stopping.is_set() or not pending:
                        return None
                    for i in pending:
                        z = zygotes.get(_group_of(tasks[i][1]))
                        if z is None or z.ready_now():
                            pending.remove(i)
                            return i
                    return pending.pop(0)

            def worker() -> None:
                while (i := next_task()) is not None:
                    results[i] = work(tasks[i])

            workers = min(jobs, len(tasks))  # no thread without a cell to run
            pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pdconform-cell")
            futures = []
            try:
                futures = [pool.submit(worker) for _ in range(workers)]
                for future in futures:
                    future.result()
            except BaseException:  # an interrupt: stop every running cell now, start no other
                stopping.set()
                for zygote in zygotes.values():  # workers waiting on an importing one give up at once
                    zygote.close()
                _stop_workers(futures)
                raise
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
    finally:  # (with one job at a time, run_cell_isolated itself kills an interrupted cell's group)
        for zygote in zygotes.values():
            zygote.close()
    for (scenario, impl, workdir, reported), result in zip(tasks, results):
        if reported and diff and impl != REFERENCE and not scenario.test_only:
            ref_dir = cell_dir(out_dir, scenario.id, REFERENCE) if REFERENCE in impls else \
                reference_for_diff_dir(out_dir, scenario.id)
            attach_divergence(result, hist.load(ref_dir / "history.jsonl"), workdir)
        _rewrite_cell_json(workdir, result)  # with what only the runner knows: inherent wait, CPU time, divergence
        if reported:
            run.cells.append(result)
    run.duration_s = round(time.monotonic() - started, 3)
    return run


INTERRUPT_GRACE_S = 10.0  # how long an interrupted run keeps killing cells its workers start


def _stop_workers(futures: list) -> None:
    """Kill running cells until every worker of ``futures`` has returned (at most
    INTERRUPT_GRACE_S seconds): a worker past its ``stopping`` check when the interrupt
    came may still start one cell, which the next round kills."""
    deadline = time.monotonic() + INTERRUPT_GRACE_S
    while futures and time.monotonic() < deadline:
        kill_running_cells()
        if not futures_wait(futures, timeout=0.05).not_done:
            return


def _rewrite_cell_json(workdir: Path, result: CellResult) -> None:
    """Write ``result`` over the cell's own ``cell.json`` when the cell wrote one (a cell
    killed before it could has none, and gets none).  A write that fails (a full disk)
    leaves the cell's own file: results.json, written later, reports the failure."""
    cell_json = workdir / "cell.json"
    if cell_json.exists():
        try:
            cell_json.write_text(json.dumps(result.to_dict(), indent=2))
        except OSError:
            pass


def attach_divergence(result: CellResult, reference_events: list[dict], workdir: Path) -> None:
    """Set ``result.divergence`` from its history (in ``workdir``) against the reference's.
    No reference history: left None."""
    if not reference_events:
        return
    result.divergence = first_divergence(reference_events, hist.load(workdir / "history.jsonl"), result.checks)
