"""Expectations: which verdict each cell is expected to have, and why.

A TOML file lists the cells expected to be other than PASS (every cell not listed
is expected to PASS)::

    sglang = "0.5.23"            # the release the file was written for (informative)

    [[expect]]
    impl = "mooncake"            # an implementation (harness.implementations)
    scenario = "early-watermark" # a scenario id (pdconform list)
    verdict = "FAIL"             # PASS | WARN | UNSUPPORTED | FAIL | ERROR
    reason = "Mooncake drops a WATERMARK that arrives before the room's metadata"
    link = "docs/sglang-bugs.md#1-..."   # issue, PR or our bug registry entry

``reason`` and ``link`` are required: an expectation without them cannot be
reviewed.  :func:`load_expectations` raises :class:`ExpectationsError` for a file
that does not parse or names an unknown implementation, scenario or verdict, or
lists a cell twice.

After a run, each cell is one of: as expected; a **regression** (its verdict is
worse than expected, in the order PASS < WARN < UNSUPPORTED < FAIL < ERROR); or a
**fix** (better than expected: the file must be updated).  Both make ``run`` exit 1.
A cell worse than expected only on timing bounds while the machine starved it is run
once more alone (harness.judge.load); when alone it is as expected it is **worse only
under load**, counted apart and reported with both verdicts, and ``run`` exits 0 on it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Iterable

import msgspec

from harness.judge.results import VERDICTS, CellResult, RunResult
from harness.judge.verdict import Verdict
from harness.spec.inputs import InputError, read_input


#: ``--expectations none``: no expectations file, every cell expected to PASS
NO_EXPECTATIONS = "none"


def shipped_path(version: str | None) -> Path | None:
    """The expectations pdconform ships for sglang ``version`` (expectations/sglang-VERSION.toml), if any."""
    from harness import ROOT

    path = ROOT / "expectations" / f"sglang-{version}.toml"
    return path if version and path.is_file() else None


def with_expectations(run: RunResult, expectations: "Expectations | None") -> RunResult:
    """``run`` with every cell's expected verdict, reason and link taken from ``expectations``
    (None: every cell expected to PASS), in place; the run."""
    for cell in run.cells:
        entry = expectations.for_cell(cell.impl, cell.scenario) if expectations else None
        cell.expected = Verdict(entry.verdict) if entry else Verdict.PASS
        cell.expected_reason, cell.expected_link = (entry.reason, entry.link) if entry else ("", "")
    return run


class ExpectationsError(ValueError):
    """The expectations file is unusable; the message names the file and the entry."""


class Expectation(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    impl: str
    scenario: str
    verdict: str
    reason: str
    link: str


class ExpectationsFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    sglang: str | None = None
    expect: list[Expectation] = msgspec.field(default_factory=list)


class Expectations(msgspec.Struct, kw_only=True):
    """A loaded, validated expectations file: ``entries[(impl, scenario)]``."""

    path: str
    sglang: str | None
    entries: dict[tuple[str, str], Expectation]

    def for_cell(self, impl: str, scenario: str) -> Expectation | None:
        """The entry for the cell, None when it is not listed (expected to PASS)."""
        return self.entries.get((impl, scenario))

    @classmethod
    def of_run(cls, run: RunResult) -> "Expectations":
        """The expectations a judged run carries in its cells (their ``expected``, reason and
        link), for judging it again when its expectations file can no longer be read."""
        entries = {(c.impl, c.scenario): Expectation(impl=c.impl, scenario=c.scenario, verdict=str(c.expected),
                                                     reason=c.expected_reason, link=c.expected_link)
                   for c in run.cells if c.expected != Verdict.PASS}
        return cls(path=run.expectations or "", sglang=None, entries=entries)

    def verdict_for(self, impl: str, scenario: str) -> Verdict:
        """The verdict the cell is expected to have."""
        entry = self.for_cell(impl, scenario)
        return Verdict(entry.verdict) if entry else Verdict.PASS


def load_expectations(path: str | Path, impls: Iterable[str], scenarios: Iterable[str]) -> Expectations:
    """Read and validate ``path`` against the known ``impls`` and ``scenarios`` ids.

    Raises ExpectationsError (file missing, TOML syntax, unknown key, missing field,
    unknown impl/scenario/verdict, empty reason or link, duplicate cell).
    """
    path = Path(path)
    try:
        raw = tomllib.loads(read_input(path, "expectations file").decode("utf-8"))
    except InputError as exc:
        raise ExpectationsError(f"{path}: cannot read ({exc})") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ExpectationsError(f"{path}: not valid TOML: {exc}") from exc
    try:
        parsed = msgspec.convert(raw, ExpectationsFile)
    except msgspec.ValidationError as exc:
        raise ExpectationsError(f"{path}: {exc}") from exc
    impls, scenarios = set(impls), set(scenarios)
    entries: dict[tuple[str, str], Expectation] = {}
    for i, e in enumerate(parsed.expect):
        where = f"{path}: expect[{i}] ({e.impl} x {e.scenario})"
        if e.impl not in impls:
            raise ExpectationsError(f"{where}: unknown impl {e.impl!r} (known: {', '.join(sorted(impls))})")
        if e.scenario not in scenarios:
            raise ExpectationsError(f"{where}: unknown scenario {e.scenario!r} (see `pdconform list`)")
        if e.verdict not in VERDICTS:
            raise ExpectationsError(f"{where}: unknown verdict {e.verdict!r} (one of {', '.join(VERDICTS)})")
        if not e.reason.strip() or not e.link.strip():
            raise ExpectationsError(f"{where}: reason and link must not be empty")
        if (e.impl, e.scenario) in entries:
            raise ExpectationsError(f"{where}: listed twice")
        entries[(e.impl, e.scenario)] = e
    return Expectations(path=str(path.resolve()), sglang=parsed.sglang, entries=entries)


def is_regression(cell: CellResult) -> bool:
    """The cell's verdict is worse than expected (harness.judge.verdict.Verdict order); for a
    cell run again alone (harness.judge.load.needs_alone), its alone verdict is: one worse
    only under load is not a regression (CellResult.under_load, reported apart)."""
    return Verdict(cell.settled) > cell.expected


def is_fix(cell: CellResult) -> bool:
    """The cell's verdict (alone, for a cell run again alone) is better than expected (the
    expectations file is out of date)."""
    return Verdict(cell.settled) < cell.expected


def under_load(run: RunResult) -> list[CellResult]:
    """The cells worse than expected only under load (CellResult.under_load)."""
    return [c for c in run.cells if c.under_load]


def regressions(run: RunResult) -> list[CellResult]:
    return [c for c in run.cells if is_regression(c)]


def fixes(run: RunResult) -> list[CellResult]:
    return [c for c in run.cells if is_fix(c)]


def updated_text(text: str, run: RunResult) -> tuple[str, list[str]]:
    """The text of an expectations file brought up to date with ``run``'s fixes (``pdconform
    expectations update``): the entry of a cell that now PASSes is removed; one whose verdict
    got better but is still not PASS gets that verdict, its reason and link kept; every other
    entry, comment and line stays as it is.  Returns (new text, one line per change).
    Regressions are never written: a new bug needs its reason and link from a person."""
    fixed = {(c.impl, c.scenario): c for c in fixes(run)}
    head, *blocks = re.split(r"(?m)^(?=\[\[expect\]\][ \t]*$)", text)
    out, changes = [head], []
    for block in blocks:
        fields = dict(re.findall(r'(?m)^(impl|scenario|verdict)\s*=\s*"([^"]*)"', block))
        cell = fixed.get((fields.get("impl"), fields.get("scenario")))
        verdict = cell.settled if cell is not None else None  # a cell run again alone: its alone verdict
        if cell is None or fields.get("verdict") == str(verdict):  # not a fix, or already written
            out.append(block)
        elif verdict == Verdict.PASS:
            changes.append(f"removed {cell.scenario} x {cell.impl}: PASS now (was expected {cell.expected})")
        else:
            out.append(re.sub(r'(?m)^verdict\s*=\s*"[^"]*"', f'verdict = "{verdict}"', block, count=1))
            changes.append(f"{cell.scenario} x {cell.impl}: expected {cell.expected} -> {verdict}")
    return "".join(out), changes
