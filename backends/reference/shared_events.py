"""Events and actions that mean the same on both sides of the reference.

Both cores take ``Clear`` (the scheduler clears a room) and ``Tick`` (time
passes, seconds on the driver's clock) and emit ``StatusChanged`` (a room's
KVPoll on that side) and ``Log`` records; the side-specific ones live in
prefill_core.py and decode_core.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Clear:
    room: int


@dataclass(frozen=True)
class Tick:
    now: float


@dataclass(frozen=True)
class StatusChanged:
    room: int
    status: int
    reason: str = ""


@dataclass(frozen=True)
class Log:
    level: str
    message: str
