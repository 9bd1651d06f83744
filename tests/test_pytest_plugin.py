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
    from harness import program

    assert f"reproduce: {program()} repro selftest-role-dies --impl selftest --seed 0" in out.stdout
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


def test_a_documented_bug_is_xfail_by_default(tmp_path):
    """The expectations shipped for the sglang under test apply without --expectations."""
    known = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-rx", "--impl", "mori",
                            "--scenario", "late-old-status", f"--cells-out={tmp_path / 'cells'}"],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert known.returncode == 0 and "1 xfailed" in known.stdout, known.stdout[-2000:]


def test_expectations_none_and_a_named_file_replace_the_shipped_one():
    from types import SimpleNamespace

    from harness.pytest_plugin import _expectations

    def config(value):
        return SimpleNamespace(getoption=lambda name: value)

    assert _expectations(config(None), "0.5.23").path.endswith("expectations/sglang-0.5.23.toml")
    assert _expectations(config("none"), "0.5.23") is None
    assert _expectations(config(None), "0.5.99") is None  # nothing shipped for it
    named = _expectations(config(str(ROOT / "expectations" / "sglang-0.5.17.toml")), "0.5.23")
    assert named.path.endswith("sglang-0.5.17.toml")
