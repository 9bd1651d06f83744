"""`pytest --impl NAME --scenario ID` runs cells as tests through the runner (harness.pytest_plugin)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pytest_cells(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--cells-out",
                           str(tmp_path / "cells"), "--impl", "selftest", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_one_test_per_cell_and_expectations_make_xfail(tmp_path):
    out = pytest_cells(tmp_path, "--scenario", "selftest-noop", "--scenario", "selftest-role-dies", "-rA")
    assert out.returncode == 1, out.stdout
    assert "PASSED tests/test_cells.py::test_cell[selftest-noop-selftest]" in out.stdout
    assert "FAILED tests/test_cells.py::test_cell[selftest-role-dies-selftest]" in out.stdout
    assert "reproduce: pdconform repro selftest-role-dies --impl selftest --seed 0" in out.stdout
    assert "1 failed, 1 passed" in out.stdout and "deselected" in out.stdout  # the ordinary suite did not run
    assert (tmp_path / "cells" / "selftest-noop--selftest" / "cells" / "selftest-noop--selftest" / "history.jsonl").exists()

    expectations = tmp_path / "e.toml"
    expectations.write_text('[[expect]]\nimpl = "selftest"\nscenario = "selftest-role-dies"\nverdict = "FAIL"\n'
                            'reason = "the role is killed on purpose"\nlink = "tests"\n')
    out = pytest_cells(tmp_path, "--scenario", "selftest-role-dies", "--expectations", str(expectations))
    assert out.returncode == 0 and "1 xfailed" in out.stdout, out.stdout


def test_unknown_names_are_usage_errors(tmp_path):
    out = pytest_cells(tmp_path, "--scenario", "no-such-scenario")
    assert out.returncode == 4 and "unknown --impl/--scenario no-such-scenario" in out.stderr + out.stdout
