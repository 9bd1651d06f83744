"""The cell history: every step's invocation and completion, as plain data.

The history is the single source of truth for checkers (pure functions of it)
and for the behaviour diff.  Each event is a dict::

    {"seq": 3, "t": 1.234, "step": 2, "op": "poll", "role": "decode",
     "type": "invoke" | "ok" | "fail" | "info" | "nemesis", "args": {...},
     "value": ..., "error": "...", "unsupported": False}

``t`` is seconds since the cell started.  ``nemesis`` records an injected fault
(kill, freeze, thaw, inject) on its own channel.  ``fail`` means the call raised or
timed out (Jepsen's indeterminate completion), never a crash of the run.
Events are appended to a JSON-lines file as they happen, so a killed cell
still leaves its history behind.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator


class History:
    """Append-only event list, mirrored to ``path`` (JSON lines) when given."""

    def __init__(self, path: str | Path | None = None):
        self.events: list[dict[str, Any]] = []
        self._t0 = time.monotonic()
        self._file = open(path, "a", encoding="utf-8") if path else None

    def record(self, type_: str, op: str, role: str | None = None, step: int | None = None, **fields: Any) -> dict:
        event = {"seq": len(self.events), "t": round(time.monotonic() - self._t0, 4), "wall": round(time.time(), 4),
                 "step": step,
                 "op": op, "role": role, "type": type_, **fields}
        self.events.append(event)
        if self._file:
            self._file.write(json.dumps(event, default=repr) + "\n")
            self._file.flush()
        return event

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None


def load(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines history; a torn last line (killed writer) is skipped."""
    events = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return events
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def completions(events: list[dict], op: str | None = None, role: str | None = None,
                room: int | None = None) -> Iterator[dict]:
    """Completion events (``ok``/``fail``) filtered by op, role and room argument."""
    for event in events:
        if event["type"] not in ("ok", "fail"):
            continue
        if op is not None and event["op"] != op:
            continue
        if role is not None and event.get("role") != role:
            continue
        if room is not None and (event.get("args") or {}).get("room") != room:
            continue
        yield event
