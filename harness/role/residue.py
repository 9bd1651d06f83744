"""Per-room residue by a deep walk of a manager's state (R-RESIDUE-1, R-STALE-1).

A backend keeps per-room state wherever its authors put it: in status maps keyed by the
room, in trackers keyed by address whose values hold rooms, in sub-objects (a staging
context, a transfer-info record) one or more levels down, in tuple keys ``(room, rank)``
or string keys ``"room_123"``.  :func:`find_rooms` walks everything reachable from the
manager (attributes, mapping keys and values, set/list/tuple/deque items, sub-objects) and
reports each path that still mentions a room of the cell, whether or not this role opened
it.  It does not follow what cannot hold a manager's own state: modules, classes,
functions, threads, locks, sockets, tensors, byte buffers.
"""

from __future__ import annotations

import re
import threading
import time
import types
from collections import deque
from collections.abc import Mapping
from typing import Any, Iterable

MAX_DEPTH = 8
MAX_NODES = 200_000  # a walk that reaches this many objects stops (reported in the paths)

_LEAVES = (str, bytes, bytearray, memoryview, int, float, complex, bool, type(None))
_SKIP_TYPES = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
               threading.Thread, type(threading.Lock()), type(threading.RLock()), threading.Event,
               threading.Condition)
# objects of these modules are machinery, not per-room records (sockets, tensors, pools, loggers)
_SKIP_MODULES = ("zmq", "torch", "numpy", "logging", "socket", "ssl", "selectors", "concurrent", "queue",
                 "multiprocessing", "http", "asyncio", "_thread", "urllib3", "requests", "aiohttp", "weakref")


def _skipped(value: Any) -> bool:
    if isinstance(value, _SKIP_TYPES):
        return True
    module = type(value).__module__ or ""
    return module.split(".")[0] in _SKIP_MODULES


def _mentions(value: Any, rooms: set[int], patterns: dict[int, re.Pattern]) -> set[int]:
    """The rooms a key or leaf value names: an int equal to one, a string that holds one as a
    whole number (``"123"``, ``"room_123"``, ``"123@tcp://..."``), or a tuple holding either."""
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value} & rooms
    if isinstance(value, (str, bytes)):
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        return {room for room, pattern in patterns.items() if pattern.search(text)}
    if isinstance(value, tuple):
        out: set[int] = set()
        for item in value:
            if isinstance(item, (int, str, bytes, tuple)):
                out |= _mentions(item, rooms, patterns)
        return out
    return set()


def _children(value: Any) -> Iterable[tuple[str, Any, Any]]:
    """``(path step, key or None, child)`` for what ``value`` holds."""
    if isinstance(value, Mapping):
        for key, inner in list(value.items()):
            yield f"[{key!r}]"[:80], key, inner
    elif isinstance(value, (list, tuple, set, frozenset, deque)):
        for index, inner in enumerate(list(value)):
            yield (f"[{index}]" if not isinstance(value, (set, frozenset)) else "{}"), None, inner
    else:
        attrs = getattr(value, "__dict__", None)
        items = list(attrs.items()) if isinstance(attrs, dict) else []
        for slot in getattr(type(value), "__slots__", ()) or ():
            if isinstance(slot, str) and hasattr(value, slot):
                items.append((slot, getattr(value, slot)))
        for name, inner in items:
            yield f".{name}", None, inner


def find_rooms(root: Any, rooms: Iterable[int], *, ignore: Iterable[str] = (), max_depth: int = MAX_DEPTH,
               max_nodes: int = MAX_NODES) -> dict[int, list[str]]:
    """Every path under ``root`` that still mentions one of ``rooms``: room -> paths like
    ``".request_status[123]"``, ``".addr_to_rooms_tracker['10.0.0.1:8998']{}"`` or
    ``".staging._outstanding[(123, 0)]"``.  ``ignore``: top-level attribute names not to
    walk (the adapter's own bookkeeping).  Bounded by ``max_depth`` and ``max_nodes``; a
    dict resized by another thread while read is walked again (three tries)."""
    wanted = {int(r) for r in rooms}
    if not wanted:
        return {}
    patterns = {room: re.compile(rf"(?<!\d){room}(?!\d)") for room in wanted}
    skip = set(ignore)
    for _ in range(3):
        try:
            return _walk(root, wanted, patterns, skip, max_depth, max_nodes)
        except RuntimeError:  # "dictionary changed size during iteration": a manager thread wrote
            time.sleep(0.01)
    return _walk(root, wanted, patterns, skip, max_depth, max_nodes)


def _walk(root, wanted, patterns, skip, max_depth, max_nodes) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
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
            break
        for room in _mentions(value, wanted, patterns):
            found.setdefault(room, []).append(path)
        if isinstance(value, _LEAVES) or depth >= max_depth or _skipped(value) or id(value) in seen:
            continue
        seen.add(id(value))
        try:
            children = list(_children(value))
        except NotImplementedError:  # a RuntimeError, but not a resize: a class that refuses iteration
            continue
        except RuntimeError:  # resized by another thread: find_rooms walks again
            raise
        except Exception:  # noqa: BLE001 - a container that refuses to be read holds nothing we can judge
            continue
        for step, key, child in children:
            if key is not None:
                for room in _mentions(key, wanted, patterns):
                    found.setdefault(room, []).append(path + step)
            if not isinstance(child, _LEAVES) or isinstance(child, (int, str, bytes)):
                todo.append((path + step, child, depth + 1))
    return {room: sorted(dict.fromkeys(paths)) for room, paths in found.items()}
