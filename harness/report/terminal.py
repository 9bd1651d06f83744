"""Human-readable views of a result tree (pure: they build rich renderables and lines).

Every string from the run (names, versions, reasons, values) is shown as plain text: no
rich markup is read from it and terminal control sequences are removed (harness.report.safe).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from rich.table import Table
from rich.text import Text

from harness.implementations import registered
from harness.judge.divergence import describe as describe_divergence
from harness.judge.results import CellResult, RunResult
from harness.report.load import alone_line, pair_line, starved_line
from harness.report.safe import cut, terminal

VERDICT_STYLE = {"PASS": "bold green", "FAIL": "bold red", "WARN": "yellow",
                 "UNSUPPORTED": "cyan", "ERROR": "bold magenta"}


def _size(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def cell_text(cell: CellResult) -> Text:
    """One matrix cell: verdict, engine and bytes that arrived where they belong;
    ``(expected X)`` marks a verdict other than the expected one, ``known B13`` a non-PASS
    verdict its expectations file expects (a known sglang bug, not this change's)."""
    text = Text(cell.verdict, style=VERDICT_STYLE.get(cell.verdict, ""))
    if cell.verdict != cell.expected:
        text.append(f" (expected {cell.expected})", style="bold red")
    elif cell.new_checks:  # the expected verdict, with a check failing that its entry does not list
        text.append(f" (+{len(cell.new_checks)} new failing check{'s' * (len(cell.new_checks) != 1)})",
                    style="bold red")
    elif cell.gone_checks:
        text.append(f" ({len(cell.gone_checks)} listed check{'s' * (len(cell.gone_checks) != 1)} fixed)",
                    style="bold red")
    elif known_mark(cell):
        text.append(f" {terminal(known_mark(cell).rstrip(': '))}", style="dim")
    if cell.alone is not None:  # run again alone (harness.judge.load): both results, the second on its own line
        text.append(f"\n{cell.alone.verdict} alone" + (": timing under load" if cell.under_load else ""),
                    style="yellow" if cell.under_load else "bold red")
    if cell.on_pair is not None:  # its run on a warm pair was not as expected: the fresh run is shown
        text.append(f"\nconfirmed fresh ({cell.on_pair.verdict} on a pair)", style="dim")
    details = [d for d in (cell.engine, _size(cell.bytes_verified) if cell.bytes_verified else None) if d]
    if details:
        text.append("\n" + terminal(", ".join(details)), style="dim")
    return text


def matrix_table(run: RunResult) -> Table:
    """Scenarios as rows, implementations as columns."""
    impls = list(dict.fromkeys(c.impl for c in run.cells))
    scenarios = list(dict.fromkeys(c.scenario for c in run.cells))
    by_key = {(c.scenario, c.impl): c for c in run.cells}
    table = Table(title=Text(terminal(f"pdconform: sglang {run.sglang.version}, seed {run.seed}, "
                                      f"{run.duration_s:.1f} s")), show_lines=True)
    table.add_column("scenario", style="bold")
    for impl in impls:
        table.add_column(Text(terminal(impl)), justify="center")
    for scenario in scenarios:
        row = [Text(terminal(scenario))]
        for impl in impls:
            cell = by_key.get((scenario, impl))
            row.append(cell_text(cell) if cell else Text("-"))
        table.add_row(*row)
    return table


def reproduce_command(run: RunResult, cell: CellResult, portable: bool = False, prog: str | None = None) -> str:
    """The command that reruns ``cell`` alone, verbosely, on the same sglang and seed (a cell
    of a run across hosts: ``run --hosts`` on the same hosts, one cell);
    ``portable``: no local path in it (a checkout of sglang is named ``SGLANG_CHECKOUT``);
    ``prog``: how to call pdconform, by default the way the run recorded (``program``:
    harness.program, pasted at the checkout root it runs), so the terminal, summary.md, the
    HTML pages and JUnit all say the same line."""
    prog = prog or run.program or "pdconform"
    if portable and prog.startswith("/"):  # an absolute path names this machine: a reader has pdconform on PATH
        prog = "pdconform"
    target = ""
    if run.sglang.source == "src" and run.sglang.path:
        # the folder that holds the sglang package: --sglang-src accepts it like the checkout
        where = "SGLANG_CHECKOUT" if portable else shlex.quote(str(Path(run.sglang.path).parent))
        target = f" --sglang-src {where}"
        target += f" --sglang-version {shlex.quote(run.sglang.version or '')}" if run.sglang.from_option else ""
    elif run.sglang.source == "venv" and run.sglang.version:
        target = f" --sglang {run.sglang.version}"
    impl = registered().get(cell.impl)
    for setting in impl.engine_settings if impl else ():
        value = run.engine_settings.get(setting.name, setting.default)
        if value != setting.default:
            target += f" --engine-setting {setting.name}={value}"
    if run.full_waits:
        target += " --full-waits"
    if run.pool_device != "cpu":
        target += f" --pool-device {shlex.quote(run.pool_device)}"
    judged = _expectations_option(run, portable)
    if run.hosts_spec:  # roles on several hosts: repro runs everything here, so the cell reruns through run
        hosts = shlex.quote(run.hosts_spec) + (f" --listen {shlex.quote(run.hosts_listen)}" if run.hosts_listen else "")
        return (f"{prog} run --hosts {hosts} --scenario {cell.scenario} --impl {cell.impl} --seed {run.seed}"
                f"{judged}{target}")
    return f"{prog} repro {cell.scenario} --impl {cell.impl} --seed {run.seed}{judged}{target}"


def _expectations_option(run: RunResult, portable: bool) -> str:
    """The ``--expectations`` a repro needs to judge its cell as the run did: none when the
    run used the file shipped for its sglang (repro's default), ``none`` when it used none."""
    from harness.judge.expectations import shipped_path

    if not run.expectations:
        return " --expectations none"
    shipped = shipped_path(run.sglang.version)
    if shipped is not None and Path(run.expectations).resolve() == shipped.resolve():
        return ""
    return f" --expectations {shlex.quote(Path(run.expectations).name if portable else run.expectations)}"


def engine_settings_line(run: RunResult) -> str:
    """The engine settings of the run's implementations, in words, "; "-separated ("" when
    none of them has a setting recorded in the run)."""
    known = registered()
    impls = [known[name] for name in dict.fromkeys(c.impl for c in run.cells) if name in known]
    return "; ".join(setting.describe(run.engine_settings[setting.name]) for impl in impls
                     for setting in impl.engine_settings if setting.name in run.engine_settings)


def bug_id(link: str) -> str:
    """The bug an expectation links to, short: ``docs/sglang-bugs.md#b13`` -> ``B13``; any
    other link as it is."""
    anchor = link.rpartition("#")[2]
    return anchor.upper() if link.startswith("docs/sglang-bugs.md#") and anchor[:1].isalpha() \
        and anchor[1:].isdigit() else link


def known_label(cell: CellResult) -> str:
    """The known bug a cell's expectation names, with its class: ``B13, bug`` (docs/sglang-bugs.md),
    the link alone when it names no bug there, ``""`` without a link."""
    if not cell.expected_link:
        return ""
    return bug_id(cell.expected_link) + (f", {cell.expected_class}" if cell.expected_class else "")


def known_mark(cell: CellResult) -> str:
    """``known B13 (bug): `` for a non-PASS cell as its expectations file expects it, else ""."""
    if cell.verdict == "PASS" or not cell.as_expected:
        return ""
    return f"known {bug_id(cell.expected_link)}{f' ({cell.expected_class})' if cell.expected_class else ''}: " \
        if cell.expected_link else "known: "


def _named(cell: CellResult, names: list[str]) -> str:
    """Check names with the requirement each cites: ``no-dead-thread (R-LIVE-2)``."""
    cites = {str(c.get("name")): c.get("requirement") for c in (cell.alone or cell).checks + cell.checks}
    return ", ".join(f"{n} ({cites[n]})" if cites.get(n) else n for n in names)


def expectation_gap(cell: CellResult) -> str:
    """How ``cell`` differs from its expectation, in words ("" when it is as expected): its
    verdict (``FAIL, expected WARN``), checks failing that its entry does not list (``new:
    no-dead-thread (R-LIVE-2) in known B13 cell``, a regression even with the expected verdict),
    listed checks that now hold (``no longer failing: ... (a partial fix)``)."""
    parts = []
    if (cell.alone or cell).verdict != cell.expected:
        parts.append(f"{(cell.alone or cell).verdict}, expected {cell.expected}")
    if cell.new_checks:
        where = f"known {known_label(cell)} cell" if cell.expected_link else f"a cell expected {cell.expected}"
        parts.append(f"new: {_named(cell, cell.new_checks)} in {where}")
    if cell.gone_checks:
        parts.append(f"no longer failing: {_named(cell, cell.gone_checks)} (a partial fix)")
    return "; ".join(parts)


def closing_line(run: RunResult) -> str:
    """The run in one line: ``88 cells: all as expected, 30 known (24 FAIL, 4 WARN, 2 UNSUPPORTED)``,
    or the regressions, fixes and cells worse only under load (harness.judge.load) first when
    there are any."""
    from collections import Counter

    from harness.judge.expectations import fixes, regressions

    known = Counter(str(c.verdict) for c in run.cells if c.verdict != "PASS" and c.as_expected)
    worse, better = len(regressions(run)), len(fixes(run))
    loaded = sum(c.under_load for c in run.cells)  # neither as expected nor a regression: counted apart
    head = "all as expected" if not (worse or better or loaded) else ", ".join(
        part for part in (f"{worse} regression{'s' * (worse != 1)}" if worse else "",
                          f"{better} fixed" if better else "",
                          f"{loaded} worse only under load (as expected alone)" if loaded else "") if part)
    tail = f", {sum(known.values())} known ({', '.join(f'{n} {v}' for v, n in sorted(known.items()))})" if known else ""
    return f"{len(run.cells)} cell{'s' * (len(run.cells) != 1)}: {head}{tail}"


def reasons(run: RunResult, prog: str | None = None) -> list[str]:
    """For each cell that did not PASS: why (marked ``known B<n>`` when its expectations file
    expects it), its first divergence from the reference (harness.judge.divergence) and the
    command that reproduces it."""
    lines = []
    for c in run.cells:
        if c.verdict == "PASS":
            continue
        lines.append(f"{c.scenario} x {c.impl}: {known_mark(c)}{c.verdict}: {cut(c.reason)}")
        if expectation_gap(c) and c.verdict == c.expected:  # the verdict as expected, the checks not
            lines.append(f"    not as expected: {expectation_gap(c)}")
        if alone_line(c) or starved_line(c):  # the load it ran under, and the alone run's verdict
            lines.append(f"    {alone_line(c) or starved_line(c)}")
        if pair_line(c):  # a warm role pair's cell, or one confirmed in a fresh cell (harness.drive.warm)
            lines.append(f"    {pair_line(c)}")
        if c.divergence:
            lines.append(f"    {cut(describe_divergence(c.divergence))}")
        lines.append(f"    reproduce: {reproduce_command(run, c, prog=prog)}")
    return [terminal(line) for line in lines]


def event_line(event: dict) -> str:
    """One history event as a line: ``t  role  op  type  value-or-error``."""
    t = event.get("t")
    when = f"{t:7.3f}" if isinstance(t, (int, float)) else "      -"
    if event.get("op") == "step":
        return terminal(f"{when}  -- step {event.get('step')}: {(event.get('args') or {}).get('step')}")
    detail = event.get("error") if event.get("type") == "fail" else event.get("value")
    text = "" if detail is None else json.dumps(detail, default=repr)
    if len(text) > 160:
        text = text[:157] + "..."
    return terminal(f"{when}  {event.get('role') or '-':<10} {event.get('op'):<16} {event.get('type'):<7} {text}")
