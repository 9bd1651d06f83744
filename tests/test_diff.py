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
                 "requirement": "R-HB-1", "reference": "Failed", "observed": "WaitingForInput"}
    assert "reference Failed, observed WaitingForInput" in describe(d)


def test_a_shorter_history_diverges_where_it_ends():
    short = _events("Failed", 1000, 0.0)[:2]
    d = first_divergence(_events("Failed", 1000, 0.0), short, [])
    assert d["observed"].startswith("(no such event") and d["reference"] == "Failed"
