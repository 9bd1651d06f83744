"""The checkers the field scenarios add, on hand-built histories (no roles run)."""

from harness.judge import checks as c
from harness.spec.protocol import KVPoll
from harness.spec.history import History
from scenarios.abort_ack_after_drain import ack_arrives, acks_safe


def _event(h: History, type_: str, op: str, role: str, t: float, **fields) -> dict:
    event = h.record(type_, op, role, 1, **fields)
    event["t"] = t
    return event


def _failed_history(after_s: float, reason: str | None) -> list[dict]:
    h = History()
    _event(h, "ok", "open_sender", "prefill", 10.0, args={"room": 5})
    _event(h, "ok", "await_status", "prefill", 10.0 + after_s, args={"room": 5},
           value={"status": KVPoll.Failed, "failure_reason": reason})
    return h.events


def test_failed_within_judges_the_window_and_the_reason():
    events = _failed_history(3.2, "timed out after 3.2s in KVPoll.Bootstrapping")
    assert c.failed_within(5, "prefill", "open_sender", "prefill", 3, 8)(events)[0]
    ok, detail, *_ = c.failed_within(5, "prefill", "open_sender", "prefill", 4, 8)(events)
    assert not ok and "before the 4 s deadline" in detail
    ok, detail, *_ = c.failed_within(5, "prefill", "open_sender", "prefill", 0, 2)(events)
    assert not ok and "allowed up to 2 s" in detail
    ok, detail, *_ = c.failed_within(5, "prefill", "open_sender", "prefill", 0, 8, ("abort",))(events)
    assert not ok and "names none of abort" in detail


def test_failed_within_from_the_last_chunk_measures_from_the_last_one():
    """dead-decode's rooms: a chunk before the decode's death, one after; the bound counts from the
    last (R-PEER-1), so 5 s between them do not count against the room."""
    h = History()
    _event(h, "ok", "send_chunk", "prefill", 10.0, args={"room": 5})
    _event(h, "ok", "send_chunk", "prefill", 15.0, args={"room": 5})
    _event(h, "ok", "await_status", "prefill", 16.0, args={"room": 5},
           value={"status": KVPoll.Failed, "failure_reason": "peer unreachable"})
    ok, detail, *_ = c.failed_within(5, "prefill", "send_chunk", "prefill", 0, 2, from_last=True)(h.events)
    assert ok and "Failed 1.0 s after send_chunk" in detail
    ok, detail, *_ = c.failed_within(5, "prefill", "send_chunk", "prefill", 0, 2)(h.events)  # from the first
    assert not ok and "Failed only 6.0 s after send_chunk" in detail


def test_failed_within_counts_too_early_from_the_start_of_the_call():
    """The implementation's timer may start inside open_sender: a Failed seen 2.999 s
    after the call returned but 3.002 s after it began is not early for a 3 s timeout."""
    h = History()
    _event(h, "invoke", "open_sender", "prefill", 10.000, args={"room": 5})
    _event(h, "ok", "open_sender", "prefill", 10.003, args={"room": 5})
    _event(h, "ok", "await_status", "prefill", 13.002, args={"room": 5},
           value={"status": KVPoll.Failed, "failure_reason": "timed out after 3.0s"})
    assert c.failed_within(5, "prefill", "open_sender", "prefill", 3, 8)(h.events)[0]
    ok, detail, *_ = c.failed_within(5, "prefill", "open_sender", "prefill", 3.5, 8)(h.events)
    assert not ok and "after open_sender was called, before the 3.5 s deadline" in detail


def test_a_failure_is_timed_when_the_role_saw_it_not_when_the_reply_arrived():
    """waiting-timeout x nixl under load: the role saw Failed 3.0 s after request_kv, but the
    completion (after the failure-reason call) was recorded 10.5 s after it; the role's own
    read time is what the backend is judged by.  A read stamped too late still fails."""
    h = History()
    _event(h, "ok", "request_kv", "decode", 0.80, args={"room": 5})
    late = _event(h, "ok", "await_status", "decode", 11.36, args={"room": 5},
                  value={"status": KVPoll.Failed, "failure_reason": "timed out after 3.0s", "seen_wall": 1000.0})
    late["wall"] = 1007.56  # recorded 7.56 s (wall clock) after the read
    assert abs(c.seen_at(late) - 3.80) < 1e-6
    assert c.failed_within(5, "decode", "request_kv", "decode", 3, 8)(h.events)[0]
    late["value"]["seen_wall"] = 1007.0  # the read itself came 10.0 s after request_kv
    ok, detail, *_ = c.failed_within(5, "decode", "request_kv", "decode", 3, 8)(h.events)
    assert not ok and "allowed up to 8 s" in detail
    del late["value"]["seen_wall"]  # an older history: the completion's own time
    assert c.seen_at(late) == 11.36


