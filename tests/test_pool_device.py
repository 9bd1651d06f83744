"""run --pool-device: the roles' pools in host memory (cpu) or device memory (cuda).  On a
machine without CUDA the option is refused up front (exit 2, one line); where a GPU is
present, NIXL registers the pools as VRAM and the layouts this CPU machine marks
'needs VRAM' run (that test skips elsewhere, saying why)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.role import pattern
from harness.role.pool_device import POOL_DEVICE_ENV, pool_device
from harness.role.pools import pattern_pools
from harness.spec.rooms import LAYOUT

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = "no CUDA device here: the pools-in-VRAM cells run only on a GPU host (the device tool, when one is lent)"


def test_the_pools_live_where_the_role_is_told_and_nowhere_else(monkeypatch):
    monkeypatch.delenv(POOL_DEVICE_ENV, raising=False)
    assert pool_device() == "cpu"
    kv, (_, aux) = pattern_pools(pattern.DECODE, LAYOUT)
    assert {t.device.type for _, t in kv} == {"cpu"} and aux.device.type == "cpu"
    monkeypatch.setenv(POOL_DEVICE_ENV, "tpu")
    with pytest.raises(ValueError, match="PDCONFORM_POOL_DEVICE='tpu': one of cpu, cuda"):
        pattern_pools(pattern.DECODE, LAYOUT)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device: --pool-device cuda is valid")
def test_a_pool_device_this_machine_lacks_is_refused_before_anything_runs(tmp_path):
    import typer

    from harness.cli import _pool_device

    for device, message in (("cuda", "--pool-device cuda: no CUDA device here"),
                            ("tpu", "--pool-device 'tpu': one of cpu, cuda")):
        with pytest.raises(typer.Exit) as refused:
            _pool_device(device)
        assert refused.value.exit_code == 2
    assert _pool_device("cpu") == "cpu"
    # end to end, once: one line, exit 2, no traceback, no run folder
    done = subprocess.run([sys.executable, "-m", "harness.cli", "repro", "happy-path", "--impl", "reference",
                           "--out", str(tmp_path), "--pool-device", "cuda"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and message_of(done) == "--pool-device cuda: no CUDA device here", done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "latest").exists()


def message_of(done: subprocess.CompletedProcess) -> str:
    """The start of the usage error's message (the CLI's one line, after its 'error:' prefix)."""
    text = (done.stderr + done.stdout).strip()
    return text.split("error:", 1)[-1].strip()[:len("--pool-device cuda: no CUDA device here")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_with_pools_in_vram_nixl_serves_the_tp_pairs_it_refuses_in_host_memory(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--pool-device", "cuda", "--impl", "reference",
                           "--impl", "nixl", "--scenario", "happy-path", "--topology", "p1-d1", "--topology", "p2-d1",
                           "--expectations", "none", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    run = json.loads((tmp_path / "latest" / "results.json").read_text())
    assert run["pool_device"] == "cuda"
    verdicts = {(c["scenario"], c["impl"]): c["verdict"] for c in run["cells"]}
    assert verdicts[("happy-path", "nixl")] == "PASS" and verdicts[("happy-path", "reference")] == "PASS", done.stdout
    assert verdicts[("happy-path@p2-d1", "nixl")] != "UNSUPPORTED", done.stdout[-3000:]


def test_a_pool_device_in_the_caller_s_environment_does_not_reach_the_cells(monkeypatch):
    from harness.session import cell_target
    from harness.target.sglang import installed_target

    monkeypatch.setenv(POOL_DEVICE_ENV, "junk")
    _, target = cell_target(installed_target(), {})
    assert target.env[POOL_DEVICE_ENV] == "cpu"  # the run's own choice, explicitly
