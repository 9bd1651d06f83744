"""harness.spec.layouts: the judge agrees with the reference planner and names a wrong pair by identity."""

from hypothesis import given, settings

from harness.spec.layout_plan import Plan, plan
from harness.judge import layout_check
from harness.spec import layouts


@settings(max_examples=200)
@given(layouts.layout_specs())
def test_reference_plans_agree_with_themselves(spec):
    result = plan(layouts.to_spec(spec))
    answer = {"pairs": [[p.src, p.dst] for p in result.pairs]} if isinstance(result, Plan) else {"rejected": "x"}
    assert layout_check.plan_difference(spec, answer) is None


def test_a_v_page_sent_to_the_draft_k_buffer_is_named():
    spec = {"attention": "MHA", "num_layers": 1, "stages": 1, "prefill": [0, 1, 0], "decode": [0, 1, 1]}
    # decode buffers: layer 0 K, layer 0 V, draft 0 K, draft 0 V
    problem = layout_check.plan_difference(spec, {"pairs": [[0, 0], [1, 2]]})
    assert problem == "prefill layer 0 V -> decode draft layer 0 K (reference: decode layer 0 V)"


def test_a_refusal_of_a_servable_layout_is_reported():
    spec = {"attention": "MLA", "num_layers": 4, "stages": 2, "prefill": [2, 4, 0], "decode": [0, 4, 0]}
    assert layout_check.plan_difference(spec, {"rejected": "IndexError"}).startswith("refuses a layout the spec serves")
    assert "prefill stage [2, 4) of 2" in layouts.describe(spec)


def test_kind_blurs_layer_numbers():
    a = layout_check.difference_kind("prefill layer 3 V -> decode draft layer 0 K (reference: decode layer 3 V)")
    b = layout_check.difference_kind("prefill layer 1 V -> decode draft layer 1 K (reference: decode layer 1 V)")
    assert a == b


def test_kind_keeps_where_a_buffer_went():
    to_draft = layout_check.difference_kind("prefill layer 0 V -> decode draft layer 0 K (reference: decode layer 0 V)")
    to_other_layer = layout_check.difference_kind("prefill layer 3 V -> decode layer 2 V (reference: decode layer 3 V)")
    assert to_draft != to_other_layer


@settings(max_examples=60, deadline=None)
@given(layouts.multi_stage_specs())
def test_the_stages_of_a_multi_stage_layout_cover_the_model_once(spec):
    """Every layer on exactly one stage, in order; the prefill's draft layers on the last
    stage only; the decode holds the whole model."""
    stages, decode = layouts.stage_role_layouts(spec)
    assert len(stages) == spec["stages"] > 1
    assert [layer for stage in stages for layer in stage.main_layers] == list(range(spec["num_layers"]))
    assert [stage.draft_layers for stage in stages] == [0] * (len(stages) - 1) + [spec["prefill"][2]]
    assert list(decode.main_layers) == list(range(spec["num_layers"])) and decode.draft_layers == spec["decode"][2]
