"""Verdicts and requirement levels, ordered.

A cell's verdict (README "Reading the output"): PASS every check held; WARN only a
SHOULD was broken; UNSUPPORTED the implementation cannot perform a step; FAIL a MUST
was broken; ERROR the cell could not be judged.  The order PASS < WARN < UNSUPPORTED
< FAIL < ERROR is the one expectations use to tell a regression from a fix
(harness.judge.expectations).
"""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    """One cell's verdict; compares by severity (``Verdict.PASS < Verdict.FAIL``), not by spelling.

    Equal to its name as a string, so ``cell.verdict == "PASS"`` holds and JSON carries the name."""

    PASS = "PASS"
    WARN = "WARN"
    UNSUPPORTED = "UNSUPPORTED"
    FAIL = "FAIL"
    ERROR = "ERROR"

    @property
    def rank(self) -> int:
        """0 for PASS up to 4 for ERROR."""
        return _ORDER.index(self)

    def _other(self, other: object) -> int:
        return Verdict(other).rank  # ValueError for a string that is no verdict

    def __lt__(self, other: object) -> bool:  # type: ignore[override]
        return self.rank < self._other(other)

    def __le__(self, other: object) -> bool:  # type: ignore[override]
        return self.rank <= self._other(other)

    def __gt__(self, other: object) -> bool:  # type: ignore[override]
        return self.rank > self._other(other)

    def __ge__(self, other: object) -> bool:  # type: ignore[override]
        return self.rank >= self._other(other)

    __hash__ = StrEnum.__hash__


_ORDER = (Verdict.PASS, Verdict.WARN, Verdict.UNSUPPORTED, Verdict.FAIL, Verdict.ERROR)


class Level(StrEnum):
    """A requirement's level in docs/protocol.md: a broken MUST is a FAIL, a broken SHOULD a WARN."""

    MUST = "MUST"
    SHOULD = "SHOULD"
