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

Each run is judged as ``pdconform run`` judges one (harness.session.run_into): against the
expectations, a cell worse than expected only on timing bounds while the machine starved it
run once more alone at the end (harness.judge.load).  So each cell of each run carries a
:func:`label`: *as expected*, *timing under load* (with both results: ``FAIL under load
(load 31.0 on 2 cores), PASS alone``), or *not as expected* (a regression or a fix, what
``run`` exits 1 on).  A flip whose every run is as expected or timing under load is
*explained*; the soak fails (exit 1) on a cell not as expected, or on a flip that is not
explained.
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
    # "scenario x impl" -> {"expected": VERDICT, "label": one of LABELS, "alone": alone line ("" when
    # it did not run alone), "new_checks": [...]}: the cell judged as `run` judges it (:func:`judged`)
    judged: dict[str, dict] = field(default_factory=dict)


AS_EXPECTED, UNDER_LOAD, NOT_AS_EXPECTED = "as expected", "timing under load", "not as expected"
LABELS = (AS_EXPECTED, UNDER_LOAD, NOT_AS_EXPECTED)


def label(cell) -> str:
    """What ``cell`` (a judged harness.judge.results.CellResult) was against its expectation,
    as ``run`` decides it: :data:`UNDER_LOAD` when it was worse than expected only under load
    (run again alone it was not: CellResult.under_load), :data:`AS_EXPECTED` when its settled
    verdict and failing checks are the expected ones, else :data:`NOT_AS_EXPECTED` (a
    regression, a new failing check in a known cell, or a fix).  Pure."""
    if cell.under_load:
        return UNDER_LOAD
    return AS_EXPECTED if cell.settled_as_expected else NOT_AS_EXPECTED


def judged(cell) -> dict:
    """The record a soak keeps of one judged cell: ``{"expected", "label", "alone", "new_checks"}``
    (:attr:`SoakRun.judged`).  Pure."""
    from harness.report.load import alone_line

    return {"expected": str(cell.expected), "label": label(cell), "alone": alone_line(cell),
            "new_checks": list(cell.new_checks)}


def unexplained(runs: list["SoakRun"]) -> list[tuple[int, str]]:
    """``(run index, cell)`` of every cell that was not as expected in a run (neither as
    expected nor timing under load), in run then cell order.  Pure."""
    return [(run.index, cell) for run in runs for cell in sorted(run.judged)
            if run.judged[cell].get("label") == NOT_AS_EXPECTED]


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
    # every run of the cell was as expected or timing under load (labelled with its alone result)
    explained: bool = False


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
            reasons.append({"verdict": verdict, "reason": masked, "example": raw[given[0]], "runs": given,
                            "labels": {str(i): _label_of(runs, i, cell) for i in given}})
        explained = all(_label_of(runs, run.index, cell) in (AS_EXPECTED, UNDER_LOAD) for run in runs)
        found.append(Flip(cell=cell, verdicts=dict(Counter(v for v, _ in outcomes.values())), reasons=reasons,
                          odd_runs=odd, odd_loads=[loads[i] for i in odd], explained=explained))
    return found


