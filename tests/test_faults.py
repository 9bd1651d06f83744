"""Fault mechanisms, on the reference: a kill is detected, injected frames are delivered."""

from cellruns import run_one


def test_killed_prefill_is_detected_by_the_decode(tmp_path):
    cell = run_one("reference", "selftest-kill-detected", tmp_path, seed=0)
    assert cell.verdict == "PASS", (cell.reason, cell.checks)
    history = (tmp_path / "history.jsonl").read_text()
    assert '"type": "nemesis"' in history and '"SIGKILL"' in history


def test_injected_frames_reach_the_control_socket(tmp_path):
    cell = run_one("reference", "selftest-inject-frames", tmp_path, seed=0)
    assert cell.verdict == "PASS", (cell.reason, cell.checks)
    assert cell.bytes_verified > 0


def test_interleaving_point_pauses_the_worker_and_resumes_it(tmp_path):
    cell = run_one("reference", "selftest-point-pause", tmp_path, seed=0)
    assert cell.verdict == "PASS", (cell.reason, cell.checks)
    paused = next(c for c in cell.checks if c["name"] == "paused-then-released")
    assert "while paused the decode saw WaitingForInput" in paused["detail"]


def test_engine_fault_fails_exactly_the_nth_transfer(tmp_path):
    cell = run_one("reference", "selftest-engine-fault", tmp_path, seed=0)
    assert cell.verdict == "PASS", (cell.reason, cell.checks)
    history = (tmp_path / "history.jsonl").read_text()
    assert history.count('"op": "engine-fault"') == 1 and '"transfer": 2' in history
