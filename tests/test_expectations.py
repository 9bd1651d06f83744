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


# --- expectations per check: a new failure inside a known cell is a regression --------------------

def _checked_cell(failing: list[str], listed: list[str] | None, verdict: str = "FAIL") -> CellResult:
    from harness.judge.expectations import Expectation, apply

    checks = [{"name": n, "requirement": "R-LIVE-2" if n == "no-dead-thread" else "R-REUSE-1", "ok": False}
              for n in failing] + [{"name": "bytes-exact", "requirement": "R-LAYOUT-1", "ok": True}]
    cell = CellResult(impl="mooncake", scenario="late-old-abort", verdict=verdict, checks=checks)
    return apply(cell, Expectation(impl="mooncake", scenario="late-old-abort", verdict="FAIL", reason="the ABORT half",
                                   link="docs/sglang-bugs.md#b13", checks=listed))


def test_a_check_failing_that_a_known_cell_does_not_list_is_a_regression_named():
    from harness.report.terminal import expectation_gap

    same = _checked_cell(["prefill-ignores-late-abort"], ["prefill-ignores-late-abort"])
    assert same.as_expected and not is_regression(same) and not is_fix(same)
    new = _checked_cell(["prefill-ignores-late-abort", "no-dead-thread"], ["prefill-ignores-late-abort"])
    assert not new.as_expected and is_regression(new) and not is_fix(new)  # the verdict alone would say "known"
    assert expectation_gap(new) == "new: no-dead-thread (R-LIVE-2) in known B13, bug cell"
    partial = _checked_cell(["prefill-ignores-late-abort"], ["prefill-ignores-late-abort", "no-dead-thread"])
    assert is_fix(partial) and not is_regression(partial)
    assert expectation_gap(partial) == "no longer failing: no-dead-thread (a partial fix)"
    legacy = _checked_cell(["prefill-ignores-late-abort", "no-dead-thread"], None)  # no list: the verdict decides
    assert legacy.as_expected and not is_regression(legacy) and legacy.expected_class == "bug"


def test_every_report_names_the_new_check_and_the_class():
    from harness.report.files import junit_bytes, summary_markdown
    from harness.report.html import render_index_html
    from harness.report.terminal import cell_text, reasons

    new = _checked_cell(["prefill-ignores-late-abort", "no-dead-thread"], ["prefill-ignores-late-abort"])
    known = _checked_cell(["prefill-ignores-late-abort"], ["prefill-ignores-late-abort"])
    known.impl = "nixl"
    run = RunResult(sglang=SglangInfo(version="0.5.23", path=None), seed=0, cells=[new, known], expectations="e.toml")
    assert "new failing check" in cell_text(new).plain and "known B13 (bug)" in cell_text(known).plain
    assert any("new: no-dead-thread (R-LIVE-2) in known B13, bug cell" in line for line in reasons(run))
    summary = summary_markdown(run)
    assert "1 regression(s)" in summary and "new: no-dead-thread (R-LIVE-2)" in summary
    assert "known B13, bug" in summary
    junit = junit_bytes(run).decode()
    assert 'type="NEW-CHECK"' in junit and 'type="known-fail"' in junit and "known FAIL (bug)" in junit
    assert "new failing check" in render_index_html(run)


def test_update_writes_the_failing_checks_and_round_trips():
    from harness.judge.expectations import updated_text

    text = ('sglang = "0.5.23"\n\n[[expect]]\nimpl = "mooncake"\nscenario = "late-old-abort"\nverdict = "FAIL"\n'
            'reason = "the ABORT half"\nlink = "docs/sglang-bugs.md#b13"\n')
    cell = _checked_cell(["prefill-ignores-late-abort", "no-dead-thread"], None)
    run = RunResult(sglang=SglangInfo(version="0.5.23", path=None), seed=0, cells=[cell])
    new, changes = updated_text(text, run)
    assert changes == ["late-old-abort x mooncake: checks listed: prefill-ignores-late-abort, no-dead-thread"]
    assert new == text + 'checks = ["prefill-ignores-late-abort", "no-dead-thread"]\n'
    assert tomllib.loads(new)["expect"][0]["checks"] == ["prefill-ignores-late-abort", "no-dead-thread"]
    listed = _checked_cell(["prefill-ignores-late-abort", "no-dead-thread"],
                           ["prefill-ignores-late-abort", "no-dead-thread"])
    again, none = updated_text(new, RunResult(sglang=run.sglang, seed=0, cells=[listed]))
    assert again == new and none == []  # up to date: nothing written
    fixed = _checked_cell(["prefill-ignores-late-abort"], ["prefill-ignores-late-abort", "no-dead-thread"])
    partial, changed = updated_text(new, RunResult(sglang=run.sglang, seed=0, cells=[fixed]))
    assert changed == ["late-old-abort x mooncake: no longer failing: no-dead-thread (a partial fix)"]
    assert partial == text + 'checks = ["prefill-ignores-late-abort"]\n'
    regressed = _checked_cell(["prefill-ignores-late-abort", "no-dead-thread"], ["prefill-ignores-late-abort"])
    assert updated_text(partial, RunResult(sglang=run.sglang, seed=0, cells=[regressed])) == (partial, [])


