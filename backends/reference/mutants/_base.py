"""What every planted bug uses: a way to replace a method, and a thread death."""

from __future__ import annotations

from typing import Callable


class PlantedLoopDeath(BaseException):
    """Raised by a mutant where a real backend's thread dies of an uncaught exception:
    a BaseException, so the reference's loops (which catch Exception) let it through."""


def wrap(cls, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``cls.name`` with ``make(original)``."""
    setattr(cls, name, make(getattr(cls, name)))
