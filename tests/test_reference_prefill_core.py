"""The reference prefill state machine: scripted transitions and a stateful property test."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from backends.reference import prefill_core as pc
from harness.spec.protocol import KVPoll

D = "decode-0"


def writes(actions):
    return [a for a in actions if isinstance(a, pc.StartWrite)]


def opened(core, room=7, pages=(5, 6, 7)):
    core.handle(pc.OpenSender(room, now=0.0))
    core.handle(pc.DecodeRegistered(room, D, pages, aux_slot=2))
    core.handle(pc.InitSender(room, num_pages=len(pages), aux_slot=1))
    return core


def test_two_chunks_then_success_sent_to_the_decode():
    core = opened(pc.PrefillCore())
    assert core.status(7) == KVPoll.WaitingForInput
    w1 = writes(core.handle(pc.SendChunk(7, (0, 1), last=False)))
    assert [(w.src, w.dst) for w in w1] == [((0, 1), (5, 6))]
    w2 = writes(core.handle(pc.SendChunk(7, (9,), last=True)))
    assert [(w.src, w.dst, w.aux) for w in w2] == [((9,), (7,), False), ((1,), (2,), True)]
    assert core.status(7) == KVPoll.Transferring
    for w in w1 + w2[:1]:
        assert core.handle(pc.WriteDone(7, w.write_id, ok=True)) == []
    actions = core.handle(pc.WriteDone(7, w2[1].write_id, ok=True))
    assert pc.SendStatus(7, D, KVPoll.Success) in actions and core.status(7) == KVPoll.Success


def test_registration_before_the_sender_is_kept():
    core = pc.PrefillCore()
    core.handle(pc.DecodeRegistered(3, D, (1,), 0))
    core.handle(pc.OpenSender(3, now=0.0))
    assert core.status(3) == KVPoll.WaitingForInput


def test_bootstrap_timeout_only_while_bootstrapping():
    core = pc.PrefillCore(bootstrap_timeout_s=5)
    core.handle(pc.OpenSender(1, now=0.0))
    opened(core, room=2)
    assert core.handle(pc.Tick(4.9)) == []
    actions = core.handle(pc.Tick(5.0))
    assert core.status(1) == KVPoll.Failed and core.status(2) == KVPoll.WaitingForInput
    assert "bootstrap timeout of 5 s" in actions[0].reason


def test_a_write_that_never_completes_fails_the_room_at_the_transfer_timeout():
    core = opened(pc.PrefillCore(transfer_timeout_s=4))
    core.handle(pc.Tick(1.0))
    stuck = writes(core.handle(pc.SendChunk(7, (0, 1, 2), last=True)))
    assert core.handle(pc.Tick(4.9)) == [] and core.status(7) == KVPoll.Transferring
    actions = core.handle(pc.Tick(5.0))
    assert core.status(7) == KVPoll.Failed
    assert any(isinstance(a, pc.SendStatus) and a.status == KVPoll.Failed and "transfer timeout of 4 s" in a.reason
               for a in actions)
    # the lost writes no longer hold the room: a late completion is ignored and clear leaves no drain
    core.handle(pc.WriteDone(7, stuck[0].write_id, ok=True))
    core.handle(pc.Clear(7))
    assert "draining" not in core.residue() and "writes" not in core.residue()


def test_writes_to_a_lost_decode_fail_so_a_cleared_room_leaves_nothing():
    """found-reference-85608e36be (explore on the reference, issue 35): the decode is killed, the
    prefill writes a chunk to it (never answered) and the engine fails the next write, so the room
    ends Failed and is cleared with the first write outstanding.  Its drain and write record stayed
    until the transfer timeout, long after the clear (R-RESIDUE-1).  A lost decode fails its
    writes (R-PEER-1), here after the clear and, for a room still held, before it; another
    decode's writes are untouched."""
    core = opened(pc.PrefillCore(transfer_timeout_s=20))
    core.handle(pc.Tick(1.0))
    core.handle(pc.OpenSender(8, now=1.0))
    core.handle(pc.DecodeRegistered(8, "decode-1", (3,), aux_slot=0))
    core.handle(pc.InitSender(8, num_pages=1, aux_slot=0))
    (other,) = writes(core.handle(pc.SendChunk(8, (4,), last=False)))
    (unanswered,) = writes(core.handle(pc.SendChunk(7, (0,), last=False)))
    (failed,) = writes(core.handle(pc.SendChunk(7, (1,), last=False)))
    core.handle(pc.WriteDone(7, failed.write_id, ok=False, reason="engine fault"))
    assert core.status(7) == KVPoll.Failed
    core.handle(pc.Clear(7))
    assert core.residue()["draining"] == [7]  # the unanswered write may still land: drained first
    assert core.handle(pc.DecodeLost(D, "its connection closed")) == []
    assert "draining" not in core.residue() and core.residue()["writes"] == [8]  # decode-1's write goes on
    assert core.status(8) == KVPoll.Transferring

    held = opened(pc.PrefillCore(), room=9)  # a room still held fails, naming the lost decode
    (w,) = writes(held.handle(pc.SendChunk(9, (0,), last=False)))
    actions = held.handle(pc.DecodeLost(D, "it refuses connections"))
    assert held.status(9) == KVPoll.Failed and not held.issued
    reason = next(a.reason for a in actions if isinstance(a, pc.StatusChanged))
    assert reason == f"write {w.write_id} failed: decode {D} lost: it refuses connections", reason


