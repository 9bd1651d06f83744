"""An implementation's KV layout planning against the planning rules (R-LAYOUT-2).

:func:`plan_difference` names, by buffer identity, the first pair an implementation's
own planning (RoleAdapter.plan_layouts) gets wrong for a generated layout
(harness.spec.layouts), or None when it agrees with harness.spec.layout_plan.  The
draft-kv-layout check decides with it; the cell's PlanLayouts executor uses it too, to
choose which layouts to shrink.
"""

from __future__ import annotations

import re

from harness.spec.layout_plan import Plan, plan, side_buffers
from harness.spec.layouts import to_spec


def difference_kind(problem: str) -> str:
    """A difference's kind: its text with numbers blurred, so that the same planning
    mistake on different layers counts once (a V sent to a V of another layer and a
    V sent to a draft K stay two kinds)."""
    return re.sub(r"\d+", "#", problem)[:100]


def plan_difference(spec: dict, result: dict) -> str | None:
    """None when ``result`` agrees with the planning rules (harness.spec.layout_plan) for ``spec``; otherwise
    what differs, by buffer identity (R-LAYOUT-2)."""
    s = to_spec(spec)
    expected = plan(s)
    src_ids, dst_ids = side_buffers(s.attention, s.prefill), side_buffers(s.attention, s.decode)

    def name(ids, index):
        return ids[index].describe() if 0 <= index < len(ids) else f"buffer #{index} (out of range)"

    if not isinstance(expected, Plan):
        if "pairs" in result and result["pairs"]:
            src, dst = result["pairs"][0]
            return (f"writes a layout the spec rejects ({expected.reason}): e.g. prefill {name(src_ids, src)} "
                    f"-> decode {name(dst_ids, dst)}")
        return None
    if "pairs" not in result:
        return f"refuses a layout the spec serves: {result.get('rejected') or result}"
    want = {(p.src, p.dst) for p in expected.pairs}
    got = {tuple(p) for p in result["pairs"]}
    for src, dst in sorted(got - want):
        right = next((p.dst for p in expected.pairs if p.src == src), None)
        should = f"decode {name(dst_ids, right)}" if right is not None else "nowhere"
        return f"prefill {name(src_ids, src)} -> decode {name(dst_ids, dst)} (reference: {should})"
    for src, dst in sorted(want - got):
        return f"prefill {name(src_ids, src)} is never sent (reference: -> decode {name(dst_ids, dst)})"
    return None


