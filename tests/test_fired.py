"""Every injected fault proves it fired (issue 38, item 6): harness.judge.fired on planted
histories, the judge's ERROR for a silent fault, and message loss by kind
(harness.role.message_loss) without roles."""

import pytest
import zmq

from harness.judge.fired import faults_of, never_fired
from harness.judge.judge import judge
from harness.judge.verdict import Verdict
from harness.role import message_loss
from harness.role.message_loss import MessageLoss, classify
from harness.spec.history import Event, Op
from harness.spec.scenario import Scenario
from harness.judge import checks as c


def _ev(seq, type_, op, role=None, wall=100.0, args=None, value=None):
    return {"seq": seq, "t": wall - 100.0, "wall": wall, "step": seq, "op": op, "role": role, "type": type_,
            "args": args or {}, "value": value}


PLAN = {"fail_nth": 2, "delay_s": 0.0, "never_complete": False, "fail_group": None, "aux_delay_s": 0.5,
        "slow_nth": 1, "slow_s": 0.0}


def test_each_part_of_an_engine_plan_needs_its_own_entry():
    events = [_ev(0, Event.NEMESIS, Op.ENGINE_FAULTS, "prefill", 100.0, PLAN),
              _ev(1, Event.NEMESIS, Op.ENGINE_FAULT, "prefill", 103.0, value={"fault": "fail", "t": 101.0})]
    faults = faults_of(events)
    # slow_nth with slow_s 0 changes nothing: not a fault; fail_nth fired, aux_delay_s did not
    assert [(f["fault"], f["fired"]) for f in faults] == [("engine-faults prefill fail_nth=2", True),
                                                         ("engine-faults prefill aux_delay_s=0.5", False)]
    assert never_fired(faults).startswith("fault never fired: engine-faults prefill aux_delay_s=0.5")


def test_an_entry_logged_under_a_later_plan_does_not_count_for_the_earlier_one():
    events = [_ev(0, Event.NEMESIS, Op.ENGINE_FAULTS, "prefill", 100.0, {"fail_nth": 1}),
              _ev(1, Event.NEMESIS, Op.ENGINE_FAULTS, "prefill", 105.0, {"fail_nth": 1}),
              _ev(2, Event.NEMESIS, Op.ENGINE_FAULT, "prefill.tp1", 110.0, value={"fault": "fail", "t": 106.0})]
    assert [f["fired"] for f in faults_of(events)] == [False, True]  # a rank process counts for its role


def test_points_fire_by_a_hit_or_an_await_and_driver_faults_by_their_event():
    events = [_ev(0, Event.NEMESIS, Op.ARM_POINT, "decode", args={"point": "a"}),
              _ev(1, Event.NEMESIS, Op.ARM_POINT, "decode", args={"point": "b"}),
              _ev(2, Event.OK, Op.AWAIT_POINT, "decode", args={"point": "b"}),
              _ev(3, Event.NEMESIS, Op.KILL, "prefill"),
              _ev(4, Event.NEMESIS, Op.NETWORK, "prefill", args={"heal": True})]
    faults = faults_of(events)
    assert [(f["fault"], f["fired"]) for f in faults] == [("arm-point decode a", False), ("arm-point decode b", True),
                                                         ("kill prefill", True)]


def test_a_network_fault_fires_by_the_packets_its_heal_counted():
    """A fault on a path no packet took (say the bootstrap port, after every room registered)
    tests nothing; where the host's tool counts nothing, applying it is the evidence."""
    def cell(counted: dict | None, healed: bool = True, both_ways: bool = True) -> list[dict]:
        fault = _ev(0, Event.NEMESIS, Op.NETWORK, "prefill", args={"a": "prefill", "b": "decode", "partition": True,
                                                                   "path": "bootstrap", "both_ways": both_ways})
        heal = _ev(1, Event.NEMESIS, Op.NETWORK, "prefill", args={"a": "prefill", "b": "decode", "heal": True,
                                                                  **({"packets": counted} if counted is not None else {})})
        return [fault, heal] if healed else [fault]

    idle, = faults_of(cell({"prefill->decode": 0, "decode->prefill": 0}))
    assert not idle["fired"] and "prefill->decode: 0" in idle["evidence"]
    assert faults_of(cell({"prefill->decode": 0, "decode->prefill": 7}))[0]["fired"]
    uncounted, = faults_of(cell({"prefill->decode": None}))
    assert uncounted["fired"] and "counts none" in uncounted["evidence"]
    assert faults_of(cell(None, healed=False))[0]["fired"]
    # a one-way fault is judged on its own direction only: the other one's packets were never its
    assert not faults_of(cell({"prefill->decode": 0, "decode->prefill": 7}, both_ways=False))[0]["fired"]
    # its direction not counted (a blackhole route), the other counted 0 by a both-ways heal: not counted
    assert faults_of(cell({"prefill->decode": None, "decode->prefill": 0}, both_ways=False))[0]["fired"]
    replaced = [*cell(None, healed=False), _ev(1, Event.NEMESIS, Op.NETWORK, "prefill",
                                               args={"a": "prefill", "b": "decode", "delay_ms": 5}),
                _ev(2, Event.NEMESIS, Op.NETWORK, "prefill", args={"a": "prefill", "b": "decode", "heal": True,
                                                                   "packets": {"prefill->decode": 0}})]
    first, second = faults_of(replaced)
    assert first["fired"] and "replaced before a heal" in first["evidence"] and not second["fired"]


