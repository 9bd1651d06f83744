"""The adapter contract: what every implementation offers the harness.

An adapter lives inside a *role process* (see :mod:`harness.drive.role_host`) and
drives one side of one implementation: the prefill (with its bootstrap server)
or the decode.  The cell driver reaches it only through the role process's
command socket, so the same contract works for local processes and, later,
roles on other hosts.

Adapters translate vocabulary calls into calls on the implementation and report
*observations*; they never decide a verdict (that is :mod:`harness.judge.checks`).

Every method that takes a ``room`` refers to a bootstrap room id (an int).
Statuses are :class:`harness.spec.protocol.KVPoll` values (sglang's ints).
"""

from __future__ import annotations

import inspect
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from harness.role.faults import Points
from harness.spec.protocol import KVPoll, kvpoll_name

if TYPE_CHECKING:
    from harness.role.at_success import SuccessBytes
    from harness.role.faults import EngineFaultPlan

AWAIT_POLL_S = 0.005  # between KVPoll reads of RoleAdapter.await_status (seconds): the latency floor of a status


class Unsupported(Exception):
    """Raised by an adapter for a step its implementation cannot perform.

    The message is the reason; the cell's verdict becomes UNSUPPORTED.  Preferably from the
    engine's or sglang's own refusal at run time (:class:`Refusal`), saying what would make
    the step run; a reason decided before anything runs is a prediction (:func:`predicted`).
    """


#: how a reason that was predicted, not seen, begins (:func:`predicted`)
PREDICTED = "predicted (not run): "


def predicted(reason: str) -> str:
    """``reason`` marked as a prediction: decided by the adapter before anything ran, kept only
    where letting the engine try would harm this machine, so a reader knows that no engine
    or sglang code refused it here."""
    return reason if reason.startswith(PREDICTED) else PREDICTED + reason


@dataclass(frozen=True)
class Refusal:
    """A refusal the engine or sglang raises at run time, recognised by the exception's type
    name (``exception``) and ``words`` of its message, with the ``advice`` an UNSUPPORTED
    reason gives (what would make it run: "needs VRAM: ... run on a GPU host")."""

    exception: str
    words: str
    advice: str

    def matches(self, exception: str, message: str) -> bool:
        """Whether an exception of type name ``exception`` with ``message`` is this refusal."""
        return exception == self.exception and self.words in message


def refused(refusals: tuple[Refusal, ...], dead_threads: list[dict[str, str]]) -> str | None:
    """The UNSUPPORTED reason for the first of ``dead_threads`` (RoleRecorder's records:
    ``thread``, ``exception``, ``message``) that died of one of ``refusals``: its advice, then
    what raised it, in the engine's own words; None when none did."""
    for dead in dead_threads:
        for refusal in refusals:
            if refusal.matches(dead.get("exception", ""), dead.get("message", "")):
                return (f"{refusal.advice} (refused at run time: thread {dead.get('thread', '?')} raised "
                        f"{dead['exception']}: {dead.get('message', '')})")
    return None


