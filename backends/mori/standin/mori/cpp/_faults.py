"""Fault injection for the pdconform mori stand-in.  STAND-IN ONLY: no such API in amd-mori.

Faults are per process and apply to every stand-in IOEngine in it.  Counting
starts afresh at every ``set_standin_faults`` call.  Counted are the transfers
(one per status, i.e. per uid) and the groups (one per ``batch_write`` /
``batch_read`` / ``write`` / ``read`` / session call) that pass argument
checks, in submission order, reads and writes alike.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from typing import Optional, Tuple

FAIL = "fail"
NEVER = "never"
SLOW = "slow"


@dataclasses.dataclass(frozen=True)
class StandinFaults:
    """Faults the stand-in engine injects.  STAND-IN ONLY.

    Attributes:
        fail_nth_transfer: the n-th transfer (1-based) fails with ERR_RDMA_OP
            and moves no bytes; None: no such fault.
        delay_s: seconds the engine's background thread waits before running
            each transfer (0: none).
        never_complete: transfers move no bytes and stay IN_PROGRESS for ever
            (waits on them return at their timeout, or the stand-in's cap).
        fail_group: every transfer of the n-th group (1-based; a group is one
            batch_write/batch_read/write/read call) fails with ERR_RDMA_OP.
        slow_nth_transfer: the n-th transfer (1-based) runs ``slow_s`` seconds
            late on a timer of its own, while the engine goes on with the ones after
            it (so they complete first); None: no such fault.
        slow_s: how late the slow transfer runs (seconds).
    """

    fail_nth_transfer: Optional[int] = None
    delay_s: float = 0.0
    never_complete: bool = False
    fail_group: Optional[int] = None
    slow_nth_transfer: Optional[int] = None
    slow_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("fail_nth_transfer", "fail_group", "slow_nth_transfer"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"StandinFaults.{name} must be None or an int >= 1, got {v!r}")
        for name in ("delay_s", "slow_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"StandinFaults.{name} must be a finite number >= 0, got {v!r}")
        if not isinstance(self.never_complete, bool):
            raise ValueError(f"StandinFaults.never_complete must be a bool, got {self.never_complete!r}")


_lock = threading.Lock()
_active = StandinFaults()
_transfers = 0
_groups = 0
_log: list = []


def set_standin_faults(faults: Optional[StandinFaults] = None, **fields) -> StandinFaults:
    """Install faults for every stand-in engine of this process.  STAND-IN ONLY.

    Call with a ``StandinFaults``, or with its fields as keywords
    (``set_standin_faults(fail_nth_transfer=2)``), or with nothing to clear all
    faults.  Resets the transfer and group counters.  Returns the faults now
    in force.

    Raises:
        TypeError: both a StandinFaults and keywords, or an unknown keyword.
        ValueError: a field out of range (see StandinFaults).
    """
    global _active, _transfers, _groups
    if faults is not None and fields:
        raise TypeError("set_standin_faults: pass a StandinFaults or keywords, not both")
    if faults is None:
        faults = StandinFaults(**fields)
    elif not isinstance(faults, StandinFaults):
        raise TypeError(f"set_standin_faults: expected StandinFaults, got {type(faults).__name__}")
    with _lock:
        _active, _transfers, _groups = faults, 0, 0
        _log.clear()
    return faults


def standin_fault_log() -> list:
    """Every fault injected since the last ``set_standin_faults``: dicts with
    ``transfer`` (1-based count), ``fault`` (fail, never-complete, delay), ``what``
    and ``t`` (wall clock when it was injected, seconds).  STAND-IN ONLY."""
    with _lock:
        return list(_log)


def get_standin_faults() -> StandinFaults:
    """The faults now in force (STAND-IN ONLY)."""
    return _active


def next_group() -> Tuple[StandinFaults, bool]:
    """Count one group; return the faults in force and whether this group must fail."""
    global _groups
    with _lock:
        _groups += 1
        return _active, _active.fail_group == _groups


def next_transfer(faults: StandinFaults, group_fails: bool) -> Optional[str]:
    """Count one transfer; return FAIL, NEVER, SLOW or None for it."""
    global _transfers
    with _lock:
        _transfers += 1
        nth = _transfers
    verdict = FAIL if group_fails or faults.fail_nth_transfer == nth else NEVER if faults.never_complete else None
    if verdict is None and faults.slow_s and faults.slow_nth_transfer == nth:
        verdict = SLOW
    with _lock:
        if faults.delay_s:
            _log.append({"transfer": nth, "fault": "delay", "what": "stand-in transfer", "delay_s": faults.delay_s,
                         "t": time.time()})
        if verdict is not None:
            _log.append({"transfer": nth, "fault": {FAIL: "fail", NEVER: "never-complete", SLOW: "slow"}[verdict],
                         "what": "stand-in transfer" + (f" (group {_groups})" if group_fails else ""),
                         "t": time.time()})
    return verdict
