"""Runs one cell isolated in its own process group with a deadline, and records how it ended.

sglang keeps process-global state and starts daemon threads that never exit, so every
cell runs in a process of its own (forked from a fork server, or a fresh ``python -m
harness.drive.cell``) whose roles join its process group.  At the cell's deadline the
runner kills the whole group; the next cell starts clean.  Either way, once the process
is gone the runner appends one :attr:`Op.CELL_EXIT` event to the cell's history (how it
ended, its wall and CPU seconds, the load it ran under: harness.drive.load), so the judge
(harness.judge.judge) reads everything from the history.  Nothing here decides a verdict.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness import ROOT, nofollow
from harness.drive.load import GroupSampler
from harness.drive.forkserver_client import FORK_SERVER_ENV, ForkedProcess, ForkServer, ForkServerError
from harness.drive.ports import free_port_block
from harness.spec.history import Event, Op, Resolver, append_event
from harness.spec.scenario import Scenario
from harness.drive.remote import HOSTS_ENV
from harness.target.role_context import BIND_ENV
from harness.target.sglang import SglangTarget, installed_target

FOLLOW_S = 0.1  # how often a followed cell's history is read while it runs (seconds)
LOG_TAIL_LINES = 15  # of cell.log, quoted when a cell process ends before its history does


@dataclass(frozen=True)
class CellRun:
    """One executed cell: ``scenario`` id, ``impl``, its ``workdir`` (``history.jsonl``,
    ``cell.log``, role logs) and whether the run reports it (False: a reference cell that
    only serves the behaviour diff)."""

    scenario: str
    impl: str
    workdir: Path
    reported: bool = True


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (SIGCONT first: a frozen role still dies)."""
    try:
        os.killpg(pid, signal.SIGCONT)
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _killpg(process) -> None:
    """Kill the process group led by ``process`` (a Popen or a ForkedProcess); wait at most 10 s."""
    kill_group(process.pid)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


_RUNNING: set = set()  # cell processes running now (Popen or ForkedProcess), for kill_running_cells
_RUNNING_LOCK = threading.Lock()


def track_process(process) -> None:
    """Count cell process ``process`` (a cell's, a long-lived pair's: harness.drive.pair) among
    the running cells, so that :func:`kill_running_cells` kills its group too."""
    with _RUNNING_LOCK:
        _RUNNING.add(process)


def forget_process(process) -> None:
    """The inverse of :func:`track_process`, once ``process``'s group is gone."""
    with _RUNNING_LOCK:
        _RUNNING.discard(process)


