"""``pdconform diff`` and ``run --baseline``: what changed between two runs, cell by cell and
check by check.

Typical use: the same matrix against sglang before and after a pull request (or
0.5.17 against 0.5.23).  Only the cells both runs have are compared, unless asked
(``all_cells``): then a cell present in only one run is listed too, as ``missing`` on
the other side, and one that run B lost counts as worse.  Worse/better follows the
verdict order of harness.judge.expectations (PASS < WARN < UNSUPPORTED < FAIL < ERROR).
A cell whose verdict stayed but whose failing checks changed is listed too.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

from harness.judge.results import RunResult
from harness.judge.verdict import Verdict
from harness.report.safe import md, md_code, terminal
from harness.report.terminal import VERDICT_STYLE

MISSING = "missing"


@dataclass(frozen=True)
class CellChange:
    """One (scenario, impl) cell whose verdict differs: ``before`` in run A, ``after`` in run B."""

    scenario: str
    impl: str
    before: str
    after: str
    reason: str  # run B's reason for its verdict ("" when PASS or missing)
    checks: tuple[str, ...] = ()  # "fails now: NAME" / "passes now: NAME", check by check

    @property
    def worse(self) -> bool:
        """B's verdict is worse than A's, or B lost the cell (a gate must not pass because a
        failing cell vanished); a cell only in B is not worse."""
        if self.after == MISSING:
            return True
        if self.before == MISSING:
            return False
        return Verdict(self.after) > Verdict(self.before)

    @property
    def direction(self) -> str:
        if self.after == MISSING:
            return "only in A: worse"
        if self.before == MISSING:
            return "only in B"
        if self.before == self.after:
            return "same verdict, checks changed"
        return "worse" if self.worse else "better"


def _failing(cell) -> set[str]:
    return {c["name"] for c in cell.checks if c.get("ok") is False}


def check_changes(before, after) -> tuple[str, ...]:
    """The checks of one cell whose outcome differs between two runs (``before``/``after``
    are CellResults), as ``fails now: NAME`` and ``passes now: NAME`` (a check only one run
    has is left out)."""
    names = {c["name"] for c in before.checks} & {c["name"] for c in after.checks}
    was, now = _failing(before) & names, _failing(after) & names
    return tuple(f"{label}: {', '.join(sorted(group))}" for label, group in
                 (("fails now", now - was), ("passes now", was - now)) if group)


def changed_cells(run_a: RunResult, run_b: RunResult, all_cells: bool = False) -> list[CellChange]:
    """Cells whose verdict, or set of failing checks, differs between ``run_a`` and ``run_b``,
    in run A's order; with ``all_cells`` also the cells only one run has (B's new ones last)."""
    a = {(c.scenario, c.impl): c for c in run_a.cells}
    b = {(c.scenario, c.impl): c for c in run_b.cells}
    keys = [k for k in a if k in b] if not all_cells else list(a) + [k for k in b if k not in a]
    changes = []
    for key in keys:
        before = a[key].verdict if key in a else MISSING
        after = b[key].verdict if key in b else MISSING
        checks = check_changes(a[key], b[key]) if key in a and key in b else ()
        if before != after or checks:
            changes.append(CellChange(key[0], key[1], before, after, b[key].reason if key in b else "", checks))
    return changes


def unmatched(run_a: RunResult, run_b: RunResult) -> tuple[int, int]:
    """How many cells only run A has, and only run B."""
    a, b = ({(c.scenario, c.impl) for c in run.cells} for run in (run_a, run_b))
    return len(a - b), len(b - a)


def baseline_marks(baseline: RunResult, run: RunResult) -> dict[str, dict]:
    """For ``run --baseline``: each cell of ``run`` against the same cell of ``baseline``,
    keyed ``SCENARIO x IMPL``: ``{"mark", "before": verdict, "checks": [...]}``, the mark
    one of ``new`` (worse than the baseline), ``fixed`` (better), ``same`` (the same
    verdict, its failing checks possibly changed), ``now judged`` (UNSUPPORTED in the
    baseline: nothing to compare with), ``no longer judged`` (UNSUPPORTED now) or ``not in
    baseline``."""
    base = {(c.scenario, c.impl): c for c in baseline.cells}
    marks = {}
    for cell in run.cells:
        old = base.get((cell.scenario, cell.impl))
        if old is None:
            marks[f"{cell.scenario} x {cell.impl}"] = {"mark": "not in baseline", "before": MISSING, "checks": []}
            continue
        before, after = Verdict(old.verdict), Verdict(cell.verdict)
        mark = ("same" if before == after else "now judged" if before == Verdict.UNSUPPORTED else
                "no longer judged" if after == Verdict.UNSUPPORTED else "new" if after > before else "fixed")
        marks[f"{cell.scenario} x {cell.impl}"] = {"mark": mark, "before": str(old.verdict),
                                                   "checks": list(check_changes(old, cell))}
    return marks


def _label(run: RunResult) -> str:
    commit = f" @{run.sglang.commit[:10]}" if run.sglang.commit else ""
    return f"sglang {run.sglang.version}{commit}"


def changes_table(run_a: RunResult, run_b: RunResult, changes: list[CellChange]) -> Table:
    """The changes as a rich table (A's and B's sglang in the title)."""
    table = Table(title=Text(terminal(f"{len(changes)} cell(s) changed: A = {_label(run_a)}, B = {_label(run_b)}")))
    for column in ("scenario", "impl", "A", "B", "", "checks", "B's reason"):
        table.add_column(column)
    for c in changes:
        table.add_row(Text(terminal(c.scenario)), Text(terminal(c.impl)),
                      Text(c.before, style=VERDICT_STYLE.get(c.before, "")),
                      Text(c.after, style=VERDICT_STYLE.get(c.after, "")), Text(c.direction),
                      Text(terminal("; ".join(c.checks))), Text(terminal(c.reason[:120])))
    return table


def changes_markdown(run_a: RunResult, run_b: RunResult, changes: list[CellChange]) -> str:
    """The changes as Markdown for a pull-request comment."""
    lines = [f"### pdconform diff: {len(changes)} cell(s) changed", "",
             f"A = {md(_label(run_a))} ({md(run_a.sglang.source)}), B = {md(_label(run_b))} ({md(run_b.sglang.source)})",
             ""]
    if not changes:
        return "\n".join(lines + ["No cell changed its verdict."]) + "\n"
    lines += ["| scenario | impl | A | B | | checks | B's reason |", "|---|---|---|---|---|---|---|"]
    for c in changes:
        lines.append(f"| {md_code(c.scenario)} | {md(c.impl)} | {c.before} | {c.after} | {c.direction} | "
                     f"{md('; '.join(c.checks))} | {md(c.reason[:200])} |")
    return "\n".join(lines) + "\n"


#: the marks :func:`baseline_marks` gives, in the order reports count them
MARKS = ("new", "fixed", "now judged", "no longer judged", "same", "not in baseline")


def baseline_rows(run: RunResult) -> tuple[dict[str, int], list[tuple[str, str, str, str, list[str]]]]:
    """A run's ``baseline`` for a report: (count per mark, in :data:`MARKS` order), and a row
    ``(mark, "SCENARIO x IMPL", before, after, checks)`` for every cell worth a line (not
    ``same`` with unchanged checks, not ``not in baseline``)."""
    marks = (run.baseline or {}).get("marks", {})
    counts = {k: sum(m["mark"] == k for m in marks.values()) for k in MARKS}
    after = {f"{c.scenario} x {c.impl}": str(c.verdict) for c in run.cells}
    rows = [(m["mark"], key, m["before"], after.get(key, "?"), list(m["checks"])) for key, m in marks.items()
            if m["mark"] not in ("same", "not in baseline") or m["checks"]]
    return counts, rows


def baseline_lines(run: RunResult) -> list[str]:
    """``run --baseline``: one line with the counts, then each new, fixed or now / no longer
    judged cell and each cell whose checks changed, check by check ([] without a baseline)."""
    if not run.baseline:
        return []
    counts, rows = baseline_rows(run)
    lines = [f"against baseline {run.baseline.get('path')} (sglang {run.baseline.get('sglang')}): "
             + ", ".join(f"{n} {k}" for k, n in counts.items() if n)]
    lines += [f"  {mark}: {key}: {before} -> {after}" + (f" ({'; '.join(checks)})" if checks else "")
              for mark, key, before, after, checks in rows]
    return [terminal(line) for line in lines]
