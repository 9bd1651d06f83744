"""The ``pdconform`` command line (typer).

Exit codes: 0 every cell as expected (or the command succeeded), 1 some cell
not as expected (or doctor found an unusable engine), 2 bad usage.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape

from harness.implementations import IMPLEMENTATIONS
from harness.target.role_context import DEFAULT_NIXL_PROGRESS_DELAY_US

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Conformance harness for SGLang PD-disaggregation transfer backends.")
# Lines are never wrapped mid-word; when output is not a terminal (CI logs,
# pipes) the matrix gets 120 columns instead of rich's default 80.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True, soft_wrap=True)

DEFAULT_OUT = Path("reports/out/latest")


def _usage_error(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code=2)


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Python, sglang version and path, and for each engine: real, stand-in or unusable, and why."""
    from harness.target.doctor import diagnose

    report = diagnose()
    if as_json:
        console.print_json(json.dumps(report))
    else:
        console.print(f"python   {report['python']['version']} ({report['python']['executable']})")
        sg = report["sglang"]
        console.print(f"sglang   {sg['version'] or 'NOT INSTALLED'} ({sg['path'] or '-'})")
        console.print(f"libibverbs.so.1  {'present' if report['libibverbs'] else 'missing'}")
        for e in report["engines"]:
            style = {"real": "green", "standin": "yellow", "unusable": "red"}[e["engine"]]
            console.print(f"{e['impl']:<9}[{style}]{e['engine']:<9}[/]{e['reason']}")
    usable = report["sglang"]["version"] and all(e["engine"] != "unusable" for e in report["engines"])
    raise typer.Exit(code=0 if usable else 1)


