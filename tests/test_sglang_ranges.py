"""Each implementation declares the sglang releases it supports; outside them its
cells are UNSUPPORTED with a reason naming the release, never a crash.

None of this needs the sglang release under test installed: ranges are data, and
the out-of-range path never imports the adapter.
"""

import pytest

from backends.sglang_releases import SGLANG_COMMON_RANGE
from cellruns import run_one
from harness import implementations as im
from harness.role.adapter import Unsupported
from harness.target.version import VERSION_ENV, SglangRange, release_of


@pytest.mark.parametrize("version, release", [
    ("0.5.17", (0, 5, 17)), ("0.5.18.post1", (0, 5, 18)), ("0.5.18rc2", (0, 5, 18)),
    ("0.5.23+cpu", (0, 5, 23)), ("1.0", (1, 0, 0)), ("0.5.dev3", (0, 5, 0)),
])
def test_a_version_belongs_to_its_release(version, release):
    assert release_of(version) == release


def test_a_version_without_a_release_number_is_rejected():
    with pytest.raises(ValueError, match="not a release version"):
        release_of("latest")


def test_the_reference_runs_against_any_release():
    reference = im.implementation("reference")
    assert reference.sglang_range is None
    assert reference.unsupported_sglang("0.4.0") is None
    assert reference.unsupported_sglang(None) is None


@pytest.mark.parametrize("impl", ["mooncake", "nixl", "mori"])
@pytest.mark.parametrize("version, supported", [
    ("0.5.16", False), ("0.5.17", True), ("0.5.18", True), ("0.5.18.post1", True),
    ("0.5.19", False), ("0.5.20", False), ("0.5.21", False), ("0.5.22", True), ("0.5.23", True), ("0.6.0", True),
    # a checkout of main, a post or local build: their release decides, never the suffix
    ("0.5.24.dev0", True), ("0.5.24.dev12+g0a1b2c3", True), ("0.5.23.post1", True), ("0.5.23+abc", True),
    ("0.5.24rc1", True), ("0.5.20.dev0", False), ("0.5.17.post2", True),
])
def test_sglang_backends_declare_the_releases_they_were_checked_on(impl, version, supported):
    declared = im.implementation(impl).sglang_range
    assert declared is SGLANG_COMMON_RANGE
    assert declared.contains(version) is supported
    assert (im.implementation(impl).unsupported_sglang(version) is None) is supported


def test_a_range_reads_as_its_spans():
    assert str(SGLANG_COMMON_RANGE) == "0.5.17 - 0.5.18, >= 0.5.22"
    assert str(SglangRange(spans=(((0, 5, 20), (0, 5, 20)),))) == "0.5.20"


def test_the_reason_names_the_release_the_range_and_why():
    reason = im.implementation("nixl").unsupported_sglang("0.5.20")
    assert reason.startswith(
        "sglang 0.5.20 is outside the releases the nixl adapter supports (0.5.17 - 0.5.18, >= 0.5.22;")
    assert "0.5.19 - 0.5.21 have neither shape" in reason
    assert "sglang is not installed" in im.implementation("mori").unsupported_sglang(None)


def test_an_out_of_range_role_refuses_every_step_with_the_reason():
    role = im.OutOfRangeRole("mooncake", "prefill", "sglang 0.5.20 is outside ...")
    for call in (lambda: role.start_prefill(layout={}, bootstrap_port=1),
                 lambda: role.start_decode(layout={}, bootstrap_port=1),
                 lambda: role.open_sender(room=1, bootstrap_addr="x"),
                 lambda: role.arm_point("worker-take-chunk", "pause"),
                 lambda: role.plan_layouts([])):
        with pytest.raises(Unsupported, match=r"sglang 0\.5\.20 is outside"):
            call()
    role.teardown()  # shutting the role down still works
    assert role.observe()["role"] == "prefill"


def test_an_out_of_range_adapter_is_never_imported(monkeypatch):
    monkeypatch.setenv(VERSION_ENV, "0.5.20")  # as a --sglang-src tree of that release sets it
    role = im.load_role_adapter("nixl", role="decode", recorder=None)
    assert isinstance(role, im.OutOfRangeRole)
    assert role.impl == "nixl" and "sglang 0.5.20" in role.reason


def test_a_cell_outside_the_declared_range_is_unsupported(tmp_path):
    """Through real role processes: the test-only implementation declares a range no
    release is in, so whatever sglang is installed its happy-path cell is UNSUPPORTED."""
    result = run_one("selftest-out-of-range", "happy-path", tmp_path / "cell")
    assert result.verdict == "UNSUPPORTED", result.reason
    assert "start_prefill" in result.reason
    assert "is outside the releases the selftest-out-of-range adapter supports (0.0.0; no real release" in result.reason


@pytest.mark.parametrize("version, strategy", [
    ("0.5.24.dev0", "published-runtime-context"), ("0.5.23+abc", "published-runtime-context"),
    ("0.5.18.post1", "parallel-state-globals"),
])
def test_a_dev_post_or_local_version_gets_its_releases_role_context(version, strategy):
    from harness.target.role_context import strategy_for

    assert strategy_for(version).name == strategy
