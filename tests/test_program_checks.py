"""The checks of generated programs (harness.explore.program_checks) on hand-built histories:
each catches its planted state and passes the correct one; and the program model marks the
rooms a failed write may reach."""

import pytest

from harness.explore import program_checks as pc
from harness.explore.program import ProgramMachine
from harness.explore.program_model import AT_RISK_BOUND_S, PREFILLS
from harness.spec.history import History
from harness.spec.protocol import KVPoll
from harness.spec.steps import AwaitStatus, Clear, EngineFaults, KillRole, SendChunk, VerifyPools


def _lifecycle(h: History, label: str, room: int, status: int, verified_ok: bool | None) -> None:
    h.record("ok", "await_status", "decode", 1, args={"room": room, "label": label},
             value={"reached": True, "status": status, "status_name": KVPoll(status).name})
    if verified_ok is not None:
        h.record("ok", "verify", "decode", 1, args={"label": label},
                 value={"ok": verified_ok, "mismatch_pages": 0 if verified_ok else 1,
                        "mismatches": [] if verified_ok else ["decode page 3 layer 0 K: pattern of nothing"]})
    h.record("ok", "await_status", "prefill", 1, args={"room": room, "label": label},
             value={"reached": True, "status": status, "status_name": KVPoll(status).name})


def test_bytes_at_success_catches_a_success_read_before_the_bytes_landed():
    h = History()
    _lifecycle(h, "L0", 2**40, KVPoll.Success, True)
    _lifecycle(h, "L1", 2**40 + 1, KVPoll.Success, False)  # planted: Success with a page not yet written
    ok, detail, *_ = pc.bytes_at_success()(h.events)
    assert ok is False and "lifecycle L1" in detail and "page 3" in detail
    right = History()
    _lifecycle(right, "L0", 2**40, KVPoll.Success, True)
    _lifecycle(right, "L1", 2**40 + 1, KVPoll.Failed, False)  # a Failed room's pages are not judged here
    assert pc.bytes_at_success()(right.events)[0] is True


def test_at_risk_rooms_may_fail_but_must_conclude_on_both_sides():
    h = History()
    _lifecycle(h, "L0", 2**40, KVPoll.Failed, None)
    assert pc.all_reached(("L0",), (KVPoll.Success, KVPoll.Failed))(h.events)[0] is True
    assert pc.all_reached(("L0",), (KVPoll.Success,))(h.events)[0] is False
    stuck = History()
    stuck.record("ok", "await_status", "prefill", 1, args={"room": 7, "label": "L0"},
                 value={"reached": True, "status": KVPoll.Failed, "status_name": "Failed"})
    stuck.record("ok", "await_status", "decode", 1, args={"room": 7, "label": "L0"},
                 value={"reached": False, "status": KVPoll.WaitingForInput, "status_name": "WaitingForInput"})
    ok, detail, *_ = pc.all_reached(("L0",), (KVPoll.Success, KVPoll.Failed))(stuck.events)
    assert ok is False and "decode room 7 (lifecycle L0) read WaitingForInput" in detail


def _acks(acks: list[tuple[int, int, int]]) -> list[dict]:
    h = History()
    h.record("info", "abort-acks", "decode", 1, args={},
             value=[{"room": r, "generation": g, "sender": s, "t": 1.0} for r, g, s in acks])
    return h.events


def test_abort_ack_once_catches_a_second_copy_of_one_generation():
    assert pc.acks_once((5,))(_acks([(5, 1, 0), (5, 2, 0), (5, 1, 1)]))[0] is True  # reuse and a second sender
    ok, detail, *_ = pc.acks_once((5,))(_acks([(5, 1, 0), (5, 1, 0)]))
    assert ok is False and "room 5 generation 1" in detail


class _Draws:
    """Stands in for hypothesis's ``data`` in a rule: answers each draw by its label."""

    def __init__(self, **answers):
        self.answers = answers

    def draw(self, strategy, label: str):
        return self.answers[label]


def _open(m: ProgramMachine, room: int, prefill: str = "prefill") -> None:
    m.open_room(_Draws(**{"pages": 2, "room": room, "source pages": [0, 1], "chunk cuts": set(), "aux source": 0,
                          "reuse a cleared room id": False, "prefill": prefill}))


