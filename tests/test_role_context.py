"""The role context picks a strategy per sglang release and says clearly when it has none."""

import pytest

from harness import role_context as rc


def test_supported_release_has_a_strategy():
    assert rc.strategy_for("0.5.23").name == "published-runtime-context"
    assert rc.strategy_for("0.5.19.post1").name == "published-runtime-context"


def test_unsupported_release_names_the_supported_ranges():
    with pytest.raises(rc.UnsupportedSglang, match=r"sglang 0\.4\.9 has no role-context strategy.*>= 0\.5\.19"):
        rc.strategy_for("0.4.9")


def test_bad_mode_is_rejected_before_touching_sglang():
    with pytest.raises(ValueError, match="'prefill' or 'decode'"):
        rc.prepare_role(rc.RoleSettings(mode="router", backend="mooncake", bootstrap_port=1))


def test_attention_tp_rank_outside_the_width_is_rejected_before_touching_sglang():
    with pytest.raises(ValueError, match="rank 2 is not a rank of 2"):
        rc.prepare_role(rc.RoleSettings(mode="decode", backend="mooncake", bootstrap_port=1,
                                        attn_tp_size=2, attn_tp_rank=2))
