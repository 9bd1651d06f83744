"""Runs a matrix of cells, each isolated in its own process group with a deadline.

sglang keeps process-global state and starts daemon threads that never exit, so
every cell runs in a fresh ``python -m harness.cell`` process whose roles are
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
import time
from pathlib import Path
from typing import Callable

from harness import history as hist
from harness.diff import first_divergence
from harness.results import CellResult, RunResult, SglangInfo, load_cell
from harness.sglang_target import SglangTarget, installed_info, installed_target
from harness.scenario import Scenario

REFERENCE = "reference"

PORT_BLOCK = 8


def sglang_info() -> SglangInfo:
    """Installed sglang version and package directory, without importing it."""
    return installed_info()


def free_port_block(size: int = PORT_BLOCK, rng: random.Random | None = None) -> int:
    """First port of ``size`` consecutive loopback TCP ports that are free now."""
    rng = rng or random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - size)
        try:
            sockets = []
            for port in range(base, base + size):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no block of free loopback ports found")


def _killpg(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGCONT)
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


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
                      on_event: Callable[[dict], None] | None = None) -> CellResult:
    """Run one cell in a new process group; kill it at ``timeout_s`` (default: the scenario's).

    ``target``: the sglang to run against (harness.sglang_target; default the installed one).
    ``on_event``: called with each history event (harness.history) as the cell records it.
    """
    target = target or installed_target()
    workdir = workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)  # logs and history of an earlier run
    workdir.mkdir(parents=True)
    deadline = timeout_s if timeout_s is not None else scenario.timeout_s
    cmd = [target.python, "-m", "harness.cell", "--impl", impl, "--scenario", scenario.id,
           "--seed", str(seed), "--workdir", str(workdir), "--base-port", str(free_port_block())]
    start = time.monotonic()
    with open(workdir / "cell.log", "wb") as log:
        process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, env=target.cell_env(), cwd=str(Path(__file__).resolve().parent.parent))
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
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    try:
        return load_cell(workdir / "cell.json")
    except (OSError, ValueError) as exc:
        tail = "\n".join((workdir / "cell.log").read_text(errors="replace").splitlines()[-15:])
        return CellResult(
            impl=impl, scenario=scenario.id, verdict="ERROR", duration_s=round(time.monotonic() - start, 3),
            reason=f"cell process exited with code {process.returncode} without a result ({exc}): {tail}",
            workdir=str(workdir),
        )


def run_matrix(impls: list[str], scenarios: list[Scenario], seed: int, out_dir: Path,
               on_cell: Callable[[int, int, CellResult], None] | None = None,
               on_start: Callable[[int, int, str, Scenario], None] | None = None,
               diff: bool = True, target: SglangTarget | None = None,
               on_event: Callable[[dict], None] | None = None) -> RunResult:
    """Run every (scenario, impl) cell in turn; return the run's result tree.

    ``on_start(i, total, impl, scenario)`` and ``on_cell(i, total, result)`` report progress.
    With ``diff``, each backend cell of a non-test scenario gets its first divergence
    from the reference's history for the same scenario and seed
    (:mod:`harness.diff`); when the reference is not among ``impls``, its cell runs
    anyway, under ``OUT/reference-for-diff/``, and is not reported.  ``target``: the
    sglang the cells import (default: the installed one).  ``on_event``: each history
    event of the reported cells as it is recorded (not the hidden reference cells').
    """
    target = target or installed_target()
    started = time.monotonic()
    run = RunResult(sglang=target.info, seed=seed,
                    started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    cells = [(scenario, impl) for scenario in scenarios for impl in impls]
    reference_history: dict[str, list[dict]] = {}
    for i, (scenario, impl) in enumerate(cells, 1):
        if on_start:
            on_start(i, len(cells), impl, scenario)
        workdir = out_dir / "cells" / f"{scenario.id}--{impl}"
        result = run_cell_isolated(impl, scenario, seed, workdir, target=target, on_event=on_event)
        if impl == REFERENCE:
            reference_history[scenario.id] = hist.load(workdir / "history.jsonl")
        elif diff and not scenario.test_only:
            if scenario.id not in reference_history:
                ref_dir = out_dir / "reference-for-diff" / scenario.id
                run_cell_isolated(REFERENCE, scenario, seed, ref_dir, target=target)
                reference_history[scenario.id] = hist.load(ref_dir / "history.jsonl")
            attach_divergence(result, reference_history[scenario.id], workdir)
        run.cells.append(result)
        if on_cell:
            on_cell(i, len(cells), result)
    run.duration_s = round(time.monotonic() - started, 3)
    return run


def attach_divergence(result: CellResult, reference_events: list[dict], workdir: Path) -> None:
    """Set ``result.divergence`` from its history against the reference's, and write it
    into the cell's ``cell.json`` too.  No reference history: left None."""
    if not reference_events:
        return
    result.divergence = first_divergence(reference_events, hist.load(workdir / "history.jsonl"), result.checks)
    cell_json = workdir / "cell.json"
    if cell_json.exists():
        cell_json.write_text(json.dumps(result.to_dict(), indent=2))