@app.command("list")
def list_scenarios(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Scenarios with id, title and the requirement IDs they check."""
    from harness.spec.scenario import all_scenarios

    rows = [{"id": s.id, "title": s.title, "requirements": list(s.requirements)} for s in all_scenarios()]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    width = max((len(row["id"]) for row in rows), default=0) + 2
    for row in rows:
        console.print(f"[bold]{row['id']:<{width}}[/]{row['title']}  [dim]{', '.join(row['requirements'])}[/]")


def _target(sglang_src: Optional[Path], sglang_version: Optional[str]):
    """Resolve --sglang-src / --sglang (harness.target.sglang); bad input exits 2."""
    from harness.target.role_context import UnsupportedSglang, strategy_for
    from harness.target.sglang import TargetError, resolve_target

    try:
        target = resolve_target(sglang_src, sglang_version)
    except TargetError as exc:
        raise _usage_error(str(exc))
    try:
        strategy_for(target.info.version)
    except UnsupportedSglang as exc:
        raise _usage_error(str(exc))
    return target


def _select(impl: Optional[List[str]], scenario: Optional[List[str]]):
    """The implementations and scenarios asked for (default: all); unknown names exit 2."""
    from harness.implementations import available
    from harness.spec.scenario import all_scenarios

    impls = list(dict.fromkeys(impl or IMPLEMENTATIONS))
    unknown = [i for i in impls if i not in available()]
    if unknown:
        raise _usage_error(f"unknown --impl {', '.join(unknown)} (known: {', '.join(IMPLEMENTATIONS)})")
    known = {s.id: s for s in all_scenarios()}
    wanted = list(dict.fromkeys(scenario or known))
    missing = [s for s in wanted if s not in known]
    if missing:
        raise _usage_error(f"unknown --scenario {', '.join(missing)} (known: {', '.join(known)}; see `pdconform list`)")
    return impls, [known[s] for s in wanted]


REPORT_FILES = ("results.json", "junit.xml", "summary.md", "index.html")


def _out_dir(out: Path) -> Path:
    """Check --out and create it; every problem is a usage error (exit 2)."""
    if str(out).strip() in ("", "."):  # typer turns an empty --out into "."
        raise _usage_error("--out needs a directory path (got an empty one, or the current directory)")
    try:
        out = out.expanduser().resolve()  # cells run with the repository as working directory
        if out.exists() and not out.is_dir():
            raise _usage_error(f"--out {out} is a file, not a directory")
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
        for name in REPORT_FILES:
            if (out / name).is_dir():
                raise _usage_error(f"--out {out}: {name} there is a directory")
        for name in ("cells", "reference-for-diff"):
            if (out / name).exists() and not (out / name).is_dir():
                raise _usage_error(f"--out {out}: {name} there is not a directory")
    except typer.Exit:  # (a RuntimeError too) already said why
        raise
    except (OSError, RuntimeError) as exc:  # symlink loops, unknown ~user, names too long, no permission
        raise _usage_error(f"cannot use --out {out}: {getattr(exc, 'strerror', None) or exc}")
    return out


def _stop_on_signals() -> None:
    def interrupted(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: a job started with & ignores it
        signal.signal(signum, interrupted)


SGLANG_SRC_OPTION = typer.Option(None, "--sglang-src", help="Run against this sglang checkout (its python/ folder) "
                                 "or unpacked wheel instead of the installed sglang.")
SGLANG_VERSION_OPTION = typer.Option(None, "--sglang", help="Run against this released sglang version, set up once "
                                     "into the cached environment .venv-sglang-VERSION.")
NIXL_DELAY_OPTION = typer.Option(
    DEFAULT_NIXL_PROGRESS_DELAY_US, "--nixl-progress-delay-us", min=0,
    help="Microseconds the NIXL agent's progress thread sleeps between polls; 0 is sglang's busy loop, "
         "which keeps a core busy per NIXL role (see docs/performance.md).")

FULL_WAITS_OPTION = typer.Option(
    False, "--full-waits", help="Let every wait run to its bound even after a status that must come never came "
    "(default: fail fast, later waits of that cell are cut to 1 s).")


@app.command()
def run(
    impl: Optional[List[str]] = typer.Option(None, "--impl", help=f"Implementation (repeatable): {', '.join(IMPLEMENTATIONS)}."),
    scenario: Optional[List[str]] = typer.Option(None, "--scenario", help="Scenario id (repeatable); see `pdconform list`."),
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Directory for results.json, the reports and per-cell logs."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed for the scenarios' room ids, pages and faults."),
    expectations: Optional[Path] = typer.Option(None, "--expectations", help="TOML file of expected verdicts "
                                                "(see expectations/); exit 1 on a regression or a fix."),
    sglang_src: Optional[Path] = SGLANG_SRC_OPTION,
    sglang_version: Optional[str] = SGLANG_VERSION_OPTION,
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Cells run at once (default: the number "
                                       "of cores). Verdicts do not depend on it."),
    fork: bool = typer.Option(True, "--fork/--no-fork", help="Fork cells and roles from one process that imported "
                              "sglang once (default), or start a fresh interpreter for each."),
    nixl_progress_delay_us: int = NIXL_DELAY_OPTION,
    full_waits: bool = FULL_WAITS_OPTION,
) -> None:
    """Run the selected cells (default: every implementation x every scenario), print the matrix
    and write results.json, junit.xml, summary.md and index.html into --out."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from harness.judge.expectations import ExpectationsError, apply_expectations, fixes, load_expectations, regressions
    from harness.implementations import available
    from harness.report.terminal import matrix_table, reasons, reproduce_command
    from harness.report.files import write_reports
    from harness.judge.results import dump_run
    from harness.drive.runner import default_jobs, expected_durations, run_matrix
    from harness.spec.scenario import all_scenarios

    impls, scenarios = _select(impl, scenario)
    jobs = jobs or default_jobs()
    loaded = None
    if expectations is not None:
        try:
            loaded = load_expectations(expectations, available(), [s.id for s in all_scenarios()])
        except ExpectationsError as exc:
            raise _usage_error(str(exc))
    out = _out_dir(out)
    results_path = out / "results.json"
    hint = None
    try:  # an earlier run's cell durations: the longest cells start first
        from harness.judge.results import load_run

        hint = {(c.scenario, c.impl): c.duration_s for c in load_run(results_path).cells}
    except (OSError, ValueError):
        if loaded:  # else the cells the expectations say fail (they wait out stuck steps) go first
            hint = expected_durations(scenarios, impls, seed, lambda i, sc: getattr(loaded.for_cell(i, sc),
                                                                                     "verdict", "PASS"))
    # An interrupted run must not leave an old verdict behind, nor cells or reports of another run:
    # removed before the sglang target is set up (a release's environment can take minutes).
    for name in REPORT_FILES:
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "cells", ignore_errors=True)
    shutil.rmtree(out / "reference-for-diff", ignore_errors=True)
    target = _target(sglang_src, sglang_version)
    if loaded and loaded.sglang and loaded.sglang != target.info.version:
        err.print(f"[yellow]note:[/] {expectations} was written for sglang {loaded.sglang}, "
                  f"this run uses {target.info.version}")
    _stop_on_signals()
    # Progress only on a terminal: CI logs get the matrix and nothing else.
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal)
    with progress:
        task = progress.add_task("starting", total=len(impls) * len(scenarios))

        def on_start(i: int, total: int, name: str, sc) -> None:
            progress.update(task, description=f"{sc.id} x {name}")

        def on_cell(i: int, total: int, result) -> None:
            progress.advance(task)

        try:
            result = run_matrix(impls, scenarios, seed, out, on_cell=on_cell, on_start=on_start, target=target,
                                jobs=jobs, fork=fork, on_note=lambda note: err.print(f"[yellow]note:[/] {note}"),
                                duration_hint=hint, nixl_progress_delay_us=nixl_progress_delay_us,
                                full_waits=full_waits)
        except KeyboardInterrupt:
            progress.stop()
            err.print("[bold red]interrupted[/]: the running cell and its roles were stopped; no results written")
            raise typer.Exit(code=130)
        except OSError as exc:  # --out went away or filled up mid-run
            progress.stop()
            raise _usage_error(f"cannot write the run into {out}: {exc.strerror or exc}")
    if loaded:
        apply_expectations(result, loaded)
    try:
        dump_run(result, results_path)
        reports = write_reports(result, out)
    except OSError as exc:
        raise _usage_error(f"cannot write the results into {out}: {exc.strerror or exc}")
    console.print(matrix_table(result))
    for line in reasons(result):
        console.print(f"  {line}", markup=False, highlight=False)
    regs, fixed = regressions(result), fixes(result)
    for title, cells in (("regressions (worse than expected)", regs), ("fixed (better than expected: update "
                                                                      f"{expectations or 'the expectations'})", fixed)):
        if cells:
            console.print(f"[bold red]{len(cells)} {title}:[/]")
            for c in cells:
                console.print(f"  {c.scenario} x {c.impl}: {c.verdict}, expected {c.expected}   "
                              f"({reproduce_command(result, c)})", markup=False, highlight=False)
    console.print(f"results: {results_path}  reports: {', '.join(p.name for p in reports.values())}",
                  highlight=False)
    raise typer.Exit(code=0 if result.all_as_expected else 1)