def _label_of(runs: list[SoakRun], index: int, cell: str) -> str:
    """The label of ``cell`` in run ``index``; "" when that run did not judge it (a missing cell)."""
    run = next(r for r in runs if r.index == index)
    return (run.judged.get(cell) or {}).get("label", "")


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
    before (the first by ``config.duration_hint``).  Each run is judged against
    ``config.expectations`` and runs its starved cells worse than expected only on timing
    bounds once more alone at its end, as ``run`` does.  KeyboardInterrupt and OSError as
    harness.session.run_into raises them."""
    from dataclasses import replace

    from harness.session import run_into

    done: list[SoakRun] = []
    for index in range(1, runs + 1):
        run_dir = folder / f"run-{index}"
        run_dir.mkdir()
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        begin = time.monotonic()
        with _LoadSampler() as load:  # the first verdicts flip or not; the alone reruns label them
            result = run_into(replace(config, alone_reruns=True), run_dir)
        samples = load.samples or [os.getloadavg()[0]]
        run = SoakRun(index=index, folder=run_dir.name, started_at=started,
                      duration_s=round(time.monotonic() - begin, 1),
                      load_mean=round(sum(samples) / len(samples), 2), load_max=round(max(samples), 2),
                      cells={f"{c.scenario} x {c.impl}": [str(c.verdict), c.reason or ""] for c in result.cells},
                      judged={f"{c.scenario} x {c.impl}": judged(c) for c in result.cells})
        done.append(run)
        config = replace(config, duration_hint={(c.scenario, c.impl): c.duration_s for c in result.cells})
        if on_run is not None:
            on_run(run)
    return done


def write_soak(folder: Path, runs: list[SoakRun], jobs: int, cores: int) -> tuple[Path, Path]:
    """soak.json (every run, flip and cell not as expected) and soak.md (the same, for
    docs/reliability.md and PR comments; strings from the runs escaped) into ``folder``,
    atomically; their paths."""
    found = flips(runs)
    data = {"jobs": jobs, "cores": cores, "runs": [asdict(r) for r in runs], "flips": [asdict(f) for f in found],
            "not_as_expected": [{"run": i, "cell": c} for i, c in unexplained(runs)]}
    return write_json_and_markdown(folder, "soak", data, soak_markdown(runs, found, jobs, cores))


def run_counts(run: SoakRun) -> dict[str, int]:
    """How many of ``run``'s cells were red (not PASS) and, of those, how many had each label,
    plus the cells not as expected whatever their verdict: ``{"cells", "red", "red as expected",
    "red timing under load", "not as expected"}``.  Pure."""
    red = [c for c, (verdict, _) in run.cells.items() if verdict != "PASS"]
    labels = Counter((run.judged.get(c) or {}).get("label", "") for c in red)
    return {"cells": len(run.cells), "red": len(red), "red as expected": labels[AS_EXPECTED],
            "red timing under load": labels[UNDER_LOAD],
            "not as expected": sum(1 for j in run.judged.values() if j.get("label") == NOT_AS_EXPECTED)}


def soak_markdown(runs: list[SoakRun], found: list[Flip], jobs: int, cores: int) -> str:
    """The soak as Markdown: the runs' load and wall time; per run its red cells by label; each
    cell not as expected and each cell timing under load with its alone result; then each flip,
    every run of it labelled."""
    loads = [r.load_mean for r in runs]
    cells = len(runs[0].cells) if runs else 0
    lines = [f"## pdconform: soak, {len(runs)} runs of {cells} cells, --jobs {jobs} on {cores} cores, "
             f"{len(found)} flipping cell(s)", ""]
    if runs:
        lines.append(f"Load average (1 min) while running: mean {sum(loads) / len(loads):.1f}, lowest run "
                     f"{min(loads):.1f}, highest run {max(loads):.1f}, peak {max(r.load_max for r in runs):.1f}; "
                     f"wall {min(r.duration_s for r in runs):.0f}-{max(r.duration_s for r in runs):.0f} s per run.")
        lines.append("")
        lines.append("| run | load (mean/peak) | wall s | red cells | as expected | timing under load | not as expected |")
        lines.append("|---|---|---|---|---|---|---|")
        for r in runs:
            n = run_counts(r)
            lines.append(f"| {r.index} | {r.load_mean:.1f} / {r.load_max:.1f} | {r.duration_s:.0f} | {n['red']} | "
                         f"{n['red as expected']} | {n['red timing under load']} | {n['not as expected']} |")
        lines.append("")
    by_index = {r.index: r for r in runs}
    wrong = unexplained(runs)
    lines.append(f"### Not as expected: {len(wrong)}")
    lines.append("")
    for index, cell in wrong:
        verdict, j = by_index[index].cells[cell][0], by_index[index].judged[cell]
        new = f", new failing checks: {md(', '.join(j['new_checks']))}" if j.get("new_checks") else ""
        alone = f"; {md(j['alone'])}" if j.get("alone") else ""
        lines.append(f"- run {index}: {md(cell)}: {md(verdict)}, expected {md(j['expected'])}{new}{alone}")
    if wrong:
        lines.append("")
    loaded = [(r.index, cell, r.judged[cell]) for r in runs for cell in sorted(r.judged)
              if r.judged[cell].get("label") == UNDER_LOAD]
    lines.append(f"### Timing under load (worse than expected starved, as expected run again alone): {len(loaded)}")
    lines.append("")
    for index, cell, j in loaded:
        lines.append(f"- run {index}: {md(cell)}: {md(j['alone'])}")
    if loaded:
        lines.append("")
    if found:
        lines.append(f"**Flips: {len(found)}** ({sum(1 for f in found if not f.explained)} not explained by "
                     f"the expectations or the load)")
        lines.append("")
    for flip in found:
        counts = ", ".join(f"{md(v)} x{n}" for v, n in sorted(flip.verdicts.items()))
        odd = ", ".join(f"run {i} (load {load:.1f})" for i, load in zip(flip.odd_runs, flip.odd_loads))
        lines.append(f"### {md(flip.cell)}: {counts}" + ("" if flip.explained else " (not explained)"))
        lines.append("")
        lines.append(f"Unlike the others: {odd}.")
        lines.append("")
        for r in flip.reasons:
            said = Counter((r.get("labels") or {}).values())
            labels = "; ".join(f"{md(k)} x{n}" for k, n in sorted(said.items()) if k)
            lines.append(f"- {md(r['verdict'])} in run(s) {', '.join(map(str, r['runs']))}"
                         f"{f' ({labels})' if labels else ''}: {md_code(r['example'])}")
        lines.append("")
    if not found:
        lines.append("Every cell had the same verdict and reason in every run.")
    return "\n".join(lines).rstrip() + "\n"
