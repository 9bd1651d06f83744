"""The report files a run writes into its out directory, each a pure function of the result tree.

- ``junit.xml`` (:func:`junit_xml`): one test case per cell, classname the
  implementation, name the scenario.  As with pytest's xfail, a cell whose verdict
  is the expected non-PASS one is *skipped* with the expectation's reason.  Otherwise
  FAIL is a ``failure`` (message: requirement and reason; text: the first
  divergence), ERROR an ``error``, a PASS better than expected a ``failure``
  ("fixed"), UNSUPPORTED ``skipped`` and WARN a ``failure`` when not expected.  So the
  JUnit view is red exactly when ``run --expectations`` exits 1.
- ``summary.md`` (:func:`summary_markdown`): the matrix, then the cells not as
  expected with requirement, first divergence and reproduce command, then the
  known (expected) non-PASS cells folded away; sized for a pull-request comment.
- ``index.html`` and each cell's ``cells/SCENARIO--IMPL/cell.html``: :mod:`harness.report.html`,
  :mod:`harness.report.cell_page`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from harness.judge.divergence import describe as describe_divergence
from harness.judge.expectations import fixes, is_fix, regressions, under_load
from harness.judge.results import VERDICTS, CellResult, RunResult, write_atomic
from harness.report.html import write_index_html
from harness.report.load import alone_line, load_warning, pair_line, pairs_sentence, starved_line
from harness.report.safe import cut, md, md_code
from harness.report.run_diff import baseline_rows
from harness.report.terminal import bug_id, engine_settings_line, expectation_gap, known_label, reproduce_command

# GitHub rejects comments over 65,536 characters; summary.md stays well below.
SUMMARY_LIMIT = 60_000
MARK = {"PASS": "✅", "WARN": "⚠️", "UNSUPPORTED": "➖", "FAIL": "❌", "ERROR": "💥"}


_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """``text`` without the characters XML 1.0 cannot carry (terminal escapes, NULs from
    role logs end up in reasons); each becomes ``?``."""
    return _XML_INVALID.sub("?", text)


def failure_text(cell: CellResult) -> str:
    """Why a cell did not PASS: its reason (which names the requirement) and its first divergence."""
    lines = [cell.reason or cell.verdict]
    if cell.divergence:
        lines.append(describe_divergence(cell.divergence))
    return "\n".join(lines)


def _requirement(cell: CellResult) -> str:
    if cell.divergence and cell.divergence.get("requirement"):
        return cell.divergence["requirement"]
    failed = [c.get("requirement") for c in cell.checks if not c.get("ok", True) and c.get("requirement")]
    return failed[0] if failed else ""


def sglang_line(run: RunResult, path: bool = True) -> str:
    """``sglang 0.5.23 (installed, /path)`` with the commit for a checkout; ``path`` False
    leaves the local path out (reports read on another machine, a pull request)."""
    s = run.sglang
    commit = f", commit {s.commit[:12]}" if s.commit else ""
    return f"sglang {s.version} ({s.source}{commit}{f', {s.path}' if path else ''})"


def doc_link(run: RunResult, link: str) -> str:
    """``link`` as a reader of the report can follow it: a link into the checkout's docs/
    (``docs/sglang-bugs.md#b3``) made absolute with the run's ``docs_url`` when it has one;
    any other link as it is."""
    if run.docs_url and link.startswith("docs/"):
        return f"{run.docs_url.rstrip('/')}/{link}"
    return link


def expectations_name(run: RunResult) -> str:
    """The expectations file, without the local path: relative to the checkout when it is
    one of the shipped files, else its file name."""
    from harness import ROOT

    path = Path(run.expectations or "")
    try:
        return str(path.resolve().relative_to(ROOT.resolve()))
    except ValueError:
        return path.name


def junit_xml(run: RunResult) -> JUnitXml:
    """The run as one JUnit test suite (junitparser objects; ``.write(path)`` writes it)."""
    suite = TestSuite(f"pdconform: {sglang_line(run, path=False)}, seed {run.seed}")
    for cell in run.cells:
        case = TestCase(cell.scenario, classname=cell.impl, time=cell.duration_s)
        text = failure_text(cell)
        head, requirement = text.splitlines()[0], _requirement(cell)
        if requirement and requirement not in head:
            head = f"{requirement}: {head}"
        out = [f"verdict {cell.verdict} (expected {cell.expected}), engine {cell.engine}, "
               f"{cell.bytes_verified} bytes verified", f"reproduce: {reproduce_command(run, cell, portable=True)}"]
        if cell.verdict != "PASS" and cell.as_expected:  # known: its type says which verdict
            result = Skipped(f"known {cell.expected}{f' ({cell.expected_class})' if cell.expected_class else ''}: "
                             f"{cell.expected_reason} ({doc_link(run, cell.expected_link)})",
                             f"known-{str(cell.expected).lower()}")
            result.text = text
            case.result = [result]
        elif cell.verdict == cell.expected and cell.verdict != "PASS" and not cell.under_load:
            # the expected verdict, but not the checks its entry lists: a new failure is a regression,
            # a listed check that holds a partial fix; either way red, named
            result = Failure(f"not as expected: {expectation_gap(cell)}", "NEW-CHECK" if cell.new_checks else "FIXED")
            result.text = text
            case.result = [result]
        elif cell.under_load:  # as expected run again alone: neither a pass nor a regression (harness.judge.load)
            result = Skipped(f"worse only under load: {alone_line(cell)}", "timing-under-load")
            result.text = text
            case.result = [result]
        elif cell.verdict == "FAIL" or (cell.verdict == "PASS" and is_fix(cell)):
            result = Failure(head if cell.verdict == "FAIL" else
                             f"fixed: PASS, expected {cell.expected} (pdconform expectations update rewrites the "
                             "expectations file)", "FAIL" if cell.verdict == "FAIL" else "FIXED")
            result.text = text
            case.result = [result]
        elif cell.verdict == "ERROR":
            result = Error(head, "ERROR")
            result.text = text
            case.result = [result]
        elif cell.verdict in ("UNSUPPORTED", "WARN"):  # not the expected verdict (that was skipped above)
            result = Failure(f"{cell.verdict}, expected {cell.expected}: {head}", cell.verdict)
            result.text = text
            case.result = [result]
        case.system_out = "\n".join(out)
        suite.add_testcase(case)
    for case in suite:
        for result in case.result:
            if result.message:
                result.message = xml_safe(result.message)
            if result.text:
                result.text = xml_safe(result.text)
        case.system_out = xml_safe(case.system_out or "")
    xml = JUnitXml()
    xml.add_testsuite(suite)
    suite.time = xml.time = round(run.duration_s, 3)  # the run's wall time, not the sum of its cells
    return xml


def _matrix_markdown(run: RunResult) -> list[str]:
    impls = list(dict.fromkeys(c.impl for c in run.cells))
    engines = {impl: next((c.engine for c in run.cells if c.impl == impl and c.engine), "no manager started")
               for impl in impls}
    by_key = {(c.scenario, c.impl): c for c in run.cells}
    lines = ["| scenario | " + " | ".join(f"{md(i)} ({md(engines[i])})" for i in impls) + " |",
             "|---" * (len(impls) + 1) + "|"]
    for scenario in dict.fromkeys(c.scenario for c in run.cells):
        row = [md_code(scenario)]
        for impl in impls:
            cell = by_key.get((scenario, impl))
            if cell is None:
                row.append("")
                continue
            text = f"{MARK.get(cell.verdict, '')} {cell.verdict}"
            if cell.verdict != cell.expected:
                text = f"**{text}** (expected {cell.expected})"
            elif not cell.as_expected:  # the expected verdict, not the expected checks
                text = f"**{text}** ({'new failing check' if cell.new_checks else 'a listed check fixed'})"
            elif cell.verdict != "PASS" and cell.expected_link:
                text += f" known {md(known_label(cell))}"
            if cell.alone is not None:  # run again alone (harness.judge.load)
                text += f"<br>{cell.alone.verdict} alone" + (": timing under load" if cell.under_load else "")
            if cell.on_pair is not None:  # its run on a warm pair was not as expected (harness.drive.warm)
                text += f"<br>confirmed fresh ({cell.on_pair.verdict} on a pair)"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _cell_block(run: RunResult, cell: CellResult) -> list[str]:
    """One cell not PASSing, as a list item; every string from the run is escaped (harness.report.safe)."""
    lines = [f"- **{md(cell.scenario)} x {md(cell.impl)}**: {cell.verdict}, expected {cell.expected}",
             f"  - {md(cut(cell.reason or str(cell.verdict)))}"]  # one item per value, whatever lines it holds
    if expectation_gap(cell) and not cell.as_expected:
        lines.insert(1, f"  - not as expected: {md(expectation_gap(cell))}")
    if cell.divergence:
        lines.append(f"  - {md(cut(describe_divergence(cell.divergence)))}")
    if alone_line(cell) or starved_line(cell):  # the load it ran under (harness.judge.load)
        lines.append(f"  - load: {md(alone_line(cell) or starved_line(cell))}")
    if pair_line(cell):  # a warm role pair's cell, or one confirmed in a fresh cell (harness.drive.warm)
        lines.append(f"  - ran: {md(pair_line(cell))}")
    if cell.faults:  # what the cell injected, and whether each fired (harness.judge.fired)
        lines.append(f"  - faults: {md(cut(faults_line(cell)))}")
    if cell.expected_reason:
        link = doc_link(run, cell.expected_link)
        shown = f"[{md(bug_id(cell.expected_link))}]({link})" if re.match(r"^(https?://|docs/)", link) else md(link)
        shown += f", {md(cell.expected_class)}" if cell.expected_class else ""
        lines.append(f"  - expected because: {md(cell.expected_reason)} ({shown})")
    lines.append(f"  - reproduce: {md_code(reproduce_command(run, cell, portable=True))}")
    return lines


def faults_line(cell) -> str:
    """The faults a cell injected, each with whether it fired (harness.judge.fired)."""
    return "; ".join(f"{f.get('fault')} ({'fired' if f.get('fired') else 'NEVER FIRED'})" for f in cell.faults)


def _baseline_markdown(run: RunResult) -> list[str]:
    """``run --baseline``: the counts, then every new or fixed cell, check by check."""
    if not run.baseline:
        return []
    counts, rows = baseline_rows(run)
    lines = ["", f"### Against the baseline (sglang {md(str(run.baseline.get('sglang')))})", "",
             ", ".join(f"{n} {k}" for k, n in counts.items() if n), ""]
    lines += [f"- **{mark}** {md(key)}: {before} -> {after}" + (f": {md('; '.join(checks))}" if checks else "")
              for mark, key, before, after, checks in rows]
    return lines


def summary_markdown(run: RunResult) -> str:
    """The run as Markdown for a pull-request comment (at most SUMMARY_LIMIT characters)."""
    counts = {v: sum(c.verdict == v for c in run.cells) for v in VERDICTS}
    regs, fixed, loaded = regressions(run), fixes(run), under_load(run)
    if regs or fixed:
        status = f"**{len(regs)} regression(s), {len(fixed)} fix(es)** against the expectations"
    elif loaded:  # counted apart: neither as expected nor a regression (harness.judge.load)
        status = f"**{len(loaded)} cell(s) worse than expected only under load**, as expected alone"
    elif run.expectations:
        status = "every cell as expected"
    else:
        status = "no expectations file: every cell expected to PASS"
    lines = [f"## pdconform: {status}", "",
             f"{md(sglang_line(run, path=False))}, seed {run.seed}, {len(run.cells)} cells in {run.duration_s:.0f} s: "
             + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
             + (f"; expectations {md_code(expectations_name(run))}" if run.expectations else ""), ""]
    lines[-1:-1] = ["", md(note)] if (note := run.sglang.expectations_note(run.expectations)) else []
    if engine_settings_line(run):
        lines[-1:-1] = ["", md(engine_settings_line(run))]
    if load_warning(run):
        lines += [f"> **Warning**: {md(load_warning(run))}", ""]
    if pairs_sentence(run):
        lines += [md(pairs_sentence(run)), ""]
    lines += _matrix_markdown(run)
    lines += _baseline_markdown(run)
    if regs or fixed:
        lines += ["", "### Not as expected", ""]
        for cell in regs + fixed:
            lines += _cell_block(run, cell)
    if loaded:
        lines += ["", "### Worse than expected only under load (as expected run again alone)", ""]
        for cell in loaded:
            lines += _cell_block(run, cell)
    known = [c for c in run.cells if c.verdict != "PASS" and c.as_expected]
    unexpected_ok = [c for c in run.cells if c.verdict != "PASS" and c not in regs and c not in fixed
                     and c not in known and c not in loaded]
    for title, cells in (("Known non-PASS cells (as expected)", known),
                         ("Other non-PASS cells", unexpected_ok)):
        if not cells:
            continue
        lines += ["", f"<details><summary>{title}: {len(cells)}</summary>", ""]
        for cell in cells:
            lines += _cell_block(run, cell)
        lines += ["", "</details>"]
    text = "\n".join(lines) + "\n"
    if len(text) > SUMMARY_LIMIT:
        cut = text[:SUMMARY_LIMIT].rsplit("\n", 1)[0]
        if cut.count("<details>") > cut.count("</details>"):
            cut += "\n\n</details>"
        text = cut + "\n\n… (truncated: the full list is in results.json and index.html)\n"
    return text


def write_reports(run: RunResult, out_dir: str | Path, histories: dict[tuple[str, str], list[dict]]) -> dict[str, Path]:
    """Write junit.xml, summary.md and index.html into ``out_dir``, each atomically; return
    their paths by name.  ``histories``: the run's (harness.judge.results.load_histories),
    which index.html shows.  results.json is written by the caller (harness.session)."""
    out_dir = Path(out_dir)
    paths = {"junit.xml": out_dir / "junit.xml", "summary.md": out_dir / "summary.md"}
    write_atomic(paths["junit.xml"], junit_bytes(run))
    write_atomic(paths["summary.md"], summary_markdown(run).encode("utf-8"))
    paths["index.html"] = write_index_html(run, out_dir, histories)
    return paths


def junit_bytes(run: RunResult) -> bytes:
    """:func:`junit_xml` serialized (pretty, UTF-8, with its XML declaration), in memory."""
    import io

    buffer = io.BytesIO()
    junit_xml(run).write(buffer, pretty=True)
    return buffer.getvalue()


def write_json_and_markdown(folder: Path, stem: str, data: Any, markdown: str) -> tuple[Path, Path]:
    """``folder/stem.json`` (``data``, indented) and ``folder/stem.md``, each written
    atomically (:func:`write_atomic`); their paths.  OSError as write_atomic raises it."""
    json_path, md_path = Path(folder) / f"{stem}.json", Path(folder) / f"{stem}.md"
    write_atomic(json_path, (json.dumps(data, indent=1) + "\n").encode())
    write_atomic(md_path, markdown.encode())
    return json_path, md_path
