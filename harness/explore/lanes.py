"""Explore's lanes (programs run several at once, one thread per lane) and what an interrupted
explorer must end beyond its own pairs and fork servers (harness.explore.session.Explorer.stop).

Lanes are daemon threads, not a thread pool: an interrupted run exits without waiting for a
lane (a pool's threads are joined at exit, however long their program takes); Explorer.stop
kills what the lanes wait on, so they end within a poll, and gives them :data:`STOP_JOIN_S`.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from harness.drive import forkserver_client, pair
from harness.drive.contain import become_subreaper, children, kill_descendants

STOP_JOIN_S = 1.0  # an interrupted explorer: how long its lanes get to end once their cells were killed (seconds)
# a round's lanes end by then after its budget: the last program's deadline, a pair's start (the fork server's
# import and a fork) and its judging; past it the round stops as pdconform's own error (seconds)
LANE_OVERRUN_S = 400.0
TEMP_PREFIXES = (forkserver_client.DIR_PREFIX, pair.DIR_PREFIX)  # the temporary folders an explorer makes


#: the longest the main thread waits on a lane in one go (seconds): how late it may run a signal's handler
JOIN_SLICE_S = 0.1


class Lanes:
    """``count`` daemon threads that take items off one iterator and hand each to ``work(item,
    lane)`` until it returns False, the items run out, or ``stopping`` is set (an interrupt).
    The first error a lane raises while not stopping is raised by :meth:`run`."""

    def __init__(self, count: int, stopping: threading.Event, name: str = "pdconform-explore-lane"):
        self.count, self.stopping, self.name = count, stopping, name
        self.threads: list[threading.Thread] = []

    def run(self, items: Iterable, work: Callable[[object, int], bool], until: float) -> None:
        """Run every item (see the class docstring) and wait for the lanes; ``until``: the
        time.monotonic() by which every lane must have ended, else RuntimeError (a lane that
        hangs is pdconform's own error).  KeyboardInterrupt (the main thread's) propagates at
        once: the caller ends what the lanes wait on (Explorer.stop)."""
        feed, take, errors = iter(items), threading.Lock(), []

        def lane_loop(lane: int) -> None:
            try:
                while not self.stopping.is_set():
                    with take:
                        item = next(feed, None)
                    if item is None or not work(item, lane):
                        return
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, unless stopping
                if not self.stopping.is_set():
                    errors.append(exc)

        self.threads = [threading.Thread(target=lane_loop, args=(lane,), name=f"{self.name}-{lane}", daemon=True)
                        for lane in range(self.count)]
        for thread in self.threads:
            thread.start()
        for thread in self.threads:
            # in slices: a signal the kernel hands to a lane thread only wakes the main thread, which
            # runs Python's handlers, when its wait returns; one long join would hold an interrupt
            # for the rest of the budget
            while thread.is_alive() and time.monotonic() < until:
                thread.join(min(JOIN_SLICE_S, max(0.0, until - time.monotonic())))
            if thread.is_alive():
                raise RuntimeError(f"{thread.name} still running past its bound (pdconform's own error)")
        if errors:
            raise errors[0]

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds in all for the lanes to end; whether all have."""
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            if thread.ident is not None:  # an interrupt between creating the lanes and starting them all
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self.threads)


def _owned_temp_dirs() -> set[Path]:
    return set().union(*(forkserver_client.owned_dirs(prefix) for prefix in TEMP_PREFIXES))


def watch_leftovers() -> tuple[set[int], set[Path]]:
    """Make this process a subreaper (the orphans of killed cells' roles come back here,
    harness.drive.contain) and say what is not the explorer's to end or remove: this process's
    children and its temporary folders now (for :func:`end_leftovers`)."""
    become_subreaper()
    return set(children()), _owned_temp_dirs()


def end_leftovers(before: tuple[set[int], set[Path]], folders: bool = True) -> list[str]:
    """End every child of this process not in ``before`` (SIGKILL; reaped) and, with ``folders``
    (an interrupt: nothing of the explorer's runs any more), remove the temporary folders of
    :data:`TEMP_PREFIXES` it made since, whatever an interrupt cut short before one was recorded;
    the processes ended, as harness.drive.contain.describe says."""
    ended = kill_descendants(keep=before[0])
    for folder in _owned_temp_dirs() - before[1] if folders else ():
        shutil.rmtree(folder, ignore_errors=True)
    return ended


__all__ = ["Lanes", "watch_leftovers", "end_leftovers", "STOP_JOIN_S", "LANE_OVERRUN_S", "TEMP_PREFIXES"]
