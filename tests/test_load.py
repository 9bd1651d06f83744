"""Load is part of the record (issue 34 item 5): each cell stores the load it ran under, the
judge decides from that history whether it ran starved and whether it failed only on timing
bounds, such a cell worse than expected runs once more alone, and every report shows both
results, counted apart from regressions."""

import json
import os
import subprocess
import sys
import time

import pytest

from harness.drive import load as sampling
from harness.judge import checks as c
from harness.judge.expectations import Expectation, Expectations, is_regression
from harness.judge.judge import judge, judge_run
from harness.judge.load import STARVED_WAIT_MIN_S, cell_load, needs_alone, starved, timing_only
from harness.judge.results import RunResult
from harness.report.files import junit_xml, summary_markdown
from harness.report.html import render_index_html
from harness.report.load import alone_line, load_warning
from harness.report.terminal import closing_line, reasons
from harness.spec.history import Event, History, Op
from harness.spec.protocol import KVPoll
from harness.spec.scenario import Scenario
from harness.target.sglang import SglangInfo

ROOM = 1234
# one timing-bound check: the decode's room must fail between 2 and 3 s after request_kv (R-TIMEOUT-2)
TIMED = Scenario(id="timed", title="a timing bound", steps=lambda seed: [],
                 checks=lambda seed: [c.Check("failed-in-time", "R-TIMEOUT-2",
                                              c.failed_within(ROOM, "decode", "request_kv", "decode", 2.0, 3.0))])
# the same room, judged on its failure reason only: no bound on time
REASON = Scenario(id="reason", title="a reason", steps=lambda seed: [],
                  checks=lambda seed: [c.Check("names-timeout", "R-REASON-1",
                                               c.failed_within(ROOM, "decode", "request_kv", "decode", 0,
                                                               c.NO_BOUND_S, ("timeout",)))])


def _history(failed_at: float, reason: str = "waiting timeout", load_1m: float = 0.3, wait_s: float = 0.2,
             duration_s: float = 10.0, how: str = "exited") -> list[dict]:
    """A decode room that failed ``failed_at`` s after its request_kv; the runner's load record
    says the 1-minute load was ``load_1m`` on 2 cores and the cell's threads waited ``wait_s`` s."""
    h = History()
    h.record(Event.INFO, Op.CELL_START, None, None, value={"impl": "nixl", "scenario": "timed", "seed": 0})
    h.record(Event.OK, Op.LAUNCH, "decode", 0, args={}, value={"endpoint": "ipc://x", "pid": 222})
    h.record(Event.INVOKE, Op.REQUEST_KV, "decode", 1, args={"room": ROOM})
    h.record(Event.OK, Op.REQUEST_KV, "decode", 1, args={"room": ROOM}, value=None)
    request = h.events[-1]
    h.record(Event.OK, Op.AWAIT_STATUS, "decode", 2, args={"room": ROOM},
             value={"status": int(KVPoll.Failed), "failure_reason": reason, "waited_s": failed_at})
    h.events[-1]["t"] = request["t"] + failed_at  # when it was seen, on the history's clock
    h.events[-1]["wall"] = request["wall"] + failed_at
    h.record(Event.OK, Op.OBSERVE, "decode", 3, args={},
             value={"dead_threads": [], "loops": {}, "log_records": [], "rooms": {}})
    h.record(Event.INFO, Op.CELL_END, None, None,
             value={"outcome": "completed", "load": {"111": {"run_s": 0.1, "wait_s": wait_s / 2, "threads": 3}}})
    h.record(Event.INFO, Op.CELL_EXIT, None, None, value={
        "impl": "nixl", "how": how, "returncode": 0, "deadline_s": 30, "duration_s": duration_s, "cpu_s": 0.5,
        "log_tail": "", "load": {"cores": 2, "cell_pid": 111, "load_start": [load_1m, 0.2, 0.1],
                                 "load_end": [load_1m, 0.2, 0.1], "load_peak_1m": load_1m, "sample_s": 1.0,
                                 "processes": {"111": {"run_s": 0.2, "wait_s": wait_s / 4, "threads": 3},
                                               "222": {"run_s": 0.3, "wait_s": wait_s / 2, "threads": 9}}}})
    return h.events


