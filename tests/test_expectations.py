"""The expectations file: validation, applying it, and `run --expectations` exit codes."""

import json
import subprocess
import tomllib
import sys
from pathlib import Path

import pytest

from harness.implementations import available
from harness.judge.expectations import ExpectationsError, fixes, is_fix, is_regression, load_expectations, regressions
from harness.judge.results import CellResult, RunResult, SglangInfo
from harness.spec.scenario import scenario_ids

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = scenario_ids()  # every scenario, and each on every topology it runs on
IMPLEMENTATIONS = available()
ENTRY = '[[expect]]\nimpl = "{impl}"\nscenario = "{scenario}"\nverdict = "{verdict}"\nreason = "{reason}"\nlink = "x#1"\n'


def write(tmp_path, *entries, head=""):
    path = tmp_path / "expect.toml"
    path.write_text(head + "\n".join(ENTRY.format(**{"reason": "because", **e}) for e in entries))
    return path


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_shipped_expectations_are_valid_and_reasoned(version):
    exp = load_expectations(ROOT / "expectations" / f"sglang-{version}.toml", IMPLEMENTATIONS, SCENARIOS)
    assert exp.sglang == version and len(exp.entries) >= 20
    bugs = (ROOT / "docs" / "sglang-bugs.md").read_text()
    for (impl, scenario), e in exp.entries.items():
        assert impl != "reference", "the reference must PASS everything: never expect otherwise"
        assert e.verdict != "PASS" and len(e.reason) > 20
        anchor = e.link.split("#", 1)[1]
        assert f'<a id="{anchor}"></a>' in bugs, f"{impl} x {scenario}: {e.link} has no entry in docs/sglang-bugs.md"


@pytest.mark.parametrize("text, message", [
    ('[[expect]]\nimpl = "bogus"\nscenario = "happy-path"\nverdict = "FAIL"\nreason = "r"\nlink = "l"\n', "unknown impl"),
    ('[[expect]]\nimpl = "nixl"\nscenario = "nope"\nverdict = "FAIL"\nreason = "r"\nlink = "l"\n', "unknown scenario"),
    ('[[expect]]\nimpl = "nixl"\nscenario = "happy-path"\nverdict = "RED"\nreason = "r"\nlink = "l"\n', "unknown verdict"),
    ('[[expect]]\nimpl = "nixl"\nscenario = "happy-path"\nverdict = "FAIL"\nlink = "l"\n', "reason"),
    ('[[expect]]\nimpl = "nixl"\nscenario = "happy-path"\nverdict = "FAIL"\nreason = " "\nlink = "l"\n', "must not be empty"),
    ('[[expect]]\nimpl = "nixl"\nscenario = "happy-path"\nverdict = "FAIL"\nreason = "r"\nlink = "l"\ncolour = 1\n', "colour"),
    ('[[expect]]\nimpl = "nixl"\nscenario = "happy-path"\nverdict = "FAIL"\nreason = "r"\nlink = "l"\n' * 2, "twice"),
    ("[[expect]\n", "not valid TOML"),
])
def test_bad_files_are_refused_with_the_entry_named(tmp_path, text, message):
    path = tmp_path / "e.toml"
    path.write_text(text)
    with pytest.raises(ExpectationsError, match=message):
        load_expectations(path, IMPLEMENTATIONS, SCENARIOS)


def test_missing_file(tmp_path):
    with pytest.raises(ExpectationsError, match="cannot read"):
        load_expectations(tmp_path / "nope.toml", IMPLEMENTATIONS, SCENARIOS)


def test_expected_verdicts_classify_regressions_and_fixes(tmp_path):
    path = write(tmp_path, {"impl": "nixl", "scenario": "room-reuse", "verdict": "FAIL"},
                 {"impl": "mori", "scenario": "no-residue", "verdict": "WARN"},
                 {"impl": "mooncake", "scenario": "no-residue", "verdict": "FAIL"})
    expectations = load_expectations(path, IMPLEMENTATIONS, SCENARIOS)
    seen = [("nixl", "room-reuse", "FAIL"),  # as expected
            ("mori", "no-residue", "FAIL"),  # worse than WARN
            ("mooncake", "no-residue", "PASS"),  # fixed
            ("nixl", "happy-path", "ERROR"),  # worse than the default PASS
            ("nixl", "no-residue", "PASS")]
    run = RunResult(sglang=SglangInfo(version="0.5.23", path=None), seed=0, cells=[
        CellResult(impl=i, scenario=s, verdict=v, expected=expectations.verdict_for(i, s)) for i, s, v in seen])
    assert [c.expected for c in run.cells] == ["FAIL", "WARN", "FAIL", "PASS", "PASS"]
    assert expectations.for_cell("nixl", "room-reuse").reason == "because"
    assert expectations.for_cell("nixl", "happy-path") is None
    assert [(c.impl, c.scenario) for c in regressions(run)] == [("mori", "no-residue"), ("nixl", "happy-path")]
    assert [(c.impl, c.scenario) for c in fixes(run)] == [("mooncake", "no-residue")]
    assert not is_regression(run.cells[0]) and not is_fix(run.cells[0])
    assert not run.all_as_expected