def test_every_shipped_bug_link_has_a_class():
    from harness.judge.expectations import bug_class

    exp = load_expectations(ROOT / "expectations" / "sglang-0.5.23.toml", IMPLEMENTATIONS, SCENARIOS)
    unclassed = {e.link for e in exp.entries.values() if e.link.startswith("docs/sglang-bugs.md#") and not bug_class(e.link)}
    assert not unclassed, f"entries of docs/sglang-bugs.md without a **Class:** line: {sorted(unclassed)}"


@pytest.mark.nightly  # half a minute; the planted-state tests above prove the same rule on a stored cell
@pytest.mark.e2e
def test_judge_of_a_real_known_cell_names_a_check_its_entry_does_not_list(tmp_path):
    """malformed-frame x nixl (known B3): judged against the shipped file, exit 0; against a copy
    whose entry lists one failing check fewer, exit 1, the missing check named."""
    out = tmp_path / "out"
    ran = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--impl", "nixl", "--scenario",
                          "malformed-frame", "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    shipped = (ROOT / "expectations" / "sglang-0.5.23.toml").read_text()
    entry = shipped.split('scenario = "malformed-frame"\nimpl = "nixl"\n', 1)[1].split("\n\n", 1)[0]
    listed = tomllib.loads(entry)["checks"]
    assert "no-dead-thread" in listed
    fewer = tmp_path / "fewer.toml"
    fewer.write_text(shipped.replace(entry, entry.replace(', "no-dead-thread"', "")))
    judged = subprocess.run([sys.executable, "-m", "harness.cli", "judge", str(out), "--expectations", str(fewer)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert judged.returncode == 1, judged.stdout[-2000:]
    assert "malformed-frame x nixl: new: no-dead-thread (R-LIVE-2) in known B3, bug cell" in judged.stdout
    again = subprocess.run([sys.executable, "-m", "harness.cli", "judge", str(out), "--expectations",
                            str(ROOT / "expectations" / "sglang-0.5.23.toml")],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert again.returncode == 0, again.stdout[-2000:]


def test_a_check_that_fails_only_sometimes_is_neither_new_nor_fixed():
    from harness.judge.expectations import Expectation, apply

    def cell(failing: list[str], verdict: str) -> CellResult:
        checks = [{"name": n, "requirement": "R-RESIDUE-1", "ok": False} for n in failing]
        return apply(CellResult(impl="nixl", scenario="found-nixl-f409f150d1", verdict=verdict, checks=checks),
                     Expectation(impl="nixl", scenario="found-nixl-f409f150d1", verdict="FAIL", reason="B16, timing",
                                 link="docs/sglang-bugs.md#b16", checks=["no-residue-after-clear", "every-failure-has-reason"],
                                 sometimes=["no-residue-after-clear"]))

    for shown in (cell(["no-residue-after-clear", "every-failure-has-reason"], "FAIL"),
                  cell(["every-failure-has-reason"], "WARN")):  # the timing-dependent half did not show this time
        assert shown.as_expected and not is_regression(shown) and not is_fix(shown)
    gone = cell([], "PASS")  # the steady half holds too: a fix
    assert is_fix(gone) and gone.gone_checks == ["every-failure-has-reason"]
    worse = cell(["every-failure-has-reason", "bytes-exact"], "FAIL")
    assert is_regression(worse) and worse.new_checks == ["bytes-exact"]


def test_sometimes_must_be_listed_in_checks(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nimpl = "nixl"\nscenario = "happy-path"\nverdict = "FAIL"\nreason = "r"\nlink = "l"\n'
                    'checks = ["a"]\nsometimes = ["b"]\n')
    with pytest.raises(ExpectationsError, match="sometimes lists checks that checks does not: b"):
        load_expectations(path, IMPLEMENTATIONS, SCENARIOS)


FOUND = sorted((ROOT / "scenarios" / "found").glob("found-*.json"))


@pytest.mark.nightly
@pytest.mark.parametrize("path", FOUND, ids=[p.stem for p in FOUND])
def test_every_shipped_found_program_repro_exits_0(tmp_path, path):
    """A shipped found program still shows its bug on sglang 0.5.23, as its expectations entry says."""
    impl = json.loads(path.read_text())["impl"]
    done = subprocess.run([sys.executable, "-m", "harness.cli", "repro", path.stem, "--impl", impl, "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
