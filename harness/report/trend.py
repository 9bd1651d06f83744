"""``OUT/trend.html``: every stored run of an --out folder side by side, cell by cell.

Rows are the cells (scenario x implementation) any stored run has, columns the runs
oldest first (start time, sglang release, seed), each square the cell's verdict in that
run (marked when it was not the expected one), linked to that run's cell page.  So a
verdict that flipped between sglang releases, or a fix landing, shows as a change of
colour along a row.  A pure function of the stored results.json files
(:func:`render_trend`); :func:`write_trend` reads them and writes the page atomically.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import quote

from harness.judge.results import MARKER, RUNS, TREND_PAGE, RunResult, cell_dir_name, load_run, write_atomic
from harness.report.cell_page import CELL_PAGE
from harness.report.templates_env import env
from harness.report.terminal import known_label

OURS = "<!-- written by pdconform: harness/report/trend.py -->"  # a trend.html without it is not ours to replace


def render_trend(runs: list[tuple[str, RunResult]], pages: set[str] | None = None) -> str:
    """The trend page for ``runs``: ``(run folder name, its result)`` oldest first (pure).
    ``pages``: the cell pages that exist (``runs/<run>/cells/<cell>/cell.html``; None: all);
    a square whose page does not (a run made before cell pages) links to its run's index.html."""
    keys = list(dict.fromkeys((c.scenario, c.impl) for _, run in runs for c in run.cells))
    columns = [{"name": name, "started": run.started_at or name, "sglang": run.sglang.version or "?",
                "seed": run.seed, "cells": {(c.scenario, c.impl): c for c in run.cells}} for name, run in runs]
    rows = []
    for scenario, impl in keys:
        seen = [col["cells"].get((scenario, impl)) for col in columns]
        verdicts = {c.verdict for c in seen if c is not None}
        rows.append({"scenario": scenario, "impl": impl, "changed": len(verdicts) > 1,
                     "cells": [None if c is None else
                               {"verdict": c.verdict, "expected": c.expected, "unexpected": not c.as_expected,
                                "known": (known_label(c) or "bug") if c.verdict != "PASS" and c.as_expected
                                else "",
                                "href": _href(col["name"], cell_dir_name(scenario, impl), pages)}
                               for c, col in zip(seen, columns)]})
    return env.get_template("trend.html.j2").render(columns=columns, rows=rows,
                                                    changed=sum(r["changed"] for r in rows))


def _href(run: str, cell: str, pages: set[str] | None) -> str:
    page = f"{RUNS}/{quote(run)}/cells/{quote(cell)}/{CELL_PAGE}"
    return page if pages is None or page in pages else f"{RUNS}/{quote(run)}/index.html"


def stored_runs(out: Path) -> list[tuple[str, RunResult]]:
    """The finished runs under ``OUT/runs/`` (pdconform's folders with a readable results.json
    of this schema), oldest first; others are skipped."""
    found = []
    folder = Path(out) / RUNS
    if not folder.is_dir():
        return found
    for run_dir in sorted(folder.iterdir()):
        if run_dir.is_symlink() or not (run_dir / MARKER).is_file():
            continue
        try:
            found.append((run_dir.name, load_run(run_dir / "results.json")))
        except (OSError, ValueError):  # unfinished, foreign or older: not part of the trend
            continue
    return found


def ours(path: Path) -> bool | None:
    """Whether ``path`` is a trend page pdconform wrote (True), is free (None: nothing there),
    or is something else: a link, a folder, a FIFO, a file of the user's (False).  Reads at
    most the page's first 400 bytes; never follows a link."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return False
    with open(path, "rb") as f:
        return OURS.encode() in f.read(400)


def write_trend(out: str | Path) -> Path | None:
    """Write ``OUT/trend.html`` from the runs stored under ``OUT/runs/``, atomically; its path,
    or None when something pdconform did not write is there (left as it is).  OSError when
    it cannot be written."""
    out = Path(out)
    path = out / TREND_PAGE
    if ours(path) is False:
        return None
    runs = stored_runs(out)
    pages = {str(p.relative_to(out)) for name, _ in runs
             for p in (out / RUNS / name / "cells").glob(f"*/{CELL_PAGE}")}
    write_atomic(path, render_trend(runs, {quote(p, safe="/") for p in pages}).encode("utf-8"))
    return path