def test_a_checker_that_holds_time_to_a_bound_is_marked_where_it_is_declared():
    late = _history(failed_at=7.5)
    (bounded,) = [check.run(late) for check in TIMED.checks(0)]
    assert bounded.ok is False and bounded.timing and "allowed up to 3 s" in bounded.detail
    (reason_only,) = [check.run(late) for check in REASON.checks(0)]
    assert reason_only.ok is True and not reason_only.timing  # 0 .. NO_BOUND_S bounds nothing
    from harness.judge.fault_checks import failed_after, failed_after_kill

    assert c.is_timing_bound(failed_after_kill(ROOM, "decode", "prefill", 2.0))
    assert c.is_timing_bound(failed_after(ROOM, "decode", "network", "prefill", 2.0))
    assert not c.is_timing_bound(c.reached_status(ROOM, "decode", KVPoll.Success))


def test_the_load_record_is_summed_per_role_from_the_runner_and_the_cell_process():
    load = cell_load(_history(failed_at=2.5, load_1m=31.0, wait_s=8.0))
    assert load["cores"] == 2 and load["load_peak_1m"] == 31.0 and load["duration_s"] == 10.0
    # per pid the larger of the runner's sample and the cell's own reading as it ended
    assert load["roles"] == {"cell": {"run_s": 0.2, "wait_s": 4.0, "threads": 3},
                             "decode": {"run_s": 0.3, "wait_s": 4.0, "threads": 9}}
    assert load["wait_s"] == 8.0
    assert cell_load(_history(2.5)[:-1]) is None  # no cell-exit (a run made before it was recorded)


@pytest.mark.parametrize("load_1m, wait_s, duration_s, why", [
    (0.3, 0.2, 10.0, ""),  # idle
    (31.0, 0.2, 10.0, "load 31.0 on 2 cores"),  # the load average above the cores
    (1.0, 3.0, 10.0, "waited 3.0 s for a core in 10.0 s"),  # a burst the 1-minute average smooths away
    (1.0, 2.0, 10.0, ""),  # under a quarter of the wall time
    (1.0, 0.6, 0.8, ""),  # a short cell's processes wait as they are forked: under the floor
])
def test_starved_is_decided_from_the_recorded_numbers(load_1m, wait_s, duration_s, why):
    assert starved(cell_load(_history(2.5, load_1m=load_1m, wait_s=wait_s, duration_s=duration_s))) == why
    assert STARVED_WAIT_MIN_S == 1.0


def test_timing_only_means_every_failure_was_a_bound_on_time():
    late = judge(TIMED, 0, _history(failed_at=7.5, load_1m=31.0))
    assert late.verdict == "FAIL" and late.timing_only and late.starved == "load 31.0 on 2 cores"
    wrong = judge(REASON, 0, _history(failed_at=2.5, reason="connection refused", load_1m=31.0))
    assert wrong.verdict == "WARN" and not wrong.timing_only  # a wrong reason (R-REASON-1, a SHOULD) is no timing bound
    in_time = judge(TIMED, 0, _history(failed_at=2.5, load_1m=31.0))
    assert in_time.verdict == "PASS" and not in_time.timing_only
    killed = _history(failed_at=2.5, how="deadline")  # the cell's own deadline is a bound on time
    assert timing_only(killed, [])
    assert not timing_only(_history(2.5), [{"ok": False, "timing": True}, {"ok": None, "unsupported": False}])
    # a role call that got no answer within the harness's own bound (observe at load 197): timing, whatever failed
    unanswered = _history(2.5) + [{"seq": 99, "t": 9.0, "op": "observe", "role": "decode", "type": "fail",
                                   "error": "decode: observe got no answer within 10.0 s", "timed_out": True}]
    assert timing_only(unanswered, [{"ok": False, "name": "loops-alive"}])
    refused = _history(2.5) + [{"seq": 99, "t": 9.0, "op": "observe", "role": "decode", "type": "fail",
                                "error": "decode.observe raised KeyError", "timed_out": False}]
    assert not timing_only(refused, [{"ok": False, "name": "loops-alive"}])  # an answer, wrong: no timing
    # a room's wait ran out its bound before the status came (multi-chunk-long-prompt@p1-d4-kv2 at load 29):
    # the checks that failed there are on time; one that failed elsewhere is not
    ran_out = _history(2.5) + [{"seq": 105, "t": 9.0, "op": "await_status", "role": "decode", "type": "ok",
                                "args": {"room": 7, "must_come": True}, "value": {"reached": False, "status": 2}}]
    assert timing_only(ran_out, [{"ok": False, "name": "long-room-decode-success", "at": 105}])
    assert not timing_only(ran_out, [{"ok": False, "name": "long-room-decode-success", "at": 105},
                                     {"ok": False, "name": "bytes-exact", "at": 110}])


