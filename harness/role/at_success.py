"""The decode's bytes at the moment it first reports Success (R-XFER-2), kept in the role.

R-XFER-2 says a room is Success only once every byte of it is in place.  Judging the pools
after a settle cannot tell a Success announced early from one announced on time: the late
bytes have landed by then.  So the role copies, at the first read of Success of a room's
lifecycle, the rows of that room's destination pages and aux slot of every decode buffer;
at the end of the cell the driver has those copies judged against the same moves as the
pools themselves (:meth:`SuccessBytes.verify`).  A row a later request takes over (a reused
page or slot) is forgotten, so the copies always belong to the lifecycle the moves describe.

Pure bookkeeping over ``torch`` rows: no I/O, no sglang import.  Thread-safe.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from harness.role import pattern


class SuccessBytes:
    """The destination rows of each room, copied when its Success was first read.

    ``requested`` (room, pages, aux slot) starts a lifecycle; ``seen_success`` copies its
    rows once; ``verify`` judges the copies.  Buffers are ``(BufferSpec, tensor)`` pairs as
    :mod:`harness.role.pools` makes them (K/V tensors ``[pages, bytes]``, aux ``[slots, bytes]``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[int, tuple[tuple[int, ...], int]] = {}
        self._taken: set[int] = set()
        self._kv: dict[int, dict[int, Any]] = {}  # page -> buffer index -> row copy
        self._aux: dict[int, dict[int, Any]] = {}  # slot -> buffer index -> row copy

    def requested(self, room: int, pages: Sequence[int], aux_slot: int) -> None:
        """A lifecycle of ``room`` asked for ``pages`` and ``aux_slot``: older copies of those rows are void."""
        with self._lock:
            self._requests[room] = (tuple(int(p) for p in pages), int(aux_slot))
            self._taken.discard(room)
            for page in pages:
                self._kv.pop(int(page), None)
            self._aux.pop(int(aux_slot), None)

    def seen_success(self, room: int, buffers: list[tuple[pattern.BufferSpec, Any]] | None) -> None:
        """``room`` was read Success: copy its rows, unless this lifecycle's were copied already."""
        with self._lock:
            if not buffers or room in self._taken or room not in self._requests:
                return
            self._taken.add(room)
            pages, slot = self._requests[room]
            for i, (spec, tensor) in enumerate(buffers):
                rows, where = (self._aux, (slot,)) if spec.kind == pattern.AUX else (self._kv, pages)
                for index in where:
                    if 0 <= index < tensor.shape[0]:
                        rows.setdefault(index, {})[i] = tensor[index].clone()

    def verify(self, buffers: list[tuple[pattern.BufferSpec, Any]] | None, kv_moves: Sequence, aux_moves: Sequence,
               unchecked_kv: Sequence[int] = (), unchecked_aux: Sequence[int] = (),
               sent_layers: Sequence[int] | None = None) -> dict:
        """:func:`harness.role.pattern.verify_pools` over the copied rows only: each copied page
        and slot against its move (a copied row no move names must still hold decode tags),
        every row not copied left unjudged.  Returns the report's dict plus ``rooms`` (how many
        Success reads were copied) and ``rows`` (pages and slots judged)."""
        with self._lock:
            if not buffers:
                return {"ok": True, "bytes_verified": 0, "bytes_untouched_checked": 0, "mismatch_pages": 0,
                        "mismatches": [], "rooms": 0, "rows": 0}
            views = []
            for i, (spec, tensor) in enumerate(buffers):
                view = tensor.clone()
                for index, saved in (self._aux if spec.kind == pattern.AUX else self._kv).items():
                    if i in saved:
                        view[index] = saved[i]
                views.append((spec, view))
            pages = _rows(buffers, aux=False)
            slots = _rows(buffers, aux=True)
            kv, aux = set(self._kv), set(self._aux)
            report = pattern.verify_pools(
                views, [tuple(m) for m in kv_moves if m[1] in kv], [tuple(m) for m in aux_moves if m[1] in aux],
                sorted(set(unchecked_kv) | (set(range(pages)) - kv)),
                sorted(set(unchecked_aux) | (set(range(slots)) - aux)), sent_layers).to_dict()
            return {**report, "rooms": len(self._taken), "rows": len(kv) + len(aux)}


def _rows(buffers: list[tuple[pattern.BufferSpec, Any]], aux: bool) -> int:
    """How many pages (or aux slots) the first K/V (or aux) buffer has; 0 without one."""
    return next((int(t.shape[0]) for spec, t in buffers if (spec.kind == pattern.AUX) == aux), 0)
