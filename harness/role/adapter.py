"""The adapter contract: what every implementation offers the harness.

An adapter lives inside a *role process* (see :mod:`harness.drive.role_host`) and
drives one side of one implementation: the prefill (with its bootstrap server)
or the decode.  The cell driver reaches it only through the role process's
command socket, so the same contract works for local processes and, later,
roles on other hosts.

Adapters translate vocabulary calls into calls on the implementation and report
*observations*; they never decide a verdict (that is :mod:`harness.judge.checks`).

Every method that takes a ``room`` refers to a bootstrap room id (an int).
Statuses are sglang ``KVPoll`` values as ints: Failed 0, Bootstrapping 1,
WaitingForInput 2, Transferring 3, Success 4.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from harness.role.faults import Points

# KVPoll values (sglang.srt.disaggregation.base.conn.KVPoll), spelled out so
# that the driver side never imports sglang.
FAILED, BOOTSTRAPPING, WAITING_FOR_INPUT, TRANSFERRING, SUCCESS = 0, 1, 2, 3, 4
KVPOLL_NAMES = {
    FAILED: "Failed",
    BOOTSTRAPPING: "Bootstrapping",
    WAITING_FOR_INPUT: "WaitingForInput",
    TRANSFERRING: "Transferring",
    SUCCESS: "Success",
}
TERMINAL = (FAILED, SUCCESS)
AWAIT_POLL_S = 0.005  # between KVPoll reads of RoleAdapter.await_status (seconds): the latency floor of a status


def kvpoll_name(value: int | None) -> str:
    """Human name of a KVPoll int (``"None"`` for no status)."""
    return KVPOLL_NAMES.get(value, str(value)) if value is not None else "None"


class Unsupported(Exception):
    """Raised by an adapter for a step its implementation cannot perform.

    The message is the reason; the cell's verdict becomes UNSUPPORTED.
    """


@dataclass(frozen=True)
class Layout:
    """KV pool layout of one side.

    ``num_layers`` model layers (this side holds all of them for PP = 1);
    ``num_pages`` pages per buffer; ``page_size`` tokens per page;
    ``page_bytes`` bytes per page per buffer (multiple of 8); ``aux_slots`` aux
    slots of ``aux_bytes`` bytes each; ``mla`` selects one KV buffer per layer
    (MLA) instead of separate K and V buffers (MHA).  ``stage_start``/``stage_end``:
    the pipeline stage this side holds (``stage_end`` None: to the last layer);
    ``draft_layers``: draft-model KV layers appended after the main ones, as
    sglang's schedulers append them to ``KVArgs.kv_data_ptrs``.
    """

    num_layers: int = 3
    num_pages: int = 16
    page_size: int = 4
    page_bytes: int = 256
    aux_slots: int = 4
    aux_bytes: int = 64
    mla: bool = False
    kv_heads: int = 1
    stage_start: int = 0
    stage_end: int | None = None
    draft_layers: int = 0

    @property
    def main_layers(self) -> range:
        """The model layers of this side's stage."""
        return range(self.stage_start, self.num_layers if self.stage_end is None else self.stage_end)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Observation:
    """What a role saw during the cell, as plain data.

    * ``loops``: the implementation's control/worker threads by name -> alive;
    * ``log_records``: WARNING and above from the implementation's loggers
      (``level``, ``logger``, ``message``);
    * ``dead_threads``: threads that died with an exception (``thread``,
      ``exception``, ``message``, ``traceback``);
    * ``rooms``: per-room state left in the manager: room -> list of
      ``"attribute[key]"`` paths that still mention the room;
    * ``remembered``: per-room memory of *ended* generations that the spec allows
      for a bounded time (R-REUSE-1: tombstones, retired generations), kept apart
      from ``rooms`` so that a check for leftover state does not count it.
    """

    role: str
    loops: dict[str, bool] = field(default_factory=dict)
    log_records: list[dict[str, str]] = field(default_factory=list)
    dead_threads: list[dict[str, str]] = field(default_factory=list)
    rooms: dict[int, list[str]] = field(default_factory=dict)
    remembered: dict[int, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RoleAdapter(ABC):
    """One implementation's side of a PD pair, inside one role process.

    Subclasses set ``impl`` (``reference``, ``mooncake``, ``nixl``, ``mori``) and
    implement the abstract methods.  A role process hosts exactly one adapter;
    the prefill role also hosts the bootstrap server.
    """

    impl: ClassVar[str]

    # ---- lifecycle -------------------------------------------------------
    @abstractmethod
    def engine(self) -> str:
        """``real``, ``standin`` or ``reference``: which transfer engine runs."""

    @abstractmethod
    def start_prefill(self, layout: dict, bootstrap_port: int) -> dict:
        """Start the bootstrap server on ``bootstrap_port`` and the prefill manager
        over pattern-filled pools.  Returns facts for the history (ports, engine)."""

    @abstractmethod
    def start_decode(self, layout: dict, bootstrap_port: int, attn_tp: tuple[int, int] = (1, 0)) -> dict:
        """Start the decode manager over pattern-filled pools, as attention-TP rank
        ``attn_tp[1]`` of a decode with ``attn_tp[0]`` ranks (one process per rank)."""

    @abstractmethod
    def teardown(self) -> None:
        """Stop what the adapter started, as far as the implementation allows."""

    # ---- prefill side ----------------------------------------------------
    @abstractmethod
    def open_sender(self, room: int, bootstrap_addr: str, destinations: int = 1) -> None:
        """Create the prefill sender for ``room``, which ``destinations`` decode ranks
        will register for (more than one when the decode's attention TP is wider than
        the prefill's); Unsupported when the adapter cannot build such a room."""

    @abstractmethod
    def init_sender(self, room: int, num_pages: int, aux_slot: int) -> None:
        """Tell the sender how many KV pages the request has and its aux slot."""

    @abstractmethod
    def send_chunk(self, room: int, pages: list[int]) -> None:
        """Send one chunk: prefill page indices, in order."""

    # ---- decode side -----------------------------------------------------
    @abstractmethod
    def open_receiver(self, room: int, bootstrap_addr: str, timeout_s: float) -> None:
        """Create the decode receiver for ``room`` and resolve the prefill's
        parallel info (bounded by ``timeout_s`` seconds)."""

    @abstractmethod
    def request_kv(self, room: int, pages: list[int], aux_slot: int) -> None:
        """Initialise the receiver and send its destination pages and aux slot."""

    @abstractmethod
    def verify(self, kv_moves: list[tuple[int, int]], aux_moves: list[tuple[int, int]],
               unchecked_kv: list[int] = (), unchecked_aux: list[int] = (),
               sent_layers: list[int] | None = None) -> dict:
        """Check this side's pools against (source, destination) page/slot pairs,
        leaving ``unchecked_kv`` pages and ``unchecked_aux`` slots unjudged and
        expecting K/V buffers of layers not in ``sent_layers`` (when given) untouched;
        returns :meth:`harness.role.pattern.PoolReport.to_dict`."""

    # ---- either side -----------------------------------------------------
    @abstractmethod
    def poll(self, room: int) -> int:
        """The room's KVPoll on this side."""

    def await_status(self, room: int, statuses: list[int], timeout_s: float,
                     interval_s: float = AWAIT_POLL_S) -> dict:
        """Read :meth:`poll` every ``interval_s`` seconds until the room's KVPoll is one of
        ``statuses`` or ``timeout_s`` seconds have passed (at least one read).

        Runs inside the role, so a status is seen within ``interval_s`` without a round
        trip per read.  Returns ``{"status": int, "trail": [KVPoll names in the order
        seen], "waited_s": float}``; what :meth:`poll` raises propagates."""
        start = time.monotonic()
        trail: list[str] = []
        while True:
            status = self.poll(room)
            if not trail or trail[-1] != kvpoll_name(status):
                trail.append(kvpoll_name(status))
            waited = time.monotonic() - start
            if status in statuses or waited > timeout_s:
                return {"status": status, "trail": trail, "waited_s": round(waited, 3)}
            time.sleep(interval_s)

    @abstractmethod
    def failure_reason(self, room: int) -> str | None:
        """The implementation's failure reason for the room, if any."""

    @abstractmethod
    def clear(self, room: int) -> None:
        """Clear the room's sender/receiver."""

    @abstractmethod
    def abort(self, room: int) -> None:
        """Abort the room's sender/receiver."""

    @abstractmethod
    def observe(self) -> dict:
        """:class:`Observation` as a dict."""

    # ---- fault injection (harness.role.faults) --------------------------------
    #: interleaving points this adapter can reach: name -> the code it wraps
    POINTS: ClassVar[dict[str, str]] = {}

    @property
    def points(self) -> Points:
        if "_points" not in self.__dict__:
            self.__dict__["_points"] = Points(self.POINTS)
        return self.__dict__["_points"]

    def arm_point(self, point: str, action: str, frames: list | None = None, hold_s: float = 20.0) -> None:
        """Arm an interleaving point for its next hit (:meth:`harness.role.faults.Points.arm`).
        Unsupported when this adapter cannot reach ``point``."""
        if point not in self.POINTS:
            reachable = ", ".join(sorted(self.POINTS)) or "none"
            raise Unsupported(f"{self.impl} cannot reach interleaving point {point!r} (reachable: {reachable})")
        self.points.arm(point, action, frames, hold_s)

    def point_hits(self) -> dict:
        """Points a thread is paused at now and every finished hit."""
        return self.points.hits()

    def release_point(self, point: str) -> bool:
        """Let the thread paused at ``point`` continue; False when none waits there."""
        return self.points.release(point)

    def set_engine_faults(self, **plan) -> dict:
        """Install an :class:`harness.role.faults.EngineFaultPlan` on this role's transfer
        engine; returns what was installed.  Unsupported by default."""
        raise Unsupported(f"{self.impl} has no engine fault injection")

    def fault_log(self) -> list[dict]:
        """Every engine fault injected so far (``transfer``, ``fault``, ``what``)."""
        return []

    # ---- wire messages for field scenarios (decode side) -----------------
    def abort_frames(self, room: int) -> list[bytes]:
        """The plain ABORT this decode's implementation sends a prefill for ``room``
        (Common protocol: ``[ABORT, room, decode_ip, decode_port(, generation)]``, no
        backend guard frame), with this decode's address so an ACK can come back.
        Unsupported by default."""
        raise Unsupported(f"{self.impl} cannot build its ABORT frames")

    def abort_acks(self) -> list[dict]:
        """Every ABORT_ACK this decode received: ``room``, ``generation`` (None when the
        message names none) and ``t`` (wall clock, seconds).  Empty by default."""
        return []

    # ---- layout planning (harness.spec.layouts) -------------------------------
    def plan_layouts(self, specs: list[dict]) -> list[dict]:
        """Run the implementation's own KV layout planning on each spec
        (:mod:`harness.spec.layouts`): ``{"pairs": [[src, dst], ...]}`` or
        ``{"rejected": reason}`` per spec.  Unsupported by default."""
        raise Unsupported(f"{self.impl} exposes no layout planning function")

    def unsupported_layout(self, spec: dict) -> str | None:
        """Why a real transfer for layout ``spec`` cannot run in this environment
        (None: it can).  Such layouts are skipped and listed, never judged."""
        return None


class RoleRecorder:
    """Collects log records and dead threads inside a role process.

    Installed once per process by the role host; adapters read it in ``observe``.
    Bounded: keeps the first ``limit`` records of each kind.
    """

    def __init__(self, logger_prefixes: tuple[str, ...] = ("sglang", "mooncake", "nixl", "NIXL", "mori"),
                 limit: int = 500):
        self.logger_prefixes = logger_prefixes
        self.limit = limit
        self.log_records: list[dict[str, str]] = []
        self.dead_threads: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._previous_hook = threading.excepthook

    def install(self) -> "RoleRecorder":
        recorder = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if not record.name.startswith(recorder.logger_prefixes):
                    return
                try:
                    message = record.getMessage()
                except Exception as exc:  # a bad format string is still a record
                    message = f"{record.msg!r} (unformattable: {exc})"
                with recorder._lock:
                    if len(recorder.log_records) < recorder.limit:
                        recorder.log_records.append(
                            {"level": record.levelname, "logger": record.name, "message": message}
                        )

        handler = _Handler(level=logging.WARNING)
        logging.getLogger().addHandler(handler)
        threading.excepthook = self._excepthook
        return self

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

    def observation(self, role: str, threads: list[threading.Thread],
                    rooms: dict[int, list[str]] | None = None,
                    remembered: dict[int, list[str]] | None = None) -> dict:
        """The :class:`Observation` an adapter's ``observe`` returns: its ``threads``
        by name and liveness, the recorded logs and dead threads, ``rooms`` and
        ``remembered``."""
        logs, dead = self.snapshot()
        loops = {f"{t.name}#{i}": t.is_alive() for i, t in enumerate(threads)}
        return Observation(role=role, loops=loops, log_records=logs, dead_threads=dead, rooms=rooms or {},
                           remembered=remembered or {}).to_dict()