@app.command()
def repro(
    scenario: str = typer.Argument(..., help="Scenario id; see `pdconform list`."),
    impl: str = typer.Option(..., "--impl", help=f"Implementation: {', '.join(IMPLEMENTATIONS)}."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed for the scenario's room ids, pages and faults."),
    out: Path = typer.Option(Path("reports/out/repro"), "--out", help="Directory for the cell's logs and history."),
    sglang_src: Optional[Path] = SGLANG_SRC_OPTION,
    sglang_version: Optional[str] = SGLANG_VERSION_OPTION,
    nixl_progress_delay_us: int = NIXL_DELAY_OPTION,
    full_waits: bool = FULL_WAITS_OPTION,
) -> None:
    """Run one cell verbosely: the replayable step list, the history as it happens, the verdict.

    Exit 0 when the cell PASSes, 1 otherwise, 2 on bad usage.
    """
    from harness.report.terminal import cell_text, reasons
    from harness.judge.results import dump_run
    from harness.drive.runner import run_matrix

    from harness.spec.scenario import all_scenarios

    if scenario not in {s.id for s in all_scenarios()}:
        raise _usage_error(f"unknown scenario {scenario} (see `pdconform list`)")
    impls, scenarios = _select([impl], [scenario])
    sc = scenarios[0]
    out = _out_dir(out)
    target = _target(sglang_src, sglang_version)
    (out / "results.json").unlink(missing_ok=True)  # an interrupted repro must not leave an older verdict
    console.print(f"[bold]{sc.id}[/] x [bold]{impl}[/], seed {seed}, sglang {target.info.version} "
                  f"({target.info.source}: {target.info.path})", highlight=False)
    console.print(f"{sc.title}  [dim]{', '.join(sc.requirements)}[/]")
    console.print("[bold]steps[/] (replayable: the scenario's step list for this seed)")
    for i, step in enumerate(sc.steps(seed)):
        console.print(f"  {i:>2}. {step!r}", markup=False, highlight=False)
    console.print("[bold]history[/] (t in s since the cell started)")

    def on_event(event: dict) -> None:
        console.print("  " + _event_line(event), markup=False, highlight=False)

    _stop_on_signals()
    try:
        result = run_matrix([impl], [sc], seed, out, target=target, on_event=on_event,
                            nixl_progress_delay_us=nixl_progress_delay_us, full_waits=full_waits)
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]: the cell and its roles were stopped")
        raise typer.Exit(code=130)
    dump_run(result, out / "results.json")
    cell = result.cells[0]
    console.print(cell_text(cell))
    for check in cell.checks:
        mark = "[green]ok[/]" if check.get("ok") else "[red]NOT OK[/]"
        console.print(f"  {mark} {check.get('requirement')} {check.get('name')}: ", check.get("detail", ""),
                      highlight=False)
    for line in reasons(result):
        console.print(f"  {line}", markup=False, highlight=False)
    console.print(f"cell directory: {cell.workdir}", highlight=False)
    raise typer.Exit(code=0 if cell.verdict == "PASS" else 1)


