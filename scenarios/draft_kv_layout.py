"""draft-kv-layout: the backend's own KV layout planning, pair by pair, against the
reference planner, over generated layouts (R-LAYOUT-2).

Layouts (harness.layouts): MHA and MLA; 1-8 layers split into 1-4 prefill
pipeline stages; the decode with one stage or the same stages; draft KV on the
decode only, on both, or on neither.  The adapter runs the implementation's
planning function on each; every layout planned differently is shrunk to a
smallest layout with the same kind of difference and printed.  Then one real
transfer (three layers, PP 1, no draft) is run and verified byte by byte.

Not yet covered: a real transfer for a sampled layout with PP stages or draft KV
(the role pools hold PP 1 without draft buffers).
"""

from __future__ import annotations

from harness import checks as c
from harness import layouts
from harness.scenario import Scenario, register
from harness.steps import PlanLayouts, StartRoles
from scenarios._flows import LAYOUT, Planner, full_room, room_succeeds, verify

COUNT = 200


def steps(seed: int):
    room = Planner(seed).room()
    return [StartRoles(layout=LAYOUT), PlanLayouts("prefill", count=COUNT, seed=seed), *full_room(room), verify([room])]


def _planned_like_reference(events):
    runs = [e for e in events if e["op"] == "layout-shrink"]
    if not runs:
        calls = [e for e in events if e["op"] == "plan_layouts" and e["type"] == "fail"]
        return None, (calls[0].get("error") if calls else "no layouts were planned")
    value = runs[-1]["value"]
    wrong = [(spec, problem) for spec, result in zip(value["specs"], value["results"])
             if (problem := layouts.judge(spec, result)) is not None]
    if not wrong:
        return True, f"{len(value['specs'])} generated layouts planned exactly like the reference planner"
    shown = "; ".join(f"[{s['layout']}] {s['problem']}" for s in value["shrunk"])
    return False, f"{len(wrong)} of {len(value['specs'])} layouts planned wrongly; shrunk: {shown}"


def checks(seed: int):
    room = Planner(seed).room()
    return [
        c.Check("planning-matches-reference", "R-LAYOUT-2", "MUST", _planned_like_reference),
        *room_succeeds(room, "R-XFER-1", "sample-room"),
        c.Check("bytes-exact", "R-LAYOUT-1", "MUST", c.pools_exact()),
    ]


SCENARIO = register(
    Scenario(
        id="draft-kv-layout",
        title="Generated MHA/MLA x PP-stage x draft-KV layouts planned like the reference; shrunk when not",
        requirements=("R-LAYOUT-2", "R-LAYOUT-1", "R-XFER-1"),
        steps=steps,
        checks=checks,
        timeout_s=150.0,
    )
)
