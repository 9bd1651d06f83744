"""The judge: a cell's verdict is a pure function of its scenario, seed and history; and
`pdconform judge` on a stored run reproduces every verdict of the run."""

import json
import subprocess
import sys
from pathlib import Path

from cellruns import run_cells
from harness.judge.expectations import Expectation
from harness.spec.history import Event, History, Op
from harness.judge.judge import judge
from harness.spec.scenario import get_scenario

ROOT = Path(__file__).resolve().parents[1]
NOOP = get_scenario("selftest-noop")  # one check: every step completed
HAPPY = get_scenario("happy-path")


def history(*events, start=True, end: dict | None = None, exit_: dict | None = None) -> list[dict]:
    """A cell history: cell-start, ``events`` as (type, op, role, step, fields), cell-end, cell-exit."""
    h = History()
    if start:
        h.record(Event.INFO, Op.CELL_START, None, None, value={"impl": "mooncake", "scenario": "x", "seed": 0})
    for type_, op, role, step, fields in events:
        h.record(type_, op, role, step, **fields)
    if end is not None:
        h.record(Event.INFO, Op.CELL_END, None, None, value=end)
    if exit_ is not None:
        h.record(Event.INFO, Op.CELL_EXIT, None, None,
                 value={"impl": "mooncake", "how": "exited", "returncode": 0, "deadline_s": 30, "duration_s": 1.5,
                        "cpu_s": 0.7, "log_tail": "", **exit_})
    return h.events


STEP0 = (Event.INFO, Op.STEP, None, 0, {"args": {"step": "Sleep"}})
COMPLETED = {"outcome": "completed"}


def test_a_completed_cell_is_judged_by_its_checks_and_carries_the_runners_figures():
    cell = judge(NOOP, 0, history(STEP0, end=COMPLETED, exit_={}))
    assert (cell.impl, cell.verdict, cell.reason) == ("mooncake", "PASS", "")
    assert (cell.duration_s, cell.cpu_s) == (1.5, 0.7) and all(c["ok"] for c in cell.checks)
    # its own check, then the generic post-conditions (harness.judge.postconditions)
    assert [c["name"] for c in cell.checks] == ["steps-complete", "every-trail-terminal", "every-failure-has-reason",
                                               "no-dead-thread", "no-residue-after-clear", "failure-reason-names-cause",
                                               "bytes-in-place-at-success", "ack-names-abort-generation",
                                               "every-abort-answered", "every-abort-sent",
                                               "unscheduled-registration-dropped", "every-message-whole",
                                               "decode-abort-fails-room"]
    failed = judge(NOOP, 0, history(STEP0, (Event.FAIL, Op.OPEN_SENDER, "prefill", 0, {"error": "boom"}),
                                    end=COMPLETED, exit_={}))
    assert failed.verdict == "FAIL" and "open_sender on prefill failed: boom" in failed.reason


def test_a_cell_killed_at_its_deadline_is_an_error_naming_where_it_stopped():
    events = history(STEP0, (Event.INVOKE, Op.OPEN_SENDER, "prefill", 0, {"args": {"room": 1}}),
                     exit_={"how": "deadline", "returncode": -9, "deadline_s": 6})
    cell = judge(NOOP, 0, events)
    assert cell.verdict == "ERROR" and cell.checks == []
    assert cell.reason == ("cell exceeded its deadline of 6 s and was killed "
                           "(in step 0 Sleep, last event: open_sender on prefill (invoke))")


def test_a_cell_process_that_died_before_its_history_ended_is_an_error_with_its_log():
    cell = judge(NOOP, 0, history(STEP0, exit_={"returncode": 70, "log_tail": "Traceback: ImportError"}))
    assert cell.verdict == "ERROR"
    assert cell.reason == "cell process exited with code 70 before its history ended: Traceback: ImportError"
    assert judge(NOOP, 0, []).reason.startswith("the cell's history has no end")


def test_an_unsupported_step_and_an_aborted_cell():
    unsupported = judge(NOOP, 0, history(STEP0, end={"outcome": "unsupported", "reason": "prefill.x: no hook"},
                                         exit_={}))
    assert (unsupported.verdict, unsupported.reason) == ("UNSUPPORTED", "prefill.x: no hook")
    aborted = judge(NOOP, 0, history(STEP0, end={"outcome": "aborted", "reason": "role decode did not start"},
                                     exit_={}))
    assert (aborted.verdict, aborted.reason) == ("ERROR", "role decode did not start")


def test_the_fail_fast_note_names_the_stuck_step():
    cut = {"args": {"room": 1, "cut": {"from_s": 6.0, "after_step": 3}}}
    cell = judge(NOOP, 0, history(STEP0, (Event.INVOKE, Op.AWAIT_STATUS, "decode", 4, cut), end=COMPLETED, exit_={}))
    assert "fail fast: step 3's status never came, so 1 later wait(s) were cut to 1 s" in cell.reason


