"""Checkers are pure functions of the history; the verdict folds their results."""

from harness.judge import checks as c
from harness.role.adapter import FAILED, SUCCESS
from harness.judge.history import History


def _await(h: History, role: str, room: int, status: int, reason=None):
    args = {"room": room, "statuses": ["Success", "Failed"], "timeout_s": 5}
    h.record("invoke", "await_status", role, 1, args=args)
    h.record("ok", "await_status", role, 1, args=args,
             value={"status": status, "waited_s": 0.1, "failure_reason": reason})


def test_reached_status_pass_and_fail_detail():
    h = History()
    _await(h, "decode", 7, FAILED, reason="prefill 127.0.0.1:9 is dead")
    ok, detail = c.reached_status(7, "decode", SUCCESS)(h.events)
    assert not ok
    assert "ended at Failed, expected Success" in detail and "prefill 127.0.0.1:9 is dead" in detail
    _await(h, "decode", 7, SUCCESS)
    assert c.reached_status(7, "decode", SUCCESS)(h.events)[0]


def test_never_polled_room_fails():
    ok, detail = c.reached_status(1, "prefill", SUCCESS)([])
    assert not ok and "never polled" in detail


def test_verdict_levels():
    must = c.CheckResult("a", "R-1", "MUST", False, "broken")
    should = c.CheckResult("b", "R-2", "SHOULD", False, "meh")
    fine = c.CheckResult("c", "R-3", "MUST", True, "")
    assert c.verdict_of([fine]) == ("PASS", "")
    assert c.verdict_of([fine, should])[0] == "WARN"
    assert c.verdict_of([should, must]) == ("FAIL", "R-1 a: broken")
    assert c.verdict_of([must], run_error="role died")[0] == "ERROR"
    assert c.verdict_of([must], unsupported="no such hook")[0] == "UNSUPPORTED"


def test_crashing_checker_is_unknown_not_a_crash():
    def boom(events):
        raise KeyError("value")

    result = c.Check("x", "R-1", "MUST", boom).run([])
    assert result.ok is None and "checker error" in result.detail
    assert c.verdict_of([result])[0] == "ERROR"


def test_dead_thread_and_stopped_loop_are_reported():
    h = History()
    h.record("ok", "observe", "prefill", None, args={}, value={
        "loops": {"transfer-worker#0": False, "bootstrap#1": True},
        "dead_threads": [{"thread": "transfer-worker", "exception": "ValueError", "message": "bad frame"}],
        "log_records": [], "rooms": {}})
    ok, detail = c.no_dead_threads()(h.events)
    assert not ok and "transfer-worker died: ValueError: bad frame" in detail
    ok, detail = c.loops_alive()(h.events)
    assert not ok and "prefill:transfer-worker#0" in detail


def test_terminal_status_that_flips_is_caught():
    h = History()
    _await(h, "prefill", 5, SUCCESS)
    _await(h, "prefill", 5, FAILED)
    ok, detail = c.stays_terminal(5, ("prefill",))(h.events)
    assert not ok and "prefill room 5: Success -> Failed" in detail


def test_launched_role_that_was_never_observed_fails_liveness():
    h = History()
    for role in ("prefill", "decode"):
        h.record("ok", "launch", role, 0, args={}, value={"endpoint": "tcp://x"})
    h.record("ok", "observe", "decode", None, args={}, value={"loops": {"w#0": True}, "dead_threads": [],
                                                             "log_records": [], "rooms": {}})
    h.record("fail", "observe", "prefill", None, args={},
             error="prefill cannot be observed: its process ended (killed by SIGKILL)")
    for check in (c.loops_alive(), c.no_dead_threads()):
        ok, detail = check(h.events)
        assert not ok and "killed by SIGKILL" in detail


def test_no_checks_is_an_error_not_a_pass():
    assert c.verdict_of([]) == ("ERROR", "the scenario declares no check: nothing was judged")


def test_unknown_check_yields_to_must_failure():
    must = c.CheckResult("a", "R-1", "MUST", False, "broken")
    unknown = c.CheckResult("b", "R-2", "MUST", None, "could not run")
    assert c.verdict_of([unknown, must])[0] == "FAIL"
    assert c.verdict_of([unknown])[0] == "ERROR"
