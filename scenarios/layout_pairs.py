"""layout-pairs: layout pairs whose two sides are drawn on their own, as two sglang configs
may set them (attention kind, layers, draft KV layers, page size, KV heads, bytes per head;
each side its whole model, since a decode holding one stage would run PP > 1), each
transferred for real on roles of its own (R-LAYOUT-2).

The spec's planner (harness.spec.layout_plan.plan_pair) says for each pair where every
buffer lands or that the pair must be refused.  A served pair must arrive byte-exact.  A
refused one must be refused visibly (harness.judge.layout_pairs): an explicit error at any
step (sglang's bootstrap checks raise while the decode opens its receiver) or the decode's
room Failed with a reason, before any write, before the decode's waiting timeout, with a
reason that is not a timeout; a hang, a timeout, a reasonless end or a dead thread is a
silent refusal.  A pair whose roles the harness could not start is an error (the check then
cannot tell), and one the engine refuses on this machine (an adapter's Unsupported, such as
NIXL's DRAM refusals) is not judged here.  The check counts the outcomes, lists every pair
that did not go right, and names, for each way a pair went wrong, the smallest pair found
that goes wrong the same way.
``PDCONFORM_LAYOUT_PAIRS`` sets how many pairs (default 6; ``make nightly`` draws 24).  It runs when
named (``pdconform run --scenario layout-pairs``) or in a ``--topology nightly`` run, not in
the default matrix: its transfers cost a CI gate too much.
"""

from __future__ import annotations

import os

from harness.judge import checks as c
from harness.judge.layout_pairs import pairs_as_specified
from harness.spec.scenario import Scenario, register
from harness.spec.steps import TransferPairs

PAIRS_ENV = "PDCONFORM_LAYOUT_PAIRS"


def _count() -> int:
    """Pairs per cell: ``PDCONFORM_LAYOUT_PAIRS`` (a positive whole number), 6 when unset.
    ValueError, naming the variable, for anything else (the cell then says so)."""
    value = os.environ.get(PAIRS_ENV, "").strip()
    if not value:
        return 6
    if not (value.isascii() and value.isdigit() and int(value) > 0):
        raise ValueError(f"{PAIRS_ENV} must be a positive whole number of layout pairs, got {value[:40]!r}")
    return int(value)


def steps(seed: int):
    return [TransferPairs(count=_count(), seed=seed)]


def checks(seed: int):
    return [c.Check("pairs-as-specified", "R-LAYOUT-2", pairs_as_specified()),
            c.Check("no-dead-thread", "R-LIVE-2", c.no_dead_threads())]


SCENARIO = register(
    Scenario(
        id="layout-pairs",
        title="Layout pairs drawn side by side (heads, pages, layers, draft KV): served byte-exact or refused "
              "visibly, as the spec's planner says",
        steps=steps,
        checks=checks,
        timeout_s=240.0,
        topologies=(("p1-d1",), "it draws both sides' layouts itself and starts roles of its own for each pair"),
        nightly="each pair starts two roles of its own: about 12 real transfers per backend, 25 s of CPU for NIXL "
                "(docs/performance.md)",
    )
)
