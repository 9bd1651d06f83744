"""Bootstrap rooms of their own for a matrix cell served by a warm role pair (harness.drive.pair).

A scenario's rooms are drawn from its seed, so two scenarios (or one scenario twice) on the
same long-lived roles would name the same rooms, and the second would meet what the first
left in sglang's maps.  A cell on a pair therefore talks to its roles through a
:class:`RoomShift`: every room it names reaches the roles moved up by ``delta`` (a multiple of
:data:`harness.spec.rooms.ROOM_STRIDE`, so each room keeps its DP engine, R-DP-1) and every
reply comes back moved down again.  The history, and so the judge, sees the scenario's own
rooms, exactly as in an isolated cell; sglang sees rooms no earlier cell of the pair used.

The mapping is on values, not on call signatures: an ``int`` equal to one of the cell's rooms,
and a run of digits equal to one inside a ``str`` or ``bytes`` (a room in a log line, a failure
reason, a residue path, a wire frame ``str(room).encode()``), at any depth of dicts, lists,
tuples and sets.  It is unambiguous only when every room has at least :data:`MIN_DIGITS`
digits (a page number or a port never equals one): :func:`shiftable` says whether a cell's
rooms are; a cell whose rooms are not runs isolated.
"""

from __future__ import annotations

import re
from typing import Any

from harness.spec.rooms import MAX_SHIFTS, ROOM_STRIDE

MIN_DIGITS = 10  # a room shorter than this could equal a page, slot or port number: not shifted
MAX_DIGITS = 19  # 2^63 has 19 digits: a longer run (a malformed frame's) names no room
_DIGITS = re.compile(rf"(?<![0-9])[0-9]{{{MIN_DIGITS},{MAX_DIGITS}}}(?![0-9])")
_DIGITS_B = re.compile(_DIGITS.pattern.encode())


def shiftable(rooms) -> bool:
    """Whether a cell naming ``rooms`` (ints) can be served with its rooms shifted: each has
    at least :data:`MIN_DIGITS` digits and stays below 2^62 (so a shifted room stays below 2^63)."""
    return all(10 ** (MIN_DIGITS - 1) <= r < 2**62 for r in rooms)


class RoomShift:
    """The room mapping of one cell on a pair: ``rooms`` (the scenario's, ints) move up by ``k``
    strides of ROOM_STRIDE on the way to the roles (:meth:`out`) and back down on the way back
    (:meth:`back`).  ValueError when ``k`` is out of 1..MAX_SHIFTS or a room is not shiftable."""

    def __init__(self, rooms, k: int):
        rooms = frozenset(int(r) for r in rooms)
        if not 1 <= k <= MAX_SHIFTS:
            raise ValueError(f"a room shift of {k} strides (1 to {MAX_SHIFTS})")
        if not shiftable(rooms):
            raise ValueError(f"rooms too short or too large to shift: {sorted(rooms)[:4]}")
        self.k, self.delta = k, k * ROOM_STRIDE
        self._up = {r: r + self.delta for r in rooms}
        self._down = {v: r for r, v in self._up.items()}

    def out(self, value: Any) -> Any:
        """``value`` (a call's keyword arguments) with each of the cell's rooms moved up."""
        return _mapped(value, self._up)

    def back(self, value: Any) -> Any:
        """``value`` (a role's reply or error text) with each moved room moved back down."""
        return _mapped(value, self._down)


def _mapped(value: Any, table: dict[int, int]) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return table.get(value, value)
    if isinstance(value, str):
        return _DIGITS.sub(lambda m: str(table.get(int(m.group()), m.group())), value)
    if isinstance(value, bytes):
        return _DIGITS_B.sub(lambda m: str(table.get(int(m.group()), int(m.group()))).encode(), value)
    if isinstance(value, dict):
        return {_mapped(k, table): _mapped(v, table) for k, v in value.items()}
    if type(value) in (list, tuple, set, frozenset):  # not a named tuple or a subclass: rebuilt as its own type
        return type(value)(_mapped(v, table) for v in value)
    return value


__all__ = ["RoomShift", "shiftable", "MIN_DIGITS"]
