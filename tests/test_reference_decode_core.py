"""The reference decode state machine: scripted transitions for its requirements."""

from backends.reference import decode_core as dc
from harness.spec.protocol import KVPoll


def requested(core, room, prefill="P-A", now=0.0):
    core.handle(dc.OpenReceiver(room, prefill, now))
    (reg,) = [a for a in core.handle(dc.RequestKV(room, (1, 2), 0, now)) if isinstance(a, dc.SendRegistration)]
    return reg


def test_success_of_the_current_generation_only():
    core = dc.DecodeCore()
    reg = requested(core, 5)
    assert core.status(5) == KVPoll.WaitingForInput
    assert core.handle(dc.StatusReceived(5, "P-A", KVPoll.Success, generation=reg.generation + 1)) == []
    actions = core.handle(dc.StatusReceived(5, "P-A", KVPoll.Success, generation=reg.generation))
    assert dc.ReleaseSafe(5) in actions and core.status(5) == KVPoll.Success
    assert core.handle(dc.StatusReceived(5, "P-A", KVPoll.Failed, "late", reg.generation)) == []  # R-TERM-1


def test_reused_room_ignores_the_old_lifecycle():
    core = dc.DecodeCore()
    old = requested(core, 5)
    core.handle(dc.Clear(5))
    new = requested(core, 5)
    assert new.generation != old.generation
    assert core.handle(dc.StatusReceived(5, "P-A", KVPoll.Success, generation=old.generation)) == []
    assert core.status(5) == KVPoll.WaitingForInput


def test_dead_prefill_fails_only_its_rooms():
    core = dc.DecodeCore(heartbeat_interval_s=2, heartbeat_max_failures=2)
    requested(core, 1, "P-A")
    core.handle(dc.OpenReceiver(2, "P-A", 0.0))  # still Bootstrapping: fails too
    requested(core, 3, "P-B")
    probes = core.handle(dc.Tick(2.0))
    assert {p.prefill for p in probes if isinstance(p, dc.ProbeHealth)} == {"P-A", "P-B"}
    assert core.handle(dc.HeartbeatResult("P-A", False, 2.0)) == []
    actions = core.handle(dc.HeartbeatResult("P-A", False, 4.0))
    assert {a.room for a in actions} == {1, 2}
    assert all("prefill P-A stopped answering" in a.reason for a in actions)
    assert core.status(3) == KVPoll.WaitingForInput


def test_waiting_timeout_names_the_prefill():
    core = dc.DecodeCore(waiting_timeout_s=10)
    requested(core, 1)
    core.handle(dc.OpenReceiver(2, "P-A", 0.0))
    assert [a for a in core.handle(dc.Tick(9.9)) if isinstance(a, dc.StatusChanged)] == []
    (failed,) = [a for a in core.handle(dc.Tick(10.0)) if isinstance(a, dc.StatusChanged)]
    assert failed.room == 1 and "prefill P-A" in failed.reason and core.status(2) == KVPoll.Bootstrapping


def test_abort_releases_only_on_the_ack_of_this_generation():
    core = dc.DecodeCore(deferred_release=True)
    reg = requested(core, 4)
    actions = core.handle(dc.Abort(4))
    assert dc.SendAbort(4, "P-A", reg.generation) in actions and dc.ReleaseSafe(4) not in actions
    assert core.handle(dc.AbortAckReceived(4, reg.generation - 1)) == []
    assert core.handle(dc.AbortAckReceived(4, reg.generation)) == [dc.ReleaseSafe(4)]
    assert core.handle(dc.AbortAckReceived(4, reg.generation)) == []
    core.handle(dc.Clear(4))
    assert core.residue() == {}


def test_a_room_of_several_prefill_stages_needs_every_stage():
    """A prefill of two pipeline stages: one stage's Success (twice) is not the room's; one
    stage's ABORT_ACK does not release the pages while the other stage may still write."""
    core = dc.DecodeCore()
    core.handle(dc.OpenReceiver(6, "P-A", 0.0, stages=2))
    (reg,) = [a for a in core.handle(dc.RequestKV(6, (1,), 0, 0.0)) if isinstance(a, dc.SendRegistration)]
    assert core.handle(dc.StatusReceived(6, "P-A", KVPoll.Success, generation=reg.generation, stage=1)) == []
    assert core.handle(dc.StatusReceived(6, "P-A", KVPoll.Success, generation=reg.generation, stage=1)) == []
    assert core.status(6) == KVPoll.WaitingForInput
    actions = core.handle(dc.StatusReceived(6, "P-A", KVPoll.Success, generation=reg.generation, stage=0))
    assert core.status(6) == KVPoll.Success and dc.ReleaseSafe(6) in actions

    core.handle(dc.OpenReceiver(7, "P-A", 0.0, stages=2))
    (reg,) = [a for a in core.handle(dc.RequestKV(7, (2,), 1, 0.0)) if isinstance(a, dc.SendRegistration)]
    core.handle(dc.Abort(7))
    assert core.handle(dc.AbortAckReceived(7, reg.generation, stage=0)) == []
    assert core.handle(dc.AbortAckReceived(7, reg.generation, stage=1)) == [dc.ReleaseSafe(7)]


def test_one_stage_failing_fails_the_room():
    core = dc.DecodeCore()
    core.handle(dc.OpenReceiver(8, "P-A", 0.0, stages=3))
    (reg,) = [a for a in core.handle(dc.RequestKV(8, (1,), 0, 0.0)) if isinstance(a, dc.SendRegistration)]
    core.handle(dc.StatusReceived(8, "P-A", KVPoll.Success, generation=reg.generation, stage=0))
    core.handle(dc.StatusReceived(8, "P-A", KVPoll.Failed, "stage 2: write failed", reg.generation, stage=2))
    assert core.status(8) == KVPoll.Failed
