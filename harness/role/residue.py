"""Per-room residue by a deep walk of a manager's state (R-RESIDUE-1, R-STALE-1).

A backend keeps per-room state wherever its authors put it: in status maps keyed by the
room, in trackers keyed by address whose values hold rooms, in sub-objects (a staging
context, a transfer-info record) one or more levels down, in tuple keys ``(room, rank)``
or string keys ``"room_123"``.  :func:`find_rooms` walks everything reachable from the
manager (attributes, mapping keys and values, set/list/tuple/deque items, sub-objects) and
reports each path that still mentions a room of the cell, whether or not this role opened
it.  It does not follow what cannot hold a manager's own state: modules, classes,
functions, threads, locks, sockets, tensors; byte strings over 1 MiB are not searched.
The walk is bounded (objects visited, items taken from one container); a walk that hit a
bound says so (:class:`Residue` ``incomplete``), and residue checks then cannot tell.
"""

from __future__ import annotations

import itertools
import numbers
import re
import threading
import time
import types
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterable

MAX_DEPTH = 8
MAX_NODES = 200_000  # objects one walk visits at most
MAX_ITEMS = 50_000  # items taken from one container at most
MAX_TEXT = 1 << 20  # longer strings and byte strings are not searched (bytes)

_LEAVES = (str, bytes, bytearray, memoryview, numbers.Number, type(None))
_SKIP_TYPES = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
               threading.Thread, type(threading.Lock()), type(threading.RLock()), threading.Event,
               threading.Condition)
# objects of these modules are machinery, not per-room records (sockets, tensors, pools, loggers)
_SKIP_MODULES = ("zmq", "torch", "numpy", "logging", "socket", "ssl", "selectors", "concurrent", "queue",
                 "multiprocessing", "http", "asyncio", "_thread", "urllib3", "requests", "aiohttp", "weakref")


@dataclass
class Residue:
    """What a walk found: room -> paths (see :func:`find_rooms`), and ``incomplete``: why
    the walk did not see everything ("" when it did)."""

    rooms: dict[int, list[str]] = field(default_factory=dict)
    incomplete: str = ""


def _skipped(value: Any) -> bool:
    if isinstance(value, _SKIP_TYPES):
        return True
    module = type(value).__module__ or ""
    return module.split(".")[0] in _SKIP_MODULES


class _Matcher:
    """Which rooms a key or a leaf names: an integral number equal to one (numpy's too, not
    a bool), a string or byte string holding one as a whole number (``"123"``,
    ``"room_123"``, ``"123@tcp://..."``), or a tuple or frozenset holding either."""

    def __init__(self, rooms: set[int]):
        self.rooms = rooms
        self.pattern = re.compile("(?<!\\d)(" + "|".join(str(r) for r in sorted(rooms)) + ")(?!\\d)")

    def __call__(self, value: Any) -> set[int]:
        if isinstance(value, bool):
            return set()
        if isinstance(value, numbers.Integral):
            return {int(value)} & self.rooms
        if isinstance(value, (str, bytes, bytearray)):
            if len(value) > MAX_TEXT:
                return set()
            text = value.decode("latin-1") if isinstance(value, (bytes, bytearray)) else value
            return {int(m) for m in self.pattern.findall(text)}
        if isinstance(value, (tuple, frozenset)):
            out: set[int] = set()
            for item in itertools.islice(value, MAX_ITEMS):
                out |= self(item)
            return out
        return set()


def _slots(value: Any) -> list[str]:
    """Every ``__slots__`` name of ``value``'s class and its bases (a bare string is one name)."""
    names: list[str] = []
    for cls in type(value).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [n for n in slots if isinstance(n, str)]
    return [n for n in dict.fromkeys(names) if n not in ("__dict__", "__weakref__")]


def _children(value: Any) -> Iterable[tuple[str, Any, Any]]:
    """``(path step, key or None, child)`` for what ``value`` holds, at most MAX_ITEMS."""
    if isinstance(value, Mapping):
        for key, inner in itertools.islice(value.items(), MAX_ITEMS):
            yield f"[{_show(key)}]", key, inner
    elif isinstance(value, (list, tuple, set, frozenset, deque)):
        sized = not isinstance(value, (set, frozenset))
        for index, inner in enumerate(itertools.islice(value, MAX_ITEMS)):
            yield (f"[{index}]" if sized else "{}"), None, inner
    else:
        attrs = getattr(value, "__dict__", None)
        items = list(attrs.items()) if isinstance(attrs, dict) else []
        for slot in _slots(value):
            try:
                items.append((slot, object.__getattribute__(value, slot)))
            except AttributeError:  # an unset slot
                continue
        for name, inner in items:
            yield f".{name}", None, inner


