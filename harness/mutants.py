"""``pdconform mutants``: the scenarios against planted bugs, and which check caught each.

A check earns its place by catching a bug.  Each registered implementation may declare
planted-bug mutants of itself (the reference does: backends/reference/mutants/; the
registry lists them as ``mutant.<id>`` when harness.implementations.MUTANTS_ENV is set).
One run executes the chosen scenarios against the unmutated implementation (the control:
every cell must come out as it always does, PASS) and against every mutant; then
:func:`outcomes`, a pure function of that run's result tree, says for each mutant whether
it was *caught*: a cell that is FAIL or WARN failed a check that cites the mutant's
requirement (a MUST check makes the cell FAIL, a SHOULD one WARN), and the control did
not fail that check in the same scenario.  A mutant that only fails checks of
other requirements is not caught: the suite found something, but not the bug planted.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.judge.results import CellResult, RunResult
from harness.judge.verdict import Verdict
from harness.report.files import write_json_and_markdown
from harness.report.safe import md, md_code
from harness.spec.topology import default_set


#: cells on other topologies than p1-d1 that ``pdconform mutants`` runs besides every
#: scenario (issue 36, item 2): the happy path on every shape of the default set and on
#: prefill DP engines (R-DP-1; R-LAYOUT-1 per KV head slice and per PP stage; R-XFER-2 per
#: decode rank), a long prompt on DP engines, a write that completes out of order where a
#: room has several prefill ranks (TP, PP: one rank's Success is not the room's), and
#: aborts where a room has several decode ranks, and the happy path of MLA with a prefill wider
#: than its decode (its extra ranks send nothing), and registrations that come before their
#: sender with several decode ranks or prefill stages (each rank parks its own; an ABORT reaches
#: every stage), and aborts of bound rooms where a room has several decode ranks (each rank's ABORT is
#: answered at that rank)
TOPOLOGY_CELLS = (*(f"happy-path@{t.name}" for t in default_set() if t.name != "p1-d1"),  # every default shape,
                  # as it grows (p1-d4-kv2's replicated heads were missing from a list written out by hand)
                  "happy-path@p1dp2-d1", "multi-chunk-long-prompt@p1dp2-d1", "happy-path@p2-d1", "happy-path@p1-d2",
                  "happy-path@p1pp2-d1", "happy-path@p1-d1dp2", "write-out-of-order@p2-d1",
                  "write-out-of-order@p1pp2-d1", "abort-unguarded@p1-d2", "happy-path@p2-d1-mla",
                  "decode-first@p1-d2", "decode-first@p1pp2-d1", "abort-in-every-state@p1-d2")
TOPOLOGY_CELLS = tuple(dict.fromkeys(TOPOLOGY_CELLS))

@dataclass
class MutantOutcome:
    """What the suite did with one mutant: ``catching`` lists ``{"scenario", "check",
    "detail"}`` for every failed check citing ``requirement``; ``other`` the cells that
    failed for another requirement (``{"scenario", "verdict", "reason"}``)."""

    id: str
    impl: str
    requirement: str
    bug: str
    like: str
    caught: bool = False
    catching: list[dict] = field(default_factory=list)
    other: list[dict] = field(default_factory=list)


def _catching(cell: CellResult, requirement: str, control_failed: set[tuple[str, str]]) -> list[dict]:
    """The failed checks of ``cell`` that cite ``requirement`` and did not fail in the
    control's cell of the same scenario (a check the unmutated implementation fails too
    says nothing about the mutant)."""
    if cell.verdict not in (Verdict.FAIL, Verdict.WARN):
        return []
    return [{"scenario": cell.scenario, "check": check["name"], "detail": check["detail"]}
            for check in cell.checks if check["ok"] is False and check["requirement"] == requirement
            and (cell.scenario, check["name"]) not in control_failed]


def unconfirmed(cell: CellResult, rerun: bool) -> bool:
    """Whether judged ``cell`` catches nothing whatever it failed: a first run that failed only
    on timing bounds while starved (harness.judge.load.needs_alone: its rerun alone decides), or
    a ``rerun`` whose own threads waited for a core (harness.judge.load.rerun_starved).  The one
    rule EarlyStop and :func:`outcomes` both hold a catch to."""
    from harness.judge.load import needs_alone, rerun_starved

    return rerun_starved(cell) if rerun else needs_alone(cell)


class EarlyStop:
    """A mutant needs one catching cell: once a finished cell of it fails a check citing its
    requirement, its cells not yet started are skipped (the run's ``Callbacks``: ``on_cell``
    judges each finished cell, ``skip`` answers the scheduler, for the reruns alone too): a
    mutant's cell catches only once the control's cell of its scenario has ended, on a check the
    control did not fail, as :func:`outcomes` counts; one that failed only on timing bounds while
    starved catches nothing until its rerun alone does.  Such a starved catch is *provisional*:
    the mutant's other cells are deferred (``skip`` declines them, and its other reruns alone)
    until that rerun has run; if the rerun does not catch, the scheduler runs what was deferred
    in another round (harness.drive.scheduler._rounds).  :meth:`priority` puts
    each mutant's cells of the scenarios citing its requirement first, so the cell likeliest
    to catch it runs before the rest.  The verdicts and the score still come from the run's
    result tree (:func:`outcomes`); this only decides what need not run.

    ``planted``: impl name -> its ``planted`` dict; ``scenarios``: id -> Scenario; ``seed``:
    the run's.  Thread-safe (the scheduler calls from its worker threads)."""

    def __init__(self, planted: dict[str, dict], scenarios: dict, seed: int):
        self.planted, self.scenarios, self.seed = planted, scenarios, seed
        self.caught: set[str] = set()
        self.control_failed: dict[str, set[str]] = {}  # scenario -> the checks its control cell failed
        self.provisional: dict[str, str] = {}  # impl -> the scenario of its starved catch awaiting its rerun alone
        self._lock = threading.Lock()

    def priority(self) -> dict[tuple[str, str], int]:
        """(scenario id, impl) -> when a mutant's cell starts (lower first; the control's cells,
        absent, start first): each mutant's cells ranked 1, 2, ... in its own order, the
        scenarios citing its requirement before its others, and within each the cheapest first
        (Scenario.expected_s: waits and steps), so a mutant a short cell catches never waits
        out its long ones.  The ranks interleave the mutants: every mutant's first cell, then
        every second one, so a mutant's next cell starts only after many others' and its first
        catch has usually been judged by then (its later cells are then skipped) instead of all
        its cheap cells running at once."""
        cost = {sid: sc.expected_s(self.seed) for sid, sc in self.scenarios.items()}
        out = {}
        for impl, bug in self.planted.items():
            order = sorted(self.scenarios, key=lambda sid: (bug["requirement"] not in self.scenarios[sid].requirements,
                                                           cost[sid], sid))
            out.update({(sid, impl): rank for rank, sid in enumerate(order, start=1)})
        return out

    def skip(self, impl: str, scenario: str) -> bool:
        """Whether ``impl``'s cell (or rerun alone) of ``scenario`` need not run now: its mutant
        was caught, or waits for the rerun alone of another scenario's provisional catch."""
        with self._lock:
            return impl in self.caught or self.provisional.get(impl, scenario) != scenario

    def on_alone(self, cell) -> None:
        """A cell run once more alone ended: it may catch its mutant (and spare that mutant's other
        reruns); whatever it shows, the provisional catch it was run for is settled (confirmed, or
        dropped so that what waited for it runs: a stuck mark would leave them unrun)."""
        try:
            self._judge(cell, alone=True)
        finally:
            with self._lock:
                if self.provisional.get(cell.impl) == cell.scenario:
                    del self.provisional[cell.impl]

    def on_cell(self, done: int, total: int, cell) -> None:
        """A cell (harness.drive.runner.CellRun) ended: the control's failures are noted, a mutant's catch too."""
        self._judge(cell, alone=False)

    def _judge(self, cell, alone: bool) -> None:
        from harness.judge.judge import judge_cell
        from harness.spec import history as hist

        bug = self.planted.get(cell.impl)
        path = Path(cell.workdir) / "history.jsonl"
        if cell.impl in self.caught or not path.is_file():
            return
        judged = judge_cell(self.scenarios[cell.scenario], self.seed, hist.load(path), cell.impl, None)
        if bug is None:  # the control: a check it fails catches nothing in that scenario (as in outcomes)
            with self._lock:
                self.control_failed[cell.scenario] = {c["name"] for c in judged.checks if c["ok"] is not True}
            return
        # failed only on timing bounds while starved: its rerun decides (a rerun that waited for a core: nothing)
        starved = unconfirmed(judged, rerun=alone)
        with self._lock:
            control = self.control_failed.get(cell.scenario)
            if control is None:  # the control's cell has not ended: a catch cannot be told yet
                return
            catches = bool(_catching(judged, bug["requirement"], {(cell.scenario, name) for name in control}))
            if catches and not starved:
                self.caught.add(cell.impl)
            elif catches and not alone:  # provisional: the mutant's other cells wait for this one's rerun
                self.provisional.setdefault(cell.impl, cell.scenario)