def _run(cells, alone=None, expected="PASS"):
    expectations = Expectations(path="x.toml", sglang=None, entries={} if expected == "PASS" else {
        ("nixl", "timed"): Expectation(impl="nixl", scenario="timed", verdict=expected, reason="r", link="l")})
    meta = RunResult(sglang=SglangInfo(version="0.5.23", path="", source="installed"), seed=0)
    return judge_run(meta, "/tmp/out", [("timed", "nixl")], {"timed": TIMED}, {("timed", "nixl"): cells},
                     expectations, alone=alone)


def test_a_starved_cell_failing_only_a_timing_bound_runs_alone_and_every_report_shows_both():
    loaded = _history(failed_at=7.5, load_1m=31.0)
    first = _run(loaded).cells[0]
    assert needs_alone(first)  # worse than expected, timing only, starved
    assert not needs_alone(_run(_history(failed_at=7.5, load_1m=0.3)).cells[0])  # not starved: a real FAIL
    assert not needs_alone(_run(loaded, expected="FAIL").cells[0])  # a known FAIL stands either way

    run = _run(loaded, alone={("timed", "nixl"): _history(failed_at=2.5, load_1m=0.4)})
    cell = run.cells[0]
    assert (cell.verdict, cell.alone.verdict, cell.under_load) == ("FAIL", "PASS", True)
    assert not is_regression(cell) and run.all_as_expected  # `run` exits 0: counted apart, not a regression
    assert alone_line(cell) == "FAIL under load (load 31.0 on 2 cores), PASS alone: timing under load"
    assert closing_line(run) == "1 cell: 1 worse only under load (as expected alone)"
    assert any(alone_line(cell) in line for line in reasons(run))
    summary = summary_markdown(run)
    assert "1 cell(s) worse than expected only under load" in summary and "PASS alone: timing under load" in summary
    assert "load average up to 31.0 on 2 cores" in summary
    page = render_index_html(run)
    assert 'id="load-warning"' in page and "PASS alone" in page
    skipped = next(iter(next(iter(junit_xml(run))))).result[0]
    assert skipped._tag == "skipped" and skipped.type == "timing-under-load"
    assert json.loads(json.dumps(cell.to_dict()))["alone"]["verdict"] == "PASS"  # carried into results.json

    still = _run(loaded, alone={("timed", "nixl"): _history(failed_at=7.5, load_1m=0.4)})
    assert is_regression(still.cells[0]) and not still.all_as_expected  # fails alone too: a regression
    assert closing_line(still) == "1 cell: 1 regression"
    assert alone_line(still.cells[0]).endswith("FAIL alone: not as expected alone either")


def test_no_warning_when_no_cell_ran_starved():
    run = _run(_history(failed_at=2.5, load_1m=0.3))
    assert load_warning(run) == "" and "Warning" not in summary_markdown(run)


def test_the_sampler_reads_the_run_queue_wait_of_a_process_groups_threads():
    busy = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                             "def spin():\n    end = time.time() + 3\n    while time.time() < end: pass\n"
                             "ts = [threading.Thread(target=spin) for _ in range(3)]\n"
                             "[t.start() for t in ts]; [t.join() for t in ts]"], process_group=0)
    try:
        sampler = sampling.GroupSampler(busy.pid, every_s=0.2).start()
        time.sleep(1.0)
        record = sampler.stop()
    finally:
        busy.kill()
        busy.wait()
    figures = record["processes"][str(busy.pid)]
    assert figures["threads"] >= 4 and figures["run_s"] > 0.3  # the main thread and three spinning ones
    assert record["cores"] == sampling.cores() and len(record["load_start"]) == 3 and record["cell_pid"] == busy.pid
    assert sampling.figures_now([os.getpid()])[str(os.getpid())]["threads"] >= 1


