"""The reference layout planner pairs buffers by layer identity (R-LAYOUT-2).

The oracle here is independent arithmetic on KVArgs positions, not the planner's
own lookup: for MHA a side with n main and d draft layers lists K main at
[0, n), V main at [n, 2n), K draft at [2n, 2n+d), V draft at [2n+d, 2n+2d).
"""

from hypothesis import given
from hypothesis import strategies as st

from harness.spec.layout_plan import LayoutSpec, Plan, Rejection, SideLayout, plan


def identity_at(attention, side, index):
    """(draft, layer, kind) of buffer ``index`` by position arithmetic."""
    n, d = side.end_layer - side.start_layer, side.draft_layers
    if attention == "MLA":
        return (False, side.start_layer + index, "KV") if index < n else (True, index - n, "KV")
    if index < n:
        return False, side.start_layer + index, "K"
    if index < 2 * n:
        return False, side.start_layer + index - n, "V"
    if index < 2 * n + d:
        return True, index - 2 * n, "K"
    return True, index - 2 * n - d, "V"


@st.composite
def layouts(draw):
    attention = draw(st.sampled_from(["MHA", "MLA"]))
    num_layers = draw(st.integers(1, 12))
    stages = draw(st.integers(1, num_layers))
    bounds = sorted(draw(st.sets(st.integers(1, num_layers - 1), min_size=stages - 1, max_size=stages - 1))) \
        if stages > 1 else []
    edges = [0, *bounds, num_layers]
    stage = draw(st.integers(0, len(edges) - 2))
    draft = draw(st.sampled_from(["none", "decode", "both"]))
    n_draft = draw(st.integers(1, 2))
    prefill = SideLayout(edges[stage], edges[stage + 1], n_draft if draft == "both" else 0)
    same_stages = draw(st.booleans())
    decode_range = (edges[stage], edges[stage + 1]) if same_stages else (0, num_layers)
    decode = SideLayout(*decode_range, n_draft if draft in ("decode", "both") else 0)
    return LayoutSpec(attention, num_layers, prefill, decode)


@given(layouts())
def test_every_prefill_buffer_lands_in_the_same_layer_on_decode(spec):
    result = plan(spec)
    assert isinstance(result, Plan), result
    n_src = len({p.src for p in result.pairs})
    expected_src = (1 if spec.attention == "MLA" else 2) * (
        spec.prefill.end_layer - spec.prefill.start_layer + spec.prefill.draft_layers)
    assert n_src == len(result.pairs) == expected_src
    assert len({p.dst for p in result.pairs}) == len(result.pairs)
    for pair in result.pairs:
        assert identity_at(spec.attention, spec.prefill, pair.src) == identity_at(spec.attention, spec.decode, pair.dst)


def test_draft_kv_on_decode_only_shifts_nothing():
    spec = LayoutSpec("MHA", 2, SideLayout(0, 2), SideLayout(0, 2, draft_layers=1))
    result = plan(spec)
    # prefill [K0 K1 V0 V1] -> decode [K0 K1 V0 V1 dK0 dV0]: V stays at 2, 3
    assert [(p.src, p.dst) for p in result.pairs] == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_second_pp_stage_into_a_one_stage_decode():
    spec = LayoutSpec("MHA", 4, SideLayout(2, 4), SideLayout(0, 4))
    result = plan(spec)
    # prefill [K2 K3 V2 V3] -> decode [K0 K1 K2 K3 V0 V1 V2 V3]
    assert [(p.src, p.dst) for p in result.pairs] == [(0, 2), (1, 3), (2, 6), (3, 7)]
    assert result.pairs[2].buffer.describe() == "layer 2 V"


def test_rejections_say_why():
    wrong_stage = plan(LayoutSpec("MLA", 4, SideLayout(0, 4), SideLayout(2, 4)))
    assert isinstance(wrong_stage, Rejection) and "does not hold prefill layers 0..1" in wrong_stage.reason
    prefill_draft_only = plan(LayoutSpec("MHA", 2, SideLayout(0, 2, 1), SideLayout(0, 2)))
    assert isinstance(prefill_draft_only, Rejection) and "1 draft KV layer(s) but the decode has 0" in prefill_draft_only.reason
    empty = plan(LayoutSpec("MHA", 2, SideLayout(1, 1), SideLayout(0, 2)))
    assert isinstance(empty, Rejection) and "not a non-empty range" in empty.reason
    assert isinstance(plan(LayoutSpec("GQA", 2, SideLayout(0, 2), SideLayout(0, 2))), Rejection)
