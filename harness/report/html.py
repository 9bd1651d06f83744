"""``index.html``: the matrix at a glance, as a pure function of the result tree.

One self-contained page (inline CSS and a few lines of inline JS, no network assets,
works from ``file://``): scenarios as rows, implementations as columns, each cell
coloured by verdict, marked when the verdict is not the expected one, with its known
bug, and, for ``run --baseline``, its mark against the baseline (new, fixed, ...).  A
cell links to its own page (``cells/SCENARIO--IMPL/cell.html``,
harness.report.cell_page).  Below the matrix: a "non-PASS only" filter, the cells that
did not PASS with their reasons, a requirement x implementation view (for each
requirement of docs/protocol.md the run's checks cite, how many of each
implementation's cells broke it, linked to those cells), and a link to the trend page
across the stored runs when the run folder sits in an --out folder
(harness.report.trend).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from harness.judge.results import VERDICTS, CellResult, RunResult, cell_dir_name, write_atomic
from harness.report.cell_page import CELL_PAGE, docs_href, requirement_link, write_cell_pages
from harness.report.load import alone_line, load_warning, pair_line, pairs_sentence, starved_line
from harness.report.templates_env import env
from harness.report.terminal import bug_id, engine_settings_line, expectation_gap, known_label, reproduce_command
from harness.spec.requirements import requirements


def _engine_label(cells: list[CellResult]) -> str:
    engines = list(dict.fromkeys(c.engine for c in cells if c.engine))
    return " / ".join(engines) if engines else "no manager started"


def cell_href(cell: CellResult) -> str:
    """The cell's page, relative to the run folder."""
    return f"cells/{cell_dir_name(cell.scenario, cell.impl)}/{CELL_PAGE}"


def _cell_view(run: RunResult, cell: CellResult) -> dict:
    mark = (run.baseline or {}).get("marks", {}).get(f"{cell.scenario} x {cell.impl}")
    return {
        "cell": cell,
        "id": "cell-" + cell_dir_name(cell.scenario, cell.impl),
        "href": cell_href(cell),
        "unexpected": not cell.as_expected,
        "bug": known_label(cell) if cell.expected_link and cell.verdict != "PASS" and cell.as_expected else "",
        "gap": expectation_gap(cell),  # how it differs from its expectation ("" when as expected)
        "baseline": mark["mark"] if mark and mark["mark"] not in ("same", "not in baseline") else "",
        "baseline_title": (f"{mark['mark']}: {mark['before']} before" + (f"; {'; '.join(mark['checks'])}"
                                                                         if mark["checks"] else "")) if mark else "",
        "reproduce": reproduce_command(run, cell),
        "load": alone_line(cell) or starved_line(cell),  # the load it ran under, the alone run (harness.judge.load)
        "pair": pair_line(cell),  # a warm role pair's cell, or one confirmed in a fresh cell (harness.drive.warm)
    }


def requirement_view(run: RunResult) -> list[dict]:
    """The requirement x implementation view: for every requirement the run's checks cite,
    in docs/protocol.md's order, per implementation the cells whose check citing it failed
    (``broken``: [(scenario, href)]), ran (``judged``) and its level and text."""
    impls = list(dict.fromkeys(c.impl for c in run.cells))
    cited: dict[str, dict[str, dict]] = {}
    for cell in run.cells:
        for check in cell.checks:
            rid = check.get("requirement")
            if not rid:
                continue
            entry = cited.setdefault(rid, {impl: {"judged": set(), "broken": {}} for impl in impls})[cell.impl]
            entry["judged"].add(cell.scenario)
            if check.get("ok") is False:
                entry["broken"][cell.scenario] = cell_href(cell)
    spec = requirements()
    order = {rid: i for i, rid in enumerate(spec)}
    rows = []
    for rid in sorted(cited, key=lambda r: (order.get(r, len(order)), r)):
        req = spec.get(rid)
        rows.append({"id": rid, "level": req.level if req else "?", "text": req.text if req else "",
                     "href": docs_href(run, requirement_link(rid)),
                     "impls": [{"impl": impl, "judged": len(cited[rid][impl]["judged"]),
                                "broken": sorted(cited[rid][impl]["broken"].items())} for impl in impls]})
    return rows


def render_index_html(run: RunResult, trend_href: str | None = None) -> str:
    """The whole ``index.html`` page for ``run``, as a string (pure: no I/O).

    ``trend_href``: the trend page's address from the run folder (None: no link).  Every
    string from the result tree is HTML-escaped."""
    impls = list(dict.fromkeys(c.impl for c in run.cells))
    scenarios = list(dict.fromkeys(c.scenario for c in run.cells))
    views = {(c.scenario, c.impl): _cell_view(run, c) for c in run.cells}
    columns = [{"impl": impl, "engine": _engine_label([c for c in run.cells if c.impl == impl])} for impl in impls]
    counts = {v: sum(1 for c in run.cells if c.verdict == v) for v in VERDICTS}
    all_pass = {sc for sc in scenarios if all(v["cell"].verdict == "PASS" for k, v in views.items() if k[0] == sc)}
    from harness.report.run_diff import baseline_rows

    return env.get_template("index.html.j2").render(
        run=run, columns=columns, scenarios=scenarios, views=views, counts=counts, all_pass=all_pass,
        unexpected=sum(1 for c in run.cells if not c.as_expected), engine_settings=engine_settings_line(run),
        under_load=sum(c.under_load for c in run.cells), load_warning=load_warning(run), pairs=pairs_sentence(run),
        non_pass=[views[(c.scenario, c.impl)] for c in run.cells if c.verdict != "PASS"],
        requirements=requirement_view(run), trend_href=trend_href,
        baseline_counts=baseline_rows(run)[0] if run.baseline else {},
    )


def write_index_html(run: RunResult, out_dir: str | Path, histories: Mapping[tuple[str, str], list[dict]]) -> Path:
    """Render ``OUT/index.html`` and every cell's page (harness.report.cell_page) from ``run``
    and its ``histories`` (harness.judge.results.load_histories), each atomically; the
    index's path.  The trend page is linked when the run folder is one of an --out folder's
    runs (``OUT/runs/<time>/``).  OSError if a page cannot be written."""
    from harness.judge.results import RUNS
    from harness.report.trend import TREND_PAGE

    from harness.report.trend import ours

    out_dir = Path(out_dir)
    write_cell_pages(run, out_dir, histories)
    # an --out folder's run: its trend page, which pdconform writes there when the run finishes or is
    # judged again (RunFolder.finish, harness.session.rejudge), unless a file of the user's has the name
    trend = f"../../{TREND_PAGE}" if out_dir.parent.name == RUNS and \
        ours(out_dir.parent.parent / TREND_PAGE) is not False else None
    path = out_dir / "index.html"
    write_atomic(path, render_index_html(run, trend).encode("utf-8"))
    return path