def test_a_run_records_each_cells_load_and_runs_the_picked_cells_again_alone_at_the_end(tmp_path, monkeypatch):
    # The decision is the judge's (above); here the run's plumbing, on real cell processes: the
    # session is told that every cell not PASSing ran starved on timing bounds only.
    from cellruns import run_cells
    from harness import session
    from harness.drive.scheduler import Callbacks
    from harness.spec import history as hist
    from harness.spec.scenario import get_scenario

    monkeypatch.setattr(session, "starved", lambda load: "forced by the test")
    monkeypatch.setattr(session, "needs_alone", lambda cell: cell.verdict != "PASS")
    notes = []
    run = run_cells(["selftest"], [get_scenario("selftest-clean"), get_scenario("selftest-role-dies")], tmp_path,
                    jobs=2, callbacks=Callbacks(on_note=notes.append))
    clean, dies = run.cells
    assert clean.verdict == "PASS" and clean.alone is None
    assert not (tmp_path / "alone" / "selftest-clean--selftest").exists()
    assert dies.verdict == "FAIL" and dies.alone is not None and dies.alone.verdict == "FAIL"
    assert dies.alone.workdir == str(tmp_path / "alone" / "selftest-role-dies--selftest")
    assert any("run once more alone: selftest-role-dies x selftest (FAIL" in n for n in notes)
    again = hist.load(tmp_path / "alone" / "selftest-role-dies--selftest" / "history.jsonl")
    ended = [hist.load(tmp_path / "cells" / name / "history.jsonl")[-1]["wall"]
             for name in ("selftest-clean--selftest", "selftest-role-dies--selftest")]
    assert again[0]["wall"] > max(ended)  # after every other cell had ended
    for cell in (clean, dies, dies.alone):  # the load each ran under, recorded by the runner and the cell
        assert cell.load["cores"] == sampling.cores() and cell.load["roles"]["cell"]["threads"] >= 1
        assert len(cell.load["load_start"]) == 3 and cell.load["duration_s"] == cell.duration_s
    assert {"prefill", "decode"} <= set(clean.load["roles"])  # the roles' pids come from their launch events


def test_a_known_cell_with_new_failing_checks_that_are_only_timing_bounds_runs_alone_when_starved():
    """The gap a fresh clone's make matrix showed (dead-prefill@p1pp2-d1 x mori at load 6.7): a
    known B4 cell (bytes) also failed R-HB-1's detection bound, 9.3 s against 9 s.  Such a cell
    is run again alone, and a new check that holds alone is load, not a regression."""
    from harness.judge.results import CellResult

    def known(extra: dict, starved: str = "load 4.0 on 2 cores", alone=None) -> CellResult:
        return CellResult(impl="mori", scenario="dead-prefill@p1pp2-d1", verdict="FAIL", expected="FAIL",
                          expected_checks=["bytes-exact"], starved=starved, alone=alone,
                          checks=[{"name": "bytes-exact", "requirement": "R-LAYOUT-1", "ok": False}, extra])

    late = {"name": "transferring-room-failed", "requirement": "R-HB-1", "ok": False, "timing": True}
    assert needs_alone(known(late))
    assert not needs_alone(known(late, starved=""))  # not starved: a real regression
    assert not needs_alone(known({"name": "every-failure-has-reason", "requirement": "R-REASON-1", "ok": False}))
    assert not needs_alone(known({"name": "transferring-room-failed", "requirement": "R-HB-1", "ok": None,
                                  "timing": True}))  # could not tell: no bound broken
    settled = known(late, alone=known({"name": "transferring-room-failed", "requirement": "R-HB-1", "ok": True},
                                      starved=""))
    assert settled.under_load and not is_regression(settled) and not needs_alone(settled)
    still = known(late, alone=known(late, starved=""))
    assert is_regression(still) and not still.under_load
