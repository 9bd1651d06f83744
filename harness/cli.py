"""The ``pdconform`` command line (typer).

Each command checks its options (bad usage: one line on stderr, exit 2), hands the work
to the module that does it (harness.session for run/repro/judge, harness.bench.suite,
harness.report.run_diff, harness.target.doctor, the reference's simulator) and prints.

Exit codes: 0 every cell as expected (or the command succeeded), 1 some cell not as
expected (or doctor found an unusable engine, or the simulator a violation), 2 bad
usage, 130 interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape

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


def _registry():
    """harness.implementations, or exit 2 when a registered implementation does not load."""
    from harness import implementations

    try:
        implementations.registered()
    except implementations.RegistryError as exc:
        raise _usage_error(str(exc))
    return implementations


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Python, sglang version and path, and for each engine: real, stand-in or unusable, and why."""
    from harness.target.doctor import diagnose

    report = diagnose(list(_registry().available().values()))
    if as_json:
        console.print_json(json.dumps(report))
    else:
        console.print(f"python   {report['python']['version']} ({report['python']['executable']})", highlight=False)
        sg = report["sglang"]
        console.print(f"sglang   {sg['version'] or 'NOT INSTALLED'} ({sg['path'] or '-'})", highlight=False)
        console.print(f"libibverbs.so.1  {'present' if report['libibverbs'] else 'missing'}")
        for e in report["engines"]:
            style = {"real": "green", "standin": "yellow", "reference": "green"}.get(e["engine"], "red")
            console.print(f"{e['impl']:<10}[{style}]{e['engine']:<10}[/]{escape(e['reason'])}  "
                          f"[dim]sglang {escape(e['sglang_range'])}[/]")
    usable = report["sglang"]["version"] and all(e["engine"] != "unusable" for e in report["engines"])
    raise typer.Exit(code=0 if usable else 1)