def test_a_fail_plan_puts_every_unconcluded_room_and_the_next_ones_at_risk():
    m = ProgramMachine()
    _open(m, 2**40)  # concluded before the plan: not at risk
    m.init_sender(_Draws(room=m.rooms[0]))
    m.send_chunk(_Draws(room=m.rooms[0]))
    m.conclude(_Draws(room=m.rooms[0]))
    _open(m, 2**40 + 1)  # open when the plan is set: at risk
    m.engine_faults(_Draws(**{"engine fault": "fail", "nth": 2, "prefill": "prefill"}))
    _open(m, 2**40 + 2)  # opened while it holds: at risk
    m.engine_faults(_Draws(**{"engine fault": "heal", "prefill": "prefill"}))
    _open(m, 2**40 + 3)  # after the heal: clean
    program = m.program()
    assert [x[2] for x in program.lifecycles] == [False, True, True, False]
    assert EngineFaults("prefill", fail_nth=2) in program.steps
    final = [s for s in program.steps if isinstance(s, VerifyPools)][-1]
    judged = {d for _, d in final.kv_moves}
    assert judged == set(m.rooms[0].dst + m.rooms[3].dst) and set(final.unchecked_kv) == set(m.rooms[1].dst +
                                                                                             m.rooms[2].dst)
    bounds = {s.label: s.timeout_s for s in program.steps if isinstance(s, AwaitStatus) and s.label}
    assert bounds["L1"] == bounds["L2"] == AT_RISK_BOUND_S > bounds["L0"] == bounds["L3"]
    kinds = [c.name for c in program.checks()]
    assert kinds.index("failed-write-rooms-conclude") < kinds.index("clean-rooms-succeed")
    assert "abort-ack-once" not in kinds  # the plain profile: no deferred release, no ACK to judge


@pytest.mark.parametrize("unscheduled_first", [False, True])
def test_rooms_opened_after_the_prefills_restart_stand_for_r_restart_1(unscheduled_first):
    """Lifecycle i is the i-th OpenRoom that opens a sender: a registration no prefill schedules
    (its OpenRoom opens none) must not shift which lifecycles come after the restart."""
    m = ProgramMachine()
    if unscheduled_first:
        m.may_unschedule = True
        m.register_unscheduled(_Draws(prefill="prefill", room=2**41, pages=1))
    _open(m, 2**40)
    m.init_sender(_Draws(room=m.rooms[0]))
    m.send_chunk(_Draws(room=m.rooms[0]))
    m.conclude(_Draws(room=m.rooms[0]))
    m.clear(_Draws(room=m.rooms[0]))
    m.restart_prefill(_Draws(prefill="prefill"))
    _open(m, 2**40 + 1)
    checks = {c.name: c for c in m.program().checks()}
    h = History()
    _lifecycle(h, "L0", 2**40, KVPoll.Success, True)
    _lifecycle(h, "L1", 2**40 + 1, KVPoll.Failed, None)  # planted: the decode kept the old prefill's ports
    ok, detail, *_ = checks["rooms-after-restart-succeed"].fn(h.events)
    assert ok is False and "lifecycle L1" in detail and checks["rooms-after-restart-succeed"].requirement == "R-RESTART-1"
    assert checks["clean-rooms-succeed"].fn(h.events)[0] is True  # L0, before the restart, is judged there


def test_bytes_that_never_land_are_a_layout_failure_not_a_late_one():
    h = History()
    _lifecycle(h, "L0", 2**40, KVPoll.Success, False)  # wrong at Success ...
    h.record("ok", "verify", "decode", 1, args={}, value={"ok": False, "mismatch_pages": 1,
                                                          "mismatches": ["page 3: still wrong"]})  # ... and for good
    ok, detail, *_ = pc.bytes_at_success()(h.events)
    assert ok is True and "bytes-exact" in detail
    unwritten = History()
    _lifecycle(unwritten, "L0", 2**40, KVPoll.Success, False)
    poll_check = next(e for e in unwritten.events if e["op"] == "verify")
    poll_check["value"]["unwritten_pages"] = 1  # planted: a page still held the decode's own bytes
    unwritten.record("ok", "verify", "decode", 1, args={}, value={"ok": False, "mismatch_pages": 1,
                                                                  "mismatches": ["page 3: still wrong"]})
    ok, detail, *_ = pc.bytes_at_success()(unwritten.events)
    assert ok is False and "lifecycle L0" in detail


def test_a_decode_kill_fails_the_rooms_written_after_it_and_judges_the_prefill_alone():
    m = ProgramMachine()
    _open(m, 2**40)  # its first chunk goes before the kill, its second after: must read Failed
    _open(m, 2**40 + 1)  # every chunk sent before the kill: must only end
    _open(m, 2**40 + 2)  # concluded before the kill: judged as a clean room
    m.rooms[0].chunks = [(0,), (1,)]
    for r in m.rooms:
        m.init_sender(_Draws(room=r))
        m.send_chunk(_Draws(room=r))
    m.conclude(_Draws(room=m.rooms[2]))
    m.may_kill = "decode"
    m.kill()
    program = m.program()
    assert [x[3] for x in program.lifecycles] == ["sender-fail", "sender-end", ""]
    after = program.steps[program.steps.index(KillRole("decode")) + 1:]
    assert all(getattr(s, "role", "prefill") == "prefill" for s in after if not isinstance(s, VerifyPools)), after
    assert not any(isinstance(s, VerifyPools) for s in after)  # no pools left to read
    assert SendChunk(2**40, (1,)) in after and Clear(2**40, "prefill") in after
    checks = {c.name: c for c in program.checks()}
    assert "bytes-exact" not in checks and checks["sender-rooms-fail-after-decode-kill"].requirement == "R-PEER-1"
    right = History()
    for label, room, status in (("L0", 2**40, KVPoll.Failed), ("L1", 2**40 + 1, KVPoll.Success)):
        right.record("ok", "await_status", "prefill", 1, args={"room": room, "label": label},
                     value={"reached": True, "status": status, "status_name": KVPoll(status).name})
    assert checks["sender-rooms-fail-after-decode-kill"].fn(right.events)[0] is True
    assert checks["sender-rooms-end-after-decode-kill"].fn(right.events)[0] is True
    planted = History()  # a write to the dead decode reported as landed
    planted.record("ok", "await_status", "prefill", 1, args={"room": 2**40, "label": "L0"},
                   value={"reached": True, "status": KVPoll.Success, "status_name": "Success"})
    ok, detail, *_ = checks["sender-rooms-fail-after-decode-kill"].fn(planted.events)
    assert ok is False and "prefill room 1099511627776 (lifecycle L0) read Success, not Failed" in detail


