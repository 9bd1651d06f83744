"""``pdconform bench`` as one call: the figures it asks for, their table, bench.json.

The CLI checks the options and prints; this module runs the matrix, simulator and
engine benchmarks (harness.bench.matrix) and turns their figures into a table and a
file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rich.markup import escape
from rich.table import Table

from harness.bench.matrix import (
    Figure,
    bench_engines,
    bench_matrix,
    bench_simulator,
    engine_pairs,
    machine,
    overhead_by_impl,
)
from harness.bench.rooms import load_figures
from harness.judge.results import write_atomic

PARTS = ("matrix", "simulator", "engines", "explore", "isolation", "shrink")


@dataclass
class BenchPlan:
    """What one bench measures: ``repeat`` samples of each figure; ``matrix`` (a
    harness.session.RunConfig, or None to skip it), ``seeds`` simulator seeds per sample
    (0 to skip), ``engine_bytes`` per engine transfer (0 to skip); ``out_dir`` for the
    runs and bench.json."""

    out_dir: Path
    repeat: int = 3
    matrix: object | None = None
    seeds: int = 0
    engine_bytes: int = 0
    explore: tuple = ()  # (target, implementations) whose explore rate to measure ([] none); () to skip explore
    explore_s: float = 20.0  # seconds of programs per implementation and sample
    shrink: bool = False  # time explore's shrinking of a planted bug (SHRINK_MUTANT)
    isolation: bool = False  # verdicts alone and on long-lived pairs, per explored implementation
    notes: list[str] = field(default_factory=list)


class BenchUsageError(ValueError):
    """Options that ask for nothing, or for more than this machine has; the message says which."""


def plan_bench(out: Path, repeat: int, jobs: int, impls: list[str], scenarios: list, skip: set[str], seeds: int,
               engine_mib: int, engine_settings: dict[str, int], target: Callable[[], object],
               isolated: bool = False) -> BenchPlan:
    """The BenchPlan ``pdconform bench``'s options ask for: ``skip`` some of :data:`PARTS`;
    ``target()`` gives the sglang of the timed matrix, whose cells start in the order a
    clean clone's ``make matrix`` uses (the shipped expectations' failing cells first) and are
    judged against those expectations, as ``make matrix``'s are (on warm role pairs a cell not
    as expected runs again fresh: harness.drive.warm); ``isolated``: every cell fresh.
    BenchUsageError for an unknown part, nothing left to measure, or engine buffers beyond
    the free memory."""
    from harness.session import RunConfig, clean_clone_order, resolve_expectations

    unknown = skip - set(PARTS)
    if unknown:
        raise BenchUsageError(f"unknown --skip {', '.join(sorted(unknown))} (known: {', '.join(PARTS)})")
    if skip >= set(PARTS) - {"isolation"}:  # isolation is measured on explore's implementations
        raise BenchUsageError("--skip leaves nothing to measure")
    if "engines" not in skip:
        free_mib = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
        if 2 * engine_mib > free_mib:
            raise BenchUsageError(f"--engine-mib {engine_mib} needs {2 * engine_mib} MiB of memory (a source and a "
                                  f"destination buffer); {free_mib} MiB are free")
    plan = BenchPlan(out_dir=out, repeat=repeat, seeds=0 if "simulator" in skip else seeds,
                     engine_bytes=0 if "engines" in skip else engine_mib * 2**20)
    if "explore" not in skip or "shrink" not in skip:
        plan.explore = (target(), [i for i in impls if not i.startswith("mutant.")] if "explore" not in skip else [])
        plan.shrink = "shrink" not in skip
        plan.isolation = "isolation" not in skip and "explore" not in skip
    if "matrix" not in skip:
        sglang = target()
        plan.matrix = RunConfig(impls=impls, scenarios=scenarios, out_dir=out, target=sglang, jobs=jobs,
                                engine_settings=engine_settings, isolated=isolated,
                                expectations=resolve_expectations(None, sglang.info.version),
                                duration_hint=clean_clone_order(sglang.info.version, scenarios, impls))
    return plan


def run_bench(plan: BenchPlan, on_progress: Callable[[str], None] = lambda text: None) -> list[Figure]:
    """Measure what ``plan`` asks for; the figures, in report order."""
    figures: list[Figure] = []
    if plan.matrix is not None:
        wall, overhead, cpu, runs = bench_matrix(plan.matrix, plan.repeat, on_progress=on_progress)
        figures += [wall, overhead, *overhead_by_impl(runs), cpu, *load_figures(runs)]
    if plan.seeds:
        on_progress(f"simulator: {plan.repeat} x {plan.seeds} seeds")
        figures.append(bench_simulator(plan.seeds, plan.repeat))
    if plan.engine_bytes:
        on_progress(f"engines: {engine_pairs(plan.repeat)} x {plan.engine_bytes >> 20} MiB raw and instrumented")
        figures += bench_engines(plan.engine_bytes, plan.repeat)
    if plan.explore:
        rates = f"{plan.repeat} x {plan.explore_s:.0f} s per implementation" if plan.explore[1] else ""
        shrinks = f"{plan.repeat} shrinks of {SHRINK_MUTANT}" if plan.shrink else ""
        on_progress("explore: " + ", ".join(part for part in (rates, shrinks) if part))
        figures += bench_explore(*plan.explore, plan.repeat, plan.out_dir / "explore", plan.explore_s, plan.shrink,
                                 plan.isolation)
    return figures


#: the planted bug whose shrinking bench times: found within seconds by a fault-free program
SHRINK_MUTANT = "mutant.aux-slot-off-by-one"
SHRINK_BUDGET_S = 120.0  # seconds one sample may take to find it (its shrinking then has its own bound)


def bench_explore(target, impls: list[str], repeat: int, out_dir: Path, seconds: float,
                  shrink: bool = False, isolation: bool = False) -> list[Figure]:
    """Explore's rate per implementation of ``impls`` in each of :data:`EXPLORE_MODES`: ``repeat``
    samples of ``seconds`` each (programs per minute, steps per second; harness.explore.session;
    the corpus is not replayed), and with ``shrink`` its time to shrink (:data:`SHRINK_MUTANT`'s failure, from
    the first failing program to the smallest one written out), with ``isolation`` what the
    long-lived pairs give up (:func:`_isolation_figure`); found programs are written under
    ``out_dir`` (never into the corpus)."""
    from harness import implementations
    from harness.explore.session import Explorer, ImplReport

    if shrink:
        implementations.list_mutants()  # the planted bug is an implementation from now on
    figures = []
    with Explorer(target, out_dir / "programs", out_dir / "found") as explorer:
        explorer.start(impls + ([SHRINK_MUTANT] if shrink else []))
        explorer.wait_ready()
        for impl in impls:
            # the corpus's failures are known, as in a nightly run: counted, not shrunk again (not timed)
            explorer.replay_corpus(impl, ImplReport(impl))
            for mode, (faults, long_lived) in EXPLORE_MODES.items():
                explorer.faults, explorer.long_lived = faults, long_lived
                figures += _rate_figures(explorer, impl, mode, repeat if not mode else 1, seconds)  # others: one sample
            explorer.long_lived = True
            if isolation:
                figures.append(_isolation_figure(explorer, impl))
        explorer.faults, explorer.long_lived = True, True
        if shrink:
            figures.append(_shrink_figure(explorer, repeat))
    return figures


#: explore's rates bench measures: figure suffix -> (fault rules on, long-lived role pairs); the
#: issue's goal (>= 300 programs a minute) is for fault-free programs, the first one
EXPLORE_MODES = {"": (False, True), "alone": (False, False), "faults": (True, True)}  # see _rate_figures


ISOLATION_PROGRAMS = 12  # generated programs of each kind (fault-free, with faults) run alone and on a pair


def _isolation_figure(explorer, impl: str) -> Figure:
    """What long-lived pairs give up, measured: :data:`ISOLATION_PROGRAMS` fault-free programs and
    as many with the fault rules (hypothesis, seed 0), each judged alone (a fresh cell) and on
    one of ``impl``'s pairs; the figure is how many verdicts differ (goal 0), the note names them."""
    programs = []
    for faults in (False, True):
        explorer.faults = faults
        programs += explorer.write_round(0)[:ISOLATION_PROGRAMS]
    differ = []
    for i, program in enumerate(programs):
        alone = explorer.run_program(program, impl, "isolation-alone", alone=True).verdict
        paired = explorer.run_program(program, impl, "isolation-pair").verdict
        if alone != paired:
            differ.append(f"program {i}: {alone} alone, {paired} on a pair")
    explorer.close_pairs(impl)
    figure = Figure(f"explore_pair_verdicts_differ[{impl}]", "programs", [float(len(differ))])
    figure.note = f"of {len(programs)} programs" + (": " + "; ".join(differ) if differ else "")
    return figure


