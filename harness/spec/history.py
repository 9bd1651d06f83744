"""The cell history: every step's invocation and completion, as plain data.

The history is the single source of truth for the judge (harness.judge.judge: checks
are pure functions of it) and for the behaviour diff.  Each event is a dict::

    {"seq": 3, "t": 1.234, "wall": 1764600000.1, "step": 2, "op": "await_status",
     "role": "decode", "type": "invoke" | "ok" | "fail" | "info" | "nemesis",
     "args": {...}, "value": ..., "error": "...", "unsupported": False}

``t`` is seconds since the cell started, ``wall`` the wall clock (seconds).  ``type``
is an :class:`Event`, ``op`` an :class:`Op`.  ``nemesis`` records an injected fault on
its own channel.  ``fail`` means the call raised or timed out (Jepsen's indeterminate
completion), never a crash of the run.  Events are appended to a JSON-lines file as
they happen, so a killed cell still leaves its history behind; the runner appends the
cell's :attr:`Op.CELL_EXIT` (how the process ended) after it is gone.
"""

from __future__ import annotations

import json
import os
import time
from enum import StrEnum
from pathlib import Path
from typing import Any, Iterator

from harness.spec.inputs import InputError, read_input


class Event(StrEnum):
    """An event's ``type``."""

    INVOKE = "invoke"  # a call started
    OK = "ok"  # it completed
    FAIL = "fail"  # it raised or timed out
    INFO = "info"  # something the driver or runner notes (a step starts, the cell ended)
    NEMESIS = "nemesis"  # a fault was injected, or fired inside a role


class Op(StrEnum):
    """An event's ``op``.  Role calls carry the adapter method's name
    (harness.role.adapter.RoleAdapter); everything else a kebab-case name."""

    # the cell's own lifecycle (harness.drive.cell, harness.drive.runner)
    CELL_START = "cell-start"  # info: impl, scenario, seed
    CELL_END = "cell-end"  # info: how the steps ended (completed, aborted, unsupported)
    CELL_EXIT = "cell-exit"  # info, by the runner: how the cell process ended, its wall and CPU time
    STEP = "step"  # info: step ``step`` starts
    LAUNCH = "launch"  # a role process starts serving
    # role calls (adapter methods)
    START_PREFILL = "start_prefill"
    START_DECODE = "start_decode"
    OPEN_SENDER = "open_sender"
    OPEN_RECEIVER = "open_receiver"
    REQUEST_KV = "request_kv"
    INIT_SENDER = "init_sender"
    SEND_CHUNK = "send_chunk"
    AWAIT_STATUS = "await_status"
    VERIFY = "verify"
    CLEAR = "clear"
    ABORT = "abort"
    OBSERVE = "observe"  # the end-of-cell observation of a role
    PLAN_LAYOUTS = "plan_layouts"
    UNSUPPORTED_LAYOUT = "unsupported_layout"
    # driver events
    OBSERVE_MID = "observe-mid"  # an Observe step's observation
    AWAIT_POINT = "await-point"
    LAYOUT_SHRINK = "layout-shrink"
    LAYOUT_TRANSFER = "layout-transfer"
    LAYOUT_START = "layout-start"
    LAYOUT_PAIR = "layout-pair"  # a drawn layout pair's transfer begins (harness.spec.layout_pairs)
    LAYOUT_PAIR_SHRINK = "layout-pair-shrink"  # the smallest pair found that goes wrong the same way
    ABORT_ACKS = "abort-acks"  # info: the ABORT_ACKs a decode received (copied in at the end)
    # nemesis
    KILL = "kill"
    FREEZE = "freeze"
    THAW = "thaw"
    INJECT = "inject"
    RESTART = "restart"
    NETWORK = "network"  # nemesis: a link between two hosts faulted (partition, netem) or healed (harness.hosts.agent)
    INJECT_ABORT = "inject-abort"
    ABORT_FRAMES = "abort-frames"
    CAPTURE = "capture"  # a message built by a role's implementation and kept for later (CaptureFrames)
    INJECT_CAPTURED = "inject-captured"
    ARM_POINT = "arm-point"
    RELEASE_POINT = "release-point"
    ENGINE_FAULTS = "engine-faults"  # a plan installed
    ENGINE_FAULT = "engine-fault"  # a fault that fired (copied in at the end)
    POINT_HIT = "point-hit"  # a point a thread reached (copied in at the end)


#: the ops whose ``ok`` value holds the facts a role reported when its manager started
START_OPS = (Op.START_PREFILL, Op.START_DECODE)


class History:
    """Append-only event list, mirrored to ``path`` (JSON lines) when given."""

    def __init__(self, path: str | Path | None = None):
        self.events: list[dict[str, Any]] = []
        self._t0 = time.monotonic()
        self._file = open(path, "a", encoding="utf-8") if path else None

    def record(self, type_: Event, op: Op, role: str | None = None, step: int | None = None, **fields: Any) -> dict:
        """Append one event (see the module docstring) and return it."""
        event = {"seq": len(self.events), "t": round(time.monotonic() - self._t0, 4), "wall": round(time.time(), 4),
                 "step": step, "op": op, "role": role, "type": type_, **fields}
        self.events.append(event)
        if self._file:
            self._file.write(json.dumps(event, default=repr) + "\n")
            self._file.flush()
        return event

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None


