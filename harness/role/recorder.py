"""The recorder inside a role process: WARNING-and-worse log records (and any record that
carries an exception: R-STALE-1 counts an exception caught and logged inside a worker), and
threads that died.  Loggers keep their own levels (lowering them would flood the role logs
with sglang's debug output), so a caught exception logged below the level its logger emits
(WARNING, unless sglang sets another) never reaches the recorder.

Installed once per process by the role host (harness.drive.role_host); adapters read
it in ``observe`` (harness.role.adapter.RoleAdapter.observe).
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback

from harness.role.adapter import Observation


class RoleRecorder:
    """Collects log records and dead threads inside a role process.

    Installed once per process by the role host; adapters read it in ``observe``.
    Bounded: keeps the first ``limit`` records of each kind and counts the log records
    it could not keep (``log_records_dropped``), so that a check can say it cannot tell.
    """

    def __init__(self, logger_prefixes: tuple[str, ...] = ("sglang", "mooncake", "nixl", "NIXL", "mori"),
                 limit: int = 20000):
        self.logger_prefixes = logger_prefixes
        self.limit = limit
        self.log_records: list[dict[str, str]] = []
        self.log_records_dropped = 0
        self.dead_threads: list[dict[str, str]] = []
        self.started: list[tuple[threading.Thread, str]] = []  # every thread started since install, its origin
        self.joined: set[int] = set()  # id() of threads someone waited for to the end: helpers, not loops
        self._lock = threading.Lock()
        self._previous_hook = threading.excepthook

    def install(self) -> "RoleRecorder":
        recorder = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if not record.name.startswith(recorder.logger_prefixes):
                    return
                caught = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
                if record.levelno < logging.WARNING and not caught:
                    return
                try:
                    message = record.getMessage()
                except Exception as exc:  # a bad format string is still a record
                    message = f"{record.msg!r} (unformattable: {exc})"
                with recorder._lock:
                    if len(recorder.log_records) < recorder.limit:
                        recorder.log_records.append({"level": record.levelname, "logger": record.name,
                                                     "message": message, "exception": caught})
                    else:
                        recorder.log_records_dropped += 1

        self._handler = _Handler(level=logging.NOTSET)  # records with an exception count at any level
        logging.getLogger().addHandler(self._handler)
        threading.excepthook = self._excepthook
        original_start = self._thread_start = threading.Thread.start

        def start(thread: threading.Thread) -> None:
            # R-LIVE-2 covers every thread a manager starts, whenever: a transfer executor's
            # workers and a heartbeat checker start at the first room, not in the constructor
            with recorder._lock:
                if len(recorder.started) < recorder.limit:
                    recorder.started.append((thread, _origin(sys._getframe(1))))
            original_start(thread)

        original_join = self._thread_join = threading.Thread.join

        def join(thread: threading.Thread, timeout: float | None = None) -> None:
            original_join(thread, timeout)
            if not thread.is_alive():
                with recorder._lock:
                    recorder.joined.add(id(thread))

        threading.Thread.start, threading.Thread.join = start, join
        return self

    def uninstall(self) -> None:
        """Undo :meth:`install` (a test's recorder; a role process keeps its own to the end)."""
        logging.getLogger().removeHandler(self._handler)
        threading.excepthook = self._previous_hook
        threading.Thread.start, threading.Thread.join = self._thread_start, self._thread_join

    def mark(self) -> int:
        """A bookmark in the threads started so far: pass it to :meth:`observation` as
        ``since`` to watch every thread started after it (a manager's, built next)."""
        with self._lock:
            return len(self.started)

    def _excepthook(self, args: threading.ExceptHookArgs) -> None:
        with self._lock:
            if len(self.dead_threads) < self.limit:
                self.dead_threads.append(
                    {
                        "thread": args.thread.name if args.thread else "?",
                        "exception": args.exc_type.__name__,
                        "message": str(args.exc_value),
                        "traceback": "".join(
                            traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback)
                        )[-4000:],
                    }
                )
        self._previous_hook(args)

    def snapshot(self) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        with self._lock:
            return list(self.log_records), list(self.dead_threads)

    def clear(self) -> None:
        """Forget every record and dead thread kept so far (a long-lived role starting its next
        program, harness.drive.pair: each program observes only what happened during it)."""
        with self._lock:
            self.log_records, self.dead_threads, self.log_records_dropped = [], [], 0

    def dropped(self) -> int:
        """Log records not kept since the cap was reached."""
        with self._lock:
            return self.log_records_dropped

    def observation(self, role: str, threads: list[threading.Thread],
                    rooms: dict[int, list[str]] | None = None,
                    remembered: dict[int, list[str]] | None = None, residue_incomplete: str = "",
                    since: int | None = None) -> dict:
        """The :class:`Observation` an adapter's ``observe`` returns: its ``threads``
        by name and liveness, the recorded logs and dead threads, ``rooms`` and
        ``remembered``.  ``since`` (a :meth:`mark` taken before the manager was built): every
        thread the implementation's code (sglang, an adapter's backend; not an engine, the
        harness, nor the standard library's servers and pools) started after it is watched
        too (``loops`` names it ``NAME#late<i>``), whenever it started (R-LIVE-2), unless its
        starter waited for it to end (a helper that ran to completion, not a loop)."""
        logs, dead = self.snapshot()
        loops = {f"{t.name}#{i}": t.is_alive() for i, t in enumerate(threads)}
        if since is not None:
            with self._lock:
                late = [t for t, origin in self.started[since:]
                        if origin.startswith(_IMPLEMENTATION) and id(t) not in self.joined
                        and not isinstance(t, threading.Timer)]  # a Timer is one-shot by design
            for i, t in enumerate(t for t in dict.fromkeys(late) if t not in threads):
                loops[f"{t.name}#late{i}"] = t.is_alive()
        return Observation(role=role, loops=loops, log_records=logs, log_records_dropped=self.dropped(),
                           dead_threads=dead, rooms=rooms or {}, residue_incomplete=residue_incomplete,
                           remembered=remembered or {}).to_dict()


#: the code whose threads are the manager's: sglang and the adapters' backends (an engine's own
#: threads, the Mori stand-in's ``mori.cpp`` included, are the engine's business, not R-LIVE-2's)
_IMPLEMENTATION = ("sglang.", "backends.")
_MACHINERY = ("threading", "concurrent.futures")


def _origin(frame) -> str:
    """The module of the first caller of ``Thread.start`` outside the thread machinery
    (a ThreadPoolExecutor starts its workers for whoever submitted the work), "?" if none."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "?")
        if not name.startswith(_MACHINERY):
            return name
        frame = frame.f_back
    return "?"
