"""``pdconform soak``: the same matrix run N times, and every cell whose outcome changed.

A CI gate is only as good as its verdicts are stable: a cell that is PASS in one run and
FAIL in the next, on the same code and seed, either hides a race in the backend (then a
scenario must make it certain) or a harness that judges too early. Each run goes into
``run-K/`` of one soak folder (harness.session.run_into, results.json and cell.json only);
the machine's load average is sampled every second while it runs, so a flip can be set
against the load it happened under.

A cell *flips* when its verdict differs between two runs, or its reason does once numbers
are masked (a reason that says "came 1.3 s after" in one run and "1.4 s" in the next has
not changed). :func:`flips` is a pure function of the runs; soak.json and soak.md hold
the runs and the flips.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from harness.report.files import write_json_and_markdown
from harness.report.safe import md, md_code

LOAD_SAMPLE_S = 1.0
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass
class SoakRun:
    """One matrix run of a soak: ``index`` (1-based), its folder, when it started (UTC, ISO
    8601), its wall seconds, the 1-minute load average while it ran (``load_mean``,
    ``load_max``), and each cell's verdict and reason keyed ``"scenario x impl"``."""

    index: int
    folder: str
    started_at: str
    duration_s: float
    load_mean: float
    load_max: float
    cells: dict[str, list[str]] = field(default_factory=dict)  # "scenario x impl" -> [verdict, reason]


@dataclass
class Flip:
    """A cell whose outcome was not the same in every run: how often each verdict came
    (``verdicts``), each distinct reason (numbers masked; ``example``: one as given) with
    the runs that gave it, and the load average of the runs whose outcome was not the most
    common one."""

    cell: str
    verdicts: dict[str, int]
    reasons: list[dict]
    odd_runs: list[int]
    odd_loads: list[float]


def normalised(reason: str) -> str:
    """``reason`` with every number replaced by ``#`` (timings vary from run to run)."""
    return _NUMBER.sub("#", reason or "")


def flips(runs: list[SoakRun]) -> list[Flip]:
    """Every cell whose (verdict, masked reason) differs between two of ``runs``, in cell order."""
    found = []
    cells = sorted({cell for run in runs for cell in run.cells})
    for cell in cells:
        outcomes = {run.index: _outcome(run, cell) for run in runs}
        kinds = Counter(outcomes.values())
        if len(kinds) <= 1:
            continue
        usual = kinds.most_common(1)[0][0]
        odd = [i for i, o in outcomes.items() if o != usual]
        loads = {run.index: run.load_mean for run in runs}
        raw = {run.index: run.cells.get(cell, ["", ""])[1] for run in runs}
        reasons = []
        for verdict, masked in kinds:
            given = [i for i, o in outcomes.items() if o == (verdict, masked)]
            reasons.append({"verdict": verdict, "reason": masked, "example": raw[given[0]], "runs": given})
        found.append(Flip(cell=cell, verdicts=dict(Counter(v for v, _ in outcomes.values())), reasons=reasons,
                          odd_runs=odd, odd_loads=[loads[i] for i in odd]))
    return found


def _outcome(run: SoakRun, cell: str) -> tuple[str, str]:
    verdict, reason = run.cells.get(cell, ["MISSING", "the cell did not run"])
    return verdict, normalised(reason)


class _LoadSampler:
    """The 1-minute load average every LOAD_SAMPLE_S seconds, on a thread, while in a ``with``."""

    def __init__(self):
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pdconform-load", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(LOAD_SAMPLE_S):
                return

    def __enter__(self) -> "_LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def soak(config, runs: int, folder: Path, on_run: Callable[[SoakRun], None] | None = None) -> list[SoakRun]:
    """Run ``config`` (a harness.session.RunConfig) ``runs`` times into ``folder/run-K/``;
    the runs, each as it ends also given to ``on_run``.  Cells start longest first, as
    ``pdconform run`` orders them after an earlier run: by the durations of the run
    before (the first by ``config.duration_hint``).  KeyboardInterrupt and OSError as
    harness.session.run_into raises them."""
    from dataclasses import replace

    from harness.session import run_into

    done: list[SoakRun] = []
    for index in range(1, runs + 1):
        run_dir = folder / f"run-{index}"
        run_dir.mkdir()
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        begin = time.monotonic()
        with _LoadSampler() as load:  # no alone reruns: a soak counts the first verdicts under its own load
            result = run_into(replace(config, alone_reruns=False), run_dir)
        samples = load.samples or [os.getloadavg()[0]]
        run = SoakRun(index=index, folder=run_dir.name, started_at=started,
                      duration_s=round(time.monotonic() - begin, 1),
                      load_mean=round(sum(samples) / len(samples), 2), load_max=round(max(samples), 2),
                      cells={f"{c.scenario} x {c.impl}": [str(c.verdict), c.reason or ""] for c in result.cells})
        done.append(run)
        config = replace(config, duration_hint={(c.scenario, c.impl): c.duration_s for c in result.cells})
        if on_run is not None:
            on_run(run)
    return done


def write_soak(folder: Path, runs: list[SoakRun], jobs: int, cores: int) -> tuple[Path, Path]:
    """soak.json (every run and flip) and soak.md (the flips, for docs/reliability.md and PR
    comments; strings from the runs escaped) into ``folder``, atomically; their paths."""
    found = flips(runs)
    data = {"jobs": jobs, "cores": cores, "runs": [asdict(r) for r in runs], "flips": [asdict(f) for f in found]}
    return write_json_and_markdown(folder, "soak", data, soak_markdown(runs, found, jobs, cores))


def soak_markdown(runs: list[SoakRun], found: list[Flip], jobs: int, cores: int) -> str:
    """The soak as Markdown: the runs' load and wall time, then each flip."""
    loads = [r.load_mean for r in runs]
    cells = len(runs[0].cells) if runs else 0
    lines = [f"## pdconform: soak, {len(runs)} runs of {cells} cells, --jobs {jobs} on {cores} cores, "
             f"{len(found)} flipping cell(s)", ""]
    if runs:
        lines.append(f"Load average (1 min) while running: mean {sum(loads) / len(loads):.1f}, lowest run "
                     f"{min(loads):.1f}, highest run {max(loads):.1f}, peak {max(r.load_max for r in runs):.1f}; "
                     f"wall {min(r.duration_s for r in runs):.0f}-{max(r.duration_s for r in runs):.0f} s per run.")
        lines.append("")
    for flip in found:
        counts = ", ".join(f"{md(v)} x{n}" for v, n in sorted(flip.verdicts.items()))
        odd = ", ".join(f"run {i} (load {load:.1f})" for i, load in zip(flip.odd_runs, flip.odd_loads))
        lines.append(f"### {md(flip.cell)}: {counts}")
        lines.append("")
        lines.append(f"Unlike the others: {odd}.")
        lines.append("")
        for r in flip.reasons:
            lines.append(f"- {md(r['verdict'])} in run(s) {', '.join(map(str, r['runs']))}: {md_code(r['example'])}")
        lines.append("")
    if not found:
        lines.append("Every cell had the same verdict and reason in every run.")
    return "\n".join(lines).rstrip() + "\n"