def _run(tmp_path, expectations, *scenarios):
    args = [sys.executable, "-m", "harness.cli", "run", "--impl", "selftest", "--out", str(tmp_path / "out"),
            "--expectations", str(expectations)]
    for s in scenarios:
        args += ["--scenario", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_run_exit_codes(tmp_path):
    # selftest-role-dies FAILs (its prefill dies mid-step), selftest-noop PASSes.
    # (the self-test implementation and scenarios are visible: conftest sets the switch)
    as_expected = write(tmp_path, {"impl": "selftest", "scenario": "selftest-role-dies",
                                                    "verdict": "FAIL"})
    out = _run(tmp_path, as_expected, "selftest-role-dies", "selftest-noop")
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads((tmp_path / "out" / "latest" / "results.json").read_text())
    assert data["expectations"] == str(as_expected)
    assert {c["scenario"]: c["expected"] for c in data["cells"]} == {"selftest-role-dies": "FAIL", "selftest-noop": "PASS"}

    regression = write(tmp_path, {"impl": "selftest", "scenario": "selftest-role-dies", "verdict": "WARN"})
    out = _run(tmp_path, regression, "selftest-role-dies")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 regression (worse than expected)" in out.stdout and "selftest-role-dies x selftest: FAIL" in out.stdout

    fixed = write(tmp_path, {"impl": "selftest", "scenario": "selftest-noop", "verdict": "FAIL"})
    out = _run(tmp_path, fixed, "selftest-noop")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 fixed (better than expected" in out.stdout

    bad = tmp_path / "bad.toml"
    bad.write_text('[[expect]]\nimpl = "selftest"\n')
    out = _run(tmp_path, bad, "selftest-noop")
    assert out.returncode == 2 and "missing required field" in out.stderr and "Traceback" not in out.stderr


UPDATE_FILE = """# header comment kept
sglang = "0.5.23"

[[expect]]
scenario = "slow-aux"
impl = "mori"
verdict = "FAIL"
reason = "B12: aux after Success"
link = "docs/sglang-bugs.md#b12"

[[expect]]
scenario = "room-reuse"
impl = "mooncake"
verdict = "FAIL"
reason = "B6: reused room corrupted"
link = "docs/sglang-bugs.md#b6"

[[expect]]
scenario = "room-reuse"
impl = "nixl"
verdict = "FAIL"
reason = "B6 on NIXL"
link = "docs/sglang-bugs.md#b6"
"""


def _update_run():
    from harness.judge.results import CellResult, RunResult
    from harness.target.sglang import SglangInfo

    def cell(impl, scenario, verdict, expected):
        return CellResult(impl=impl, scenario=scenario, verdict=verdict, expected=expected)

    return RunResult(sglang=SglangInfo(version="0.5.23", path=None), seed=0, cells=[
        cell("mori", "slow-aux", "PASS", "FAIL"),  # fixed: its entry goes
        cell("mooncake", "room-reuse", "WARN", "FAIL"),  # better, not PASS: its verdict changes
        cell("nixl", "room-reuse", "FAIL", "FAIL"),  # as expected: untouched
        cell("mooncake", "happy-path", "FAIL", "PASS")])  # a regression: never written


def test_update_removes_fixed_entries_and_keeps_every_other_line():
    from harness.judge.expectations import updated_text

    new, changes = updated_text(UPDATE_FILE, _update_run())
    assert changes == ["removed slow-aux x mori: PASS now (was expected FAIL)",
                       "room-reuse x mooncake: expected FAIL -> WARN"]
    assert "slow-aux" not in new and "happy-path" not in new
    assert new.startswith("# header comment kept\nsglang = \"0.5.23\"\n")
    kept = new.split("[[expect]]")
    assert 'verdict = "WARN"\nreason = "B6: reused room corrupted"' in kept[1]
    assert kept[2] == UPDATE_FILE.split("[[expect]]")[3]  # the NIXL entry byte for byte
    assert len(tomllib.loads(new)["expect"]) == 2


def test_the_update_command_rewrites_the_file_the_run_was_judged_against(tmp_path):
    from harness.judge.results import dump_run

    run = _update_run()
    path = tmp_path / "expect.toml"
    path.write_text(UPDATE_FILE)
    run.expectations = str(path)
    (tmp_path / "run").mkdir()
    dump_run(run, tmp_path / "run" / "results.json")
    out = subprocess.run([sys.executable, "-m", "harness.cli", "expectations", "update", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "2 entries updated" in out.stdout and "not written: happy-path x mooncake" in out.stdout
    assert "slow-aux" not in path.read_text() and sorted(p.name for p in tmp_path.iterdir()) == ["expect.toml", "run"]
    written = path.read_text()
    again = subprocess.run([sys.executable, "-m", "harness.cli", "expectations", "update", str(tmp_path / "run"),
                            "--file", str(path)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "nothing to update" in again.stdout and path.read_text() == written


def test_update_with_a_named_file_judges_the_run_against_that_file(tmp_path):
    """--file: the cells' expected verdicts are that file's, not the ones the run was judged
    against (here: none), so its entry for a cell the run saw PASS is removed."""
    from harness.judge.results import dump_run

    run = _update_run()
    for cell in run.cells:
        cell.expected = "PASS"  # as judged with --expectations none
    run.expectations = None
    (tmp_path / "run").mkdir()
    dump_run(run, tmp_path / "run" / "results.json")
    path = tmp_path / "expect.toml"
    path.write_text(UPDATE_FILE)
    out = subprocess.run([sys.executable, "-m", "harness.cli", "expectations", "update", str(tmp_path / "run"),
                          "--file", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "removed slow-aux x mori" in out.stdout and "slow-aux" not in path.read_text()
    assert 'scenario = "room-reuse"\nimpl = "nixl"' in path.read_text()  # as expected there: kept
