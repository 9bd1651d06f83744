"""``pdconform diff``: the cells whose verdict changed between two runs.

Typical use: the same matrix against sglang before and after a pull request (or
0.5.17 against 0.5.23).  A cell present in only one run is listed too, as
``missing`` on the other side; one that run B lost counts as worse.  Worse/better follows the verdict order of
harness.judge.expectations (PASS < WARN < UNSUPPORTED < FAIL < ERROR).
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
        return "worse" if self.worse else "better"


def changed_cells(run_a: RunResult, run_b: RunResult) -> list[CellChange]:
    """Cells whose verdict differs between ``run_a`` and ``run_b``, in run A's order then B's new cells."""
    a = {(c.scenario, c.impl): c for c in run_a.cells}
    b = {(c.scenario, c.impl): c for c in run_b.cells}
    changes = []
    for key in list(a) + [k for k in b if k not in a]:
        before = a[key].verdict if key in a else MISSING
        after = b[key].verdict if key in b else MISSING
        if before != after:
            changes.append(CellChange(key[0], key[1], before, after, b[key].reason if key in b else ""))
    return changes


def _label(run: RunResult) -> str:
    commit = f" @{run.sglang.commit[:10]}" if run.sglang.commit else ""
    return f"sglang {run.sglang.version}{commit}"


def changes_table(run_a: RunResult, run_b: RunResult, changes: list[CellChange]) -> Table:
    """The changes as a rich table (A's and B's sglang in the title)."""
    table = Table(title=Text(terminal(f"{len(changes)} cell(s) changed: A = {_label(run_a)}, B = {_label(run_b)}")))
    for column in ("scenario", "impl", "A", "B", "", "B's reason"):
        table.add_column(column)
    for c in changes:
        table.add_row(Text(terminal(c.scenario)), Text(terminal(c.impl)),
                      Text(c.before, style=VERDICT_STYLE.get(c.before, "")),
                      Text(c.after, style=VERDICT_STYLE.get(c.after, "")), Text(c.direction),
                      Text(terminal(c.reason[:120])))
    return table


def changes_markdown(run_a: RunResult, run_b: RunResult, changes: list[CellChange]) -> str:
    """The changes as Markdown for a pull-request comment."""
    lines = [f"### pdconform diff: {len(changes)} cell(s) changed", "",
             f"A = {md(_label(run_a))} ({md(run_a.sglang.source)}), B = {md(_label(run_b))} ({md(run_b.sglang.source)})",
             ""]
    if not changes:
        return "\n".join(lines + ["No cell changed its verdict."]) + "\n"
    lines += ["| scenario | impl | A | B | | B's reason |", "|---|---|---|---|---|---|"]
    for c in changes:
        lines.append(f"| {md_code(c.scenario)} | {md(c.impl)} | {c.before} | {c.after} | {c.direction} | "
                     f"{md(c.reason[:200])} |")
    return "\n".join(lines) + "\n"