def test_a_prefill_killed_beside_another_fails_its_rooms_and_spares_the_others():
    m = ProgramMachine()
    m.prefills = PREFILLS
    _open(m, 2**40, "prefill-b")  # one chunk sent to the prefill that dies: must fail on the decode
    _open(m, 2**40 + 1, "prefill")  # in flight on the other prefill: spared, must succeed (R-HB-1)
    m.rooms[0].chunks = [(0,), (1,)]
    m.init_sender(_Draws(room=m.rooms[0]))
    m.send_chunk(_Draws(room=m.rooms[0]))
    m.may_kill = "prefill-b"
    m.kill()
    assert m._alive_prefills() == ["prefill"] and [r.room for r in m._serving()] == [2**40 + 1]
    _open(m, 2**40 + 2, "prefill")  # the other prefill goes on serving: a room opened after the kill
    program = m.program()
    assert [x[3] for x in program.lifecycles] == ["fail", "spared", ""]
    after = program.steps[program.steps.index(KillRole("prefill-b")) + 1:]
    assert not any("prefill-b" in (getattr(s, "role", None), getattr(s, "prefill", None)) for s in after), after
    assert SendChunk(2**40 + 1, (0, 1), prefill="prefill") in after and Clear(2**40 + 2, "prefill") in after
    checks = {c.name: c for c in program.checks()}
    assert checks["other-prefill-rooms-succeed"].requirement == "R-HB-1"
    planted = History()  # the heartbeat failed the other prefill's room too
    _lifecycle(planted, "L1", 2**40 + 1, KVPoll.Failed, None)
    ok, detail, *_ = checks["other-prefill-rooms-succeed"].fn(planted.events)
    assert ok is False and "lifecycle L1" in detail
    right = History()
    _lifecycle(right, "L1", 2**40 + 1, KVPoll.Success, True)
    assert checks["other-prefill-rooms-succeed"].fn(right.events)[0] is True
    kill = History()  # rooms-fail-after-kill looks for the kill of prefill-b, not of "prefill"
    kill.record("nemesis", "kill", "prefill-b", None, args={"signal": "SIGKILL"})
    kill.record("ok", "await_status", "decode", 1, args={"room": 2**40, "label": "L0"},
                value={"reached": True, "status": KVPoll.Failed, "status_name": "Failed", "trail": ["Failed"],
                       "failure_reason": "prefill 127.0.0.1:5 is dead", "seen_wall": 2.0})
    ok, detail, *_ = checks["rooms-fail-after-kill"].fn(kill.events)
    assert ok is False and "prefill-b never had kill" not in detail and "prefill-b (" in detail, detail  # its address
    assert "prefill never had kill" in pc.failed_after_kill(("L0",))(kill.events)[1]  # the default names "prefill"


def test_a_load_program_holds_its_burst_of_rooms_as_lifecycles_and_checks_every_byte():
    """explore's load rule (R-LOAD-1): a burst of harness.spec.load_plan's rooms, each a lifecycle
    polled to its end on both sides under its label; the program's end checks every served
    room's bytes and leaves the aborted rooms' pages unchecked."""
    from harness.explore.program_model import PROFILES
    from harness.spec import load_plan

    m = ProgramMachine()
    m.load_burst(_Draws(**{"rooms in flight": 64, "burst seed": 3}))
    program = m.program()
    burst = load_plan.plan(3, 64, load_plan.layout(256))
    assert program.steps[0] == PROFILES["load"] and len(program.lifecycles) == 64
    assert [x[1] for x in program.lifecycles] == [p.room in burst.aborted for p in burst.rooms]
    polls = {(s.room, s.role): s.label for s in program.steps if isinstance(s, AwaitStatus) and s.label}
    assert all(polls[(p.room, side)] == f"L{i}" for i, p in enumerate(burst.rooms) for side in ("decode", "prefill"))
    final = [s for s in program.steps if isinstance(s, VerifyPools)][-1]
    served = [p for p in burst.rooms if p.room not in burst.aborted]
    assert set(final.kv_moves) == {m for p in served for m in p.kv_moves}
    assert set(final.unchecked_kv) == {d for p in burst.rooms if p.room in burst.aborted for d in p.dst}
    assert not m._room_left()  # the pools hold no room beyond the burst's
    assert sum(isinstance(s, Clear) for s in program.steps) == 2 * 64