def append_event(path: str | Path, type_: Event, op: Op, **fields: Any) -> dict:
    """Append one event to the history file at ``path`` after its writer has ended (the
    runner's :attr:`Op.CELL_EXIT`): ``seq`` follows the file's last event, ``t`` is None.
    One ``write`` of one line, so a reader never sees half of it.  OSError if it cannot."""
    events = load(path)
    event = {"seq": (events[-1]["seq"] + 1) if events else 0, "t": None, "wall": round(time.time(), 4),
             "step": None, "op": op, "role": None, "type": type_, **fields}
    line = (json.dumps(event, default=repr) + "\n").encode()
    try:  # a writer killed mid-line left a torn last line: end it, so this event is a line of its own
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = b"\n" + line
    except OSError:  # an empty or missing file
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return event


def load(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines history; a torn line (killed writer) is skipped; [] when it is missing,
    not a regular file or too large (harness.spec.inputs)."""
    events = []
    try:
        lines = read_input(path, "history").decode("utf-8", errors="replace").splitlines()
    except InputError:  # missing, not a regular file, too large: no history
        return events
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if _well_formed(event):
            events.append(event)
    return events


def _well_formed(event: Any) -> bool:
    """An event the judge can read: the keys :meth:`History.record` writes, of their types."""
    if not isinstance(event, dict) or not all(key in event for key in ("seq", "t", "step", "op", "role", "type")):
        return False
    if not isinstance(event["op"], str) or not isinstance(event["type"], str):
        return False
    if event["step"] is not None and not isinstance(event["step"], int):
        return False
    if event["role"] is not None and not isinstance(event["role"], str):
        return False
    if not isinstance(event.get("args", {}), dict):
        return False
    return event["op"] not in (Op.CELL_START, Op.CELL_END, Op.CELL_EXIT) or isinstance(event.get("value"), dict)


def completions(events: list[dict], op: str | None = None, role: str | None = None,
                room: int | None = None) -> Iterator[dict]:
    """Completion events (``ok``/``fail``) filtered by op, role and room argument."""
    for event in events:
        if event["type"] not in (Event.OK, Event.FAIL):
            continue
        if op is not None and event["op"] != op:
            continue
        if role is not None and event.get("role") != role:
            continue
        if room is not None and (event.get("args") or {}).get("room") != room:
            continue
        yield event


def fact(events: list[dict], role: str, key: str) -> Any:
    """A fact ``role`` reported when its manager started (the value of its first ``start_prefill``/``start_decode``)."""
    for e in events:
        if e["role"] == role and e["op"] in START_OPS and e["type"] == Event.OK:
            return (e.get("value") or {}).get(key)
    return None


def killed_roles(events: list[dict]) -> set[str]:
    """Roles the nemesis killed, each TP rank of a killed role too (their absence at the end
    is the scenario's doing)."""
    return {name for e in events if e["type"] == Event.NEMESIS and e["op"] == Op.KILL
            for name in (e["role"], *((e.get("args") or {}).get("ranks") or []))}


def rooms_cleared_everywhere(events: list[dict]) -> set[int]:
    """Rooms whose last event on every role that ever named them (a call, a nemesis
    event with the room in its args) is a successful ``clear`` there: the rooms that
    R-RESIDUE-1's "after clear() on both sides" applies to.  A role the nemesis killed
    (:func:`killed_roles`) holds nothing to clear, so only the living sides count.  A room
    polled, aborted or re-opened after its clear on some role is left out (its lifecycle
    did not end)."""
    killed = killed_roles(events)
    last: dict[int, dict[str, dict]] = {}
    for e in events:
        room = (e.get("args") or {}).get("room")
        if e["type"] == Event.INVOKE or not isinstance(room, int) or e.get("role") in (None, *killed):
            continue
        last.setdefault(room, {})[e["role"]] = e
    return {room for room, by_role in last.items()
            if all(e["op"] == Op.CLEAR and e["type"] == Event.OK for e in by_role.values())}


def last_observations(events: list[dict]) -> dict[str, dict]:
    """Each role's last end-of-cell observation event (``observe``, ok or fail), by role."""
    return {e["role"]: e for e in events if e["op"] == Op.OBSERVE and e["type"] in (Event.OK, Event.FAIL)}


def held_rooms(observation: dict | None, rooms: set[int]) -> dict[int, list[str]]:
    """Of ``rooms``, those an observation's value still holds state of, with the paths
    that hold it (its ``rooms``, not its ``remembered`` ended generations)."""
    held = (observation or {}).get("rooms") or {}
    return {int(room): paths for room, paths in held.items() if int(room) in rooms}
