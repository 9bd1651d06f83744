"""Fault injection inside a role process: interleaving points and engine faults.

Both live in the role process next to the adapter (the cell driver reaches them
through adapter methods, see :class:`harness.role.adapter.RoleAdapter`).  Every fault
that fires is appended to a log that the adapter returns from ``observe`` and the
cell driver copies into the history as ``nemesis`` events.

Interleaving points
    A *point* is a named place in an implementation's code (for example
    ``prefill-control-started``: the prefill manager's constructor, right after it
    started its control thread).  The adapter maps each name to the exact method it
    wraps and calls :meth:`Points.hit` there.  An armed point either **pauses** the
    thread that reached it until :meth:`Points.release` (bounded by ``hold_s``), or
    **injects** multipart frames into the role's own control socket and then holds
    the thread ``hold_s`` seconds so the control thread handles them first.

Engine faults
    :class:`EngineFaultPlan` says which transfer fails, how long each waits, and
    whether transfers never complete; :class:`EngineFaultCounter` applies the plan
    to the transfers an engine wrapper counts.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass

import zmq

PAUSE, INJECT = "pause", "inject"
#: the engine error kinds a failed transfer can surface as (EngineFaultPlan.error)
POST_ERROR, REMOTE_DISCONNECT = "post-error", "remote-disconnect"
ENGINE_ERRORS = (POST_ERROR, REMOTE_DISCONNECT)
MAX_HOLD_S = 60.0  # no point holds a thread longer, whatever the scenario asks


class PointError(ValueError):
    """An arm request the adapter cannot honour (unknown point, bad action)."""


@dataclass
class _Armed:
    action: str
    frames: list[list[bytes]]
    hold_s: float
    reached: threading.Event
    released: threading.Event
    once: bool = True


class Points:
    """Named interleaving points of one role process.

    ``known`` maps each point name the adapter supports to what it means (the
    sglang method it wraps).  Thread-safe: hooks run on the implementation's
    threads, ``arm``/``release``/``hits`` on the role host's thread.
    """

    def __init__(self, known: dict[str, str]):
        self.known = dict(known)
        self._lock = threading.Lock()
        self._armed: dict[str, _Armed] = {}
        self._log: list[dict] = []
        self._paused: dict[str, _Armed] = {}

    def arm(self, point: str, action: str, frames: list[list[bytes]] | None = None, hold_s: float = 20.0) -> None:
        """Arm ``point`` for its next hit.  PointError for an unknown point or action,
        or a hold that is not a finite number of seconds in (0, 60]."""
        if point not in self.known:
            raise PointError(f"unknown interleaving point {point!r} (known: {', '.join(sorted(self.known))})")
        if action not in (PAUSE, INJECT):
            raise PointError(f"unknown point action {action!r} (pause or inject)")
        if not (isinstance(hold_s, (int, float)) and math.isfinite(hold_s) and 0 < hold_s <= MAX_HOLD_S):
            raise PointError(f"hold_s must be in (0, {MAX_HOLD_S:.0f}] seconds, got {hold_s!r}")
        with self._lock:
            self._armed[point] = _Armed(action, [list(f) for f in frames or []], float(hold_s),
                                        threading.Event(), threading.Event())

    def hit(self, point: str, endpoint: str | None = None, **facts) -> None:
        """Called by an adapter hook when a thread reaches ``point``; returns when the
        thread may go on.  ``endpoint``: the role's control socket, for INJECT."""
        with self._lock:
            armed = self._armed.pop(point, None)
        if armed is None:
            return
        record = {"point": point, "action": armed.action, "thread": threading.current_thread().name,
                  "facts": {k: str(v) for k, v in facts.items()}}
        start = time.monotonic()
        if armed.action == INJECT:
            record["frames"] = len(armed.frames)
            record["delivered"] = push_frames(endpoint, armed.frames) if endpoint else "no control endpoint"
            armed.reached.set()
            time.sleep(armed.hold_s)
        else:
            with self._lock:
                self._paused[point] = armed
            armed.reached.set()
            record["released"] = armed.released.wait(armed.hold_s)
        record["held_s"] = round(time.monotonic() - start, 3)
        with self._lock:
            self._log.append(record)
            self._paused.pop(point, None)

    def hits(self) -> dict:
        """``{"paused": [points a thread waits at now], "log": [every finished hit]}``."""
        with self._lock:
            return {"paused": sorted(self._paused), "log": list(self._log)}

    def release(self, point: str) -> bool:
        """Let the thread paused at ``point`` go on; False when none waits there, and then the
        point is disarmed: a release ends the point (of a role's DP engines only the room's
        reaches it; the others must not hold a later room's thread)."""
        with self._lock:
            armed = self._paused.get(point)
            if armed is None:
                self._armed.pop(point, None)
        if armed is None:
            return False
        armed.released.set()
        return True