def test_no_transfer_timeout_by_default():
    core = opened(pc.PrefillCore())
    core.handle(pc.Tick(0.0))
    core.handle(pc.SendChunk(7, (0, 1, 2), last=True))
    core.handle(pc.Tick(10_000.0))
    assert core.status(7) == KVPoll.Transferring


def test_stale_chunk_after_clear_is_dropped_without_a_write():
    core = opened(pc.PrefillCore())
    core.handle(pc.Clear(7))
    actions = core.handle(pc.SendChunk(7, (0,), last=True))
    assert writes(actions) == [] and core.residue() == {"retired": [7]}
    core.handle(pc.Tick(core.bootstrap_timeout_s + 1))  # the retired generation expires
    assert core.residue() == {}


def test_abort_mid_transfer_acks_once_after_drain():
    core = opened(pc.PrefillCore())
    (w,) = writes(core.handle(pc.SendChunk(7, (0,), last=False)))
    actions = core.handle(pc.AbortReceived(7, D, generation=0))
    assert core.status(7) == KVPoll.Failed and not any(isinstance(a, pc.SendAbortAck) for a in actions)
    assert core.handle(pc.AbortReceived(7, D, generation=0)) == []  # duplicate ABORT: still waiting
    assert writes(core.handle(pc.SendChunk(7, (1,), last=True))) == []  # no write after Failed
    assert core.handle(pc.WriteDone(7, w.write_id, ok=True)) == [pc.SendAbortAck(7, D, 0)]
    assert core.handle(pc.AbortReceived(7, D, generation=0)) == []  # exactly once
    core.handle(pc.Clear(7))
    assert pc.SendAbortAck(7, D, 0) not in core.handle(pc.AbortReceived(7, D, generation=0))  # even after clear
    core.handle(pc.Tick(core.bootstrap_timeout_s + 1))
    assert core.residue() == {}


def test_clear_then_abort_acks_after_the_writes_drain():
    core = opened(pc.PrefillCore())
    (w,) = writes(core.handle(pc.SendChunk(7, (0,), last=False)))
    core.handle(pc.Clear(7))
    assert core.handle(pc.AbortReceived(7, D, generation=1)) == []
    assert core.handle(pc.WriteDone(7, w.write_id, ok=True)) == [pc.SendAbortAck(7, D, 1)]
    core.handle(pc.Tick(core.bootstrap_timeout_s + 1))
    assert core.residue() == {}


def test_abort_for_an_unknown_room_is_harmless():
    core = pc.PrefillCore()
    actions = core.handle(pc.AbortReceived(99, D, generation=0))
    assert pc.SendAbortAck(99, D, 0) in actions
    assert not any(isinstance(a, pc.SendAbortAck) for a in core.handle(pc.AbortReceived(99, D, generation=0)))
    # A registration of the aborted generation that arrives late must not start a transfer.
    core.handle(pc.DecodeRegistered(99, D, (1,), 0, generation=0))
    core.handle(pc.OpenSender(99, now=0.0))
    assert core.status(99) == KVPoll.Bootstrapping
    core.handle(pc.Clear(99))
    assert core.residue() == {"tombstones": [99]}
    core.handle(pc.Tick(now=100.0))  # no time was known when it was made: it starts counting now
    assert core.residue() == {"tombstones": [99]}
    core.handle(pc.Tick(now=100.0 + core.bootstrap_timeout_s))
    assert core.residue() == {}


