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

A long string (more than :data:`REF_MIN_CHARS` characters, say a 2 MB frame a role logged
and every later observation reports again) that an earlier event of the file already
holds is written once: a later event holds a short placeholder in its place and lists,
under the top-level key :data:`REFS_KEY`, ``[path, seq, source path]`` for each (a path is
the list of keys and list indices from the event down to the string; ``seq`` the event
that holds it inline).  Top-level keys are the harness's own (:meth:`History.record`'s
fields), never text of the code under test, so no value a role reports can pose as a
reference.  :func:`load` (and :class:`Resolver`, for a reader that follows the file line
by line) puts the strings back, so every reader sees the events as they were recorded.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Any, Iterator

from harness import nofollow
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
    ABORTS_SENT = "aborts-sent"  # info: the ABORT generations a decode armed or sent (copied in at the end)
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
    LOSE_MESSAGES = "lose-messages"  # a message loss plan installed (LoseMessages)
    MESSAGE_LOST = "message-lost"  # a control message a role lost (copied in at the end, or before a kill)
    MESSAGE_AUDIT = "message-audit"  # info: what a role's control sockets received, whole or not (at the end)
    POINT_HIT = "point-hit"  # a point a thread reached (copied in at the end)


#: the ops whose ``ok`` value holds the facts a role reported when its manager started
START_OPS = (Op.START_PREFILL, Op.START_DECODE)


#: a string longer than this (characters) that an earlier event already holds is written as a reference
REF_MIN_CHARS = 4096
#: the top-level key of a written event that lists its references: ``[[path, seq, source path], ...]``
REFS_KEY = "$refs"


class History:
    """Append-only event list, mirrored to ``path`` (JSON lines) when given; in the file a
    long string an earlier event holds is a reference to it (see the module docstring),
    in :attr:`events` it is the string itself."""

    def __init__(self, path: str | Path | None = None):
        self.events: list[dict[str, Any]] = []
        self._t0 = time.monotonic()
        # no link followed anywhere in the path (harness.nofollow): the cell's folder may be in a shared OUT
        self._file = io.TextIOWrapper(nofollow.open_write(path, append=True), encoding="utf-8") if path else None
        self._first: dict[str, tuple[int, list]] = {}  # a long string -> (seq, path) of its first holder
        self._lock = threading.Lock()  # a reference is written after the line it points at

    def record(self, type_: Event, op: Op, role: str | None = None, step: int | None = None, **fields: Any) -> dict:
        """Append one event (see the module docstring) and return it."""
        with self._lock:
            event = {"seq": len(self.events), "t": round(time.monotonic() - self._t0, 4),
                     "wall": round(time.time(), 4), "step": step, "op": op, "role": role, "type": type_, **fields}
            self.events.append(event)
            if self._file:
                self._file.write(self._line(event) + "\n")
                self._file.flush()
        return event

    def _line(self, event: dict) -> str:
        """The JSON line of ``event``, each long string an earlier event (or an earlier place of
        this one) holds replaced by a reference."""
        line = json.dumps(event, default=repr)
        if len(line) <= REF_MIN_CHARS:  # no string in it is long: the common case, left as it is
            return line
        written = json.loads(line)  # as a reader will see it: bytes and objects already repr'd
        refs = []
        for container, key, path in _long_strings(written):
            text = container[key]
            if text in self._first:
                seq, source = self._first[text]
                container[key] = f"<the text at {_dotted(source)} of event {seq}: see {REFS_KEY}>"
                refs.append([path, seq, source])
            else:
                self._first[text] = (event["seq"], path)
        if not refs:
            return line
        written[REFS_KEY] = refs
        return json.dumps(written)

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None


def _long_strings(tree: Any) -> Iterator[tuple[Any, Any, list]]:
    """``(container, key, path)`` of every string longer than :data:`REF_MIN_CHARS` in the
    JSON value ``tree`` (dicts and lists), in document order; a path is built only for
    those (a deep value costs no path per node).  Iterative: any depth json accepted."""
    stack: list[tuple[Any, Any, Any, Any]] = [(tree, None, None, None)]  # node, its container, key, link
    while stack:
        node, container, key, link = stack.pop()
        if isinstance(node, str):
            if len(node) > REF_MIN_CHARS:
                path = []
                while link is not None:  # link: (parent's link, key), up to the root
                    link, step = link
                    path.append(step)
                yield container, key, path[::-1]
        elif isinstance(node, (dict, list)):
            items = list(node.items() if isinstance(node, dict) else enumerate(node))
            stack.extend((child, node, k, (link, k)) for k, child in reversed(items))


def _dotted(path: list) -> str:
    return ".".join(str(step) for step in path)


class Resolver:
    """Parses a history's lines in file order and puts back the strings its events refer
    to (the module docstring): ``Resolver()(line)`` is ``json.loads(line)`` (str or bytes;
    json.JSONDecodeError as it raises) with :data:`REFS_KEY` resolved and removed.  A
    reference that does not resolve (an edited file) keeps its placeholder text.  Keeps the
    events of the lines long enough to hold a referred string, its sources."""

    def __init__(self) -> None:
        self._sources: dict[int, dict] = {}  # seq -> the last such event (a file appended to twice repeats seqs)

    def __call__(self, line: str | bytes) -> Any:
        event = json.loads(line)
        if not isinstance(event, dict):
            return event
        refs = event.pop(REFS_KEY, None)
        if len(line) > REF_MIN_CHARS and isinstance(event.get("seq"), int):
            self._sources[event["seq"]] = event  # before resolving: a reference may point into this event
        if isinstance(refs, list):
            for ref in refs:
                self._resolve(event, ref)
        return event

    def _resolve(self, event: dict, ref: Any) -> None:
        if not (isinstance(ref, list) and len(ref) == 3 and isinstance(ref[1], int)):
            return
        path, seq, source = ref
        text = _at(self._sources.get(seq), source)
        # only a string (the placeholder) is replaced, at a place the event has
        if isinstance(text, str) and isinstance(path, list) and path and isinstance(_at(event, path), str):
            _at(event, path[:-1])[path[-1]] = text


