"""How loaded the machine was while a cell ran: the load average and how long the cell's
processes waited to run.

A cell on a machine running more runnable threads than it has cores waits for a core, and
its timers (sglang's, the scenario's bounds, the deadline) run on regardless: a timing bound
that fails there may say nothing about the implementation (issue 34 item 5).  So the runner
records, in the cell's :attr:`~harness.spec.history.Op.CELL_EXIT` event, what this module
measures, and the judge decides from it whether the cell ran starved
(harness.judge.load).  Nothing here decides anything.

Two measures, both Linux's:

- the load average (``os.getloadavg``: runnable and uninterruptible tasks, averaged over 1,
  5 and 15 minutes, machine-wide), at the cell's start and end and at each sample, against
  the cores this process may use (:func:`cores`);
- run-queue wait: ``/proc/PID/task/TID/schedstat``'s second field is the nanoseconds the
  thread spent runnable but waiting for a core (``sched_info.run_delay``; the first is its
  time on a core).  A process's own ``/proc/PID/schedstat`` is its main thread's only, and a
  thread's figures go with it when it exits, so :class:`GroupSampler` (in the runner) reads
  every thread of every process of the cell's process group (the cell and its roles), soon
  after the start and then every :data:`SAMPLE_S` seconds, keeping each thread's last
  reading; and the cell process reads itself and its roles once more as it ends, before it
  stops them (:func:`figures_now`, in ``cell-end``).  The judge takes the larger of the two
  per process: a lower bound, short of threads that ended between readings.
"""

from __future__ import annotations

import os
import threading
import time

SAMPLE_S = 1.0  # how often a running cell's threads are read (seconds): cheap enough at --jobs 16 on 2 cores
FIRST_SAMPLE_S = 0.125  # the first sample's delay, doubled up to SAMPLE_S (seconds)
SCAN_REUSE_S = 0.5  # a scan of /proc for process groups serves every cell sampling within this (seconds)


def cores() -> int:
    """The cores this process may run on (its affinity mask; else the online CPUs): what a load
    average is compared with."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def load_average() -> list[float]:
    """The machine's 1-, 5- and 15-minute load averages, rounded to 0.01 ([] where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _pgrp(pid: str) -> int | None:
    """The process group of ``pid`` from ``/proc/PID/stat`` (None: it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ")"
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[2]) if len(fields) > 2 else None


class _GroupScan:
    """Which processes are in each process group, from one scan of /proc shared by every cell
    that samples within SCAN_REUSE_S of it (one scan instead of one per running cell)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.at = -1e9
        self.groups: dict[int, list[int]] = {}

    def members(self, pgid: int) -> list[int]:
        with self.lock:
            if time.monotonic() - self.at > SCAN_REUSE_S:
                groups: dict[int, list[int]] = {}
                for name in os.listdir("/proc"):
                    if name.isdigit() and (group := _pgrp(name)) is not None:
                        groups.setdefault(group, []).append(int(name))
                self.groups, self.at = groups, time.monotonic()
            return list(self.groups.get(pgid, ()))

    def expire(self) -> None:
        """The next :meth:`members` scans again (a sample that must see the group as it is now)."""
        with self.lock:
            self.at = -1e9


_SCAN = _GroupScan()


