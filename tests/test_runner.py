"""Cell isolation: a hanging cell is killed at its deadline, reported ERROR, and the run goes on."""

import json
import subprocess
import sys
import time

import psutil

from harness.runner import run_matrix
from harness.scenario import get_scenario


def _role_processes():
    return [p for p in psutil.process_iter(["cmdline"])
            if any("harness.cell" in a or "harness.role_host" in a for a in (p.info["cmdline"] or []))]


def test_hanging_cell_is_killed_and_the_run_continues(tmp_path):
    scenarios = [get_scenario("selftest-hang"), get_scenario("selftest-noop")]
    start = time.monotonic()
    run = run_matrix(["mooncake"], scenarios, seed=0, out_dir=tmp_path)
    elapsed = time.monotonic() - start
    hang, noop = run.cells
    assert hang.verdict == "ERROR"
    assert "exceeded its deadline of 3 s and was killed" in hang.reason
    assert "in step 0 Sleep" in hang.reason
    assert noop.verdict == "PASS"
    assert elapsed < 30
    assert not _role_processes()


def test_cli_exit_code_and_results_for_a_hanging_cell(tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--impl", "mooncake",
                          "--scenario", "selftest-hang", "--scenario", "selftest-noop", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert [c["verdict"] for c in data["cells"]] == ["ERROR", "PASS"]
    assert "deadline" in out.stdout