def _at(node: Any, path: Any) -> Any:
    """The value at ``path`` (keys and indices) under ``node``; None where there is none."""
    if not isinstance(path, list):
        return None
    for step in path:
        if isinstance(node, dict) and isinstance(step, str):
            node = node.get(step)
        elif isinstance(node, list) and isinstance(step, int) and not isinstance(step, bool) and 0 <= step < len(node):
            node = node[step]
        else:
            return None
    return node


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
    fd = nofollow.open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return event


def load(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines history, references resolved (:class:`Resolver`: the events as they
    were recorded); a torn line (killed writer) is skipped; [] when it is missing, not a
    regular file or too large (harness.spec.inputs)."""
    events = []
    try:
        lines = read_input(path, "history").decode("utf-8", errors="replace").splitlines()
    except InputError:  # missing, not a regular file, too large: no history
        return events
    parse = Resolver()
    for line in lines:
        try:
            event = parse(line)
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


def silent_ranks(events: list[dict]) -> set[str]:
    """Prefill TP ranks no decode rank takes KV from (``harness.spec.topology.sources``: each
    head comes from the lowest prefill rank of a stage that holds it, so MLA's extra ranks and a
    replicated head's higher holders write nothing), from the layouts the roles were started
    with.  Such a rank has no registration to wait for (sglang's dummy registrations), so its
    WaitingForInput binds nothing.  A group is ``ROLE`` with its ``ROLE.tpN`` ranks."""
    from harness.spec.protocol import Layout
    from harness.spec.topology import sources

    starts = list({e["role"]: e for e in events if e["type"] == Event.INVOKE and e["op"] in START_OPS
                   and "layout" in (e.get("args") or {})}.values())  # a restarted role: its last start
    decodes = [Layout(**e["args"]["layout"]) for e in starts if e["op"] == Op.START_DECODE]
    groups: dict[str, list[tuple[int, str, Layout]]] = {}
    for e in starts:
        if e["op"] == Op.START_PREFILL:
            base, _, rank = str(e["role"]).rpartition(".tp")
            tp = (e["args"].get("attn_tp") or [1, 0])[1]
            groups.setdefault(base if base and rank.isdigit() else str(e["role"]), []).append((tp, e["role"], Layout(**e["args"]["layout"])))
    silent: set[str] = set()
    for ranks in groups.values():
        ranks.sort(key=lambda r: r[0])
        used = {i for d in decodes for i in sources([layout for _, _, layout in ranks], d)}
        silent |= {role for i, (_, role, _) in enumerate(ranks) if i not in used}
    return silent if decodes else set()


def rank_reads(wait: dict) -> dict[str, dict]:
    """Each rank's read in a completed AwaitStatus event, by rank name: a role of several ranks
    reports each under ``ranks`` (a dict with ``status``, ``trail``, ``failure_reason``), else
    the role's own value is its one read.  Issue 36 1d: a group's read never hides a rank."""
    value = wait.get("value") if isinstance(wait.get("value"), dict) else {}
    ranks = {name: r for name, r in (value.get("ranks") or {}).items() if isinstance(r, dict)}
    return ranks or {str(wait.get("role")): value}


def rank_statuses(wait: dict) -> dict[str, int]:
    """Each rank's status in a completed AwaitStatus event (:func:`rank_reads`; a group's own
    ``status`` is the lowest of its ranks', as sglang's scheduler reduces them)."""
    ranks = {name: r["status"] for name, r in rank_reads(wait).items() if r.get("status") is not None}
    return ranks or {str(wait.get("role")): (wait.get("value") or {}).get("status")}


def lost_message_rooms(events: list[dict], kinds: tuple[str, ...]) -> set:
    """The rooms of the control messages of ``kinds`` (message-kind names such as ``"abort"``,
    ``"abort_ack"``) that a role lost on purpose (``message-lost`` events, R-LOSS-1)."""
    return {(e.get("value") or {}).get("room") for e in events
            if e["op"] == Op.MESSAGE_LOST and (e.get("value") or {}).get("kind") in kinds}


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


def is_prefill(name: str | None) -> bool:
    """Whether a role or rank name is a prefill's (``prefill``, ``prefill-b``, ``prefill.tp1``...)."""
    return str(name or "").startswith("prefill")


def last_observations(events: list[dict]) -> dict[str, dict]:
    """Each role's last end-of-cell observation event (``observe``, ok or fail), by role."""
    return {e["role"]: e for e in events if e["op"] == Op.OBSERVE and e["type"] in (Event.OK, Event.FAIL)}


def held_rooms(observation: dict | None, rooms: set[int]) -> dict[int, list[str]]:
    """Of ``rooms``, those an observation's value still holds state of, with the paths
    that hold it (its ``rooms``, not its ``remembered`` ended generations)."""
    held = (observation or {}).get("rooms") or {}
    return {int(room): paths for room, paths in held.items() if int(room) in rooms}
