"""Expectations: which verdict each cell is expected to have, and why.

A TOML file lists the cells expected to be other than PASS (every cell not listed
is expected to PASS)::

    sglang = "0.5.23"            # the release the file was written for (informative)

    [[expect]]
    impl = "mooncake"            # an implementation (harness.implementations)
    scenario = "early-watermark" # a scenario id (pdconform list)
    verdict = "FAIL"             # PASS | WARN | UNSUPPORTED | FAIL | ERROR
    reason = "Mooncake drops a WATERMARK that arrives before the room's metadata"
    link = "docs/sglang-bugs.md#b1"      # issue, PR or our bug registry entry
    checks = ["survives-watermark-staging-off", "no-dead-thread"]   # the checks that fail
    sometimes = []               # of those, the ones that fail only sometimes (a timing-dependent bug)

``reason`` and ``link`` are required: an expectation without them cannot be
reviewed.  ``checks`` lists the names of the checks that do not hold in the cell, as
the reports show them (``pdconform expectations update`` writes it); an entry
without it compares the verdict alone.  :func:`load_expectations` raises
:class:`ExpectationsError` for a file that does not parse or names an unknown
implementation, scenario or verdict, or lists a cell twice.  A link into
docs/sglang-bugs.md brings the bug's class (its ``**Class:**`` line: bug, hardening,
hostile-peer, design, withdrawn), which every report shows beside "known".

After a run, each cell is one of: as expected; a **regression** (its verdict is
worse than expected, in the order PASS < WARN < UNSUPPORTED < FAIL < ERROR, or a
check fails that its entry does not list: a new failure inside a known cell); or a
**fix** (better than expected, or a listed check that now holds: a partial fix; the
file must be updated).  Both make ``run`` exit 1.
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
    """The expectations pdconform ships for sglang ``version``: expectations/sglang-VERSION.toml; for
    a dev, pre, post or local version without a file of its own, the file of the newest shipped
    release at or below it in PEP 440 order (harness.target.version.newest_release_at_or_below:
    ``0.5.24.dev0`` and ``0.5.23.post1`` take sglang-0.5.23.toml); None when there is none (a plain
    release without a file of its own takes no other release's)."""
    from harness import ROOT
    from harness.target.version import newest_release_at_or_below

    if not version:
        return None
    folder = ROOT / "expectations"
    path = folder / f"sglang-{version}.toml"
    if path.is_file():
        return path
    release = newest_release_at_or_below(version, [p.stem.removeprefix("sglang-") for p in folder.glob("sglang-*.toml")])
    return folder / f"sglang-{release}.toml" if release else None


def with_expectations(run: RunResult, expectations: "Expectations | None") -> RunResult:
    """``run`` with every cell's expectation (verdict, reason, link, checks, the bug's class)
    taken from ``expectations`` (None: every cell expected to PASS), in place; the run."""
    for cell in run.cells:
        apply(cell, expectations.for_cell(cell.impl, cell.scenario) if expectations else None)
    return run


def apply(cell: CellResult, entry: "Expectation | None") -> CellResult:
    """``cell`` with the expectation ``entry`` written into it (None: expected to PASS), in place."""
    cell.expected = Verdict(entry.verdict) if entry else Verdict.PASS
    cell.expected_reason, cell.expected_link = (entry.reason, entry.link) if entry else ("", "")
    cell.expected_checks = list(entry.checks) if entry and entry.checks is not None else None
    cell.expected_sometimes = list(entry.sometimes) if entry else []
    cell.expected_class = bug_class(cell.expected_link) if entry else ""
    if cell.alone is not None:
        apply(cell.alone, entry)
    return cell


BUGS_DOC = "docs/sglang-bugs.md"
_CLASS_LINE = re.compile(r"^\*\*Class:\*\*\s*([a-z-]+)")


def bug_classes(path: Path | None = None) -> dict[str, str]:
    """Each entry of docs/sglang-bugs.md by its anchor (``b13``, ``u3``) -> its class, read
    from the ``**Class:**`` line under its heading; {} when the file cannot be read."""
    from harness import ROOT

    try:
        text = (path or ROOT / BUGS_DOC).read_text(encoding="utf-8")
    except OSError:
        return {}
    classes, anchor = {}, None
    for line in text.splitlines():
        heading = re.match(r"^#{2,3} ([A-Z]\d+)\.", line)
        if heading:
            anchor = heading.group(1).lower()
        elif anchor and (m := _CLASS_LINE.match(line)):
            classes.setdefault(anchor, m.group(1))
    return classes


def bug_class(link: str) -> str:
    """The class of the bug ``link`` names (``docs/sglang-bugs.md#b13`` -> ``bug``); "" for
    any other link or an entry without a class line."""
    if not link.startswith(BUGS_DOC + "#"):
        return ""
    return _classes().get(link.rpartition("#")[2].lower(), "")


_CLASSES: dict[str, str] | None = None


def _classes() -> dict[str, str]:
    global _CLASSES
    if _CLASSES is None:  # read once per process: every cell of a run asks
        _CLASSES = bug_classes()
    return _CLASSES


class ExpectationsError(ValueError):
    """The expectations file is unusable; the message names the file and the entry."""


class Expectation(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One entry of an expectations file (see the module docstring)."""

    impl: str
    scenario: str
    verdict: str
    reason: str
    link: str
    checks: list[str] | None = None  # the checks that fail in the cell; None: the verdict alone is compared
    # of those, the ones that fail only sometimes (a timing-dependent bug, said in its docs/sglang-bugs.md entry);
    # ``verdict`` is then the worst the cell shows
    sometimes: list[str] = msgspec.field(default_factory=list)


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
                                                     reason=c.expected_reason, link=c.expected_link,
                                                     checks=c.expected_checks, sometimes=c.expected_sometimes)
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
        if e.sometimes and not set(e.sometimes) <= set(e.checks or []):
            raise ExpectationsError(f"{where}: sometimes lists checks that checks does not: "
                                    f"{', '.join(sorted(set(e.sometimes) - set(e.checks or [])))}")
        if (e.impl, e.scenario) in entries:
            raise ExpectationsError(f"{where}: listed twice")
        entries[(e.impl, e.scenario)] = e
    return Expectations(path=str(path.resolve()), sglang=parsed.sglang, entries=entries)


def is_regression(cell: CellResult) -> bool:
    """The cell's verdict is worse than expected (harness.judge.verdict.Verdict order), or a
    check fails that its expectations entry does not list (CellResult.new_checks: a new
    failure inside a known cell); for a cell run again alone (harness.judge.load.needs_alone),
    its alone run is: one worse only under load is not a regression (CellResult.under_load,
    reported apart)."""
    return Verdict(cell.settled) > cell.expected or bool(cell.new_checks)


def is_fix(cell: CellResult) -> bool:
    """Not a regression, and the cell's verdict (alone, for a cell run again alone) is better
    than expected, or a check its entry lists now holds (a partial fix): the expectations
    file is out of date."""
    better = Verdict(cell.settled) < cell.expected and not cell.expected_sometimes  # else: for want of a sometimes
    return not is_regression(cell) and (better or bool(cell.gone_checks))


def under_load(run: RunResult) -> list[CellResult]:
    """The cells worse than expected only under load (CellResult.under_load)."""
    return [c for c in run.cells if c.under_load]


def regressions(run: RunResult) -> list[CellResult]:
    return [c for c in run.cells if is_regression(c)]


def fixes(run: RunResult) -> list[CellResult]:
    return [c for c in run.cells if is_fix(c)]


def updated_text(text: str, run: RunResult) -> tuple[str, list[str]]:
    """The text of an expectations file brought up to date with ``run`` (``pdconform
    expectations update``): the entry of a cell that now PASSes is removed; one whose verdict
    got better but is still not PASS gets that verdict; every entry of a cell the run judged
    and that is not a regression gets the cell's failing checks as its ``checks`` list (a
    partial fix drops the checks that now hold; an entry without a list gets one); reasons,
    links, every other entry, comment and line stay as they are.  Returns (new text, one line
    per change).  Regressions are never written: a new bug, or a new failing check inside a
    known one, needs its reason and link from a person."""
    import json

    cells = {(c.impl, c.scenario): c for c in run.cells}
    head, *blocks = re.split(r"(?m)^(?=\[\[expect\]\][ \t]*$)", text)
    out, changes = [head], []
    for block in blocks:
        fields = dict(re.findall(r'(?m)^(impl|scenario|verdict)\s*=\s*"([^"]*)"', block))
        cell = cells.get((fields.get("impl"), fields.get("scenario")))
        if cell is None or is_regression(cell):  # not run, or a person's to write
            out.append(block)
            continue
        seen = cell.alone or cell  # a cell run again alone: its alone run
        verdict = Verdict(seen.verdict)
        if cell.expected_sometimes and not cell.gone_checks:  # as expected, a sometimes-check or not
            out.append(block)
            continue
        if verdict == Verdict.PASS:
            changes.append(f"removed {cell.scenario} x {cell.impl}: PASS now (was expected {cell.expected})")
            continue
        if fields.get("verdict") != str(verdict):
            block = re.sub(r'(?m)^verdict\s*=\s*"[^"]*"', f'verdict = "{verdict}"', block, count=1)
            changes.append(f"{cell.scenario} x {cell.impl}: expected {cell.expected} -> {verdict}")
        failing = seen.failing_checks
        if not failing and verdict in (Verdict.WARN, Verdict.FAIL):  # judged before checks were recorded
            out.append(block)
            continue
        failing += [n for n in cell.expected_sometimes if n not in failing]  # listed, whether they failed this time
        if cell.expected_checks != failing:
            line = f"checks = [{', '.join(json.dumps(n) for n in failing)}]\n"
            if re.search(r"(?m)^checks\s*=", block):
                block = re.sub(r"(?m)^checks\s*=\s*\[[^\]]*\][ \t]*\n?", line, block, count=1)
            else:  # after the entry's last key line, before the blank lines that separate entries
                body = block.rstrip("\n")
                block = body + "\n" + line + block[len(body) + 1:]
            gone = [n for n in (cell.expected_checks or []) if n not in failing]
            changes.append(f"{cell.scenario} x {cell.impl}: " + (f"no longer failing: {', '.join(gone)} (a partial fix)"
                                                                 if gone else f"checks listed: {', '.join(failing)}"))
        out.append(block)
    return "".join(out), changes
