"""`make setup` trusts its stamp only while the environment still works (scripts/setup.sh)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"


def check(venv: Path):
    return subprocess.run([str(SETUP), "--check"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=dict(os.environ, VENV=str(venv)))


def test_the_working_environment_passes_the_check():
    if not list((ROOT / ".venv").glob(".pdconform-setup-*")):
        pytest.skip("this checkout's .venv was not made by `make setup`")
    out = check(ROOT / ".venv")
    assert out.returncode == 0 and "works" in out.stdout, out.stderr


def test_a_stamped_but_broken_environment_is_not_taken_for_set_up(tmp_path):
    # the newest stamp is this tree's (`make test` runs `make setup` first); older ones may linger
    stamps = sorted((ROOT / ".venv").glob(".pdconform-setup-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    if not stamps:
        pytest.skip("this checkout's .venv was not made by `make setup` (no stamp to copy)")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\necho 'No such file or directory' >&2\nexit 127\n")  # a moved venv's interpreter
    python.chmod(0o755)
    (venv / stamps[0].name).write_text("0.5.23\n")
    out = check(venv)
    assert out.returncode == 1 and "is set up but no longer works" in out.stderr, out.stderr
    assert (venv / stamps[0].name).exists()  # --check changes nothing
    assert check(tmp_path / "never-made").returncode == 1
