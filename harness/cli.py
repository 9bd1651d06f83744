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

from harness.implementations import IMPLEMENTATIONS

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Conformance harness for SGLang PD-disaggregation transfer backends.")
# Lines are never wrapped mid-word; when output is not a terminal (CI logs,
# pipes) the matrix gets 120 columns instead of rich's default 80.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True, soft_wrap=True)

DEFAULT_OUT = Path("reports/out/latest")


def _usage_error(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=2)


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Python, sglang version and path, and for each engine: real, stand-in or unusable, and why."""
    from harness.doctor import diagnose

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
    from harness.scenario import all_scenarios

    rows = [{"id": s.id, "title": s.title, "requirements": list(s.requirements)} for s in all_scenarios()]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    for row in rows:
        console.print(f"[bold]{row['id']:<24}[/]{row['title']}  [dim]{', '.join(row['requirements'])}[/]")


@app.command()
def run(
    impl: Optional[List[str]] = typer.Option(None, "--impl", help=f"Implementation (repeatable): {', '.join(IMPLEMENTATIONS)}."),
    scenario: Optional[List[str]] = typer.Option(None, "--scenario", help="Scenario id (repeatable); see `pdconform list`."),
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Directory for results.json and per-cell logs."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed for the scenarios' room ids, pages and faults."),
) -> None:
    """Run the selected cells (default: every implementation x every scenario) and print the matrix."""
    from harness.report import cell_text, matrix_table, reasons
    from harness.results import dump_run
    from harness.runner import run_matrix
    from harness.scenario import all_scenarios

    from harness.implementations import available

    impls = list(dict.fromkeys(impl or IMPLEMENTATIONS))
    unknown = [i for i in impls if i not in available()]
    if unknown:
        raise _usage_error(f"unknown --impl {', '.join(unknown)} (known: {', '.join(IMPLEMENTATIONS)})")
    known = {s.id: s for s in all_scenarios()}
    wanted = list(dict.fromkeys(scenario or known))
    missing = [s for s in wanted if s not in known]
    if missing:
        raise _usage_error(f"unknown --scenario {', '.join(missing)} (known: {', '.join(known)}; see `pdconform list`)")
    from harness.role_context import UnsupportedSglang, strategy_for
    from harness.runner import sglang_info

    installed = sglang_info()
    if installed.version is None:
        raise _usage_error("sglang is not installed in this Python environment (run `make setup`)")
    try:
        strategy_for(installed.version)
    except UnsupportedSglang as exc:
        raise _usage_error(str(exc))
    if not str(out).strip() or str(out) == ".":
        raise _usage_error("--out needs a directory path (got an empty one)")
    out = out.expanduser().resolve()  # cells run with the repository as working directory
    if out.exists() and not out.is_dir():
        raise _usage_error(f"--out {out} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise _usage_error(f"cannot write to --out {out}: {exc.strerror or exc}")

    def on_start(i: int, total: int, name: str, sc) -> None:
        err.print(f"[dim][{i}/{total}] {sc.id} x {name} ...[/]")

    def on_cell(i: int, total: int, result) -> None:
        err.print(f"[{i}/{total}] {result.scenario} x {result.impl}: ", cell_text(result).plain.replace("\n", " "),
                  f"({result.duration_s:.1f} s)")

    results_path = out / "results.json"
    # An interrupted run must not leave an old verdict behind, nor cells of another run.
    results_path.unlink(missing_ok=True)
    shutil.rmtree(out / "cells", ignore_errors=True)

    def interrupted(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupted)
    try:
        result = run_matrix(impls, [known[s] for s in wanted], seed, out, on_cell=on_cell, on_start=on_start)
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]: the running cell and its roles were stopped; no results written")
        raise typer.Exit(code=130)
    dump_run(result, results_path)
    console.print(matrix_table(result))
    for line in reasons(result):
        console.print(f"  {line}", markup=False, highlight=False)
    console.print(f"results: {results_path}")
    raise typer.Exit(code=0 if result.all_as_expected else 1)


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