def _rate_figures(explorer, impl: str, mode: str, repeat: int, seconds: float) -> list[Figure]:
    """Programs per minute and steps per second of ``impl`` in one of :data:`EXPLORE_MODES`:
    ``explore_programs_per_min[IMPL]`` (the goal's), ``explore_alone_programs_per_min[IMPL]``
    (each program forked fresh), ``explore_faults_programs_per_min[IMPL]`` (every rule)."""
    prefix = f"explore_{mode}_" if mode else "explore_"
    rate = Figure(f"{prefix}programs_per_min[{impl}]", "/min")
    steps = Figure(f"{prefix}steps_per_s[{impl}]", "/s")
    for sample in range(repeat):
        explorer.seed = sample
        report = explorer.explore(impl, seconds, corpus=False)
        rate.samples.append(round(report.exploring_rate_per_min, 1))
        steps.samples.append(round(report.steps / report.seconds, 1) if report.seconds else 0.0)
    rate.note = "while exploring: without the cells that confirmed or shrank a failure"
    return [rate, steps]


def _shrink_figure(explorer, repeat: int) -> Figure:
    """``repeat`` samples of the seconds :data:`SHRINK_MUTANT`'s failure takes to shrink (a
    sample that does not find it within :data:`SHRINK_BUDGET_S` adds none)."""
    figure = Figure(f"explore_shrink_s[{SHRINK_MUTANT.removeprefix('mutant.')}]", "s")
    for sample in range(repeat):
        explorer.seed = sample
        report = explorer.explore(SHRINK_MUTANT, SHRINK_BUDGET_S, corpus=False, max_failures=1)
        for failure in report.failures.values():
            figure.samples.append(round(failure.shrink_s, 1))
    return figure


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "B/s":
        return f"{value / 2**20:,.1f} MiB/s"
    if unit == "s":
        return f"{value:.3f} s"
    return f"{value:,.1f} {unit}"