@dataclass
class Observation:
    """What a role saw during the cell, as plain data.

    * ``loops``: the implementation's control/worker threads by name -> alive;
    * ``log_records``: WARNING and above from the implementation's loggers, and any
      record that carries an exception, whatever its level, as long as the logger emits
      that level at all (its own level still filters first) (``level``, ``logger``,
      ``message``, and ``exception``: the exception's type, "" for none);
    * ``log_records_dropped``: records the recorder could not keep (its cap was
      reached): a check that reads the logs cannot tell when it is not 0;
    * ``dead_threads``: threads that died with an exception (``thread``,
      ``exception``, ``message``, ``traceback``);
    * ``rooms``: per-room state left in the manager: room -> list of paths that still
      mention the room (``"request_status[123]"``, ``"staging.outstanding[(123, 0)]"``:
      harness.role.residue.find_rooms);
    * ``residue_incomplete``: why the residue walk did not see everything ("" when it
      did; harness.role.residue): a residue check cannot tell then;
    * ``remembered``: per-room memory of *ended* generations that the spec allows
      for a bounded time (R-REUSE-1: tombstones, retired generations), kept apart
      from ``rooms`` so that a check for leftover state does not count it.
    """

    role: str
    loops: dict[str, bool] = field(default_factory=dict)
    log_records: list[dict[str, str]] = field(default_factory=list)
    log_records_dropped: int = 0
    dead_threads: list[dict[str, str]] = field(default_factory=list)
    rooms: dict[int, list[str]] = field(default_factory=dict)
    remembered: dict[int, list[str]] = field(default_factory=dict)
    residue_incomplete: str = ""

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
    def start_prefill(self, layout: dict, bootstrap_port: int, pp: tuple[int, int, str] = (1, 0, ""),
                      attn_tp: tuple[int, int] = (1, 0), dp: tuple[int, int] = (1, 0)) -> dict:
        """Start the bootstrap server on ``bootstrap_port`` and the prefill manager
        over pattern-filled pools.  Returns facts for the history (ports, engine).
        ``pp``: (stages, this stage, rendezvous ``tcp://host:port``): this role is one
        pipeline stage of a prefill whose stages are one role process each; stage 0
        serves the bootstrap server, every stage registers with it, and ``layout``
        holds this stage's layers (``stage_start``/``stage_end``).  ``attn_tp``: (ranks,
        this rank): this role is one attention-TP rank of a prefill whose ranks are one
        role process each, all on ``bootstrap_port`` (rank 0 serves it); ``layout`` holds
        this rank's KV heads (``kv_heads`` from ``head_start`` of ``total_kv_heads``).
        ``dp``: (engines, this engine): one DP engine of a prefill whose engines share
        ``bootstrap_port`` (engine 0 serves it) and serve room r on engine r mod engines (R-DP-1)."""

    @abstractmethod
    def start_decode(self, layout: dict, bootstrap_port: int, attn_tp: tuple[int, int] = (1, 0),
                     dp: tuple[int, int] = (1, 0)) -> dict:
        """Start the decode manager over pattern-filled pools, as attention-TP rank
        ``attn_tp[1]`` of a decode with ``attn_tp[0]`` ranks (one process per rank), of DP
        engine ``dp[1]`` of ``dp[0]`` (each engine its own manager and pools)."""

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
        seen], "waited_s": float, "seen_wall": the wall clock (s) of the read that ended the
        wait}``; what :meth:`poll` raises propagates."""
        start = time.monotonic()
        trail: list[str] = []
        while True:
            status = self.poll(room)
            if not trail or trail[-1] != kvpoll_name(status):
                trail.append(kvpoll_name(status))
            waited = time.monotonic() - start
            if status == KVPoll.Success:  # the bytes as they are when Success is first read (R-XFER-2)
                self.success_bytes.seen_success(room, getattr(self, "buffers", None))
            if status in statuses or waited > timeout_s:
                return {"status": status, "trail": trail, "waited_s": round(waited, 3), "seen_wall": time.time()}
            time.sleep(interval_s)

    @abstractmethod
    def failure_reason(self, room: int) -> str | None:
        """The implementation's failure reason for the room, if any."""

    def status_map(self, room: int) -> int | None:
        """The room's KVPoll as the manager's own status table holds it, read afresh (sglang's
        Common receivers and senders cache their first terminal :meth:`poll` answer, so a
        table that changes after it is hidden from poll); None where the implementation has no
        such table apart from what :meth:`poll` reads, or it holds no entry for the room."""
        return None

    def status_before_clear(self, room: int) -> dict:
        """The room's statuses read just before the harness clears it (R-TERM-1 at the end of
        each lifecycle): ``{"poll": KVPoll name, "map": KVPoll name}`` (:meth:`status_map`);
        a read that raises or finds nothing is left out (the room may be unknown here)."""
        out: dict = {}
        for key, read in (("poll", self.poll), ("map", self.status_map)):
            try:
                value = read(room)
            except Exception:  # noqa: BLE001 - a room this side never opened: nothing to read
                continue
            if value is not None:
                out[key] = kvpoll_name(value)
        return out

    @abstractmethod
    def clear(self, room: int) -> None:
        """Clear the room's sender/receiver."""

    @abstractmethod
    def abort(self, room: int) -> None:
        """Abort the room's sender/receiver."""

    @abstractmethod
    def observe(self, rooms: list[int] = (), residue: bool = True) -> dict:
        """:class:`Observation` as a dict.  ``rooms``: every bootstrap room the cell uses (on
        any role), so that residue is found for rooms this role never opened
        (harness.role.residue.find_rooms); ``residue`` False: threads and logs only (a
        mid-cell observation; the walk costs CPU, up to a few hundred ms per call)."""

    # ---- fault injection (harness.role.faults) --------------------------------
    #: interleaving points this adapter can reach: name -> the code it wraps
    POINTS: ClassVar[dict[str, str]] = {}

    @property
    def points(self) -> Points:
        if "_points" not in self.__dict__:
            self.__dict__["_points"] = Points(self.POINTS)
        return self.__dict__["_points"]

    def _forget_points(self) -> None:
        """Disarm every point and forget its hits, the bytes copied at Success and any message
        loss plan and its log (a long-lived role's next program: begin_program)."""
        from harness.role import message_loss

        self.__dict__.pop("_points", None)
        self.__dict__.pop("_success_bytes", None)
        message_loss.LOSS.forget()

    # ---- bytes at Success (harness.role.at_success) ---------------------------------
    @property
    def success_bytes(self) -> "SuccessBytes":
        """This decode's copies of each room's destination rows at its first Success read; the
        role host tells it of each ``request_kv`` (harness.drive.role_host)."""
        if "_success_bytes" not in self.__dict__:
            from harness.role.at_success import SuccessBytes  # torch: only in a role process
            self.__dict__["_success_bytes"] = SuccessBytes()
        return self.__dict__["_success_bytes"]

    def verify_at_success(self, kv_moves: list[tuple[int, int]], aux_moves: list[tuple[int, int]],
                          unchecked_kv: list[int] = (), unchecked_aux: list[int] = (),
                          sent_layers: list[int] | None = None) -> dict:
        """:meth:`verify`'s arguments, judged on the rows as they were when each room's Success
        was first read (R-XFER-2; :meth:`harness.role.at_success.SuccessBytes.verify`)."""
        return self.success_bytes.verify(getattr(self, "buffers", None), [tuple(m) for m in kv_moves],
                                         [tuple(m) for m in aux_moves], unchecked_kv, unchecked_aux, sent_layers)

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

    #: the engine error kinds (harness.role.faults.ENGINE_ERRORS) this role's engine can surface
    ENGINE_ERRORS: tuple[str, ...] = ()

    def _engine_plan(self, plan: dict) -> "EngineFaultPlan":
        """``plan`` as an EngineFaultPlan; Unsupported for an error kind this engine does not have."""
        from harness.role.faults import EngineFaultPlan

        checked = EngineFaultPlan(**plan)
        if checked.error and checked.error not in self.ENGINE_ERRORS:
            raise Unsupported(f"{self.impl}'s engine has no {checked.error} error to inject: a failed write surfaces "
                              f"one way there ({', '.join(self.ENGINE_ERRORS) or 'its plain failure'} only)")
        return checked

    def fault_log(self) -> list[dict]:
        """Every engine fault injected so far (``transfer``, ``fault``, ``what``)."""
        return []

    #: the control messages this implementation sends, by kind (harness.role.message_loss.KINDS)
    MESSAGE_KINDS: tuple[str, ...] = ()

    def message_kinds(self) -> tuple[str, ...]:
        """The message kinds this role's implementation sends as configured now (a backend whose
        setting moves a message off the control path overrides it)."""
        return self.MESSAGE_KINDS

    def lose_messages(self, kind: str | None = None, room: int | None = None, nth: int = 1, count: int = 1) -> dict:
        """Lose control messages this process sends (:meth:`harness.role.message_loss.MessageLoss.set`;
        R-LOSS-1); returns the plan installed.  Unsupported for a kind the implementation does
        not send as a control message (an aux written by the engine), ValueError for bad counts."""
        from harness.role import message_loss

        if kind is not None and kind not in self.message_kinds():
            sends = ", ".join(self.message_kinds()) or "none"
            raise Unsupported(f"{self.impl} sends no {kind} message on its control path (it sends: {sends})")
        message_loss.install()
        return message_loss.LOSS.set(kind, room, nth, count)

    def message_log(self) -> list[dict]:
        """Every control message lost so far (harness.role.message_loss)."""
        from harness.role import message_loss

        return message_loss.LOSS.snapshot()

    def message_audit(self) -> dict:
        """What this process's control sockets received: ``{"received": n, "not_whole": k,
        "examples": [...]}`` (harness.role.message_loss.Audit; R-LOAD-1)."""
        from harness.role import message_loss

        return message_loss.AUDIT.snapshot()

    # ---- long-lived roles (harness.drive.pair) -----------------------------------
    def begin_program(self) -> dict:
        """This role, already started, serves its next program (explore's long-lived role pairs,
        harness.drive.pair): heal the engine (a plan of no faults), forget what earlier programs
        left to observe (log records, dead threads, the engine fault log, interleaving points and
        their hits, ABORT_ACKs received, the rooms seen) and write the pools' pattern again in
        place, so that the program observes what a freshly started role would show.  Returns
        ``{"buffers": pools refilled}``.  Unsupported by default: such a role serves one program."""
        raise Unsupported(f"{self.impl} roles serve one program each (no begin_program)")

    # ---- wire messages for field scenarios (decode side) -----------------
    def abort_frames(self, room: int) -> list[bytes]:
        """The plain ABORT this decode's implementation sends a prefill for ``room``
        (Common protocol: ``[ABORT, room, decode_ip, decode_port(, generation)]``, no
        backend guard frame), with this decode's address so an ACK can come back.
        Unsupported by default."""
        raise Unsupported(f"{self.impl} cannot build its ABORT frames")

    def status_frames(self, room: int, status: int) -> list[bytes]:
        """The STATUS message this prefill's implementation sends its decode for ``room``'s
        current lifecycle with KVPoll ``status`` (no failure reason), exactly as its own
        code encodes it, so that a scenario can deliver it again later (a late message of
        an ended lifecycle, R-REUSE-1).  Unsupported by default."""
        raise Unsupported(f"{self.impl} cannot build its STATUS frames")

    def abort_acks(self) -> list[dict]:
        """Every ABORT_ACK this decode received: ``room``, ``generation`` (None when the
        message names none), ``sender`` (the prefill rank or pipeline stage that sent it, None
        when unknown: each sends its own) and ``t`` (wall clock, seconds).  Empty by default."""
        return []

    def aborts_sent(self) -> list[dict]:
        """Every ABORT generation this decode armed or sent: ``room``, ``generation`` (None when
        its ABORT names none) and ``t`` (wall clock, seconds); what each ABORT_ACK must echo
        (R-ABORT-2, harness.judge.postconditions ``ack-names-abort-generation``).  Empty by
        default (nothing is judged then)."""
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

    def unsupported_topology(self, prefill_tp: int, decode_tp: int, mla: bool, prefill_pp: int = 1,
                             prefill_dp: int = 1, decode_dp: int = 1) -> str | None:
        """Can this run here?  Why the engine cannot serve a prefill of ``prefill_tp`` attention
        TP ranks (and ``prefill_pp`` pipeline stages, into a whole-model decode; ``prefill_dp``
        and ``decode_dp`` engines each side) into a decode of ``decode_tp`` (``mla``: MLA KV) on this machine (memory kind, transport), saying
        what would make it run; None when it can.  Asked before any manager starts: such a
        cell is UNSUPPORTED, never FAIL.  Only for what the harness itself cannot build, or
        where letting the engine try would harm this machine (then :func:`predicted`): a
        refusal the engine or sglang makes at run time is left to them (:class:`Refusal`)."""
        return None