def test_failed_within_reason_optional_only_when_asked():
    events = _failed_history(1.0, None)
    assert not c.failed_within(5, "prefill", "open_sender", "prefill", 0, 2)(events)[0]
    assert c.failed_within(5, "prefill", "open_sender", "prefill", 0, 2, need_reason=False)(events)[0]


def test_failed_within_never_failed():
    h = History()
    _event(h, "ok", "open_sender", "prefill", 1.0, args={"room": 5})
    _event(h, "ok", "await_status", "prefill", 9.0, args={"room": 5}, value={"status": KVPoll.WaitingForInput})
    ok, detail, *_ = c.failed_within(5, "prefill", "open_sender", "prefill", 0, 9)(h.events)
    assert not ok and "never became Failed (last: WaitingForInput)" in detail


def _observed(rooms: dict, remembered: dict | None = None, logs: list | None = None) -> list[dict]:
    h = History()
    _event(h, "ok", "launch", "prefill", 0.0, args={})
    _event(h, "ok", "observe", "prefill", 1.0, args={},
           value={"role": "prefill", "loops": {}, "log_records": logs or [], "dead_threads": [], "rooms": rooms,
                  "remembered": remembered or {}})
    return h.events


def test_no_residue_names_what_is_left_and_ignores_bounded_memory():
    ok, detail, *_ = c.no_residue(("prefill",), (7, 8))(_observed({7: ["_deferred_ack_poisoned_rooms"], 9: ["x"]}))
    assert not ok and "room 7: _deferred_ack_poisoned_rooms" in detail and "room 9" not in detail
    assert c.no_residue(("prefill",), (7,))(_observed({}, remembered={7: ["tombstones"]}))[0]


def test_no_log_matching():
    logs = [{"level": "WARNING", "logger": "sglang.x", "message": "Malformed ABORT message: too few frames (1)"}]
    ok, detail, *_ = c.no_log_matching("prefill", r"malformed")(_observed({}, logs=logs))
    assert not ok and "Malformed ABORT" in detail
    assert c.no_log_matching("prefill", r"malformed")(_observed({}))[0]


def _ack_history(acks: list[tuple[float, int]], delays: list[tuple[float, float]]) -> list[dict]:
    h = History()
    for i, (t, delay) in enumerate(delays, start=1):
        _event(h, "nemesis", "engine-fault", "prefill", 0.0,
               value={"transfer": i, "fault": "delay", "what": f"write {i}", "t": t, "delay_s": delay})
    _event(h, "info", "abort-acks", "decode", 0.0, value=[{"room": 3, "generation": g, "t": t} for t, g in acks])
    return h.events


def test_acks_safe_catches_an_early_ack_and_two_generations():
    assert acks_safe(3)(_ack_history([(102.0, 1)], [(100.0, 1.0), (100.5, 1.0)]))[0]
    ok, detail, *_ = acks_safe(3)(_ack_history([(101.2, 1)], [(100.0, 1.0), (100.5, 1.0)]))
    assert not ok and "transfer 2" in detail and "still in flight" in detail
    ok, detail, *_ = acks_safe(3)(_ack_history([(102.0, 1), (102.1, 2)], [(100.0, 1.0)]))
    assert not ok and "2 generations" in detail
    ok, detail, *_ = acks_safe(3)(_ack_history([(102.0, 1), (102.1, 1)], [(100.0, 1.0)]))
    assert not ok and "2 ABORT_ACKs" in detail and "exactly one" in detail  # R-ABORT-2: exactly once
    assert acks_safe(3)(_ack_history([], [(100.0, 1.0)]))[0]  # none sent: none early
    assert acks_safe(3)(_ack_history([(102.0, 1)], []))[0] is None  # no fault log: cannot tell
    assert not ack_arrives(3)(_ack_history([], []))[0]


def test_a_caught_exception_logged_at_warning_counts_as_raised():
    """R-STALE-1: NIXL's worker catches a transport error and logs it at WARNING."""
    from scenarios.stale_chunk_after_clear import _nothing_raised

    plain = [{"level": "WARNING", "logger": "sglang.x", "message": "slow peer", "exception": ""}]
    caught = [{"level": "WARNING", "logger": "sglang.x", "message": "transfer failed", "exception": "KeyError"}]
    assert _nothing_raised("prefill")(_observed({}, logs=plain))[0]
    ok, detail, *_ = _nothing_raised("prefill")(_observed({}, logs=caught))
    assert not ok and "KeyError caught and logged" in detail


def test_a_full_log_recorder_makes_log_checks_unable_to_tell():
    from scenarios.stale_chunk_after_clear import _nothing_raised

    events = _observed({})
    events[-1]["value"]["log_records_dropped"] = 3
    ok, detail, *_ = _nothing_raised("prefill")(events)
    assert ok is None and "dropped 3 more" in detail
    assert c.no_log_matching("prefill", r"malformed")(events)[0] is None