def push_frames(endpoint: str, messages, ctx: zmq.Context | None = None) -> str:
    """Push multipart ``messages`` (each a sequence of bytes frames) to a control
    socket at ``endpoint``, as any peer could; the socket lingers up to 2 s so every
    message is delivered before it closes.  Returns what was sent, for the history."""
    sock = (ctx or zmq.Context.instance()).socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    try:
        sock.connect(endpoint)
        for message in messages:
            sock.send_multipart(list(message))
    finally:
        sock.close()
    return f"{len(messages)} message(s) to {endpoint}"


@dataclass(frozen=True)
class EngineFaultPlan:
    """Which faults a transfer engine injects, counted from when the plan is set.

    * ``fail_nth``: the n-th transfer (1-based) fails and moves no bytes;
    * ``delay_s``: seconds every transfer waits before it runs;
    * ``never_complete``: transfers are accepted and never complete (no bytes, no
      completion; a synchronous call blocks for :data:`NEVER_BLOCK_S`);
    * ``fail_group``: every transfer of the n-th group (one batch call) fails;
    * ``aux_delay_s``: each room's aux data reaches the decode that many seconds late, on
      whatever path the backend sends it: a write on the engine takes that much longer; a
      control message carrying it is held that long on its connection, and what is sent
      after it on the same connection waits behind it (a TCP stream delivers in order),
      while other connections go on.  Not counted as a transfer.
    * ``slow_nth`` and ``slow_s``: the n-th transfer (1-based) completes ``slow_s`` seconds
      later than it would, while the transfers after it go on where the engine runs them
      concurrently (the reference's writes, NIXL's posted handles, the Mori stand-in's queue):
      a later write completes before an earlier one, completion out of issue order (issue
      36).  Mooncake's ``batch_transfer_sync`` is synchronous: there the call itself takes
      that long, and what its worker sends next waits behind it.
    * ``error``: how the failed transfer (``fail_nth``, ``fail_group``) surfaces, in the engine's
      own terms (:data:`ENGINE_ERRORS`; issue 38): ``""`` the engine's plain failure (a failed
      state or return code), ``"post-error"`` the post call raises (NIXL's ``nixlBackendError``
      from ``transfer``), ``"remote-disconnect"`` NIXL's ``NIXL_ERR_REMOTE_DISCONNECT`` (the
      state check raises ``nixlRemoteDisconnectError`` and the peer's metadata is gone until it
      is loaded again).  An adapter whose engine has no such kind refuses the plan (UNSUPPORTED).

    ValueError for counts below 1, a delay that is negative or not finite, or an unknown error.
    """

    fail_nth: int | None = None
    delay_s: float = 0.0
    never_complete: bool = False
    fail_group: int | None = None
    aux_delay_s: float = 0.0
    slow_nth: int | None = None
    slow_s: float = 0.0
    error: str = ""

    def __post_init__(self) -> None:
        if self.error not in ("", *ENGINE_ERRORS):
            raise ValueError(f"error must be one of {', '.join(ENGINE_ERRORS)} (or empty), got {self.error!r}")
        for name in ("fail_nth", "fail_group", "slow_nth"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be None or an int >= 1, got {value!r}")
        for name in ("delay_s", "aux_delay_s", "slow_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    @property
    def engine_faults(self) -> bool:
        """Whether the plan changes the engine's transfers (anything but ``aux_delay_s``)."""
        return bool(self.fail_nth or self.delay_s or self.never_complete or self.fail_group
                    or (self.slow_nth and self.slow_s))

    def to_dict(self) -> dict:
        return asdict(self)


NEVER_BLOCK_S = 600.0
FAIL, NEVER, SLOW = "fail", "never", "slow"


class EngineFaultCounter:
    """Applies an :class:`EngineFaultPlan` to the transfers an engine wrapper counts.

    ``next_transfer(what)`` counts one transfer, sleeps the plan's delay, logs any
    fault it injects and returns ``"fail"``, ``"never"`` or None (run it).
    ``next_group()`` counts one batch and says whether all of it must fail.  Each
    log entry carries ``t``, the wall clock (seconds) when the fault was injected: a
    delayed transfer cannot complete before ``t + delay_s``.
    """

    def __init__(self, plan: EngineFaultPlan):
        self.plan = plan
        self._lock = threading.Lock()
        self.transfers = 0
        self.groups = 0
        self.log: list[dict] = []

    def next_group(self) -> bool:
        with self._lock:
            self.groups += 1
            return self.plan.fail_group == self.groups

    def next_transfer(self, what: str, group_fails: bool = False, sleep: bool = True,
                      defer_slow: bool = False) -> str | None:
        """Count one transfer and decide its fate; ``sleep=False`` leaves the plan's
        delay to the caller (which must then wait ``plan.delay_s`` itself).  The plan's slow
        transfer: with ``defer_slow`` the caller gets ``"slow"`` and completes it
        ``plan.slow_s`` late itself (without holding back the transfers after it); else it is
        slept here, before it runs."""
        with self._lock:
            self.transfers += 1
            nth = self.transfers
        if self.plan.delay_s:
            self._note(nth, "delay", what, delay_s=self.plan.delay_s)
            if sleep:
                time.sleep(self.plan.delay_s)
        if group_fails or self.plan.fail_nth == nth:
            self._note(nth, "fail", what, group=self.groups if group_fails else None)
            return FAIL
        if self.plan.never_complete:
            self._note(nth, "never-complete", what)
            return NEVER
        if self.plan.slow_nth == nth and self.plan.slow_s:
            self._note(nth, "slow", what, delay_s=self.plan.slow_s)
            if defer_slow:
                return SLOW
            time.sleep(self.plan.slow_s)
        return None

    def note_gave_up(self, what: str, after_s: float) -> None:
        """Log that the engine failed ``what``, the plan's slow transfer, at its own timeout of
        ``after_s`` seconds (a real engine's limit on a call, as Mooncake's MC_TRANSFER_TIMEOUT):
        a failed write, as ``fail_nth``'s, for whoever reads the log."""
        self._note(0, "fail", what, after_s=after_s)

    def note_aux_delay(self, what: str) -> None:
        """Log that ``what`` (an aux write or message) is held ``plan.aux_delay_s`` seconds."""
        self._note(0, "aux-delay", what, delay_s=self.plan.aux_delay_s)

    def _note(self, nth: int, fault: str, what: str, **extra) -> None:
        with self._lock:
            self.log.append({"transfer": nth, "fault": fault, "what": what, "t": time.time(),
                             **{k: v for k, v in extra.items() if v is not None}})

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.log)


class HeldConnection:
    """One connection's sending side (a ZMQ PUSH socket, or anything with ``send_multipart``)
    on which a message can be held in flight, as a TCP stream holds a delayed segment: once
    ``hold_for(parts)`` (seconds) says to hold a message, it and every message sent after it on
    this connection are sent, in order, when the hold ends; other connections go on.

    Sends are serialised under a lock, so the release (on a timer thread) never uses the
    socket at the same time as its owner (ZMQ sockets may change threads across a lock)."""

    def __init__(self, sock, hold_for):
        self.socket = sock
        self._hold_for = hold_for
        self._lock = threading.Lock()
        self._held: list[tuple[list, tuple, dict]] = []

    def send_multipart(self, parts, *args, **kwargs):
        with self._lock:
            if self._held:  # behind a held message: wait for it
                self._held.append((list(parts), args, kwargs))
                return None
            delay = self._hold_for(parts)
            if not delay:
                return self.socket.send_multipart(parts, *args, **kwargs)
            self._held.append((list(parts), args, kwargs))
        timer = threading.Timer(delay, self._release)
        timer.daemon = True
        timer.start()
        return None

    def _release(self) -> None:
        with self._lock:
            held, self._held = self._held, []
            for parts, args, kwargs in held:
                try:
                    self.socket.send_multipart(parts, *args, **kwargs)
                except Exception:  # noqa: BLE001 - a peer gone meanwhile: the message is lost, as on the wire
                    pass

    def __getattr__(self, name):
        return getattr(self.socket, name)
