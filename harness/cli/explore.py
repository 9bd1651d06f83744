"""``pdconform explore``: generated lifecycle programs against implementations (harness.explore).

Progress goes to stderr (programs, steps, distinct failures, rate); at the end a table per
implementation, each distinct failure with its count and found file, and a replay of every
found program through ``run`` (the same result tree and reports, the reference beside it),
which shows each replays with its failure.  Exit 0 when nothing failed, 1 when a failure
was found (or a corpus program still fails), 3 when the only failures are oracle failures (the
reference failed a program: pdconform's own bug, harness.explore.outcome.exit_code; 1 takes
precedence), 2 on bad usage, 130 when interrupted (SIGINT, SIGTERM or SIGHUP: every cell, role and
fork server ended and their temporary folders removed within about two seconds; the found
programs written so far stay).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from harness.cli import DEFAULT_OUT, MAX_SEED, _out_dir, _registry, _target, _usage_error, app, console, err, this_program

_UNITS = {"s": 1, "m": 60, "h": 3600}
MAX_BUDGET_S = 86400.0  # a day per implementation: a longer exploration is several runs


def parse_budget(text: str) -> float:
    """Seconds of a budget like ``90``, ``90s``, ``10m`` or ``1h``; ValueError otherwise (not
    > 0, or more than :data:`MAX_BUDGET_S`: a day)."""
    match = re.fullmatch(r"\s*(\d{1,9}(?:\.\d{1,6})?)\s*([smh]?)\s*", text or "")
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"] if match else 0.0
    if not 0 < seconds <= MAX_BUDGET_S:
        raise ValueError(f"--budget {str(text)[:30]!r}: a positive number of seconds up to a day ({MAX_BUDGET_S:g}), "
                         "or with s, m or h (10m)")
    return seconds


@app.command()
def explore(
    impl: List[str] = typer.Option(..., "--impl", help="Implementation to explore (repeatable)."),
    budget: str = typer.Option("10m", "--budget", help="Time per implementation: 90s, 10m, 1h."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed of the first hypothesis round (each round adds one)."),
    topology: str = typer.Option("p1-d1", "--topology", help="The deployment shape programs run on "
                                 "(see `pdconform list --topologies`); 'default' or 'nightly': each shape of "
                                 "that set in turn, with an equal share of the budget."),
    found: Optional[Path] = typer.Option(None, "--found", help="Folder for found programs (default scenarios/found/); "
                                         "its programs replay first, with the shipped ones."),
    out: Path = typer.Option(DEFAULT_OUT / "explore", "--out", help="Folder for the program cells and the replay run."),
    lanes: int = typer.Option(8, "--lanes", min=1, max=64, help="Programs run at once per implementation, each "
                              "lane on long-lived roles of its own; 1: one at a time."),
    sglang_src: Optional[Path] = typer.Option(None, "--sglang-src", help="Run against this sglang checkout."),
    sglang_version: Optional[str] = typer.Option(None, "--sglang", help="Run against this released sglang."),
    sglang_tree_version: Optional[str] = typer.Option(None, "--sglang-version", metavar="X", help="The version of "
                                                      "the --sglang-src tree, when the tree does not say it."),
) -> None:
    """Generated lifecycle programs (rooms, chunks, aborts, clears, reused room ids) against
    the real roles of each implementation, judged by the spec; failing ones shrunk and
    written out as scenarios that `repro` replays."""
    stopping = threading.Event()  # the explorer's: set by the first signal, so its lanes start nothing more
    _stop_on_signals(stopping)
    try:
        _explore_command(impl, budget, seed, topology, found, out, lanes, sglang_src, sglang_version, stopping,
                         sglang_tree_version)
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/]: the program cells, their roles and the fork servers were stopped; "
                  "found programs written so far are kept")
        # Everything explore started has ended (Explorer.stop, or the replay's run_matrix); the
        # interpreter's own teardown would still take seconds under load (torch, imported for the byte
        # checks, takes over one at load 4 on 2 cores), and an interrupted command must exit within 2 s.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)


def _stop_on_signals(stopping: threading.Event) -> None:
    """SIGINT, SIGTERM and SIGHUP (SIGINT too: a job started with & ignores it) set ``stopping``
    and raise KeyboardInterrupt in the main thread, the first one only: a later one must not cut
    the teardown the first started short (it is bounded: harness.explore.session.Explorer.stop)."""
    def interrupted(signum, frame):
        first = not stopping.is_set()
        stopping.set()
        if first:
            raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupted)


def _explore_command(impl, budget, seed, topology, found, out, lanes, sglang_src, sglang_version, stopping,
                     sglang_tree_version=None) -> None:
    """The explore command once its signals are handled (its options, as :func:`explore` takes them)."""
    from harness.explore.found import FOUND_DIR, FOUND_ENV
    from harness.spec.topology import TOPOLOGIES

    registry = _registry()
    unknown = [i for i in impl if i not in registry.available()]
    if unknown:
        raise _usage_error(f"unknown --impl {', '.join(unknown)} (known: {', '.join(registry.names())})")
    if topology not in TOPOLOGIES and topology not in ("default", "nightly"):
        raise _usage_error(f"unknown --topology {topology} (known: default, nightly, {', '.join(TOPOLOGIES)})")
    try:
        budget_s = parse_budget(budget)
    except ValueError as exc:
        raise _usage_error(str(exc))
    target = _target(sglang_src, sglang_version, sglang_tree_version)
    for name in impl:  # a whole budget of UNSUPPORTED cells would judge nothing and exit 0
        why = registry.implementation(name).unsupported_sglang(target.info.version)
        if why:
            raise _usage_error(f"--impl {name}: {why}")
    found_dir = (found or FOUND_DIR).resolve()
    problem = _unwritable(found_dir)
    if problem:
        raise _usage_error(f"--found {found_dir}: {problem}")
    os.environ[FOUND_ENV] = os.pathsep.join(filter(None, [os.environ.get(FOUND_ENV), str(found_dir)]))
    out = _out_dir(out)  # resolved, never the checkout (harness.report.outdir.check_out)
    folder = out / "runs" / time.strftime("%Y%m%d-%H%M%S")
    reports = _explore_all(list(dict.fromkeys(impl)), budget_s, seed, topology, target, folder, found_dir, lanes,
                           stopping)
    from harness.explore.outcome import exit_code

    _print_reports(reports)
    replay = [f.path for r in reports for f in [*r.failures.values(), *r.oracle.values()] if f.path and not f.known]
    if replay:
        _replay(replay, list(dict.fromkeys(r.impl for r in reports)), target, folder / "replay")
    raise typer.Exit(code=exit_code(reports))


def _unwritable(folder: Path) -> str:
    """Why found programs cannot be written into ``folder`` (made if missing); "" when they can."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".pdconform-probe-"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