def _event_line(event: dict) -> str:
    """One history event as a line: ``t  role  op  type  value-or-error``."""
    if event.get("op") == "step":
        return f"{event.get('t', 0):7.3f}  -- step {event.get('step')}: {(event.get('args') or {}).get('step')}"
    detail = event.get("error") if event.get("type") == "fail" else event.get("value")
    text = "" if detail is None else json.dumps(detail, default=repr)
    if len(text) > 160:
        text = text[:157] + "..."
    return (f"{event.get('t', 0):7.3f}  {event.get('role') or '-':<10} {event.get('op'):<16} "
            f"{event.get('type'):<7} {text}")


@app.command()
def diff(
    run_a: Path = typer.Argument(..., help="Results of the first run: its out directory or results.json."),
    run_b: Path = typer.Argument(..., help="Results of the second run: its out directory or results.json."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown (for a PR comment) instead of a table."),
) -> None:
    """The cells whose verdict changed between two runs (for example sglang before and after a PR).

    Exit 0 when no cell got worse, 1 when some cell got worse, 2 on bad input.
    """
    from harness.report.run_diff import changed_cells, changes_markdown, changes_table
    from harness.judge.results import load_run

    runs = []
    for path in (run_a, run_b):
        path = path / "results.json" if path.is_dir() else path
        try:
            runs.append(load_run(path))
        except OSError as exc:
            raise _usage_error(f"cannot read {path}: {exc.strerror or exc}")
        except ValueError as exc:  # msgspec.DecodeError / ValidationError
            raise _usage_error(f"{path} is not a pdconform results.json: {exc}")
    changes = changed_cells(*runs)
    if markdown:
        console.print(changes_markdown(runs[0], runs[1], changes), markup=False, highlight=False, soft_wrap=True)
    else:
        console.print(changes_table(runs[0], runs[1], changes))
    raise typer.Exit(code=1 if any(c.worse for c in changes) else 0)


@app.command()
def bench(
    repeat: int = typer.Option(3, "--repeat", min=1, help="Samples of each figure (full matrix runs, simulator runs)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Cells run at once (default: cores)."),
    impl: Optional[List[str]] = typer.Option(None, "--impl", help="Implementations of the timed matrix (default all)."),
    scenario: Optional[List[str]] = typer.Option(None, "--scenario", help="Scenarios of the timed matrix (default all)."),
    seeds: int = typer.Option(2000, "--seeds", min=1, help="Simulator seeds per sample."),
    engine_mib: int = typer.Option(128, "--engine-mib", min=1, max=4096,
                                   help="MiB per engine throughput sample (a source and a destination buffer each)."),
    skip: Optional[List[str]] = typer.Option(None, "--skip", help="Leave out: matrix, simulator, engines."),
    out: Path = typer.Option(Path("reports/out/bench"), "--out", help="Directory for the runs and bench.json."),
    nixl_progress_delay_us: int = NIXL_DELAY_OPTION,
) -> None:
    """Measure the matrix wall time, per-cell overhead, simulator rate and engine throughput
    (median and spread of --repeat samples), against the project's goals; write bench.json."""
    from rich.table import Table

    from harness.bench.matrix import (GOALS, bench_engines, bench_matrix, bench_simulator, engine_pairs, machine,
                               overhead_by_impl)
    from harness.drive.runner import default_jobs

    skip = set(skip or [])
    unknown = skip - {"matrix", "simulator", "engines"}
    if unknown:
        raise _usage_error(f"unknown --skip {', '.join(sorted(unknown))} (known: matrix, simulator, engines)")
    if skip == {"matrix", "simulator", "engines"}:
        raise _usage_error("--skip leaves nothing to measure")
    if "engines" not in skip:
        free_mib = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
        if 2 * engine_mib > free_mib:
            raise _usage_error(f"--engine-mib {engine_mib} needs {2 * engine_mib} MiB of memory (a source and a "
                               f"destination buffer); {free_mib} MiB are free")
    impls, scenarios = _select(impl, scenario)
    jobs = jobs or default_jobs()
    out = _out_dir(out)
    # Figures of an earlier bench must not pass for this one's, even if this one is interrupted.
    (out / "bench.json").unlink(missing_ok=True)
    for old_run in out.glob("run-*"):
        if old_run.is_dir() and old_run.name[4:].isdigit():
            shutil.rmtree(old_run, ignore_errors=True)
    figures = []
    _stop_on_signals()
    try:
        if "matrix" not in skip:
            target = _target(None, None)
            hint = None
            shipped = Path(__file__).resolve().parent.parent / "expectations" / f"sglang-{target.info.version}.toml"
            if shipped.is_file():  # order cells as `make matrix` on a clean clone does
                from harness.judge.expectations import load_expectations
                from harness.implementations import available
                from harness.drive.runner import expected_durations
                from harness.spec.scenario import all_scenarios

                loaded = load_expectations(shipped, available(), [s.id for s in all_scenarios()])
                hint = expected_durations(scenarios, impls, 0, lambda i, sc: getattr(loaded.for_cell(i, sc),
                                                                                      "verdict", "PASS"))
            wall, overhead, cpu, runs = bench_matrix(impls, scenarios, repeat, jobs, out, target=target,
                                                     on_progress=lambda m: err.print(f"[dim]{m}[/]"),
                                                     nixl_progress_delay_us=nixl_progress_delay_us,
                                                     duration_hint=hint)
            figures += [wall, overhead, *overhead_by_impl(runs), cpu]
        if "simulator" not in skip:
            err.print(f"[dim]simulator: {repeat} x {seeds} seeds[/]")
            figures.append(bench_simulator(seeds, repeat))
        if "engines" not in skip:
            err.print(f"[dim]engines: {engine_pairs(repeat)} x {engine_mib} MiB raw and instrumented[/]")
            figures += bench_engines(engine_mib * 2**20, repeat)
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]")
        raise typer.Exit(code=130)
    info = machine()
    table = Table(title=f"pdconform bench: {info['cores']} cores, {info['cpu']}, Python {info['python']}, "
                        f"jobs {jobs}, {repeat} samples")
    table.add_column("figure", no_wrap=True)  # a figure's name is what bench.json and the docs call it
    for column in ("median", "spread", "goal", ""):
        table.add_column(column)

    def fmt(value, unit):
        if value is None:
            return "-"
        if unit == "B/s":
            return f"{value / 2**20:,.1f} MiB/s"
        if unit == "s":
            return f"{value:.3f} s"
        return f"{value:,.1f} {unit}"

    for f in figures:
        goal = GOALS.get(f.name)
        mark = {True: "[green]met[/]", False: "[red]NOT met[/]", None: ""}[f.meets_goal()]
        spread = f"{fmt(f.spread[0], f.unit)} .. {fmt(f.spread[1], f.unit)}" if f.spread else "-"
        table.add_row(escape(f.name), fmt(f.median, f.unit), spread, f"{goal[0]} {fmt(goal[1], f.unit)}" if goal else "",
                      " ".join(part for part in (mark, escape(f.note)) if part))
    console.print(table)
    import json as _json

    (out / "bench.json").write_text(_json.dumps({"machine": info, "jobs": jobs, "repeat": repeat,
                                                 "figures": [f.to_dict() for f in figures]}, indent=2))
    console.print(f"bench.json: {out / 'bench.json'}", highlight=False)