def outcomes(result: RunResult, planted: dict[str, dict]) -> tuple[list[MutantOutcome], list[dict]]:
    """Each mutant's outcome in ``result`` (``planted``: impl name -> its ``planted`` dict,
    harness.implementations.Implementation), in ``planted``'s order, and the control's
    problems: every cell of an unmutated implementation that is not PASS
    (``{"scenario", "impl", "verdict", "reason"}``).  A check that also failed (or could
    not tell) in the control's cell of the same scenario catches nothing."""
    control_cells = [c.alone or c for c in result.cells if c.impl not in planted]
    control_failed = {(c.scenario, check["name"]) for c in control_cells for check in c.checks
                      if check["ok"] is not True}
    found = []
    for impl, bug in planted.items():
        out = MutantOutcome(id=bug["id"], impl=impl, requirement=bug["requirement"], bug=bug["bug"],
                            like=bug["like"])
        for first in (c for c in result.cells if c.impl == impl):
            cell = first.alone or first  # a rerun alone settles its cell
            # a starved timing failure not run again alone is no catch (EarlyStop skipped its rerun)
            hits = [] if unconfirmed(cell, rerun=first.alone is not None) else _catching(cell, out.requirement,
                                                                                        control_failed)
            out.catching += hits
            if not hits and cell.verdict != Verdict.PASS:
                out.other.append({"scenario": cell.scenario, "verdict": str(cell.verdict), "reason": cell.reason})
        out.caught = bool(out.catching)
        found.append(out)
    control = [{"scenario": c.scenario, "impl": c.impl, "verdict": str(c.verdict), "reason": c.reason}
               for c in control_cells if c.verdict != Verdict.PASS]
    return found, control


