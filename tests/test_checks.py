"""Checkers are pure functions of the history; the verdict folds their results."""

import pytest

from harness.judge import checks as c
from harness.spec.history import History
from harness.judge.judge import verdict_of
from harness.spec.protocol import KVPoll
from harness.spec.requirements import UnknownRequirement


def _await(h: History, role: str, room: int, status: int, reason=None):
    args = {"room": room, "statuses": ["Success", "Failed"], "timeout_s": 5}
    h.record("invoke", "await_status", role, 1, args=args)
    h.record("ok", "await_status", role, 1, args=args,
             value={"status": status, "waited_s": 0.1, "failure_reason": reason})


def test_reached_status_pass_and_fail_detail():
    h = History()
    _await(h, "decode", 7, KVPoll.Failed, reason="prefill 127.0.0.1:9 is dead")
    ok, detail, *_ = c.reached_status(7, "decode", KVPoll.Success)(h.events)
    assert not ok
    assert "ended at Failed, expected Success" in detail and "prefill 127.0.0.1:9 is dead" in detail
    _await(h, "decode", 7, KVPoll.Success)
    assert c.reached_status(7, "decode", KVPoll.Success)(h.events)[0]


def test_never_polled_room_fails():
    ok, detail, *_ = c.reached_status(1, "prefill", KVPoll.Success)([])
    assert not ok and "never polled" in detail


def test_verdict_levels():
    must = c.CheckResult("a", "R-1", "MUST", False, "broken")
    should = c.CheckResult("b", "R-2", "SHOULD", False, "meh")
    fine = c.CheckResult("c", "R-3", "MUST", True, "")
    assert verdict_of([fine]) == ("PASS", "")
    assert verdict_of([fine, should])[0] == "WARN"
    assert verdict_of([should, must]) == ("FAIL", "R-1 a: broken")
    assert verdict_of([]) == ("ERROR", "the scenario declares no check: nothing was judged")


def test_crashing_checker_is_unknown_not_a_crash():
    def boom(events):
        raise KeyError("value")

    result = c.Check("x", "R-XFER-1", boom).run([])
    assert result.ok is None and "checker error" in result.detail
    assert verdict_of([result])[0] == "ERROR"


def test_a_check_takes_its_level_from_protocol_md_and_refuses_an_unknown_id():
    assert c.Check("x", "R-REASON-1", c.steps_completed()).level == "SHOULD"
    assert c.Check("x", "R-XFER-1", c.steps_completed()).level == "MUST"
    with pytest.raises(UnknownRequirement, match="R-NOPE-1 is not a requirement of docs/protocol.md"):
        c.Check("x", "R-NOPE-1", c.steps_completed())


def test_dead_thread_and_stopped_loop_are_reported():
    h = History()
    h.record("ok", "observe", "prefill", None, args={}, value={
        "loops": {"transfer-worker#0": False, "bootstrap#1": True},
        "dead_threads": [{"thread": "transfer-worker", "exception": "ValueError", "message": "bad frame"}],
        "log_records": [], "rooms": {}})
    ok, detail, *_ = c.no_dead_threads()(h.events)
    assert not ok and "transfer-worker died: ValueError: bad frame" in detail
    ok, detail, *_ = c.loops_alive()(h.events)
    assert not ok and "prefill:transfer-worker#0" in detail


def test_terminal_status_that_flips_is_caught():
    h = History()
    _await(h, "prefill", 5, KVPoll.Success)
    _await(h, "prefill", 5, KVPoll.Failed)
    ok, detail, *_ = c.stays_terminal(5, ("prefill",))(h.events)
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
        ok, detail, *_ = check(h.events)
        assert not ok and "killed by SIGKILL" in detail


def test_unknown_check_yields_to_must_failure():
    must = c.CheckResult("a", "R-1", "MUST", False, "broken")
    unknown = c.CheckResult("b", "R-2", "MUST", None, "could not run")
    assert verdict_of([unknown, must])[0] == "FAIL"
    assert verdict_of([unknown])[0] == "ERROR"


def _verified(h: History, ok: bool):
    h.record("invoke", "verify", "decode", 1, args={})
    h.record("ok", "verify", "decode", 1, value={"ok": ok, "bytes_verified": 64, "bytes_untouched_checked": 32,
                                                 "mismatch_pages": 0 if ok else 1,
                                                 "mismatches": [] if ok else ["decode layer 0 K page 3: wrong tag"]})


@pytest.mark.parametrize("status, reason, bytes_ok, passes", [
    (KVPoll.Success, None, True, True),  # Success, every byte in place
    (KVPoll.Success, None, False, False),  # planted: Success with a wrong byte
    (KVPoll.Failed, "transfer timed out", False, True),  # Failed visibly: its bytes are not judged
    (KVPoll.Failed, None, True, False),  # planted: Failed without a reason
    (KVPoll.Transferring, None, True, False),  # planted: never concluded
])
def test_exact_or_failed_passes_exact_success_and_visible_failure_only(status, reason, bytes_ok, passes):
    from harness.judge.fault_checks import exact_or_failed

    h = History()
    _await(h, "decode", 7, status, reason=reason)
    _verified(h, bytes_ok)
    ok, detail, *_ = exact_or_failed(7, "decode", 0)(h.events)
    assert ok is passes, detail


def test_exact_or_failed_judges_the_first_terminal_read_and_wants_a_real_reason():
    from harness.judge.fault_checks import exact_or_failed

    h = History()
    _await(h, "decode", 7, KVPoll.Success)  # planted: Success with a wrong byte, then read Failed
    _await(h, "decode", 7, KVPoll.Failed, reason="late")
    _verified(h, False)
    assert exact_or_failed(7, "decode", 0)(h.events)[0] is False
    h = History()
    _await(h, "decode", 7, KVPoll.Failed, reason="  ")  # planted: a blank reason names nothing
    _verified(h, True)
    assert exact_or_failed(7, "decode", 0)(h.events)[0] is False


def _fault_and_failure(addr_in_reason: str, heal_first: bool = False) -> History:
    h = History()
    h.record("ok", "start_decode", "decode", 1, value={"heartbeat_window_s": 4.0})
    h.record("ok", "start_prefill", "prefill", 1, value={"bootstrap_addr": "10.0.0.1:80"})
    if heal_first:
        h.record("nemesis", "network", "prefill", 1, args={"heal": True})
    h.record("nemesis", "network", "prefill", 1, args={"partition": True})
    _await(h, "decode", 7, KVPoll.Failed, reason=f"prefill {addr_in_reason} stopped answering")
    return h


def test_a_heartbeat_failure_must_name_the_prefill_s_whole_address_after_the_fault_not_a_heal():
    from harness.judge.fault_checks import failed_after_kill
    from harness.spec.history import Op

    check = failed_after_kill(7, "decode", "prefill", 10.0, op=Op.NETWORK)
    assert check(_fault_and_failure("10.0.0.1:80").events)[0] is True
    ok, detail, *_ = check(_fault_and_failure("10.0.0.1:8080").events)  # planted: another port's prefill
    assert ok is False and "does not name prefill" in detail
    assert check(_fault_and_failure("10.0.0.1:80", heal_first=True).events)[0] is True