@app.command()
def simulate(
    seeds: int = typer.Option(1000, "--seeds", min=1, help="How many consecutive seeds to run."),
    seed: int = typer.Option(0, "--seed", min=0, help="First seed (alone with --seeds 1: replay that seed)."),
    trace: bool = typer.Option(False, "--trace", help="Print the step list of every run, not only failing ones."),
    planted_bug: Optional[str] = typer.Option(None, "--planted-bug", hidden=True,
                                              help="Test-only: run a reference core with a planted bug."),
) -> None:
    """Run seeded simulations of the reference prefill and decode cores over a faulty network.

    Prints runs per minute; for the first failing seed, its violations and the step
    list that replays it (`pdconform simulate --seeds 1 --seed S`).
    """
    import time

    from rich.progress import Progress

    from backends.reference.prefill_core import PrefillCore
    from backends.reference.simulator import SimConfig, simulate as run_one

    if planted_bug is not None and planted_bug not in PrefillCore.PLANTED_BUGS:
        raise _usage_error(f"unknown --planted-bug {planted_bug} (known: {', '.join(PrefillCore.PLANTED_BUGS)})")
    config = SimConfig(planted_bug=planted_bug)
    failures = []
    start = time.monotonic()
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("simulating", total=seeds)
        for s in range(seed, seed + seeds):
            result = run_one(s, config)
            if trace:
                console.print(f"seed {s}: {'ok' if result.ok else 'VIOLATION'}", highlight=False)
                for line in result.trace:
                    console.print(f"  {line}", markup=False, highlight=False)
            if not result.ok:
                failures.append(result)
            progress.advance(task)
    elapsed = max(time.monotonic() - start, 1e-9)
    console.print(f"{seeds} seeded runs in {elapsed:.1f} s: {seeds / elapsed * 60:,.0f} runs/min; "
                  f"{len(failures)} with violations", highlight=False)
    if failures:
        first = failures[0]
        console.print(f"first failing seed {first.seed}:", highlight=False)
        for v in first.violations:
            console.print(f"  VIOLATION {v}", markup=False, highlight=False)
        console.print("steps that replay it:", highlight=False)
        for line in first.trace:
            console.print(f"  {line}", markup=False, highlight=False)
        console.print(f"replay: pdconform simulate --seeds 1 --seed {first.seed}"
                      + (f" --planted-bug {planted_bug}" if planted_bug else ""), highlight=False)
        console.print(f"failing seeds: {', '.join(str(f.seed) for f in failures[:20])}"
                      + (" ..." if len(failures) > 20 else ""), highlight=False)
    raise typer.Exit(code=1 if failures else 0)


def main() -> None:
    """Console-script entry point."""
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    app(prog_name="pdconform")


if __name__ == "__main__":
    sys.exit(main())