def _scenario():
    return Scenario(id="t-fired", title="t", steps=lambda seed: [], checks=lambda seed: [
        c.Check("steps-complete", "R-XFER-1", c.steps_completed())], test_only=True)


def _history(fired: bool):
    events = [_ev(0, Event.INFO, Op.CELL_START, value={"impl": "reference"}),
              _ev(1, Event.NEMESIS, Op.LOSE_MESSAGES, "decode", args={"kind": "abort", "nth": 1, "count": 1})]
    if fired:
        events.append(_ev(2, Event.NEMESIS, Op.MESSAGE_LOST, "decode", 101.0,
                          value={"fault": "message-lost", "kind": "abort", "t": 100.5}))
    n = len(events)
    return events + [_ev(n, Event.INFO, Op.CELL_END, value={"outcome": "completed"}),
                     _ev(n + 1, Event.INFO, Op.CELL_EXIT, value={"how": "exited", "duration_s": 1.0})]


def test_a_cell_whose_fault_never_fired_is_error_never_pass():
    silent = judge(_scenario(), 0, _history(False), impl="reference")
    assert silent.verdict == Verdict.ERROR and silent.reason.startswith("fault never fired: lose-messages decode")
    assert [f["fired"] for f in silent.faults] == [False]
    fired = judge(_scenario(), 0, _history(True), impl="reference")
    assert fired.verdict == Verdict.PASS and [f["fired"] for f in fired.faults] == [True]
    # on a starved machine an unfired fault may have missed its moment: the cell runs again alone
    from harness.judge.load import needs_alone
    silent.starved = True
    assert silent.timing_only and needs_alone(silent)


@pytest.mark.parametrize("frames,expected", [
    ([b"5", b"2", b"0"], ("status", 5)),  # Common's untagged KV status (Mooncake)
    ([b"5", b"4", b"0", b"reason"], ("status", 5)),
    ([b"KV_STATUS", b"9", b"4", b"0"], ("status", 9)),  # NIXL's tagged one
    ([b"MoriMsgGuard", b"12", b"4", b"0", b""], ("status", 12)),
    ([b"MoriMsgGuard", b"None", b"10.0.0.1", b"5000", b"d", b"k"], ("kv_args", None)),
    ([b"NixlMsgGuard", b"7", b"10.0.0.1", b"5000", b"agent", b"pages"], ("registration", 7)),
    ([b"7", b"10.0.0.1", b"5000", b"session", b"pages", b"aux"], ("registration", 7)),
    ([b"ABORT", b"3", b"10.0.0.1", b"5000", b"1"], ("abort", 3)),
    ([b"ABORT_ACK", b"3", b"0", b"1"], ("abort_ack", 3)),
    ([b"AUX_DATA", b"3", b"0", b"1", b"\x00\x00\x00\x08", b"PDCONFRM"], ("aux_data", 3)),
    ([b"REGISTER", b"3", b"tcp://x", b"1", b"1,2", b"0"], ("registration", 3)),  # the reference's
    ([b"WRITE", b"3", b"1", b"7", b"1", b"0", b"aux", b"tcp://x"], ("aux_data", 3)),  # the reference's aux write
    ([b"WRITE", b"3", b"1", b"7", b"0", b"0", b"kv", b"tcp://x"], None), ([b"WRITE", b"3", b"1"], None), ([b"x"], None), ([], None), ([b"\xff\xfe", b"1", b"2"], None)])
def test_classify_reads_each_wire_format(frames, expected):
    assert classify(frames) == expected


def test_loss_drops_the_nth_message_of_its_kind_and_room_only():
    loss = MessageLoss()
    loss.set("status", room=5, nth=2, count=1)
    sent = [[b"5", b"2", b"0"], [b"6", b"2", b"0"], [b"5", b"3", b"0"], [b"ABORT", b"5", b"h", b"1"],
            [b"5", b"4", b"0"]]
    assert [loss.drops(m) for m in sent] == [False, False, True, False, False]
    (entry,) = loss.snapshot()
    assert entry["kind"] == "status" and entry["room"] == 5 and entry["nth"] == 2
    loss.set("abort", count=0)  # every later one
    assert [loss.drops([b"ABORT", str(r).encode(), b"h", b"1"]) for r in (1, 2)] == [True, True]
    loss.set(None)
    assert loss.drops([b"ABORT", b"1", b"h", b"1"]) is False
    with pytest.raises(ValueError):
        loss.set("gossip")
    with pytest.raises(ValueError):
        loss.set("abort", nth=0)


