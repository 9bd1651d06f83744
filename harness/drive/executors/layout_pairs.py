"""Executor of TransferPairs: real transfers between layout pairs drawn side by side
(harness.spec.layout_pairs), each on roles of its own, and a shrink of the first pair of each
way a pair went wrong, by more real transfers (hypothesis ``find`` over pairs no bigger)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.drive.errors import CellAborted
from harness.drive.executors import lifecycle
from harness.judge import layout_pairs as judged
from harness.spec import layout_pairs as lp
from harness.spec import steps as s
from harness.spec.frames import sample
from harness.spec.history import Event, Op
from harness.spec.layout_plan import Plan

if TYPE_CHECKING:
    from harness.drive.cell import CellDriver

SHRINK_CALLS = 4  # real transfers a shrink may spend, per example of its budget (hypothesis keeps asking)


def transfer_pairs(d: "CellDriver", step: s.TransferPairs) -> None:
    """``step.count`` pairs drawn with ``step.seed``, each transferred for real and judged as it
    ends; then, for up to ``step.max_shrinks`` ways pairs went wrong, the smallest pair found in
    ``step.shrink_examples`` more transfers that goes wrong the same way (a ``layout-pair-shrink``
    event; the first pair itself when none smaller does)."""
    first_wrong: dict[str, dict] = {}
    for i, spec in enumerate(sample(lp.pair_specs(), step.count, step.seed)):
        outcome, _ = _run_pair(d, spec, f"P{i}", step.seed + i)
        if outcome in judged.BROKEN:  # a pair not started or not verified says nothing of the backend to shrink
            first_wrong.setdefault(outcome, spec)
    for n, (outcome, spec) in enumerate(list(first_wrong.items())[: step.max_shrinks]):
        small, detail = _shrink(d, spec, outcome, step.shrink_examples, f"S{n}", step.seed)
        d.record(Event.INFO, Op.LAYOUT_PAIR_SHRINK, None, args={"first_seen": lp.describe(spec)},
                 value={"outcome": outcome, "spec": small, "layout": lp.describe(small), "detail": detail})


def _run_pair(d: "CellDriver", spec: dict, tag: str, seed: int, shrink: bool = False) -> tuple[str, str]:
    """Start the pair's roles (``prefill-<tag>``, ``decode-<tag>``), run one room, retire them;
    its outcome as the judge classifies the events it recorded."""
    prefill, decode = f"prefill-{tag}", f"decode-{tag}"
    plan = lp.expected(spec)
    marker = d.record(Event.INFO, Op.LAYOUT_PAIR, prefill, args={
        "spec": spec, "layout": lp.describe(spec), "prefill": prefill, "decode": decode, "shrink": shrink,
        "expected": "serve" if isinstance(plan, Plan) else "refuse",
        **({} if isinstance(plan, Plan) else {"reason": plan.reason})})
    start = s.StartRoles(prefills=(prefill,), decodes=(decode,), layout=lp.layout(spec["prefill"]),
                         decode_layout=lp.layout(spec["decode"]), env=lp.ENV)
    stalled, ports, started = d.stalled_step, d.ports_used, False
    try:
        lifecycle.start_roles(d, start)
        started = True
        for sub_step in lp.transfer_steps(spec, prefill, decode, seed=seed):
            d.execute(sub_step)
    except CellAborted as exc:  # the pair's own outcome, not the cell's: not started, cut short (bytes unjudged),
        # or a step the engine refused on this machine (``unsupported``: this pair is not judged here)
        d.record(Event.FAIL, Op.LAYOUT_PAIR if started else Op.LAYOUT_START, prefill, args={},
                 error=f"transfer cut short: {exc}" if started else str(exc), unsupported=exc.unsupported)
    finally:
        d.retire([n for n in (prefill, decode) if n in d.clients])
        d.stalled_step = stalled  # a pair's hang is its outcome: later pairs keep their full bounds
        d.ports_used = ports  # the retired pair's bootstrap port serves the next pair
    return judged.classify(marker, d.history.events[marker["seq"] + 1:])


def _size(spec: dict) -> tuple:
    """How big a pair is, for choosing among pairs that went wrong the same way."""
    return tuple(sum(side[k] if isinstance(side[k], int) else len(str(side[k])) for k in sorted(side) if k != "stage")
                 for side in (spec["decode"], spec["prefill"]))


def _shrink(d: "CellDriver", spec: dict, outcome: str, budget: int, tag: str, seed: int) -> tuple[dict, str]:
    """The smallest pair no bigger than ``spec`` that hypothesis finds in about ``budget`` real
    transfers going ``outcome`` too; when hypothesis cannot settle on one (a pair that went
    wrong once and not again: its own flakiness, reported as such by hypothesis), the smallest
    that did; ``spec`` itself when none did."""
    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import HypothesisException

    same: dict[str, tuple[dict, str]] = {lp.describe(spec): (spec, "")}
    calls = [0]

    def same_way(candidate: dict) -> bool:
        calls[0] += 1
        if calls[0] > SHRINK_CALLS * max(1, budget):  # hypothesis shrinks on: stop spending transfers
            return False
        got, detail = _run_pair(d, candidate, f"{tag}-{calls[0]}", seed, shrink=True)
        if got == outcome:
            same[lp.describe(candidate)] = (candidate, detail)
        return got == outcome

    try:
        small = find(lp.smaller_than(spec), same_way,
                     settings=settings(max_examples=budget, database=None, deadline=None, derandomize=True,
                                       suppress_health_check=list(HealthCheck)))
    except (HypothesisException, ExceptionGroup):  # none found, or not reproducible: the smallest seen
        small = min((pair for pair, _ in same.values()), key=_size)
    detail = same.get(lp.describe(small), (small, ""))[1]
    if not detail:  # the first pair itself: run once more for what it did
        detail = _run_pair(d, small, f"{tag}-last", seed, shrink=True)[1]
    return small, detail
