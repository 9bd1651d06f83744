"""Executors of the layout steps: an implementation's own planning of generated layouts
(shrunk where it differs from harness.spec.layout_plan), and real transfers for some of
them (harness.spec.steps.PlanLayouts, TransferLayouts; harness.spec.layouts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.drive.errors import CellAborted, RoleError
from harness.drive.executors import lifecycle
from harness.judge import layout_check
from harness.spec import layouts
from harness.spec import steps as s
from harness.spec.frames import sample
from harness.spec.history import Event, Op

if TYPE_CHECKING:
    from harness.drive.cell import CellDriver

SHRINK_EXAMPLES = 100  # hypothesis examples per shrink


def plan_layouts(d: "CellDriver", step: s.PlanLayouts) -> None:
    """Ask the role to plan ``step.count`` generated layouts; shrink one layout per kind of
    difference from the planning rules (by asking the role again about smaller ones) and
    record specs, answers and shrunk layouts as one ``layout-shrink`` event."""
    specs = sample(layouts.layout_specs(), step.count, step.seed)
    results = d.call(step.role, "plan_layouts", specs=specs)
    if results is None:
        return
    failures: dict[str, tuple[dict, str]] = {}
    for spec, result in zip(specs, results):
        problem = layout_check.plan_difference(spec, result)
        if problem is not None:
            failures.setdefault(layout_check.difference_kind(problem), (spec, problem))
    client = d.clients[step.role]
    shrunk = [_shrink(client, kind, spec) for kind, (spec, _) in list(failures.items())[: step.max_shrinks]]
    d.record(Event.INFO, Op.LAYOUT_SHRINK, step.role, args={"count": len(specs)},
             value={"specs": specs, "results": results, "shrunk": shrunk})


def _shrink(client, kind: str, spec: dict) -> dict:
    """The smallest layout hypothesis finds that the role still plans wrongly in the same way."""
    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample

    def still_fails(candidate: dict) -> bool:
        answer = client.call("plan_layouts", lifecycle.CALL_TIMEOUT_S, specs=[candidate])[0]
        found = layout_check.plan_difference(candidate, answer)
        return found is not None and layout_check.difference_kind(found) == kind

    try:
        small = find(layouts.layout_specs(), still_fails,
                     settings=settings(max_examples=SHRINK_EXAMPLES, database=None, deadline=None, derandomize=True,
                                       suppress_health_check=list(HealthCheck)))
    except (NoSuchExample, RoleError):
        small = spec
    answer = client.call("plan_layouts", lifecycle.CALL_TIMEOUT_S, specs=[small])[0]
    return {"spec": small, "layout": layouts.describe(small), "problem": layout_check.plan_difference(small, answer),
            "first_seen": layouts.describe(spec)}


def transfer_layouts(d: "CellDriver", step: s.TransferLayouts) -> None:
    """Real transfers, each on its own roles, for generated single-stage layouts and up to
    three the last PlanLayouts shrunk, then for multi-stage ones (one role per prefill
    stage) and up to two shrunk ones; a layout the machine cannot serve is skipped and
    recorded (RoleAdapter.unsupported_layout)."""
    shrunk = [e["value"]["shrunk"] for e in d.history.events if e["op"] == Op.LAYOUT_SHRINK]
    shrunk = [entry["spec"] for entry in (shrunk[-1] if shrunk else [])]
    single = sample(layouts.single_stage_specs(), step.count, step.seed)
    single += [spec for spec in shrunk if spec["stages"] == 1][:3]
    multi = sample(layouts.multi_stage_specs(), step.multi_stage, step.seed) if step.multi_stage else []
    multi += [spec for spec in shrunk if spec["stages"] > 1 and layouts.whole_model_decode(spec)][:2]
    for i, spec in enumerate(single + multi):
        _transfer_one(d, spec, i, step.seed + i, multi_stage=i >= len(single))


def _transfer_one(d: "CellDriver", spec: dict, i: int, seed: int, multi_stage: bool) -> None:
    """Start this layout's roles (``multi_stage``: one per prefill PP stage), run one room to its
    end and verify it, then retire the roles; a start that fails is recorded as this
    layout's problem, not the cell's."""
    if multi_stage:
        stage_layouts, decode_layout = layouts.stage_role_layouts(spec)
        prefills = tuple(f"prefill-L{i}-pp{k}" for k in range(len(stage_layouts)))
        start = s.StartRoles(prefills=prefills, decodes=(f"decode-L{i}",), layout=stage_layouts[0],
                             decode_layout=decode_layout, prefill_stages=tuple(stage_layouts))
    else:
        prefill_layout, decode_layout = layouts.role_layouts(spec)
        prefills = (f"prefill-L{i}",)
        start = s.StartRoles(prefills=prefills, decodes=(f"decode-L{i}",), layout=prefill_layout,
                             decode_layout=decode_layout)
    prefill, decode = prefills[0], f"decode-L{i}"
    why_not = d.call("prefill", "unsupported_layout", spec=spec) if "prefill" in d.clients else None
    d.record(Event.INFO, Op.LAYOUT_TRANSFER, prefill,
             args={"layout": layouts.describe(spec) + (f"; all {len(prefills)} stages sent, one role each" if multi_stage
                                                       else ""), "spec": spec, "skipped": why_not, "decode": decode,
                   "stages": list(prefills) if multi_stage else []})
    if why_not:
        return
    try:
        lifecycle.start_roles(d, start)
    except CellAborted as exc:  # this layout's roles did not start: its own problem, not the cell's
        d.record(Event.FAIL, Op.LAYOUT_START, prefill, args={}, error=str(exc))
        d.retire([n for n in (*prefills, decode) if n in d.clients])
        return
    try:
        for sub_step in layouts.transfer_steps(spec, prefill, decode, seed=seed, stages=prefills if multi_stage else ()):
            d.execute(sub_step)
    finally:
        d.retire([*prefills, decode])