def score_line(found: list[MutantOutcome]) -> str:
    """The last line of the report: ``N of M mutants caught``."""
    return f"{sum(m.caught for m in found)} of {len(found)} mutants caught"


def write_mutants(folder: Path, found: list[MutantOutcome], control: list[dict], duration_s: float,
                  jobs: int, skipped: int | None = None) -> tuple[Path, Path]:
    """mutants.json (one entry per mutant: id, requirement, caught, the catching cells) and
    mutants.md (the catalogue as a table, strings escaped) into ``folder``, atomically.
    ``skipped``: cells not run because their mutant was already caught (None: every cell ran)."""
    caught = sum(m.caught for m in found)
    data = {"score": {"caught": caught, "total": len(found)}, "duration_s": duration_s, "jobs": jobs,
            "skipped_cells": skipped, "control": control, "mutants": [asdict(m) for m in found]}
    return write_json_and_markdown(folder, "mutants", data,
                                   mutants_markdown(found, control, duration_s, jobs, skipped))


def mutants_markdown(found: list[MutantOutcome], control: list[dict], duration_s: float, jobs: int,
                     skipped: int | None = None) -> str:
    """The mutant catalogue and what caught each, as Markdown."""
    lines = [f"## pdconform: mutants, {score_line(found)} ({duration_s:.0f} s, --jobs {jobs})", ""]
    if skipped is not None:
        lines += [f"Each mutant stopped at its first catch: {skipped} cell(s) of caught mutants were not run, so "
                  "\"caught by\" names the catching cells that ran (`--all-cells` runs every cell).", ""]
    if control:
        lines += ["The control (the unmutated implementation) did not pass everywhere, so a catch may not be "
                  "the mutant's:", ""]
        lines += [f"- {md(c['scenario'])} x {md(c['impl'])}: {md(c['verdict'])} {md_code(c['reason'])}"
                  for c in control]
        lines.append("")
    lines += ["| mutant | requirement | planted bug | caught by |", "|---|---|---|---|"]
    for m in found:
        if m.caught:
            by = ", ".join(sorted({f"{md(h['scenario'])}: {md(h['check'])}" for h in m.catching}))
        else:
            elsewhere = "; ".join(f"{md(o['scenario'])} {md(o['verdict'])}" for o in m.other) or "nothing failed"
            by = f"**not caught** ({elsewhere})"
        lines.append(f"| {md(m.id)} | {md(m.requirement)} | {md(m.bug)} | {by} |")
    lines += ["", score_line(found)]
    return "\n".join(lines) + "\n"