def test_installed_loss_keeps_a_lost_message_off_the_wire():
    message_loss.install()
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push.connect(f"tcp://127.0.0.1:{port}")
        message_loss.LOSS.set("abort", room=3)
        push.send_multipart([b"ABORT", b"3", b"h", b"1"])  # lost
        push.send_multipart([b"ABORT", b"4", b"h", b"1"])  # another room: sent
        assert pull.poll(5000) and pull.recv_multipart()[1] == b"4"
        assert not pull.poll(200)
    finally:
        message_loss.LOSS.forget()
        push.close(0)
        pull.close(0)
        ctx.term()


def test_on_a_real_role_an_inert_fault_makes_the_cell_error_and_a_fired_one_passes(tmp_path):
    """The planted state: an engine plan whose slow write (the 50th) the room never makes, on the
    reference's real roles; the same plan for the 1st write fires and the cell passes."""
    from cellruns import run_one

    inert = run_one("reference", "selftest-fault-never-fires", tmp_path / "inert")
    assert inert.verdict == Verdict.ERROR and inert.reason.startswith("fault never fired: engine-faults prefill"), \
        inert.reason
    fired = run_one("reference", "selftest-fault-fires", tmp_path / "fired")
    assert fired.verdict == Verdict.PASS, (fired.reason, fired.checks)
    assert [f["fired"] for f in fired.faults] == [True]


class _StubAgent:
    """The calls FaultyNixlAgent passes through, answering as a healthy NIXL agent would."""

    def transfer(self, handle, *args):
        return "PROC"

    def check_xfer_state(self, handle):
        return "DONE"

    def check_remote_metadata(self, name, *args):
        return True

    def add_remote_agent(self, metadata):
        raise RuntimeError("already loaded")  # the real agent never lost it


def test_nixl_error_kinds_surface_as_nixl_raises_them():
    from nixl import _bindings

    from backends.nixl.adapter import FaultyNixlAgent
    from harness.role.faults import EngineFaultCounter, EngineFaultPlan

    post = FaultyNixlAgent(_StubAgent(), EngineFaultCounter(EngineFaultPlan(fail_nth=1, error="post-error")))
    with pytest.raises(_bindings.nixlBackendError):
        post.transfer("h1")
    assert post.transfer("h2") == "PROC"  # only the nth
    gone = FaultyNixlAgent(_StubAgent(), EngineFaultCounter(EngineFaultPlan(fail_nth=1, error="remote-disconnect")))
    assert gone.transfer("h1") == "PROC"
    assert gone.check_remote_metadata("decode") is True
    with pytest.raises(_bindings.nixlRemoteDisconnectError):
        gone.check_xfer_state("h1")
    assert gone.check_remote_metadata("decode") is False  # the peer's metadata went with the error
    with pytest.raises(_bindings.nixlRemoteDisconnectError):
        gone.transfer("h2")  # the next post to the gone peer raises at once
    gone.add_remote_agent(b"metadata")  # sglang's reload
    assert gone.check_remote_metadata("decode") is True and gone.transfer("h3") == "PROC"
    with pytest.raises(ValueError):
        EngineFaultPlan(fail_nth=1, error="meteor")


@pytest.mark.parametrize("frames,is_whole", [
    ([b"5", b"2", b"0"], True), ([b"5", b"4", b"0", b"reason"], True),
    ([b"7", b"10.0.0.1", b"5000", b"session", b"pages"], True),  # a registration
    ([b"7", b"NODE-A", b"5000", b"session", b"pages"], True), ([b"7", b"fe80::1%eth0", b"5000", b"s", b"p"], True),
    ([b"5", b"5", b"2", b"0", b"0", b"0"], False),  # two statuses' frames interleaved
    ([b"5", b"AUX_DATA", b"5", b"0", b"1", b"x"], False),  # a status's room, then an AUX_DATA's frames
    ([b"STATUS", b"5"], True), ([b"WRITE", b"3", b"1", b"7", b"0", b"0", b"kv", b"tcp://x"], True),
    ([b"2", b"0"], False), ([b"\\xff"], False)])
def test_whole_tells_an_interleaved_message(frames, is_whole):
    assert message_loss.whole(frames) is is_whole


def test_installed_audit_counts_what_a_pull_socket_received():
    message_loss.install()
    message_loss.AUDIT.forget()
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push.connect(f"tcp://127.0.0.1:{port}")
        for message in ([b"5", b"4", b"0"], [b"5", b"5", b"2", b"0", b"0", b"0"]):
            push.send_multipart(message)
            assert pull.poll(5000)
            pull.recv_multipart()
        audit = message_loss.AUDIT.snapshot()
        assert audit["received"] == 2 and audit["not_whole"] == 1 and "b'5'" in audit["examples"][0]
    finally:
        message_loss.AUDIT.forget()
        push.close(0)
        pull.close(0)
        ctx.term()
