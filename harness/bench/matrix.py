"""``pdconform bench``: how fast the harness is, measured, never asserted in a unit test.

Four figures, each the median and spread of several samples:

- matrix wall time (seconds): the selected matrix, run ``repeat`` times;
- per-cell overhead (seconds): a cell's wall time minus its scenario's inherent waits
  (its sleeps and the timeouts it sets, harness.spec.scenario.Scenario.inherent_wait_s),
  over every cell of every repeat, and per implementation (``cell_overhead_s[IMPL]``,
  no goal: it tells the harness's own cost, the reference's cells, from the engines');
- matrix CPU time (seconds, user + system, every cell and its roles: what a run costs a
  shared CI machine, and the floor of its wall time on N cores is this over N);
- reference simulator throughput (seeded lifecycle runs per minute);
- KV bytes per second through each real engine, raw and through the harness's
  instrumentation, on the same transfer (harness.bench.engines).

:data:`GOALS` are the project's targets (issue "Speed"); the report marks each.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from harness.session import RunConfig

GOALS = {
    "matrix_wall_s": ("<=", 60.0),
    "explore_programs_per_min[]": (">=", 300.0),  # issue "Explore": fault-free programs of ~10 steps, 2 cores
    "explore_pair_verdicts_differ[]": ("<=", 0.0),  # issue "Explore": a verdict alone and on a long-lived pair: the same
    "cell_overhead_s": ("<=", 0.150),
    "simulator_runs_per_min": (">=", 2000.0),
    "instrumentation_overhead_pct": ("<=", 5.0),
}


@dataclass
class Figure:
    """Samples of one measured quantity and how they compare with a goal."""

    name: str
    unit: str
    samples: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def spread(self) -> tuple[float, float] | None:
        return (min(self.samples), max(self.samples)) if self.samples else None

    @property
    def goal(self) -> tuple[str, float] | None:
        """Its goal in :data:`GOALS` (a per-implementation figure ``NAME[IMPL]``: the goal of ``NAME[]``, when there is one)."""
        return GOALS.get(self.name) or GOALS.get(self.name.split("[", 1)[0] + "[]")

    def meets_goal(self) -> bool | None:
        """True/False against its goal; None when there is no goal or no sample."""
        goal = self.goal
        if goal is None or self.median is None:
            return None
        op, bound = goal
        return self.median <= bound if op == "<=" else self.median >= bound

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "median": self.median, "spread": self.spread,
                "samples": self.samples, "goal": self.goal, "meets_goal": self.meets_goal(),
                "note": self.note}


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import os

    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "platform": platform.platform()}


def bench_matrix(config: "RunConfig", repeat: int, on_progress: Callable[[str], None] | None = None
                 ) -> tuple[Figure, Figure, Figure, list]:
    """Run ``config``'s matrix ``repeat`` times, into ``config.out_dir/run-N/`` (the bench's run
    folder; results.json and cell.json only); return (wall time, per-cell overhead and matrix CPU time figures,
    the runs).  The CPU figure has a sample only for runs whose every cell was measured
    (forked cells).  Every repeat orders its cells by ``config.duration_hint`` (as a clean
    clone's first run does, see harness.drive.scheduler.expected_durations), not by the
    previous repeat's durations."""
    from dataclasses import replace

    from harness import session

    wall = Figure("matrix_wall_s", "s")
    overhead = Figure("cell_overhead_s", "s")
    cpu = Figure("matrix_cpu_s", "s")
    runs = []
    cells = len(config.impls) * len(config.scenarios)
    for i in range(repeat):
        if on_progress:
            on_progress(f"matrix run {i + 1}/{repeat} ({cells} cells, {config.jobs} at a time)")
        folder = config.out_dir / f"run-{i + 1}"
        folder.mkdir()
        # no alone reruns: the wall time measured is the matrix's own (harness.judge.load)
        run = session.run_into(replace(config, reports=False, alone_reruns=False), folder)
        runs.append(run)
        wall.samples.append(run.duration_s)
        overhead.samples.extend(c.overhead_s for c in run.cells)
        if all(c.cpu_s is not None for c in run.cells):
            cpu.samples.append(round(sum(c.cpu_s for c in run.cells), 3))
    expected = [sum(c.as_expected for c in r.cells) for r in runs]
    reused = [sum(bool((c.pair or {}).get("reused")) for c in r.cells) for r in runs]
    confirmed = [sum(c.on_pair is not None for c in r.cells) for r in runs]
    wall.note = (f"cells as expected per run: {expected} of {cells}; on a reused warm pair: {reused}, "
                 f"confirmed fresh: {confirmed}")
    verdict_sets = {tuple(c.verdict for c in r.cells) for r in runs}
    if len(verdict_sets) > 1:
        changed = sorted({f"{a.scenario} x {a.impl}" for r in runs[1:] for a, b in zip(runs[0].cells, r.cells)
                          if a.verdict != b.verdict})
        wall.note += f"; verdicts differed between repeats: {', '.join(changed)}"
    return wall, overhead, cpu, runs


def overhead_by_impl(runs: list) -> list[Figure]:
    """``cell_overhead_s[IMPL]`` for each implementation of ``runs`` (RunResults): the
    overhead in seconds of its cells over every run, with the median over its PASS cells
    and its cells' CPU seconds per run in the note (a failing cell's overhead is mostly a
    status that never came, see docs/performance.md)."""
    figures = []
    for impl in dict.fromkeys(c.impl for run in runs for c in run.cells):
        cells = [c for run in runs for c in run.cells if c.impl == impl]
        passed = [c.overhead_s for c in cells if c.verdict == "PASS"]
        note = f"PASS cells: {statistics.median(passed):.3f} s" if passed else "no PASS cell"
        if all(c.cpu_s is not None for c in cells):
            note += f"; CPU {sum(c.cpu_s for c in cells) / len(runs):.1f} s per matrix"
        figures.append(Figure(f"cell_overhead_s[{impl}]", "s", [c.overhead_s for c in cells], note=note))
    return figures


def bench_simulator(seeds: int, repeat: int) -> Figure:
    """Seeded reference lifecycle runs per minute (the reference's ``simulator`` tool,
    harness.implementations), ``repeat`` samples."""
    from harness.implementations import implementation
    from harness.spec.protocol import REFERENCE

    simulate = implementation(REFERENCE).hook("simulator").simulate

    figure = Figure("simulator_runs_per_min", "runs/min")
    for _ in range(repeat):
        start = time.perf_counter()
        bad = sum(not simulate(seed).ok for seed in range(seeds))
        figure.samples.append(round(seeds / (time.perf_counter() - start) * 60, 1))
        if bad:
            figure.note = f"{bad} of {seeds} runs had violations"
    return figure


# Raw/instrumented pairs per engine, whatever --repeat says: one pair takes about a second,
# and on a 2-core machine a single NIXL transfer varies by 2x, so fewer pairs give a median
# of noise (4 pairs of 64 MiB read +12.9 % and -4.8 % minutes apart; 7 pairs of 128 MiB
# -0.2 % Mooncake, -4.8 % NIXL).
MIN_ENGINE_PAIRS = 9


def engine_pairs(repeat: int) -> int:
    """Raw/instrumented pairs per engine for a bench of ``repeat`` samples (at least MIN_ENGINE_PAIRS)."""
    return max(repeat, MIN_ENGINE_PAIRS)


def bench_engines(total_bytes: int, repeat: int) -> list[Figure]:
    """KV bytes/s per real engine, raw and instrumented, and the instrumentation's cost in %.

    ``total_bytes`` per transfer; ``engine_pairs(repeat)`` raw/instrumented pairs per engine.
    An engine that cannot run is reported in the figure's note, not raised.
    """
    from harness.bench.engines import compare, engines

    figures = []
    for engine in engines():
        try:
            result = compare(engine, total_bytes=total_bytes, repeats=engine_pairs(repeat))
        except Exception as exc:  # noqa: BLE001 - reported in the table, the other figures still count
            figures.append(Figure("instrumentation_overhead_pct", "%", note=f"{engine}: {type(exc).__name__}: {exc}"))
            continue
        figures.append(Figure(f"{engine}_raw_bytes_per_s", "B/s", list(result["raw"]["bytes_per_s"])))
        figures.append(Figure(f"{engine}_instrumented_bytes_per_s", "B/s", list(result["instrumented"]["bytes_per_s"])))
        cost = result["wrapper_cost"]
        figures.append(Figure("instrumentation_overhead_pct", "%", [round(result["paired_overhead_pct"], 2)],
                              note=f"{engine}: median of raw/instrumented pairs; the wrapper itself adds "
                                   f"{cost['added_s'] * 1e6:.0f} us per transfer = {cost['added_pct']:.3f} %"))
    return figures
