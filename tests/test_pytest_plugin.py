"""`pytest --impl NAME --scenario ID` runs cells as tests through the runner (harness.pytest_plugin)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pytest_cells(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly",
                           f"--cells-out={tmp_path / 'cells'}", "--impl", "selftest", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_one_test_per_cell_and_expectations_make_xfail(tmp_path):
    out = pytest_cells(tmp_path, "--scenario", "selftest-noop", "--scenario", "selftest-role-dies", "-rA")
    assert out.returncode == 1, out.stdout
    assert "PASSED tests/test_cells.py::test_cell[selftest-noop-selftest]" in out.stdout
    assert "FAILED tests/test_cells.py::test_cell[selftest-role-dies-selftest]" in out.stdout
    assert "reproduce: pdconform repro selftest-role-dies --impl selftest --seed 0" in out.stdout
    assert "1 failed, 1 passed" in out.stdout and "deselected" in out.stdout  # the ordinary suite did not run
    cell_out = tmp_path / "cells" / "selftest-noop--selftest"  # an --out folder per cell: its latest run
    assert (cell_out / "latest" / "cells" / "selftest-noop--selftest" / "history.jsonl").exists()

    expectations = tmp_path / "e.toml"
    expectations.write_text('[[expect]]\nimpl = "selftest"\nscenario = "selftest-role-dies"\nverdict = "FAIL"\n'
                            'reason = "the role is killed on purpose"\nlink = "tests"\n')
    out = pytest_cells(tmp_path, "--scenario", "selftest-role-dies", f"--expectations={expectations}")
    assert out.returncode == 0 and "1 xfailed" in out.stdout, out.stdout


def test_unknown_names_are_usage_errors(tmp_path):
    out = pytest_cells(tmp_path, "--scenario", "no-such-scenario")
    assert out.returncode == 4 and "unknown --impl/--scenario no-such-scenario" in out.stderr + out.stdout


def test_a_path_option_that_moves_the_rootdir_is_a_usage_error(tmp_path):
    # In space form pytest takes an existing path outside the checkout for a test path and
    # makes it the rootdir, silently dropping pyproject.toml's settings: say so, name the fix.
    out = pytest_cells(tmp_path, "--scenario", "selftest-noop", "--cells-out", str(tmp_path))
    assert out.returncode == 4, out.stdout + out.stderr
    assert f"write it as --cells-out={tmp_path}" in out.stdout + out.stderr
    inside = ROOT / "expectations" / "sglang-0.5.23.toml"  # inside the checkout: the rootdir stays, no error
    out = pytest_cells(tmp_path, "--scenario", "selftest-noop", "--expectations", str(inside))
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr


def test_a_documented_bug_is_xfail_by_default_and_fails_with_expectations_none(tmp_path):
    """The expectations shipped for the sglang under test apply without --expectations."""
    def cells(*args):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-rx",
                               f"--cells-out={tmp_path / 'cells'}", "--impl", "mori", "--scenario", "late-old-status",
                               *args], capture_output=True, text=True, timeout=300, cwd=ROOT)

    known = cells()
    assert known.returncode == 0 and "1 xfailed" in known.stdout, known.stdout[-2000:]
    strict = cells("--expectations", "none")
    assert strict.returncode == 1 and "1 failed" in strict.stdout, strict.stdout[-2000:]