def shapes(topology: str) -> list[str]:
    """The topologies ``--topology`` names: one, or each of the ``default`` or ``nightly`` set
    (issue 36: explore on the multi-rank shapes too).  KeyError for an unknown name."""
    from harness.spec.topology import TOPOLOGIES, topology as named

    if topology in ("default", "nightly"):
        return [name for name, t in TOPOLOGIES.items() if getattr(t, topology)]
    return [named(topology).name]


def _explore_all(impls, budget_s, seed, topology, target, folder, found_dir, lanes=8, stopping=None):
    from harness.explore.session import Explorer

    reports, shown = [], [0.0]
    live = err.is_terminal  # a terminal gets one line rewritten in place; a log a line every 10 s

    def progress(r) -> None:
        if time.monotonic() - shown[0] < (0.2 if live else 10.0):
            return
        shown[0] = time.monotonic()
        err.print(f"{chr(13) if live else ''}{escape(r.impl)}: {r.programs} programs, {r.steps} steps, "
                  f"{len(r.failures)} distinct failure(s), {r.rate_per_min:.0f}/min   ", end="" if live else "\n")

    with Explorer(target, folder / "programs", found_dir, seed=seed, on_progress=progress,
                  note=lambda text: err.print(escape(text)), stopping=stopping) as explorer:
        explorer.lanes = lanes
        explorer.start(impls)
        each = shapes(topology)
        for name in impls:
            for i, shape in enumerate(each):  # the corpus replays once per implementation
                if len(each) > 1:
                    err.print(escape(f"{name} on {shape}: {budget_s / len(each):.0f} s"))
                reports.append(explorer.explore(name, budget_s / len(each), shape, corpus=i == 0))
                err.print()
    return reports


