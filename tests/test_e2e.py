"""End to end: sglang 0.5.23's real backends in role processes.

The cells are forked from one fork server for the module (harness.drive.forkserver: sglang
imported once), as `pdconform run` does; the byte-check test starts fresh
interpreters (`--no-fork`), so both paths stay covered.

Expected bytes for happy-path: 5 pages x 256 B x (3 layers x K,V) + one 64 B aux slot.
"""

import pytest

from cellruns import run_one
from harness.drive.forkserver_client import ForkServer
from procs import harness_processes
from scenarios import happy_path

pytestmark = pytest.mark.e2e

EXPECTED_BYTES = happy_path.NUM_PAGES * happy_path.LAYOUT.page_bytes * 2 * happy_path.LAYOUT.num_layers \
    + happy_path.LAYOUT.aux_bytes


@pytest.fixture(scope="module")
def fork_server(tmp_path_factory):
    with ForkServer(impls=["reference", "mooncake", "nixl", "mori"], log_dir=tmp_path_factory.mktemp("fork_server")) as z:
        yield z


def _leftovers(workdir):
    return [p.pid for p in harness_processes(workdir)]


@pytest.mark.parametrize("impl, engine", [("reference", "reference"), ("mooncake", "real"), ("nixl", "real"),
                                          ("mori", "standin")])
def test_happy_path(impl, engine, tmp_path, fork_server):
    cell = run_one(impl, "happy-path", tmp_path, seed=1, fork_server=fork_server)
    assert cell.verdict == "PASS", (cell.reason, cell.checks)
    assert cell.engine == engine
    assert cell.bytes_verified == EXPECTED_BYTES
    assert (tmp_path / "prefill.log").exists() and (tmp_path / "decode.log").exists()
    assert not _leftovers(tmp_path)


def test_byte_check_fails_on_a_wrong_plan_and_names_the_pages(tmp_path):
    """The same real transfer, checked against a plan with two destinations swapped."""
    cell = run_one("mooncake", "selftest-misplaced", tmp_path, seed=1)
    assert cell.verdict == "FAIL"
    assert "R-LAYOUT-1 bytes-exact" in cell.reason
    assert "decode layer 0 K page" in cell.reason and "expected prefill layer 0 K page" in cell.reason
    assert not _leftovers(tmp_path)


SEED_SCENARIOS = ["dead-prefill", "stale-chunk-after-clear", "early-watermark", "malformed-frame", "draft-kv-layout"]


@pytest.mark.parametrize("scenario", SEED_SCENARIOS)
def test_reference_passes_the_seed_scenarios(scenario, tmp_path, fork_server):
    """The oracle conforms to its own spec under every fault the scenarios inject."""
    cell = run_one("reference", scenario, tmp_path, seed=0, fork_server=fork_server)
    assert cell.verdict == "PASS", (cell.reason, cell.checks)
    assert cell.bytes_verified > 0
    assert not _leftovers(tmp_path)


FIELD_SCENARIOS = ["bootstrap-timeout", "waiting-timeout", "abort-unguarded", "abort-mid-transfer",
                   "abort-ack-after-drain", "clear-then-abort", "prefill-restart-new-ports", "room-reuse",
                   "failure-fan-out", "multi-chunk-long-prompt", "transfer-never-completes", "slow-aux",
                   "no-residue", "late-old-abort", "late-old-status", "dead-decode"]


@pytest.mark.parametrize("scenario", FIELD_SCENARIOS)
def test_reference_passes_the_field_scenarios(scenario, tmp_path, fork_server):
    """The field scenarios: the oracle PASSes each (timeouts, ABORTs, restarts, residue)."""
    cell = run_one("reference", scenario, tmp_path, seed=0, fork_server=fork_server)
    assert cell.verdict == "PASS", (cell.reason, cell.checks)
    assert all(check["ok"] for check in cell.checks), cell.checks
    assert not _leftovers(tmp_path)