@app.command("list")
def list_scenarios(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Scenarios with id, title and the requirement IDs their checks cite (docs/protocol.md)."""
    from harness.spec.requirements import requirement
    from harness.spec.scenario import all_scenarios

    rows = [{"id": s.id, "title": s.title, "requirements": list(s.requirements),
             "levels": {rid: requirement(rid).level for rid in s.requirements}} for s in all_scenarios()]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    width = max((len(row["id"]) for row in rows), default=0) + 2
    for row in rows:
        console.print(f"[bold]{row['id']:<{width}}[/]{escape(row['title'])}  [dim]{', '.join(row['requirements'])}[/]")


def _target(sglang_src: Optional[Path], sglang_version: Optional[str]):
    """Resolve --sglang-src / --sglang (harness.target.sglang); bad input exits 2.  A release
    outside an implementation's declared range is not bad input: its cells are UNSUPPORTED."""
    from harness.target.sglang import TargetError, resolve_target

    try:
        return resolve_target(sglang_src, sglang_version)
    except TargetError as exc:
        raise _usage_error(str(exc))


def _select(impl: Optional[List[str]], scenario: Optional[List[str]]):
    """The implementations and scenarios asked for (default: all); unknown names exit 2."""
    from harness.spec.scenario import all_scenarios

    registry = _registry()
    impls = list(dict.fromkeys(impl or registry.names()))
    unknown = [i for i in impls if i not in registry.available()]
    if unknown:
        raise _usage_error(f"unknown --impl {', '.join(unknown)} (known: {', '.join(registry.names())})")
    known = {s.id: s for s in all_scenarios()}
    wanted = list(dict.fromkeys(scenario or known))
    missing = [s for s in wanted if s not in known]
    if missing:
        raise _usage_error(f"unknown --scenario {', '.join(missing)} (known: {', '.join(known)}; see `pdconform list`)")
    return impls, [known[s] for s in wanted]


def _expectations(path: Optional[Path]):
    """The loaded --expectations file (None without one); a bad one exits 2."""
    if path is None:
        return None
    from harness.judge.expectations import ExpectationsError, load_expectations
    from harness.spec.scenario import all_scenarios

    try:
        return load_expectations(path, _registry().available(), [s.id for s in all_scenarios()])
    except ExpectationsError as exc:
        raise _usage_error(str(exc))


def _out_dir(out: Path) -> Path:
    """Check --out and create it; every problem is a usage error (exit 2)."""
    from harness.judge.results import CELLS_DIR, REFERENCE_FOR_DIFF_DIR
    from harness.report.files import REPORT_FILES

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
        for name in (CELLS_DIR, REFERENCE_FOR_DIFF_DIR):
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


def _duration_hint(out: Path, scenarios, impls, seed: int, expectations) -> dict:
    """An earlier run's cell durations (the longest cells start first), else the cells the
    expectations say fail first (they wait out stuck steps); {} without either."""
    from harness.drive.scheduler import expected_durations
    from harness.judge.results import load_run

    try:
        return {(c.scenario, c.impl): c.duration_s for c in load_run(out / "results.json").cells}
    except (OSError, ValueError):
        pass
    if expectations is None:
        return {}
    return expected_durations(scenarios, impls, seed, expectations.verdict_for)


SGLANG_SRC_OPTION = typer.Option(None, "--sglang-src", help="Run against this sglang checkout (its python/ folder) "
                                 "or unpacked wheel instead of the installed sglang.")
SGLANG_VERSION_OPTION = typer.Option(None, "--sglang", help="Run against this released sglang version, set up once "
                                     "into the cached environment .venv-sglang-VERSION.")
NIXL_DELAY_OPTION = typer.Option(
    None, "--nixl-progress-delay-us", min=0, show_default=False,
    help="Microseconds the NIXL agent's progress thread sleeps between polls (default: pdconform's, see "
         "`pdconform doctor`); 0 is sglang's busy loop, which keeps a core busy per NIXL role (docs/performance.md).")
FULL_WAITS_OPTION = typer.Option(
    False, "--full-waits", help="Let every wait run to its bound even after a status that must come never came "
    "(default: fail fast, later waits of that cell are cut to 1 s).")
EXPECTATIONS_OPTION = typer.Option(None, "--expectations", help="TOML file of expected verdicts (see expectations/); "
                                   "exit 1 on a regression or a fix.")


def _settings(nixl_progress_delay_us: Optional[int]) -> dict[str, int]:
    """The engine settings the options change (harness.implementations.EngineSetting names)."""
    return {} if nixl_progress_delay_us is None else {"nixl_progress_delay_us": nixl_progress_delay_us}


def _print_verdicts(result, expectations_path) -> None:
    """The matrix, each non-PASS cell's reason, and the cells not as expected."""
    from harness.judge.expectations import fixes, regressions
    from harness.report.terminal import matrix_table, reasons, reproduce_command

    console.print(matrix_table(result))
    for line in reasons(result):
        console.print(f"  {line}", markup=False, highlight=False)
    for title, cells in (("regressions (worse than expected)", regressions(result)),
                         (f"fixed (better than expected: update {expectations_path or 'the expectations'})",
                          fixes(result))):
        if cells:
            console.print(f"[bold red]{len(cells)} {escape(title)}:[/]")
            for c in cells:
                console.print(f"  {c.scenario} x {c.impl}: {c.verdict}, expected {c.expected}   "
                              f"({reproduce_command(result, c)})", markup=False, highlight=False)


def _run_session(config, callbacks=None, progress=None):
    """harness.session.run, with an interrupt exiting 130 and a write failure exiting 2."""
    from harness import session

    _stop_on_signals()
    try:
        return session.run(config, callbacks)
    except KeyboardInterrupt:
        if progress is not None:
            progress.stop()
        err.print("[bold red]interrupted[/]: the running cells and their roles were stopped; no results written")
        raise typer.Exit(code=130)
    except OSError as exc:  # --out went away or filled up mid-run
        if progress is not None:
            progress.stop()
        raise _usage_error(f"cannot write the run into {config.out_dir}: {exc.strerror or exc}")


@app.command()
def run(
    impl: Optional[List[str]] = typer.Option(None, "--impl", help="Implementation (repeatable); see `pdconform doctor`."),
    scenario: Optional[List[str]] = typer.Option(None, "--scenario", help="Scenario id (repeatable); see `pdconform list`."),
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Directory for results.json, the reports and per-cell logs."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed for the scenarios' room ids, pages and faults."),
    expectations: Optional[Path] = EXPECTATIONS_OPTION,
    sglang_src: Optional[Path] = SGLANG_SRC_OPTION,
    sglang_version: Optional[str] = SGLANG_VERSION_OPTION,
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Cells run at once (default: the number "
                                       "of cores). Verdicts do not depend on it."),
    fork: bool = typer.Option(True, "--fork/--no-fork", help="Fork cells and roles from one process that imported "
                              "sglang once (default), or start a fresh interpreter for each."),
    nixl_progress_delay_us: Optional[int] = NIXL_DELAY_OPTION,
    full_waits: bool = FULL_WAITS_OPTION,
) -> None:
    """Run the selected cells (default: every implementation x every scenario), print the matrix
    and write results.json, junit.xml, summary.md and index.html into --out."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from harness.drive.runner import default_jobs
    from harness.drive.scheduler import Callbacks
    from harness.session import RunConfig, clear_reports

    impls, scenarios = _select(impl, scenario)
    loaded = _expectations(expectations)
    out = _out_dir(out)
    hint = _duration_hint(out, scenarios, impls, seed, loaded)
    clear_reports(out)  # before the target is set up (a release's environment can take minutes)
    target = _target(sglang_src, sglang_version)
    if loaded and loaded.sglang and loaded.sglang != target.info.version:
        err.print(f"[yellow]note:[/] {escape(str(expectations))} was written for sglang {escape(loaded.sglang)}, "
                  f"this run uses {escape(str(target.info.version))}")
    config = RunConfig(impls=impls, scenarios=scenarios, out_dir=out, target=target, seed=seed,
                       jobs=jobs or default_jobs(), fork=fork, full_waits=full_waits,
                       engine_settings=_settings(nixl_progress_delay_us), expectations=loaded, duration_hint=hint)
    # Progress only on a terminal: CI logs get the matrix and nothing else.
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal)
    with progress:
        task = progress.add_task("starting", total=len(impls) * len(scenarios))
        callbacks = Callbacks(on_start=lambda i, n, name, sc: progress.update(task, description=f"{sc.id} x {name}"),
                              on_cell=lambda i, n, cell: progress.advance(task),
                              on_note=lambda note: err.print(f"[yellow]note:[/] {escape(note)}"))
        result = _run_session(config, callbacks, progress)
    _print_verdicts(result, expectations)
    console.print(f"results: {out / 'results.json'}  reports: junit.xml, summary.md, index.html", highlight=False)
    raise typer.Exit(code=0 if result.all_as_expected else 1)


@app.command()
def repro(
    scenario: str = typer.Argument(..., help="Scenario id; see `pdconform list`."),
    impl: str = typer.Option(..., "--impl", help="Implementation; see `pdconform doctor`."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed for the scenario's room ids, pages and faults."),
    out: Path = typer.Option(Path("reports/out/repro"), "--out", help="Directory for the cell's logs and history."),
    sglang_src: Optional[Path] = SGLANG_SRC_OPTION,
    sglang_version: Optional[str] = SGLANG_VERSION_OPTION,
    nixl_progress_delay_us: Optional[int] = NIXL_DELAY_OPTION,
    full_waits: bool = FULL_WAITS_OPTION,
) -> None:
    """Run one cell verbosely: the replayable step list, the history as it happens, the verdict.

    Exit 0 when the cell PASSes, 1 otherwise, 2 on bad usage.
    """
    from harness.drive.scheduler import Callbacks
    from harness.report.terminal import cell_text, event_line, reasons
    from harness.session import RunConfig
    from harness.spec.scenario import all_scenarios

    if scenario not in {s.id for s in all_scenarios()}:
        raise _usage_error(f"unknown scenario {scenario} (see `pdconform list`)")
    impls, scenarios = _select([impl], [scenario])
    sc = scenarios[0]
    out = _out_dir(out)
    target = _target(sglang_src, sglang_version)
    (out / "results.json").unlink(missing_ok=True)  # an interrupted repro must not leave an older verdict
    console.print(f"[bold]{escape(sc.id)}[/] x [bold]{escape(impl)}[/], seed {seed}, sglang "
                  f"{escape(str(target.info.version))} ({target.info.source}: {escape(str(target.info.path))})",
                  highlight=False)
    console.print(f"{escape(sc.title)}  [dim]{', '.join(sc.requirements)}[/]")
    console.print("[bold]steps[/] (replayable: the scenario's step list for this seed)")
    for i, step in enumerate(sc.steps(seed)):
        console.print(f"  {i:>2}. {step!r}", markup=False, highlight=False)
    console.print("[bold]history[/] (t in s since the cell started)")
    config = RunConfig(impls=impls, scenarios=scenarios, out_dir=out, target=target, seed=seed, full_waits=full_waits,
                       engine_settings=_settings(nixl_progress_delay_us))
    result = _run_session(config, Callbacks(
        on_event=lambda event: console.print("  " + event_line(event), markup=False, highlight=False)))
    cell = result.cells[0]
    console.print(cell_text(cell))
    for check in cell.checks:
        mark = "[green]ok[/]" if check.get("ok") else "[red]NOT OK[/]"
        console.print(f"  {mark} {check.get('requirement')} {escape(str(check.get('name')))}: ",
                      check.get("detail", ""), highlight=False, markup=False)
    for line in reasons(result):
        console.print(f"  {line}", markup=False, highlight=False)
    console.print(f"cell directory: {cell.workdir}", highlight=False)
    raise typer.Exit(code=0 if cell.verdict == "PASS" else 1)


@app.command()
def judge(
    run_dir: Path = typer.Argument(..., help="The out directory of a stored run (it holds results.json and cells/)."),
    expectations: Optional[Path] = typer.Option(None, "--expectations", help="Judge against this expectations file "
                                                "instead of the one the run was judged against."),
) -> None:
    """Judge a stored run again from its histories, offline, and rewrite its results.json and reports.

    On an unchanged checkout every verdict comes out as the run gave it.  Exit codes as for `run`.
    """
    from harness.session import RejudgeError, rejudge

    loaded = _expectations(expectations)
    try:
        result = rejudge(run_dir.expanduser().resolve(), loaded,
                         on_note=lambda note: err.print(f"[yellow]note:[/] {escape(note)}"))
    except RejudgeError as exc:
        raise _usage_error(str(exc))
    except OSError as exc:
        raise _usage_error(f"cannot rewrite the results in {run_dir}: {exc.strerror or exc}")
    _print_verdicts(result, result.expectations)
    console.print(f"results: {run_dir / 'results.json'} (judged again)", highlight=False)
    raise typer.Exit(code=0 if result.all_as_expected else 1)


@app.command()
def diff(
    run_a: Path = typer.Argument(..., help="Results of the first run: its out directory or results.json."),
    run_b: Path = typer.Argument(..., help="Results of the second run: its out directory or results.json."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown (for a PR comment) instead of a table."),
) -> None:
    """The cells whose verdict changed between two runs (for example sglang before and after a PR).

    Exit 0 when no cell got worse, 1 when some cell got worse, 2 on bad input.
    """
    from harness.judge.results import load_run
    from harness.report.run_diff import changed_cells, changes_markdown, changes_table

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
    nixl_progress_delay_us: Optional[int] = NIXL_DELAY_OPTION,
) -> None:
    """Measure the matrix wall time, per-cell overhead, simulator rate and engine throughput
    (median and spread of --repeat samples), against the project's goals; write bench.json."""
    from harness.bench.suite import BenchUsageError, clear_old, figures_table, plan_bench, run_bench, write_bench_json
    from harness.drive.runner import default_jobs

    jobs = jobs or default_jobs()
    impls, scenarios = _select(impl, scenario)
    try:  # every option is checked before --out is touched
        plan = plan_bench(out.expanduser().absolute(), repeat, jobs, impls, scenarios, set(skip or []), seeds,
                          engine_mib, _settings(nixl_progress_delay_us), target=lambda: _target(None, None))
    except BenchUsageError as exc:
        raise _usage_error(str(exc))
    out = plan.out_dir = _out_dir(out)
    if plan.matrix is not None:
        plan.matrix.out_dir = out
    clear_old(out)
    _stop_on_signals()
    try:
        figures = run_bench(plan, on_progress=lambda m: err.print(f"[dim]{escape(m)}[/]"))
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]")
        raise typer.Exit(code=130)
    console.print(figures_table(figures, jobs, repeat))
    console.print(f"bench.json: {write_bench_json(out, figures, jobs, repeat)}", highlight=False)


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

    registry = _registry()
    sim = registry.implementation(registry.REFERENCE).hook("simulator")
    if planted_bug is not None and planted_bug not in sim.PLANTED_BUGS:
        raise _usage_error(f"unknown --planted-bug {planted_bug} (known: {', '.join(sim.PLANTED_BUGS)})")
    config = sim.SimConfig(planted_bug=planted_bug)
    failures = []
    start = time.monotonic()
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("simulating", total=seeds)
        for s in range(seed, seed + seeds):
            result = sim.simulate(s, config)
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
        _print_first_failure(failures, planted_bug)
    raise typer.Exit(code=1 if failures else 0)


def _print_first_failure(failures: list, planted_bug: Optional[str]) -> None:
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


def main() -> None:
    """Console-script entry point."""
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    app(prog_name="pdconform")


if __name__ == "__main__":
    sys.exit(main())