def _print_reports(reports) -> None:
    """The table of each implementation's exploration: its findings, then its *oracle failures*
    (programs the reference failed: pdconform's own bug, on their own lines, each with its found
    file under the found folder's oracle/), the corpus, pair-only and disputed failures; then a
    line to reproduce each found program and, when there are oracle failures, what they mean."""
    from harness.explore.found import FOUND_DIR, FOUND_ENV
    from harness.report.safe import terminal

    table = Table("implementation", "programs", "steps", "programs/min", "failure", "count", "first after",
                  "found file", title="pdconform explore")
    for r in reports:
        rows = [*r.findings, *r.oracle_failures]
        shown = r.impl if r.topology == "p1-d1" else f"{r.impl}@{r.topology}"
        first = [shown, str(r.programs), str(r.steps), f"{r.rate_per_min:.0f}"]
        if not rows:
            table.add_row(*first, "none", "", "", "")
        for i, f in enumerate(rows):
            sig = f"{f.signature['check']} ({f.signature['requirement']})" + (" [flaky]" if f.flaky else "") + \
                (" [known: corpus]" if f.known else "")
            if f.oracle:  # the reference failed it: pdconform's bug, whatever the implementation explored
                sig = f"oracle failure: the reference fails {sig}" + (f", beside {f.beside}" if f.beside else "") + \
                    (" (the same check: disputed)" if f.disputes else "")
            shrunk = "" if f.known or f.beside else f" (shrunk in {f.shrink_s:.1f} s, {f.shrink_runs} cells)"
            table.add_row(*(first if i == 0 else [""] * 4), escape(terminal(sig)), str(f.count),
                          f"{f.first_after_s:.1f} s{shrunk}", escape(str(f.path or "")))
        for name, sig in r.corpus.items():
            now = {"PASS": "fixed, passes now", "WARN": "fixed (a SHOULD still warns)",
                   "UNSUPPORTED": "not judged here (UNSUPPORTED)"}.get(sig, "unreadable" if sig.startswith("unreadable")
                                                                      else "still fails")
            table.add_row(r.impl, "", "", "", escape(terminal(f"corpus {name}: {now}")), "", "", "")
        if r.pair_only:  # not a finding: what reuse gave up showed (harness.drive.pair)
            kinds = sorted({key for key, _ in r.pair_only})
            table.add_row(r.impl, "", "", "", escape(terminal(f"pair-only (passed in a fresh cell): {', '.join(kinds)}")),
                          str(len(r.pair_only)), "", "")
        if r.disputed:  # not the implementation's finding: the reference fails the program the same way
            kinds = sorted({f"{key} (reference: {ref})" for key, ref, _ in r.disputed})
            table.add_row(r.impl, "", "", "", escape(terminal("disputed, not a finding: the reference fails it the "
                                                              f"same way (an oracle failure): {', '.join(kinds)}")),
                          str(len(r.disputed)), "", "")
    console.print(table)
    for r in reports:
        for f in [*r.failures.values(), *r.oracle.values()]:
            if f.path:
                env = "" if f.path.parent.resolve() == FOUND_DIR.resolve() else \
                    f"{FOUND_ENV}={shlex.quote(str(f.path.parent))} "
                impl = f.signature.get("impl") or r.impl  # an oracle failure reproduces on the reference
                line = f"reproduce: {env}{this_program()} repro {f.path.stem} --impl {impl}"
                console.print(escape(terminal(line)))
    oracle = sum(len(r.oracle_failures) for r in reports)
    if oracle:
        console.print(f"{oracle} oracle failure(s): the reference fails a program whose outcome the spec fixes, so "
                      "pdconform's reference, or explore's rules or checks, are wrong, not the implementation explored "
                      "(please report it, with the found file); exit 3 unless an implementation's own failure exits 1")


def _replay(paths: list[Path], impls: list[str], target, folder: Path) -> None:
    """Run every found program on the explored implementations (and the reference beside
    them) as ``run`` does: the result tree and reports of the failures."""
    from harness import session
    from harness.explore.found import load_file

    folder.mkdir(parents=True, exist_ok=True)
    scenarios = [load_file(p) for p in paths]
    result = session.run_into(session.RunConfig(impls=impls, scenarios=scenarios, out_dir=folder, target=target,
                                                jobs=2, isolated=True), folder)
    bad = [c for c in result.cells if c.verdict != "PASS"]
    console.print(f"replayed {len(result.cells)} cell(s), {len(bad)} failing as found: {escape(str(folder))}"
                  f"/index.html")


__all__ = ["explore", "parse_budget"]

