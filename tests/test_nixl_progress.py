"""The NIXL progress-thread setting (backends/nixl/adapter.py): applied to the real agent,
recorded in results.json, shown in the reports and carried into the repro command."""

import subprocess
import sys
from pathlib import Path

import pytest

from harness.report.terminal import engine_settings_line, reproduce_command
from harness.report.files import summary_markdown
from harness.judge.results import CellResult, RunResult, SglangInfo

ROOT = Path(__file__).resolve().parents[1]

# A real agent with sglang's configuration (no backends in the config, STRICT sync, then
# the UCX backend), idle for a second: the process's CPU time in that second.
IDLE_CPU = """
import os, sys, time
os.environ.setdefault("UCX_TLS", "tcp"); os.environ.setdefault("UCX_NET_DEVICES", "lo")
from backends.nixl.adapter import install_progress_delay
assert install_progress_delay(int(sys.argv[1]))
from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t
agent = nixl_agent("t", nixl_agent_config(backends=[], sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT))
agent.create_backend("UCX", {})
t0 = time.process_time(); time.sleep(1.0); print(time.process_time() - t0, flush=True)
os._exit(0)  # nixl's threads can crash an interpreter shutdown (SIGSEGV); the roles leave the same way
"""


def idle_cpu_s(delay_us: int) -> float:
    proc = subprocess.run([sys.executable, "-c", IDLE_CPU, str(delay_us)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return float(proc.stdout.strip().splitlines()[-1])


def test_the_delay_reaches_the_real_agents_progress_thread():
    pytest.importorskip("nixl")
    delayed, busy = idle_cpu_s(100), idle_cpu_s(0)
    # nixl's default (0) polls in a busy loop: a core's worth of CPU while nothing moves
    assert delayed < 0.25, f"progress thread still busy with a 100 us delay: {delayed:.2f} s CPU in 1 s"
    assert busy > max(0.3, 2 * delayed), f"delay 0 should be nixl's busy loop: {busy:.2f} s CPU in 1 s"


def test_bad_delay_value_is_a_clear_error(monkeypatch):
    from backends.nixl.adapter import progress_delay_us

    monkeypatch.setenv("PDCONFORM_NIXL_PROGRESS_DELAY_US", "-5")
    with pytest.raises(ValueError, match="PDCONFORM_NIXL_PROGRESS_DELAY_US=-5"):
        progress_delay_us()
    monkeypatch.setenv("PDCONFORM_NIXL_PROGRESS_DELAY_US", "250")
    assert progress_delay_us() == 250


def _run(delay: int | None) -> RunResult:
    settings = {} if delay is None else {"nixl_progress_delay_us": delay}
    return RunResult(sglang=SglangInfo(version="0.5.23", path=None), seed=1, engine_settings=settings, cells=[
        CellResult(impl="nixl", scenario="happy-path", verdict="FAIL", engine="real", reason="x"),
        CellResult(impl="mooncake", scenario="happy-path", verdict="FAIL", engine="real", reason="x")])


def test_reports_and_repro_say_which_progress_thread_ran():
    default, busy, old = _run(100), _run(0), _run(None)
    assert "sleeps 100 us" in engine_settings_line(default) and "sleeps 100 us" in summary_markdown(default)
    assert "busy loop, as sglang runs it" in summary_markdown(busy)
    assert engine_settings_line(old) == ""  # a results.json from before the setting existed
    nixl_cell, mooncake_cell = busy.cells
    assert reproduce_command(busy, nixl_cell).endswith("--engine-setting nixl_progress_delay_us=0")
    assert "--engine-setting" not in reproduce_command(busy, mooncake_cell)
    assert "--engine-setting" not in reproduce_command(default, default.cells[0])