def _show(key: Any) -> str:
    try:
        return repr(key)[:80]
    except Exception:  # noqa: BLE001 - a key whose repr raises still has a place
        return f"<{type(key).__name__}>"


def _too_big(value: Any) -> bool:
    try:
        return isinstance(value, (Mapping, list, tuple, set, frozenset, deque)) and len(value) > MAX_ITEMS
    except Exception:  # noqa: BLE001
        return False


def find_rooms(root: Any, rooms: Iterable[int], *, ignore: Iterable[str] = (), max_depth: int = MAX_DEPTH,
               max_nodes: int = MAX_NODES) -> Residue:
    """Every path under ``root`` that still mentions one of ``rooms``: room -> paths like
    ``"request_status[123]"``, ``"addr_to_rooms_tracker['10.0.0.1:8998']{}"`` or
    ``"staging._outstanding[(123, 0)]"`` (top-level attribute first, no leading dot); object
    keys are walked too (``"index[Key(...)]<key>.room"``).
    ``ignore``: top-level attribute names not to walk (the adapter's own bookkeeping).
    Bounded by ``max_depth``, ``max_nodes`` and MAX_ITEMS per container (a bound hit is
    reported in ``incomplete``); a dict resized by another thread while read is walked
    again (three tries); an object that raises when read is skipped."""
    wanted = {int(r) for r in rooms}
    if not wanted:
        return Residue()
    match = _Matcher(wanted)
    skip = set(ignore)
    for _ in range(3):
        try:
            return _walk(root, match, skip, max_depth, max_nodes)
        except RuntimeError as exc:
            if "changed size during iteration" not in str(exc):
                raise
            time.sleep(0.01)  # a manager thread wrote while we read
    return _walk(root, match, skip, max_depth, max_nodes)


def _visit(out: Residue, path: str, value: Any, depth: int, match: _Matcher, seen: set[int],
           max_depth: int) -> list:
    """Note what ``value`` names; the children to walk next (none for a leaf, machinery, an
    object seen before, or one past ``max_depth``)."""
    for room in match(value):
        out.rooms.setdefault(room, []).append(path)
    if isinstance(value, _LEAVES) or _skipped(value) or id(value) in seen:
        return []
    if depth >= max_depth:
        out.incomplete = out.incomplete or f"objects deeper than {max_depth} levels were not walked ({path})"
        return []
    seen.add(id(value))
    if _too_big(value):
        out.incomplete = out.incomplete or f"{path} holds more than {MAX_ITEMS} items; the rest were not walked"
    return list(_children(value))


def _walk(root, match: _Matcher, skip: set[str], max_depth: int, max_nodes: int) -> Residue:
    out = Residue()
    seen: set[int] = {id(root)}
    todo: deque[tuple[str, Any, int]] = deque()
    for step, _, child in _children(root):
        if step.lstrip(".") not in skip:
            todo.append((step.lstrip("."), child, 1))
    nodes = 0
    while todo:
        path, value, depth = todo.popleft()
        nodes += 1
        if nodes > max_nodes:
            out.incomplete = f"the walk stopped after {max_nodes} objects"
            break
        try:
            children = _visit(out, path, value, depth, match, seen, max_depth)
        except RuntimeError as exc:
            if "changed size during iteration" in str(exc):
                raise
            continue  # a C++ runtime_error, a RecursionError: an object that refuses to be read
        except Exception:  # noqa: BLE001 - an object that refuses to be read holds nothing we can judge
            continue
        for step, key, child in children:
            if key is not None:
                for room in match(key):
                    out.rooms.setdefault(room, []).append(path + step)
                if not isinstance(key, _LEAVES) and not isinstance(key, (tuple, frozenset)):
                    todo.append((path + step + "<key>", key, depth + 1))  # an object used as a key
            todo.append((path + step, child, depth + 1))
    out.rooms = {room: sorted(dict.fromkeys(paths)) for room, paths in out.rooms.items()}
    return out