class PrefillMachine(RuleBasedStateMachine):
    """Random event sequences; invariants from docs/protocol.md after every step."""

    ROOMS = st.sampled_from([1, 2, 3])

    def __init__(self):
        super().__init__()
        self.core = pc.PrefillCore(bootstrap_timeout_s=3, deferred_release=True)
        self.now = 0.0
        self.inflight: dict[int, int] = {}  # write id -> room
        self.terminal: dict[int, int] = {}  # room -> terminal status seen this lifecycle
        self.cleared: set[int] = set()
        self.acks: dict[tuple[int, int], int] = {}
        self.generation = {1: 0, 2: 0, 3: 0}
        self.known: set[int] = set()  # opened and not cleared, or cleared with writes in flight

    def apply(self, event):
        for a in self.core.handle(event):
            if isinstance(a, pc.StatusChanged):
                old = self.terminal.get(a.room)
                assert old is None, f"room {a.room} left terminal {old} for {a.status}"  # R-TERM-1
                if a.status in (KVPoll.Success, KVPoll.Failed):
                    self.terminal[a.room] = a.status
            elif isinstance(a, pc.StartWrite):
                assert a.room not in self.cleared, "write for a cleared room"  # R-STALE-1
                assert a.room not in self.terminal, "write after a terminal status"
                self.inflight[a.write_id] = a.room
            elif isinstance(a, pc.SendAbortAck):
                assert not [w for w, r in self.inflight.items() if r == a.room], "ACK before drain"  # R-ABORT-2
                if a.room in self.known:  # a never-known room may be answered each time
                    key = (a.room, a.generation)
                    self.acks[key] = self.acks.get(key, 0) + 1
                    assert self.acks[key] == 1, f"second ACK for {key}"

    @rule(room=ROOMS)
    def open(self, room):
        if room in self.core.rooms:
            return
        self.cleared.discard(room)
        self.terminal.pop(room, None)
        self.generation[room] += 1
        self.acks = {k: v for k, v in self.acks.items() if k[0] != room}
        self.known.add(room)
        self.apply(pc.OpenSender(room, self.now))

    @rule(room=ROOMS, n=st.integers(1, 4))
    def register(self, room, n):
        self.apply(pc.DecodeRegistered(room, D, tuple(range(n)), 0, self.generation[room]))
        self.apply(pc.InitSender(room, n, 0))

    @rule(room=ROOMS, pages=st.lists(st.integers(0, 9), max_size=2), last=st.booleans())
    def send(self, room, pages, last):
        self.apply(pc.SendChunk(room, tuple(pages), last))

    @precondition(lambda self: self.inflight)
    @rule(data=st.data(), ok=st.booleans())
    def complete(self, data, ok):
        write_id = data.draw(st.sampled_from(sorted(self.inflight)))
        room = self.inflight.pop(write_id)
        self.apply(pc.WriteDone(room, write_id, ok, "injected"))
        if room not in self.core.rooms and room not in self.inflight.values():
            self.known.discard(room)  # a cleared room's last write drained

    @rule(room=ROOMS)
    def abort(self, room):
        self.apply(pc.AbortReceived(room, D, self.generation[room]))

    @rule(room=ROOMS)
    def clear(self, room):
        self.apply(pc.Clear(room))
        self.cleared.add(room)
        if room not in self.inflight.values():
            self.known.discard(room)
        self.terminal.pop(room, None)

    @rule(dt=st.floats(0, 2))
    def tick(self, dt):
        self.now += dt
        self.apply(pc.Tick(self.now))

    @invariant()
    def no_residue_once_all_cleared_and_drained(self):
        if not self.core.rooms and not self.inflight:
            assert not set(self.core.residue()) - {"registrations", "tombstones", "retired"}, self.core.residue()


TestPrefillMachine = PrefillMachine.TestCase  # example counts come from the hypothesis profile (conftest.py)


class LostDecodeMachine(PrefillMachine):
    """The same, with the decode lost now and then (its process killed: the engine fails every
    write to it, R-PEER-1); its own class, so the planted bug's search below stays the same."""

    @rule()
    def lose_decode(self):
        lost, self.inflight = self.inflight, {}
        self.apply(pc.DecodeLost(D, "injected"))
        for room in set(lost.values()):
            if room not in self.core.rooms:
                self.known.discard(room)  # a cleared room's last write drained


TestLostDecodeMachine = LostDecodeMachine.TestCase