def figures_table(figures: list[Figure], jobs: int, repeat: int) -> Table:
    """The figures as a rich table: median, spread, goal and whether it is met."""
    info = machine()
    table = Table(title=f"pdconform bench: {info['cores']} cores, {info['cpu']}, Python {info['python']}, "
                        f"jobs {jobs}, {repeat} samples")
    table.add_column("figure", no_wrap=True)  # a figure's name is what bench.json and the docs call it
    for column in ("median", "spread", "goal", ""):
        table.add_column(column)
    for f in figures:
        goal = f.goal
        mark = {True: "[green]met[/]", False: "[red]NOT met[/]", None: ""}[f.meets_goal()]
        spread = f"{_fmt(f.spread[0], f.unit)} .. {_fmt(f.spread[1], f.unit)}" if f.spread else "-"
        table.add_row(escape(f.name), _fmt(f.median, f.unit), spread,
                      f"{goal[0]} {_fmt(goal[1], f.unit)}" if goal else "",
                      " ".join(part for part in (mark, escape(f.note)) if part))
    return table


def write_bench_json(out_dir: Path, figures: list[Figure], jobs: int, repeat: int) -> Path:
    """Write ``out_dir/bench.json`` (machine, jobs, repeat, every figure), atomically; its path."""
    path = out_dir / "bench.json"
    write_atomic(path, json.dumps({"machine": machine(), "jobs": jobs, "repeat": repeat,
                                   "figures": [f.to_dict() for f in figures]}, indent=2).encode())
    return path