#: an op the role host itself answers (it ends the role), beside the adapter's methods
SHUTDOWN = "shutdown"


class ContractError(TypeError):
    """A driver asked a role for an op the adapter contract does not have, or with arguments it does not take."""


def contract() -> dict[str, inspect.Signature]:
    """The ops a driver may call on a role: every public method of :class:`RoleAdapter`
    with its signature (``self`` left out), plus :data:`SHUTDOWN`."""
    ops = {}
    for name in dir(RoleAdapter):
        member = getattr(RoleAdapter, name)
        if name.startswith("_") or not callable(member):
            continue
        signature = inspect.signature(member)
        ops[name] = signature.replace(parameters=list(signature.parameters.values())[1:])
    ops[SHUTDOWN] = inspect.Signature()
    return ops


CONTRACT = contract()


def check_call(op: str, kwargs: dict[str, Any]) -> None:
    """Raise :class:`ContractError` unless ``op(**kwargs)`` is a call the contract allows."""
    signature = CONTRACT.get(op)
    if signature is None:
        raise ContractError(f"{op!r} is not a role op (harness.role.adapter.RoleAdapter has no such method)")
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        raise ContractError(f"{op}{signature}: {exc}") from None


class OutOfRangeRole(RoleAdapter):
    """Stands in a role process for an adapter whose declared sglang range
    (harness.implementations) excludes the sglang being driven: it never imports that adapter (its imports may already
    fail there), and every step raises :class:`Unsupported` with ``reason``."""

    def __init__(self, impl: str, role: str, reason: str):
        self.impl = impl
        self.role = role
        self.reason = reason

    def _refuse(self, *args, **kwargs):
        raise Unsupported(self.reason)

    engine = start_prefill = start_decode = open_sender = init_sender = send_chunk = _refuse
    open_receiver = request_kv = verify = poll = failure_reason = clear = abort = _refuse
    arm_point = set_engine_faults = lose_messages = abort_frames = status_frames = plan_layouts = _refuse
    unsupported_layout = _refuse

    def teardown(self) -> None:
        return None

    def observe(self, rooms: list[int] = (), residue: bool = True) -> dict:
        return {"role": self.role, "loops": {}, "log_records": [], "log_records_dropped": 0, "dead_threads": [],
                "rooms": {}, "residue_incomplete": "",
                "remembered": {}}