def kill_running_cells() -> None:
    """SIGKILL the process group of every cell running now (an interrupted run)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for process in running:
        kill_group(process.pid)


class _HistoryFollower:
    """Hands each complete new line of a growing history.jsonl to ``on_event``."""

    def __init__(self, path: Path, on_event: Callable[[dict], None]):
        self.path, self.on_event, self.offset = path, on_event, 0
        self.parse = Resolver()  # a long string an earlier event holds is a reference in the file

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
                self.on_event(self.parse(line))
            except json.JSONDecodeError:
                continue


def start_cell_process(args: list[str], workdir: Path, log, target: SglangTarget, fork_server: ForkServer | None):
    """A cell process running ``python -m harness.drive.cell ARGS`` (its output to ``log``, an
    open binary file; the fork server writes ``workdir/cell.log``): forked by ``fork_server``
    when it can, else a fresh interpreter, in a process group of its own."""
    cmd = [target.python, "-m", "harness.drive.cell", *args]
    if fork_server is not None:
        try:
            return fork_server.wait_ready().fork("cell", args, workdir / "cell.log", env={FORK_SERVER_ENV: fork_server.socket_path})
        except ForkServerError as exc:  # the fork server is gone: this cell starts a fresh interpreter
            log.write(f"pdconform: fork server unusable ({exc}); fresh interpreter\n".encode())
            log.flush()
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            process_group=0, env=target.cell_env(), cwd=str(ROOT))


def _wait(process, cmd: list[str], deadline_s: float, follower: _HistoryFollower | None) -> bool:
    """Wait for the cell process; False when it passed its deadline (it is then killed)."""
    start = time.monotonic()
    try:
        if follower is None:
            process.wait(timeout=deadline_s)
        else:
            while process.poll() is None:
                if time.monotonic() - start > deadline_s:
                    raise subprocess.TimeoutExpired(cmd, deadline_s)
                follower.poll()
                try:  # a forked cell's wait is held by the fork server: no polling in between
                    process.wait(timeout=min(FOLLOW_S, max(0.01, deadline_s - (time.monotonic() - start))))
                except subprocess.TimeoutExpired:
                    pass
            follower.poll()
        return True
    except subprocess.TimeoutExpired:
        _killpg(process)
        if follower:
            follower.poll()
        return False


def log_tail(workdir: Path) -> str:
    """The last lines of ``workdir/cell.log`` ("" when unreadable)."""
    try:
        return "\n".join((workdir / "cell.log").read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
    except OSError:
        return ""


REMOTE_DEADLINE_FACTOR = 2  # a cell's deadline when its roles run on other hosts (no fork server there)


def run_cell_isolated(impl: str, scenario: Scenario, seed: int, workdir: Path,
                      timeout_s: float | None = None, target: SglangTarget | None = None,
                      on_event: Callable[[dict], None] | None = None, fork_server: ForkServer | None = None,
                      base_port: int | None = None, full_waits: bool = False) -> CellRun:
    """Run one cell in a new process group; kill it at ``timeout_s`` (default: the scenario's,
    times REMOTE_DEADLINE_FACTOR when its roles run on other hosts).
    Its history then ends with an :attr:`Op.CELL_EXIT` event: ``how`` (``exited`` or
    ``deadline``), ``returncode``, ``deadline_s``, ``duration_s`` (wall seconds from its
    start), ``cpu_s`` (forked cells: CPU seconds of the cell and its roles, else None),
    ``load`` (the load average and each process's run-queue wait while it ran:
    harness.drive.load.GroupSampler.record) and the tail of its ``cell.log``.

    ``target``: the sglang to run against (harness.target.sglang; default the installed one).
    ``on_event``: called with each history event (harness.spec.history) as the cell records it.
    ``fork_server``: fork the cell (and its roles) from this fork server instead of starting
    fresh interpreters.  ``base_port``: first of the cell's ports (default: a
    free block picked now).  ``full_waits``: see harness.drive.cell.run_cell.
    """
    target = target or installed_target()
    workdir = workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)  # logs and history of an earlier run
    os.close(nofollow.open_dir(workdir.parent, create=True))  # no link followed on the way (harness.nofollow)
    workdir.mkdir()
    deadline = timeout_s if timeout_s is not None else scenario.timeout_s
    if HOSTS_ENV in target.env:  # roles on other hosts start as fresh interpreters: each imports sglang there
        deadline *= REMOTE_DEADLINE_FACTOR
    args = ["--impl", impl, "--scenario", scenario.id, "--seed", str(seed), "--workdir", str(workdir),
            "--base-port", str(base_port if base_port is not None else free_port_block(host=target.env.get(BIND_ENV)))]
    if full_waits:
        args.append("--full-waits")
    cmd = [target.python, "-m", "harness.drive.cell", *args]
    start = time.monotonic()
    with nofollow.open_write(workdir / "cell.log") as log:
        process = start_cell_process(args, workdir, log, target, fork_server)
        track_process(process)
        sampler = GroupSampler(process.pid).start()  # the load the cell ran under (harness.judge.load judges it)
        follower = _HistoryFollower(workdir / "history.jsonl", on_event) if on_event else None
        try:
            finished = _wait(process, cmd, deadline, follower)
        finally:
            load = sampler.stop()
            forget_process(process)  # the cell's roles are in its process group: none may outlive it
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    duration = round(time.monotonic() - start, 3)
    cpu = process.group_cpu_s() if isinstance(process, ForkedProcess) else None
    exit_ = {"impl": impl, "scenario": scenario.id, "seed": seed, "how": "exited" if finished else "deadline",
             "returncode": process.returncode, "deadline_s": deadline, "duration_s": duration, "cpu_s": cpu,
             "load": load, "log_tail": log_tail(workdir)}
    event = append_event(workdir / "history.jsonl", Event.INFO, Op.CELL_EXIT, value=exit_)
    if on_event:
        on_event(event)
    return CellRun(scenario.id, impl, workdir)


def default_jobs() -> int:
    """The default number of cells run at once: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)