def thread_schedstats(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread of process ``pid``: (ns on a core, ns waiting for one), from
    ``/proc/PID/task/TID/schedstat``; {} when the process is gone."""
    out: dict[int, tuple[int, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                run_ns, wait_ns, *_ = f.read().split()
            out[int(tid)] = (int(run_ns), int(wait_ns))
        except (OSError, ValueError):
            continue
    return out


def _summed(tids: dict[int, tuple[int, int]]) -> dict:
    """``{"run_s", "wait_s", "threads"}`` of threads ``tids`` (tid -> (run ns, wait ns))."""
    return {"run_s": round(sum(r for r, _ in tids.values()) / 1e9, 3),
            "wait_s": round(sum(w for _, w in tids.values()) / 1e9, 3), "threads": len(tids)}


def _since(tids: dict[int, tuple[int, int]], before: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """``tids``' figures less what each thread had already spent in ``before`` (tid -> (run ns, wait ns))."""
    return {tid: (run - before.get(tid, (0, 0))[0], wait - before.get(tid, (0, 0))[1]) for tid, (run, wait) in tids.items()}


def process_figures(pid: int) -> dict | None:
    """Process ``pid`` now: ``{"run_s", "wait_s", "threads"}`` (seconds on a core and waiting
    for one, summed over its live threads); None when it is gone."""
    tids = thread_schedstats(pid)
    return _summed(tids) if tids else None


def figures_now(pids: list[int]) -> dict[str, dict]:
    """:func:`process_figures` of each of ``pids`` still running, keyed by pid as a string: what
    the cell process records of itself and its roles as it ends (``cell-end`` ``load``), when
    their threads are still there to read, which the runner's samples, a second apart, miss
    for a short cell."""
    return {str(pid): figures for pid in pids if (figures := process_figures(pid)) is not None}


class GroupSampler:
    """Samples, on a thread of its own, the load average and the run-queue wait of every thread
    of process group ``pgid`` (a cell process and its roles) every ``every_s`` seconds, from
    :meth:`start` to :meth:`stop`, which takes a last sample and returns the record the runner
    stores in ``cell-exit`` (:meth:`record`).  ``since_now``: count only what the group's threads
    do from :meth:`start` on (a long-lived role pair's program, harness.drive.pair), not since
    each thread began."""

    def __init__(self, pgid: int, every_s: float = SAMPLE_S, since_now: bool = False):
        self.pgid, self.every_s, self.since_now = pgid, every_s, since_now
        self.threads: dict[int, dict[int, tuple[int, int]]] = {}  # pid -> tid -> (run ns, wait ns), last seen
        self.before: dict[int, dict[int, tuple[int, int]]] = {}  # since_now: the same, at start
        self.start_load = load_average()
        self.peak_1m = self.start_load[0] if self.start_load else 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pdconform-load", daemon=True)

    def sample(self) -> None:
        """Read every thread of the group now (and the 1-minute load average)."""
        for pid in _SCAN.members(self.pgid):
            seen = thread_schedstats(pid)
            if seen:
                self.threads.setdefault(pid, {}).update(seen)
        now = load_average()
        if now:
            self.peak_1m = max(self.peak_1m, now[0])

    def _run(self) -> None:
        wait = min(FIRST_SAMPLE_S, self.every_s)
        while not self._stop.wait(wait):
            self.sample()
            wait = min(wait * 2, self.every_s)  # sooner at first: a short cell's roles are read at least once

    def start(self) -> "GroupSampler":
        if self.since_now:
            self.sample()
            self.before = {pid: dict(tids) for pid, tids in self.threads.items()}
        self._thread.start()
        return self

    def stop(self) -> dict:
        """Stop sampling after one last sample (call it while the group still runs, before it is
        killed, so that the last interval counts); :meth:`record`."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            _SCAN.expire()  # this last sample must see the group as it is now
            self.sample()
        except OSError:  # /proc unreadable: what was sampled stands
            pass
        return self.record()

    def record(self) -> dict:
        """``{"cores", "cell_pid", "load_start": [1, 5, 15 min], "load_end": [...], "load_peak_1m",
        "sample_s", "processes": {PID: {"run_s", "wait_s", "threads"}}}``: seconds on a core
        and waiting for one, summed over the threads seen of each process of the group (the
        cell's own pid is the group's; the roles' pids are in their ``launch`` events)."""
        end = load_average()
        processes = {str(pid): _summed(_since(tids, self.before.get(pid, {}))) for pid, tids in sorted(self.threads.items())}
        return {"cores": cores(), "cell_pid": self.pgid, "load_start": self.start_load, "load_end": end,
                "load_peak_1m": max([self.peak_1m, *end[:1]]), "sample_s": self.every_s, "processes": processes}
