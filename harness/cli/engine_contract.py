"""The ``engine-contract`` command: the transport contract of each real engine, measured
(harness.bench.contract), printed as a table per engine or as JSON, and written as JSON with
``--out`` (atomically: a reader sees the old file or the whole new one).

Exit codes: 0 every engine asked for was measured (or skipped as unavailable here), 1 a
measurement failed, 2 bad usage (one line on stderr), 130 interrupted.
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from harness.cli import _stop_on_signals, _usage_error, app, console, err


def _number(name: str, text: str, low: float, high: float, whole: bool) -> float:
    """``text`` as a number from ``low`` to ``high`` (a whole one when ``whole``); exit 2 (one line) otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low <= value <= high or (whole and value != int(value)):
        raise _usage_error(f"{name} {text[:24]}: give a {'whole ' if whole else ''}number from {low:g} to {high:g}")
    return int(value) if whole else value


def _checked(engine: Optional[List[str]], question: Optional[List[str]], out: Optional[Path]) -> tuple[list, list]:
    """The engines and questions asked for (default: all) and a usable ``--out``; exit 2 on the first bad one."""
    from harness.bench.contract import QUESTIONS, engines

    known = engines()
    engines_asked = list(dict.fromkeys(engine or known))
    unknown = [e for e in engines_asked if e not in known]
    if unknown:
        raise _usage_error(f"unknown --engine {', '.join(unknown)} (known: {', '.join(known)})")
    asked = list(dict.fromkeys(q.upper() for q in question or QUESTIONS))
    unknown = [q for q in asked if q not in QUESTIONS]
    if unknown:
        raise _usage_error(f"unknown --question {', '.join(unknown)} (known: {', '.join(QUESTIONS)})")
    if out is not None and (str(out) in ("", ".") or out.is_dir()):
        raise _usage_error(f"--out {str(out)[:80]!r}: give a file path, not a folder")
    if out is not None:  # checked now, not after minutes of measuring: its folder made, a file written there
        try:
            out.expanduser().absolute().parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=out.expanduser().absolute().parent):
                pass
        except OSError as exc:
            raise _usage_error(f"cannot write --out {str(out)[:80]}: {exc.strerror or exc}")
    return engines_asked, asked


def _table(result: dict) -> Table:
    from harness.bench.contract_report import heading, rows

    table = Table(title=escape(heading(result)), show_lines=True, title_justify="left")
    for name, ratio in (("", 0), ("question", 2), ("answer", 5), ("evidence", 4)):
        table.add_column(name, ratio=ratio or None, overflow="fold")
    for row in rows(result):
        table.add_row(*(escape(cell) for cell in row))
    return table


def _measure(engines: list[str], questions: list[str], options: dict, as_json: bool) -> tuple[list[dict], int]:
    from harness.bench.contract import run_contract
    from harness.bench.engines import EngineBenchError, EngineUnavailable

    results, code = [], 0
    for engine in engines:
        if not as_json:
            err.print(f"[dim]measuring {engine} ...[/]")
        try:
            result = run_contract(engine, questions=questions, **options)
        except EngineUnavailable as exc:
            result = {"engine": engine, "unavailable": str(exc)}
            err.print(f"{engine}: skipped: {escape(str(exc))}", highlight=False)
        except (EngineBenchError, ValueError) as exc:
            result, code = {"engine": engine, "error": str(exc)}, 1
            err.print(f"[bold red]{engine}: failed:[/] {escape(str(exc))}", highlight=False)
        else:
            if not as_json:
                console.print(_table(result))
        results.append(result)
    return results, code


@app.command("engine-contract")
def engine_contract(
    engine: Optional[List[str]] = typer.Option(None, "--engine", help="mooncake, nixl or mori (repeatable; default "
                                               "every engine with contract sides)."),
    question: Optional[List[str]] = typer.Option(None, "--question", help="Q1 ... Q5 (repeatable; default all)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the results to this JSON file (atomically)."),
    total_mib: str = typer.Option("128", "--total-mib", metavar="N", help="MiB per transfer (1 to 4096)."),
    block_kib: str = typer.Option("128", "--block-kib", metavar="N", help="KiB per block, a KV page (4 to 65536)."),
    done_repeats: str = typer.Option("20", "--done-repeats", metavar="N", help="Transfers checked at \"done\" "
                                     "(Q2; 1 to 1000)."),
    starved_repeats: str = typer.Option("5", "--starved-repeats", metavar="N", help="More of them with the "
                                        "receiver's engine threads starved (Q2; 0 to 1000)."),
    disconnect_limit: str = typer.Option("30", "--disconnect-limit", metavar="S", help="Seconds to wait for a "
                                         "disconnect to surface (Q5; 1 to 600)."),
) -> None:
    """Measure each engine's transport contract (sglang issue #34510): does submit block, does
    "done" mean the bytes are readable on the remote side, what poll returns, how a failure and
    a remote disconnect surface.  Mooncake (TCP) and NIXL (UCX over TCP) are the real engines;
    Mori runs pdconform's stand-in (the real one needs AMD GPUs)."""
    options = {"total_bytes": _number("--total-mib", total_mib, 1, 4096, True) << 20,
               "block_bytes": _number("--block-kib", block_kib, 4, 65536, True) << 10,
               "done_repeats": _number("--done-repeats", done_repeats, 1, 1000, True),
               "starved_repeats": _number("--starved-repeats", starved_repeats, 0, 1000, True),
               "disconnect_limit_s": _number("--disconnect-limit", disconnect_limit, 1, 600, False)}
    if options["total_bytes"] % options["block_bytes"]:
        raise _usage_error("--total-mib must be a whole number of --block-kib blocks")
    engines, questions = _checked(engine, question, out)
    _stop_on_signals()
    try:
        results, code = _measure(engines, questions, options, as_json)
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]: every engine process was ended")
        raise typer.Exit(code=130)
    if as_json:
        console.print_json(json.dumps({"results": results}, default=repr))
    if out is not None:
        _write(out, results)
    raise typer.Exit(code=code)


def _write(out: Path, results: list[dict]) -> None:
    from harness import program
    from harness.bench.contract_report import document
    from harness.nofollow import write_atomic

    command = " ".join([program(), *map(shlex.quote, sys.argv[1:])])
    try:
        write_atomic(out.expanduser().absolute(), document(results, command))
    except OSError as exc:
        raise _usage_error(f"cannot write --out {out}: {exc.strerror or exc}")
    if not results or "answers" in results[-1]:
        err.print(f"results: {escape(str(out))}", highlight=False)