def test_planted_bug_is_found_and_shrunk_to_a_short_replay():
    """With the test-only switch, ABORT is answered while a write is in flight:
    the stateful test must find it and shrink it to a few steps."""
    from hypothesis.stateful import run_state_machine_as_test

    class Planted(PrefillMachine):
        def __init__(self):
            super().__init__()
            self.core = pc.PrefillCore(bootstrap_timeout_s=3, planted_bug="ack-before-drain")

    try:
        run_state_machine_as_test(Planted, settings=settings(max_examples=3000, stateful_step_count=40,
                                                             deadline=None, database=None,
                                                             derandomize=True))  # the same search every run
    except AssertionError as exc:
        assert "ACK before drain" in str(exc)
        notes = "\n".join(getattr(exc, "__notes__", []))
    else:
        raise AssertionError("the planted bug was not found")
    program = [ln.strip() for ln in notes.splitlines()
               if ln.strip().startswith("state.") and "no_residue" not in ln and "teardown" not in ln]
    assert 3 <= len(program) <= 8, notes  # open, register, send, abort: a short replay


def test_failure_on_one_destination_reaches_every_destination():
    """R-FANOUT-1: a room with two decode ranks; a write to one fails."""
    core = pc.PrefillCore()
    core.handle(pc.OpenSender(8, now=0.0, destinations=2))
    core.handle(pc.DecodeRegistered(8, "rank-0", (1, 2), 0, generation=3))
    assert core.status(8) == KVPoll.Bootstrapping  # waits for every destination
    core.handle(pc.DecodeRegistered(8, "rank-1", (5, 6), 1, generation=9))
    core.handle(pc.InitSender(8, 2, 0))
    w = writes(core.handle(pc.SendChunk(8, (0, 1), last=False)))
    assert sorted((x.decode, x.dst, x.generation) for x in w) == [("rank-0", (1, 2), 3), ("rank-1", (5, 6), 9)]
    actions = core.handle(pc.WriteDone(8, w[1].write_id, ok=False, reason="link down"))
    told = {(a.decode, a.generation) for a in actions if isinstance(a, pc.SendStatus) and a.status == KVPoll.Failed}
    assert told == {("rank-0", 3), ("rank-1", 9)}


def test_abort_from_one_destination_fails_the_room_for_all():
    core = pc.PrefillCore()
    core.handle(pc.OpenSender(8, now=0.0, destinations=2))
    core.handle(pc.DecodeRegistered(8, "rank-0", (1,), 0, generation=1))
    core.handle(pc.DecodeRegistered(8, "rank-1", (2,), 0, generation=1))
    actions = core.handle(pc.AbortReceived(8, "rank-1", generation=1))
    told = {a.decode for a in actions if isinstance(a, pc.SendStatus) and a.status == KVPoll.Failed}
    assert told == {"rank-0", "rank-1"}
    assert pc.SendAbortAck(8, "rank-1", 1) in actions


def test_registration_before_any_clock_survives_the_first_tick():
    """A driver's clock may start anywhere (time.monotonic): early state must not expire at once."""
    core = pc.PrefillCore(bootstrap_timeout_s=30)
    core.handle(pc.DecodeRegistered(6, D, (1,), 0, generation=1))
    core.handle(pc.Tick(5000.0))
    core.handle(pc.OpenSender(6, now=5000.1))
    assert core.status(6) == KVPoll.WaitingForInput


def test_late_abort_of_an_old_generation_leaves_the_reused_room_alone():
    core = opened(pc.PrefillCore(), room=7)  # generation 0 bound
    core.handle(pc.Clear(7))
    core.handle(pc.OpenSender(7, now=1.0))
    core.handle(pc.DecodeRegistered(7, D, (3,), 0, generation=2))
    actions = core.handle(pc.AbortReceived(7, D, generation=0))
    assert core.status(7) == KVPoll.WaitingForInput
    assert not any(isinstance(a, pc.SendAbortAck) for a in actions)  # R-REUSE-1


def test_late_registration_of_a_cleared_generation_is_refused():
    core = opened(pc.PrefillCore(), room=7)  # generation 0 bound and cleared
    core.handle(pc.Clear(7))
    core.handle(pc.DecodeRegistered(7, D, (5, 6, 7), 2, generation=0))  # duplicate arriving late
    core.handle(pc.OpenSender(7, now=1.0))
    assert core.status(7) == KVPoll.Bootstrapping  # waits for the new generation's registration
    core.handle(pc.DecodeRegistered(7, D, (1,), 0, generation=1))
    assert core.status(7) == KVPoll.WaitingForInput


def test_last_chunk_short_of_the_request_fails_instead_of_succeeding():
    core = opened(pc.PrefillCore())  # 3 pages announced
    actions = core.handle(pc.SendChunk(7, (0,), last=True))
    assert core.status(7) == KVPoll.Failed and "last chunk ends at page 1 of 3" in actions[0].reason
