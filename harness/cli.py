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


def main() -> None:
    """Console-script entry point."""
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    app(prog_name="pdconform")


if __name__ == "__main__":
    sys.exit(main())
