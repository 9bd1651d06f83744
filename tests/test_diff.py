"""harness.judge.divergence: normalization drops run-specific values; the first divergence is found and named."""

from harness.judge.divergence import describe, first_divergence, normalize


def _events(status: str, port: int, t0: float):
    return [
        {"seq": 0, "t": t0, "step": 0, "op": "step", "role": None, "type": "info", "args": {"step": "StartRoles"}},
        {"seq": 1, "t": t0 + 1, "step": 0, "op": "start_prefill", "role": "prefill", "type": "ok",
         "args": {"bootstrap_port": port}, "value": {"rank_port": port + 1}},
        {"seq": 2, "t": t0 + 2, "step": 1, "op": "step", "role": None, "type": "info", "args": {"step": "AwaitStatus"}},
        {"seq": 3, "t": t0 + 3, "step": 1, "op": "await_status", "role": "decode", "type": "ok",
         "args": {"room": 5}, "value": {"status_name": status, "waited_s": t0}},
    ]


def test_ports_and_times_do_not_diverge():
    assert normalize(_events("Failed", 1000, 0.0)) == normalize(_events("Failed", 2000, 7.5))
    assert first_divergence(_events("Failed", 1000, 0.0), _events("Failed", 2000, 7.5), []) is None


def test_first_divergence_names_step_requirement_and_values():
    checks = [{"name": "x", "requirement": "R-HB-1", "ok": False}]
    d = first_divergence(_events("Failed", 1000, 0.0), _events("WaitingForInput", 2000, 1.0), checks)
    assert d == {"step": 1, "step_name": "AwaitStatus", "op": "await_status", "role": "decode",
                 "requirement": "R-HB-1", "reference": "Failed", "observed": "WaitingForInput", "seq": 3}
    assert "reference Failed, observed WaitingForInput" in describe(d)


def test_a_shorter_history_diverges_where_it_ends():
    short = _events("Failed", 1000, 0.0)[:2]
    d = first_divergence(_events("Failed", 1000, 0.0), short, [])
    assert d["observed"].startswith("(no such event") and d["reference"] == "Failed"


def _two_polls(a_status: str, b_status: str, rooms=(11, 22), first_step: int = 0, label: dict | None = None):
    """Two steps, each one AwaitStatus: the prefill's poll of ``rooms[0]``, then the decode's of ``rooms[1]``."""
    return [
        {"seq": 0, "t": 0, "step": first_step, "op": "step", "role": None, "type": "info",
         "args": {"step": "AwaitStatus"}},
        {"seq": 1, "t": 1, "step": first_step, "op": "await_status", "role": "prefill", "type": "ok",
         "args": {"room": rooms[0]}, "value": {"status_name": a_status}},
        {"seq": 2, "t": 2, "step": first_step + 1, "op": "step", "role": None, "type": "info",
         "args": {"step": "AwaitStatus"}},
        {"seq": 3, "t": 3, "step": first_step + 1, "op": "await_status", "role": "decode", "type": "ok",
         "args": {"room": rooms[1], **(label or {})}, "value": {"status_name": b_status}},
    ]


def _two_rooms(a_status: str, b_status: str):
    return _two_polls(a_status, b_status)


def test_the_divergence_is_the_failing_cases_not_an_unrelated_passing_one():
    """Room 11 differs harmlessly (its checks pass); room 22's check fails: the divergence is room 22's."""
    checks = [{"name": "a-ok", "requirement": "R-XFER-1", "ok": True, "detail": "prefill room 11 reached Transferring"},
              {"name": "b-success", "requirement": "R-XFER-1", "ok": False,
               "detail": "decode room 22 ended at WaitingForInput"}]
    d = first_divergence(_two_rooms("WaitingForInput", "Success"), _two_rooms("Transferring", "WaitingForInput"),
                         checks)
    assert (d["step"], d["role"], d["reference"], d["observed"]) == (1, "decode", "Success", "WaitingForInput")
    assert [c["case"] for c in d["cases"]] == ["room 22"]  # said, since the history's first one is elsewhere


def test_each_failing_case_gets_its_own_first_divergence():
    checks = [{"name": "a-success", "requirement": "R-XFER-1", "ok": False, "detail": "prefill room 11 ended at X"},
              {"name": "b-success", "requirement": "R-HB-1", "ok": False, "detail": "decode room 22 ended at Y"}]
    d = first_divergence(_two_rooms("Success", "Success"), _two_rooms("Failed", "Failed"), checks)
    assert [(c["case"], c["checks"], c["observed"]) for c in d["cases"]] == [
        ("room 11", ["a-success"], "Failed"), ("room 22", ["b-success"], "Failed")]
    line = describe(d)
    assert "room 11 (a-success): first divergence at step 0" in line and "room 22 (b-success)" in line


def _reused_room(first_prefill: str, second_decode: str):
    """One room id, two lifecycles: step 1 polls the prefill of the first, step 2 the decode of
    the second (the room reused)."""
    return _two_polls(first_prefill, second_decode, rooms=(7, 7), first_step=1, label={"label": "after-reuse"})


def test_the_divergence_is_at_the_step_the_failing_check_was_decided_on():
    """room-reuse x mooncake: the first lifecycle differs harmlessly at step 1 (either status
    is allowed there); the check that fails was decided at step 2: the divergence is step 2's,
    and it points at the observed event (seq 3) for the cell page."""
    checks = [{"name": "reuse", "requirement": "R-REUSE-1", "level": "MUST", "ok": False, "at": 3,
               "detail": "decode room 7 was Success at 'after-reuse'"}]
    d = first_divergence(_reused_room("Transferring", "WaitingForInput"), _reused_room("WaitingForInput", "Success"),
                         checks)
    assert (d["step"], d["role"], d["reference"], d["observed"], d["seq"]) == (2, "decode", "WaitingForInput",
                                                                               "Success", 3)
    assert [(c["case"], c["step"], c["checks"]) for c in d["cases"]] == [("room 7", 2, ["reuse"])]
    # without the check's event, the same room's first divergence (step 1) is all there is to say
    unplaced = [{**checks[0], "at": None}]
    assert first_divergence(_reused_room("Transferring", "WaitingForInput"),
                            _reused_room("WaitingForInput", "Success"), unplaced)["step"] == 1
    # at its step the histories agree: the case's first divergence
    same_at_step = _reused_room("Transferring", "Success")
    d = first_divergence(same_at_step, _reused_room("WaitingForInput", "Success"), checks)
    assert d["step"] == 1


def test_the_reasons_check_comes_first_a_must_before_a_should():
    checks = [{"name": "why", "requirement": "R-REASON-1", "level": "SHOULD", "ok": False, "at": 1,
               "detail": "prefill room 11: no reason"},
              {"name": "ok", "requirement": "R-XFER-1", "level": "MUST", "ok": False, "at": 3,
               "detail": "decode room 22 ended at Failed"}]
    d = first_divergence(_two_rooms("Success", "Success"), _two_rooms("Failed", "Failed"), checks)
    assert (d["step"], d["requirement"]) == (1, "R-XFER-1")  # the MUST's, though the SHOULD's is earlier
    assert [c["checks"] for c in d["cases"]] == [["why"], ["ok"]]