def test_late_old_messages_catch_nixl_applying_an_ended_lifecycles_abort_and_status(tmp_path, fork_server):
    """B13 (docs/sglang-bugs.md): NIXL's own ABORT and STATUS of a room's first lifecycle,
    delivered after the room was reused, fail the new sender and make the new receiver
    Success before anything was sent (and the aborted first lifecycle was a real abort)."""
    abort = run_one("nixl", "late-old-abort", tmp_path / "abort", seed=0, fork_server=fork_server)
    failed = {check["name"] for check in abort.checks if not check["ok"]}
    assert abort.verdict == "FAIL" and "prefill-ignores-late-abort" in failed, abort.checks
    assert "old-lifecycle-aborted" not in failed
    status = run_one("nixl", "late-old-status", tmp_path / "status", seed=0, fork_server=fork_server)
    failed = {check["name"] for check in status.checks if not check["ok"]}
    assert status.verdict == "FAIL" and "decode-ignores-late-status" in failed, status.checks
    assert not _leftovers(tmp_path / "abort") and not _leftovers(tmp_path / "status")


def test_slow_aux_catches_mori_reporting_success_before_its_aux_lands(tmp_path, fork_server):
    """B12 (docs/sglang-bugs.md): Mori's decode polls Success while the held AUX_DATA is still
    on its own connection, so the verification at Success finds the old aux slot; the one a
    second later finds every byte (the bytes are not lost, only late)."""
    cell = run_one("mori", "slow-aux", tmp_path, seed=0, fork_server=fork_server)
    assert cell.verdict == "FAIL", cell.reason
    failed = {check["name"] for check in cell.checks if not check["ok"]}
    # its own check at the first Success, and the generic one on the rows copied at that read (issue 36)
    assert failed == {"bytes-at-success", "bytes-in-place-at-success"}, cell.checks
    assert "aux buffer 0" in cell.reason and "R-XFER-2" in cell.reason
    assert not _leftovers(tmp_path)


def test_a_multi_stage_prefill_transfers_for_real_one_role_per_stage(tmp_path, fork_server):
    """draft-kv-layout on Mooncake: prefills of several pipeline stages, one role process per
    stage in one gloo PP group, each sending its own layers to a whole-model decode.  MLA
    lands every byte; MHA across stages puts V pages in the wrong decode buffer (B4)."""
    from harness.spec.history import load

    cell = run_one("mooncake", "draft-kv-layout", tmp_path, seed=0, fork_server=fork_server)
    events = load(tmp_path / "history.jsonl")
    staged = [e for e in events if e["op"] == "layout-transfer" and e["args"].get("stages")]
    verified = {e["role"]: e["value"] for e in events if e["op"] == "verify" and e["type"] == "ok"}
    outcomes = {(t["args"]["spec"]["attention"], len(t["args"]["stages"])): verified[t["args"]["decode"]]["ok"]
                for t in staged}
    assert any(ok for (attention, _), ok in outcomes.items() if attention == "MLA"), outcomes
    assert any(not ok for (attention, _), ok in outcomes.items() if attention == "MHA"), outcomes
    starts = [e for e in events if e["op"] == "start_prefill" and e["type"] == "ok" and "-pp" in e["role"]]
    assert {tuple(e["value"]["pp"]) for e in starts} >= {(2, 0), (2, 1)}
    assert cell.verdict == "FAIL" and not _leftovers(tmp_path)


def test_dead_decode_nixl_fails_the_dead_decodes_rooms_in_time_then_keeps_them_after_clear(tmp_path, fork_server):
    """R-PEER-1 on a real backend: the prefill fails both rooms of the killed decode (its writes
    meet a dead peer) and serves the other decode; then, once cleared, keeps the failed rooms in
    _deferred_ack_poisoned_rooms (docs/sglang-bugs.md B8): the residue is judged on the surviving
    prefill only because a killed role needs no clear."""
    cell = run_one("nixl", "dead-decode", tmp_path, seed=0, fork_server=fork_server)
    judged = {check["name"]: check for check in cell.checks}
    peer = [check for check in cell.checks if check["requirement"] == "R-PEER-1"]
    assert len(peer) == 6 and all(check["ok"] for check in peer), peer
    assert cell.verdict == "FAIL" and judged["no-residue-after-clear"]["ok"] is False, cell.reason
    assert "_deferred_ack_poisoned_rooms" in judged["no-residue-after-clear"]["detail"]
    assert not _leftovers(tmp_path)
