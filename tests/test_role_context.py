"""The role context picks a strategy per sglang release and says clearly when it has none."""

import pytest

from harness.target import role_context as rc


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


@pytest.mark.parametrize("version", ["0.5.17", "0.5.18", "0.5.18.post1"])
def test_releases_before_the_published_context_use_the_parallel_state_globals(version):
    assert rc.strategy_for(version).name == "parallel-state-globals"


def test_the_published_context_strategy_keeps_its_range():
    published = rc.strategy_for("0.5.19")
    assert published.name == "published-runtime-context"
    assert (published.min_version, published.max_version) == ((0, 5, 19), None)


@pytest.mark.parametrize("version", ["0.5.16", "0.5.16.post3", "0.4.9"])
def test_releases_before_0_5_17_name_both_ranges(version):
    with pytest.raises(rc.UnsupportedSglang) as raised:
        rc.strategy_for(version)
    assert "published-runtime-context: >= 0.5.19" in str(raised.value)
    assert "parallel-state-globals: >= 0.5.17, <= 0.5.18" in str(raised.value)


def test_an_upper_end_includes_post_releases_of_that_release():
    strategy = rc.ContextStrategy("s", (0, 5, 17), (0, 5, 18), lambda settings: None)
    assert strategy.covers("0.5.18.post2")
    assert not strategy.covers("0.5.19")
    assert not strategy.covers("0.5.16.post1")


@pytest.mark.parametrize("version", ["0.5.2rc2", "0.5.1.dev10", "0.5.3+cpu", "latest"])
def test_a_pre_release_is_judged_by_its_own_release(version):
    # 0.5.2rc2 is a candidate for 0.5.2, not 0.5.22: no strategy covers it, and the run says so.
    with pytest.raises(rc.UnsupportedSglang, match="has no role-context strategy"):
        rc.strategy_for(version)


def test_a_release_candidate_of_a_covered_release_is_covered():
    assert rc.strategy_for("0.5.23rc1").name == "published-runtime-context"
    assert rc.strategy_for("0.5.17rc0").name == "parallel-state-globals"


_STAGE = """
import os, sys, time
from harness.target.role_context import StagePPGroup
group = StagePPGroup(2, int(sys.argv[1]), sys.argv[2])
got = group.broadcast_object({"from": "stage 0"} if group.rank_in_group == 0 else None, src=0)
print("got", got["from"], group.is_first_rank, group.is_last_rank, flush=True)
time.sleep(float(sys.argv[3]))
os._exit(0)  # as a role process ends (no teardown): gloo's threads torn down at exit can abort the process
"""


def test_the_pp_group_of_two_stage_processes_broadcasts_and_listens_on_loopback_only():
    """StagePPGroup: a real gloo group of two processes; stage 0's store socket is bound to the
    rendezvous host (torch's own TCPStore would listen on every interface)."""
    import subprocess
    import sys

    from harness import ROOT
    from harness.drive.ports import free_port_block

    port = free_port_block(1)
    rendezvous = f"tcp://127.0.0.1:{port}"
    stages = [subprocess.Popen([sys.executable, "-c", _STAGE, str(rank), rendezvous, "3" if rank == 0 else "0"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for rank in (0, 1)]
    try:
        out1, err1 = stages[1].communicate(timeout=60)
        assert stages[1].returncode == 0, err1[-2000:]
        assert out1.split() == ["got", "stage", "0", "False", "True"]
        listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
        assert listening.strip() and all(line.split()[3].startswith("127.0.0.1:") for line in listening.splitlines())
        out0, err0 = stages[0].communicate(timeout=60)
        assert stages[0].returncode == 0 and "got stage 0 True False" in out0, err0[-2000:]
    finally:
        for p in stages:
            p.kill()
            p.wait()