def test_the_expectation_and_the_divergence_are_decided_here_and_nowhere_else():
    poll = (Event.OK, Op.AWAIT_STATUS, "decode", 1, {"args": {"room": 1}, "value": {"status_name": "Failed"}})
    ref_poll = (Event.OK, Op.AWAIT_STATUS, "decode", 1, {"args": {"room": 1}, "value": {"status_name": "Success"}})
    observed = history(STEP0, poll, end=COMPLETED, exit_={})
    reference = history(STEP0, ref_poll, end=COMPLETED, exit_={})
    expectation = Expectation(impl="mooncake", scenario="happy-path", verdict="FAIL", reason="known", link="b#1")
    cell = judge(HAPPY, 0, observed, reference=reference, expectation=expectation, workdir="/w")
    assert (cell.expected, cell.expected_reason, cell.expected_link, cell.workdir) == ("FAIL", "known", "b#1", "/w")
    assert cell.divergence["reference"] == "Success" and cell.divergence["observed"] == "Failed"
    assert judge(HAPPY, 0, observed).divergence is None  # no reference history: no divergence
    assert judge(HAPPY, 0, observed, reference=reference) == judge(HAPPY, 0, observed, reference=reference)  # pure


def test_pdconform_judge_reproduces_a_stored_runs_verdicts_cell_for_cell(tmp_path):
    scenarios = [get_scenario(s) for s in ("selftest-noop", "selftest-role-dies", "selftest-hang", "happy-path")]
    run = run_cells(["selftest"], scenarios, tmp_path, jobs=2)
    (tmp_path / ".pdconform-run").write_text("{}")  # (run_cells wrote into tmp_path itself: mark it a run folder)
    before = json.loads((tmp_path / "results.json").read_text())
    assert [c.verdict for c in run.cells] == ["PASS", "FAIL", "ERROR", "PASS"]
    assert (tmp_path / "reference-for-diff" / "happy-path" / "history.jsonl").is_file()  # the diff was computed
    cell_json = (tmp_path / "cells" / "happy-path--selftest" / "cell.json").read_text()
    (tmp_path / "summary.md").unlink()
    out = subprocess.run([sys.executable, "-m", "harness.cli", "judge", str(tmp_path)], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 1, out.stderr  # not every cell PASSes: exit 1, as run's
    after = json.loads((tmp_path / "results.json").read_text())
    assert after["cells"] == before["cells"]  # every field of every cell, verdicts included
    assert (tmp_path / "cells" / "happy-path--selftest" / "cell.json").read_text() == cell_json
    assert (tmp_path / "summary.md").is_file() and "judged again" in out.stdout


def test_pdconform_judge_refuses_a_folder_without_a_run(tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness.cli", "judge", str(tmp_path)], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "is not a pdconform run folder" in out.stderr and "Traceback" not in out.stderr


def test_a_cell_whose_driver_crashes_is_an_error_not_judged_on_its_half_history(tmp_path):
    (cell,) = run_cells(["selftest"], [get_scenario("selftest-harness-bug")], tmp_path).cells
    assert cell.verdict == "ERROR" and cell.checks == []
    assert cell.reason.startswith("cell process crashed in step 3: KeyError: 'ghost'"), cell.reason


def test_rejudging_keeps_a_cell_whose_history_is_gone_and_the_runs_expected_verdicts(tmp_path):
    import shutil

    expectations = tmp_path / "e.toml"
    expectations.write_text('[[expect]]\nimpl = "selftest"\nscenario = "selftest-role-dies"\nverdict = "FAIL"\n'
                            'reason = "the role is killed on purpose"\nlink = "tests"\n')
    out = tmp_path / "out"
    ran = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--impl", "selftest", "--scenario", "selftest-noop",
                          "--scenario", "selftest-role-dies", "--out", str(out), "--expectations", str(expectations)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_dir = (out / "latest").resolve()
    expectations.unlink()  # the run's expectations file is gone ...
    shutil.rmtree(run_dir / "cells" / "selftest-noop--selftest")  # ... and so is one cell's history
    again = subprocess.run([sys.executable, "-m", "harness.cli", "judge", str(out)], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
    assert again.returncode == 1 and "the expected verdicts stored in the run are kept" in again.stderr, again.stderr
    data = json.loads((run_dir / "results.json").read_text())
    cells = {(c["scenario"], c["impl"]): c for c in data["cells"]}
    assert set(cells) == {("selftest-noop", "selftest"), ("selftest-role-dies", "selftest")}
    assert cells[("selftest-noop", "selftest")]["verdict"] == "ERROR"  # no history: not judged PASS, not renamed
    assert cells[("selftest-role-dies", "selftest")]["expected"] == "FAIL"  # kept, though the file is gone
    assert data["expectations"] == str(expectations)  # stored absolute, not as typed


def test_malformed_history_lines_are_skipped_and_a_torn_line_does_not_swallow_the_next_event(tmp_path):
    from harness.spec.history import append_event, load

    path = tmp_path / "history.jsonl"
    good = history(STEP0, end=COMPLETED)
    lines = [json.dumps(e) for e in good]
    lines.insert(1, json.dumps({"op": "verify", "type": "ok"}))  # parseable, but not an event
    lines.insert(2, json.dumps({**good[0], "value": "x"}))  # a cell-start whose value is no dict
    path.write_text("\n".join(lines) + '\n{"seq": 9, "op": "step", "torn')
    append_event(path, Event.INFO, Op.CELL_EXIT, value={"how": "exited", "returncode": 0, "duration_s": 1.0})
    events = load(path)
    assert [e["op"] for e in events] == [Op.CELL_START, Op.STEP, Op.CELL_END, Op.CELL_EXIT]
    assert judge(NOOP, 0, events).verdict == "PASS"


def test_report_files_are_readable_by_others_as_open_would_make_them(tmp_path):
    import os

    from harness.judge.results import write_atomic

    write_atomic(tmp_path / "x.json", b"{}")
    umask = os.umask(0o022)
    os.umask(umask)
    assert (tmp_path / "x.json").stat().st_mode & 0o777 == 0o666 & ~umask
