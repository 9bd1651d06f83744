"""Stateful property test of the reference: both cores over an explicit network.

Rules open rooms (reusing room ids), request, send, abort, clear, kill and
restart the prefill, deliver / drop / duplicate any message in flight, complete
or fail any write, and advance time.  Invariants (docs/protocol.md) after every
step: terminal statuses stay terminal (R-TERM-1), no write lands in pages the
decode released (R-STALE-1, R-ABORT-2), at most one ABORT_ACK per generation of
a room the prefill holds (R-ABORT-2), no residue once everything is cleared and
quiet (R-RESIDUE-1); and at the end of every example ``settle`` checks that every
room is terminal once faults stop and the timeouts pass (R-TIMEOUT-1/2, R-HB-1).
"""

import os

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from backends.reference import decode_core as dc
from backends.reference import prefill_core as pc
from harness.spec.protocol import KVPoll

P, D = "prefill-0", "decode-0"
ROOMS = st.sampled_from([1, 2])
BOOTSTRAP_TIMEOUT, WAITING_TIMEOUT, HB_INTERVAL, HB_MAX = 4.0, 6.0, 1.0, 2


class ReferenceMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.now = 0.0
        self.prefill = self._new_prefill()
        self.decode = dc.DecodeCore(WAITING_TIMEOUT, HB_INTERVAL, HB_MAX, deferred_release=True)
        self.alive = True
        self.net: list[tuple[str, object]] = []  # messages in flight: (target, event)
        self.writes: dict[int, tuple[int, int]] = {}  # write id -> (room, decode generation)
        self.generation_of: dict[int, int] = {}  # prefill room -> generation it serves
        self.released: set[tuple[int, int]] = set()
        self.terminal: dict[tuple[str, int], int] = {}
        self.acks: dict[tuple[int, int], int] = {}

    def _new_prefill(self):
        return pc.PrefillCore(BOOTSTRAP_TIMEOUT, deferred_release=True)

    # ---- plumbing --------------------------------------------------------------
    def _status(self, side, room, status):
        key = (side, room)
        old = self.terminal.get(key)
        assert old is None or old == status, f"{side} room {room}: terminal {old} became {status}"  # R-TERM-1
        if status in (KVPoll.Success, KVPoll.Failed):
            self.terminal[key] = status

    def to_prefill(self, event):
        if not self.alive:
            return
        if isinstance(event, pc.DecodeRegistered):
            self.generation_of.setdefault(event.room, event.generation)
        for a in self.prefill.handle(event):
            if isinstance(a, pc.StartWrite):
                self.writes[a.write_id] = (a.room, a.generation)
            elif isinstance(a, pc.SendStatus):
                self.net.append(("D", dc.StatusReceived(a.room, P, a.status, a.reason, a.generation)))
            elif isinstance(a, pc.SendAbortAck):
                if a.room in self.prefill.rooms:
                    key = (a.room, a.generation)
                    self.acks[key] = self.acks.get(key, 0) + 1
                    assert self.acks[key] == 1, f"second ABORT_ACK for {key}"  # R-ABORT-2
                self.net.append(("D", dc.AbortAckReceived(a.room, a.generation)))
            elif isinstance(a, pc.StatusChanged):
                self._status("prefill", a.room, a.status)

    def to_decode(self, event):
        for a in self.decode.handle(event):
            if isinstance(a, dc.SendRegistration):
                self.net.append(("P", pc.DecodeRegistered(a.room, D, a.dst_pages, a.aux_slot, a.generation)))
            elif isinstance(a, dc.SendAbort):
                self.net.append(("P", pc.AbortReceived(a.room, D, a.generation)))
            elif isinstance(a, dc.ProbeHealth):
                self.to_decode(dc.HeartbeatResult(a.prefill, self.alive, self.now))
            elif isinstance(a, dc.ReleaseSafe):
                self.released.add((a.room, self.decode.rooms[a.room].generation))
            elif isinstance(a, dc.StatusChanged):
                self._status("decode", a.room, a.status)

    def land(self, write_id, ok):
        room, generation = self.writes.pop(write_id)
        if ok:
            assert (room, generation) not in self.released, \
                f"write {write_id} landed in room {room} (generation {generation}) after release"  # R-ABORT-2
        self.to_prefill(pc.WriteDone(room, write_id, ok, "" if ok else "injected"))

    # ---- rules -----------------------------------------------------------------
    @rule(room=ROOMS)
    def open_room(self, room):
        if room in self.decode.rooms or room in self.prefill.rooms:
            return
        self.terminal.pop(("decode", room), None)
        self.terminal.pop(("prefill", room), None)
        self.acks = {k: v for k, v in self.acks.items() if k[0] != room}
        self.to_decode(dc.OpenReceiver(room, P, self.now))
        self.to_prefill(pc.OpenSender(room, self.now))

    @rule(room=ROOMS, n=st.integers(1, 3))
    def request(self, room, n):
        self.to_decode(dc.RequestKV(room, tuple(range(10 * room, 10 * room + n)), 0, self.now))

    @rule(room=ROOMS, split=st.integers(0, 3))
    def send(self, room, split):
        r = self.prefill.rooms.get(room)
        if not self.alive or r is None or r.status != KVPoll.WaitingForInput:
            return  # the scheduler sends only once the sender is WaitingForInput
        n = len(r.dst_pages)
        self.to_prefill(pc.InitSender(room, n, 0))
        self.to_prefill(pc.SendChunk(room, tuple(range(min(split, n))), last=False))
        self.to_prefill(pc.SendChunk(room, tuple(range(min(split, n), n)), last=True))

    @rule(room=ROOMS)
    def abort(self, room):
        self.to_decode(dc.Abort(room))

    @rule(room=ROOMS)
    def clear_decode(self, room):
        r = self.decode.rooms.get(room)
        if r is not None and r.status in (KVPoll.Success, KVPoll.Failed) and not r.awaiting_ack:
            self.to_decode(dc.Clear(room))
            self.terminal.pop(("decode", room), None)

    @rule(room=ROOMS)
    def clear_prefill(self, room):
        if self.alive and self.prefill.status(room) in (KVPoll.Success, KVPoll.Failed):
            self.to_prefill(pc.Clear(room))
            self.terminal.pop(("prefill", room), None)

    @precondition(lambda self: self.net)
    @rule(data=st.data())
    def deliver(self, data):
        target, event = self.net.pop(data.draw(st.integers(0, len(self.net) - 1)))
        self.to_prefill(event) if target == "P" else self.to_decode(event)

    @precondition(lambda self: self.net)
    @rule(to=st.sampled_from(["P", "D"]))
    def deliver_all_to(self, to):
        """Everything in flight to one side, in order (the common case, in one step)."""
        pending, self.net = [e for t, e in self.net if t == to], [(t, e) for t, e in self.net if t != to]
        for event in pending:
            self.to_prefill(event) if to == "P" else self.to_decode(event)

    @precondition(lambda self: self.net)
    @rule(data=st.data())
    def drop(self, data):
        self.net.pop(data.draw(st.integers(0, len(self.net) - 1)))

    @precondition(lambda self: self.net)
    @rule(data=st.data())
    def duplicate(self, data):
        self.net.append(self.net[data.draw(st.integers(0, len(self.net) - 1))])

    @precondition(lambda self: self.writes)
    @rule(data=st.data(), ok=st.booleans())
    def complete_write(self, data, ok):
        self.land(data.draw(st.sampled_from(sorted(self.writes))), ok)

    @rule()
    def kill_prefill(self):
        self.alive = False
        self.writes.clear()  # a dead prefill's posted writes never complete
        self.net = [(t, e) for t, e in self.net if t != "P"]

    @precondition(lambda self: not self.alive)
    @rule()
    def restart_prefill(self):
        self.prefill = self._new_prefill()
        self.alive = True
        self.terminal = {k: v for k, v in self.terminal.items() if k[0] != "prefill"}

    @rule(dt=st.floats(0.05, 1.0))  # short steps: rooms live long enough for races to happen
    def advance(self, dt):
        self.now += dt
        self.to_decode(dc.Tick(self.now))
        self.to_prefill(pc.Tick(self.now))

    def teardown(self):
        self.settle()

    def settle(self):
        """Faults stop and both schedulers do their part: deliver everything, complete
        every write, send every waiting room, let the timeouts pass."""
        for room, r in list(self.decode.rooms.items()):
            if r.waiting_since is None:
                self.request(room, 1)
        for _ in range(50):
            for room in list(self.prefill.rooms if self.alive else []):
                self.send(room, 0)
            while self.net:
                target, event = self.net.pop(0)
                self.to_prefill(event) if target == "P" else self.to_decode(event)
            for write_id in sorted(self.writes):
                self.land(write_id, True)
            waiting = self.alive and any(r.status == KVPoll.WaitingForInput for r in self.prefill.rooms.values())
            if not self.net and not self.writes and not waiting:
                break
        for _ in range(int((WAITING_TIMEOUT + BOOTSTRAP_TIMEOUT) / HB_INTERVAL) + 3):
            self.advance(HB_INTERVAL)
            while self.net:
                target, event = self.net.pop(0)
                self.to_prefill(event) if target == "P" else self.to_decode(event)
        for room, r in self.decode.rooms.items():
            assert r.status in (KVPoll.Success, KVPoll.Failed), f"decode room {room} still {r.status} after every timeout"
        if self.alive:
            for room, r in self.prefill.rooms.items():
                assert r.status in (KVPoll.Success, KVPoll.Failed), f"prefill room {room} still {r.status} after every timeout"

    @invariant()
    def no_residue_when_everything_is_cleared(self):
        if not self.decode.rooms and not self.writes and not self.net:
            assert self.decode.residue() == {}, self.decode.residue()
            if self.alive and not self.prefill.rooms:
                assert not set(self.prefill.residue()) - {"registrations", "tombstones", "retired"}, self.prefill.residue()


TestReferenceMachine = ReferenceMachine.TestCase  # example counts from the hypothesis profile (conftest.py)


@pytest.mark.skipif(os.environ.get("PDCONFORM_HYPOTHESIS_PROFILE") != "nightly",
                    reason="needs the nightly example budget: the two-core machine reaches this race rarely")
def test_planted_bug_is_found_by_the_two_core_machine():
    """The reference's own planted bug (ABORT answered with writes in flight) is found by
    the two-core machine at nightly size (at CI size only the prefill machine finds it)."""
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    class Planted(ReferenceMachine):
        def _new_prefill(self):
            return pc.PrefillCore(BOOTSTRAP_TIMEOUT, deferred_release=True, planted_bug="ack-before-drain")

    try:
        run_state_machine_as_test(Planted, settings=settings(max_examples=5000, stateful_step_count=40,
                                                             deadline=None, database=None, derandomize=True))
    except AssertionError as exc:
        assert "after release" in str(exc) or "ABORT_ACK" in str(exc), exc
    else:
        raise AssertionError("the planted bug was not found")
