"""The writer of explore's generated lifecycle programs (a hypothesis state machine): what
``pdconform explore`` runs against an implementation.

A program is a list of steps from the scenario vocabulary (harness.spec.steps) over several
bootstrap rooms of one prefill and one decode, in the orders a real pair of schedulers
can produce: rooms opened and registered while others transfer, chunks of different
rooms interleaved, the decode aborting a room at any point after it registered (its
scheduler's AbortReq), rooms cleared once both sides concluded, and a cleared room id
used again for a new lifecycle (R-REUSE-1), the prefill's transfer engine delaying its
writes, delaying the aux data, failing its n-th write or completing none, a role frozen
for less than the heartbeat window, a message the control loops cannot parse pushed to
either role's control socket (harness.spec.frames.malformed), a status read in passing (the
poll every scheduler loop makes), the prefill or the decode killed with rooms in flight (one
program in four may: the decode's heartbeat must fail the rooms of a dead prefill, the
prefill's writes the rooms of a dead decode), a registration no prefill ever schedules
(R-RESIDUE-2), and (a profile drawn first) deferred KV release with its ABORT_ACKs.
:class:`ProgramMachine`, a hypothesis
rule-based state machine, writes them: each rule's precondition keeps the program legal
for a scheduler (a chunk only after the sender's init, a clear only after both sides
concluded, never more pages than the pools hold), so shrinking a failing program keeps it
legal.  The program then runs as one cell (harness.explore.session); its checks come from
the spec (harness.explore.program_checks lists them, in the order a failure's signature
takes the first), and the judge adds the generic post-conditions.

A program is data (harness.explore.program_model.Program): :meth:`Program.to_json` and
harness.explore.program_file.program_from_json write and read it, which is how a cell process gets it and how a found program replays (harness.explore.found).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from harness.explore.program_model import (ANY_STATUS, AT_RISK_BOUND_S, AUX_DELAY_S, ENGINE_DELAYS_S, FAIL_NTH,
                                           FREEZES_S, KILL_BOUND_S, LAYOUT, LOAD_ROOMS, LONG_WAIT_S, MAX_ENGINE_PLANS,
                                           MAX_INJECTIONS, MAX_LIFECYCLES, MAX_ROOM_PAGES, OUT_OF_ORDER_S, PREFILLS,
                                           PROFILES, ROOM_MIN, SLEEPS_S, Program)
from harness.spec import frames, load_plan
from harness.spec.protocol import KVPoll
from harness.spec.rooms import DONE
from harness.spec.steps import (Abort, AwaitStatus, Clear, EngineFaults, FreezeRole, InitSender, InjectFrames, KillRole,
                                LoseMessages, OpenRoom, RequestKV, RestartRole, SendChunk, Sleep, Step, ThawRole,
                                VerifyPools)

#: the messages a program injects: frames.malformed's kinds but the 2 MiB one (malformed-frame sends it)
MALFORMED = st.one_of(frames.truncated(), frames.unknown_tag(), frames.non_ascii(), frames.non_numeric(),
                      frames.empty(), frames.extra_frames(), frames.well_formed_unknown_room())


@dataclass
class _Room:
    """One lifecycle of a room in the model: its id, pages, aux slots, chunks, and how far it got."""

    room: int
    src: tuple[int, ...]
    dst: tuple[int, ...]
    aux_src: int
    aux_dst: int
    chunks: list[tuple[int, ...]]
    prefill: str = "prefill"  # the prefill that serves it
    inited: bool = False
    sent: int = 0  # chunks sent
    concluded: bool = False  # both sides awaited to a terminal status
    aborted: bool = False
    cleared: bool = False
    at_risk: bool = False  # a write the prefill's engine was told to fail may be this room's
    after_kill: str = ""  # in flight at a kill: one of AFTER_KILL
    lost: bool = False  # one kind of its control messages is lost (R-LOSS-1)

    @property
    def all_sent(self) -> bool:
        return self.inited and self.sent == len(self.chunks)


class ProgramMachine(RuleBasedStateMachine):
    """Writes one program (see the module docstring); :meth:`program` is what it wrote.
    Nothing runs while it writes: a subclass (harness.explore.session) runs the program
    at ``teardown``, so hypothesis shrinks failing programs rule by rule."""

    #: whether the prefill may be restarted (RestartRole): a prefill of one process only
    restarts = True
    #: whether the fault rules apply (engine faults, freezes, restarts, injected messages, the
    #: wait past the bootstrap timeout); False: fault-free programs (bench's rate goal)
    faults = True

    def __init__(self):
        super().__init__()
        self.steps: list[Step] = [PROFILES["plain"]]
        self.prefills: tuple[str, ...] = PREFILLS[:1]  # drawn with the first room: one or two
        self.rooms: list[_Room] = []
        self.free_pages = list(range(LAYOUT.num_pages))
        self.free_aux = list(range(LAYOUT.aux_slots))
        self.failing: set[str] = set()  # the prefills whose engine is set to fail a write
        self.slow = False  # a delay plan was set: a room's writes may queue behind every other room's
        self.plans = 0  # engine fault plans set
        self.injections = 0  # malformed messages pushed
        self.killed = ""  # the role killed: its rooms' ends are the survivor's alone
        self.may_kill = ""  # the role this program may kill, drawn with the first room ("": none)
        self.may_lose = False  # whether this program loses one kind of message of one room (drawn first)
        self.lost_one = False
        self.unscheduled: dict[int, bool] = {}  # registrations no prefill takes: room -> aborted by the decode
        self.may_unschedule = False  # drawn first

    # ---- the model ----------------------------------------------------------------
    def _live(self) -> list[_Room]:
        return [r for r in self.rooms if not r.cleared]

    def _serving(self) -> list[_Room]:
        """The live rooms whose prefill and decode are both alive: the ones schedulers still drive."""
        return [r for r in self._live() if self.killed not in (r.prefill, "decode")]

    def _alive_prefills(self) -> list[str]:
        return [] if self.killed == "decode" else [p for p in self.prefills if p != self.killed]

    def _room_left(self) -> bool:
        """Whether the pools have pages and an aux slot for another room (lifecycle or unscheduled)."""
        return len(self.rooms) + len(self.unscheduled) < MAX_LIFECYCLES and bool(self.free_aux)

    def _reusable(self) -> list[int]:
        """Cleared room ids a new lifecycle may take: not a lost room's, whose loss plan (on the id,
        for the rest of the program) would hit the new lifecycle's messages too."""
        live = {r.room for r in self._live()} | {r.room for r in self.rooms if r.lost}
        return sorted({r.room for r in self.rooms if r.cleared} - live)

    # ---- rules: what a pair of schedulers may do next -------------------------------
    @initialize(data=st.data())
    def first_room(self, data) -> None:
        """The profile (deferred KV release or not, one prefill or two; a shrink falls back to
        plain, one), then a room."""
        deferred = data.draw(st.booleans(), label="deferred KV release")
        # one program in four sends to two prefills (R-HB-1's other prefill, the decode's connections to each);
        # not fault-free ones, whose rate bench times: a third role process and more pairs to start
        if self.faults and data.draw(st.integers(0, 3), label="two prefills (3)") == 3:
            self.prefills = PREFILLS
        two = "two-prefills" if len(self.prefills) > 1 else ""
        self.steps[0] = PROFILES["-".join(filter(None, (two, "deferred-release" if deferred else ""))) or "plain"]
        # one program in four may kill a role: a kill ends that side of the program and its
        # long-lived pair, so more would crowd out everything else (a shrink drops the 3)
        if self.faults and data.draw(st.integers(0, 3), label="may kill (3)") == 3:
            self.may_kill = data.draw(st.sampled_from((*self.prefills, "decode")), label="which role")
        # one program in sixteen that kills nothing loses a message: a lost status or registration
        # waits out the decode's waiting timeout, so more would slow every lane
        elif self.faults and data.draw(st.integers(0, 15), label="may lose a message (15)") == 15:
            self.may_lose = True
        # one program in eight leaves a registration unscheduled: on a backend that keeps it
        # (B22) every such program fails, and a failing program costs its pair and a fresh cell
        self.may_unschedule = self.faults and data.draw(st.integers(0, 7), label="may leave one unscheduled (7)") == 7
        # one program in sixteen that kills and loses nothing starts with a burst of many rooms (1 to 4 s)
        if self.faults and not (self.may_kill or self.may_lose) and \
                data.draw(st.integers(0, 15), label="a load burst (15)") == 15:
            self.load_burst(data)
            return
        self.open_room(data)

    def load_burst(self, data) -> None:
        """64 to 256 rooms in flight at once through several transfer workers (R-LOAD-1;
        harness.spec.load_plan, as load-64 and load-256 but drawn): every room registered, one in
        eight aborted, the rest's chunks interleaved across rooms, every room polled to its end.
        The rooms are the program's lifecycles (the pools hold no more); the other rules go on
        with them (clears, polls, faults)."""
        n = data.draw(st.integers(64, LOAD_ROOMS), label="rooms in flight")
        burst = load_plan.plan(data.draw(st.integers(0, 2**32 - 1), label="burst seed"), n,
                               load_plan.layout(LOAD_ROOMS))
        self.steps[0], self.prefills = PROFILES["load"], PREFILLS[:1]  # one prefill's workers carry the load
        self.free_pages, self.free_aux = [], []  # no room beyond the burst's
        labels = {p.room: f"L{i}" for i, p in enumerate(burst.rooms)}
        for p in burst.rooms:
            aborted = p.room in burst.aborted
            self.rooms.append(_Room(p.room, p.src, p.dst, p.aux_src, p.aux_dst, list(p.chunks), inited=not aborted,
                                    sent=0 if aborted else len(p.chunks), concluded=True, aborted=aborted))
        self.steps += load_plan.steps(burst, labels, verify=False)  # the program's end checks every byte

    @precondition(lambda self: self._alive_prefills() and self._room_left())
    @rule(data=st.data())
    def open_room(self, data) -> None:
        """The decode opens a receiver and registers its pages with one prefill; that prefill's
        sender waits."""
        prefill = data.draw(st.sampled_from(self._alive_prefills()), label="prefill")
        n = data.draw(st.integers(1, MAX_ROOM_PAGES), label="pages")
        reuse = self._reusable()
        if reuse and data.draw(st.booleans(), label="reuse a cleared room id"):
            room = data.draw(st.sampled_from(reuse), label="room")
        else:
            # bootstrap rooms are random 63-bit numbers in sglang; never small ones, which a
            # manager's state holds as counts and settings too (the residue walk matches values)
            room = data.draw(st.integers(ROOM_MIN, 2**62), label="room")
            if any(r.room == room for r in self.rooms) or room in self.unscheduled:
                room = max([r.room for r in self.rooms] + list(self.unscheduled)) + 1
        src = tuple(sorted(data.draw(st.lists(st.integers(0, LAYOUT.num_pages - 1), min_size=n, max_size=n,
                                              unique=True), label="source pages")))
        dst, self.free_pages = tuple(self.free_pages[:n]), self.free_pages[n:]
        aux_dst = self.free_aux.pop(0)
        cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=n - 1), label="chunk cuts")) if n > 1 else []
        bounds = [0, *cuts, n]
        chunks = [src[a:b] for a, b in zip(bounds, bounds[1:])]
        aux_src = data.draw(st.integers(0, LAYOUT.aux_slots - 1), label="aux source")
        self.rooms.append(_Room(room, src, dst, aux_src, aux_dst, chunks, prefill, at_risk=prefill in self.failing))
        self.steps += [OpenRoom(room, prefill=prefill), RequestKV(room, dst, aux_dst),
                       AwaitStatus(room, prefill, (KVPoll.WaitingForInput, KVPoll.Failed))]

    @precondition(lambda self: any(not r.inited and not r.concluded for r in self._serving()))
    @rule(data=st.data())
    def init_sender(self, data) -> None:
        """The prefill's scheduler starts the request: the sender learns its page count."""
        r = data.draw(st.sampled_from([r for r in self._serving() if not r.inited and not r.concluded]), label="room")
        r.inited = True
        self.steps.append(InitSender(r.room, len(r.src), r.aux_src, prefill=r.prefill))

    @precondition(lambda self: any(r.inited and not r.all_sent and not r.concluded for r in self._serving()))
    @rule(data=st.data())
    def send_chunk(self, data) -> None:
        """The prefill sends the room's next chunk (the last one with its aux data), also
        after the decode aborted it, as long as the prefill has not seen it conclude."""
        r = data.draw(st.sampled_from([r for r in self._serving() if r.inited and not r.all_sent and not r.concluded]),
                      label="room")
        self.steps.append(SendChunk(r.room, r.chunks[r.sent], prefill=r.prefill))
        r.sent += 1

    @precondition(lambda self: any(not r.aborted and not r.concluded and not r.lost for r in self._serving()))
    @rule(data=st.data())
    def abort_on_decode(self, data) -> None:
        """The decode's scheduler aborts the request (its client went away); not a room whose
        status is being lost (the prefill may then send none, and the loss would not fire)."""
        r = data.draw(st.sampled_from([r for r in self._serving() if not r.aborted and not r.concluded and not r.lost]),
                      label="room")
        r.aborted = True
        self.steps.append(Abort(r.room, "decode"))

    @precondition(lambda self: any((r.all_sent or r.aborted) and not r.concluded for r in self._serving()))
    @rule(data=st.data())
    def conclude(self, data) -> None:
        """Both schedulers poll the room until it concludes (Success or Failed)."""
        r = data.draw(st.sampled_from([r for r in self._serving() if (r.all_sent or r.aborted) and not r.concluded]),
                      label="room")
        self._await(r)

    @precondition(lambda self: any(r.concluded for r in self._serving()))
    @rule(data=st.data())
    def clear(self, data) -> None:
        """Both schedulers release the concluded request."""
        r = data.draw(st.sampled_from([r for r in self._serving() if r.concluded]), label="room")
        r.cleared = True
        self.steps += [Clear(r.room, r.prefill), Clear(r.room, "decode")]

    @precondition(lambda self: self.killed or not isinstance(self.steps[-1], Sleep))  # after a kill, always
    @rule(which=st.integers(0, 9))
    def wait(self, which: int) -> None:
        """Time passes: control messages are handled, heartbeats run; one wait in ten
        outlasts the bootstrap timeout, which may fail only a room still Bootstrapping
        (R-TIMEOUT-1), and every program room has registered by then."""
        if isinstance(self.steps[-1], Sleep):  # after a kill (where it may be the only rule): one wait is enough
            return
        self.steps.append(Sleep(LONG_WAIT_S if which == 9 and self.faults else SLEEPS_S[which % len(SLEEPS_S)]))

    @precondition(lambda self: self.may_lose and not self.lost_one)
    @rule(data=st.data())
    def lose_abort(self, data) -> None:
        """One control message of one room is lost on its way (R-LOSS-1; one loss per program): the
        decode aborts a room and its ABORT never reaches the prefill, whose scheduler, never told,
        sends the rest of the room.  Each side must still end the room (the decode Failed by its
        abort), within the waiting timeout plus 5 s."""
        self._lose(data, "abort")

    @precondition(lambda self: self.may_lose and not self.lost_one)
    @rule(data=st.data())
    def lose_status(self, data) -> None:
        """As :meth:`lose_abort`: every status the prefill sends for a room in flight is lost; the
        decode may fail the room at its waiting timeout, never read Success with a byte missing."""
        self._lose(data, "status")

    @precondition(lambda self: self.may_lose and not self.lost_one)
    @rule(data=st.data())
    def lose_registration(self, data) -> None:
        """As :meth:`lose_abort`: the decode's registration of a room opened now is lost; the prefill
        fails it at its bootstrap timeout, the decode at its waiting timeout."""
        self._lose(data, "registration")

    def _lose(self, data, kind: str) -> None:
        serving = [r for r in self._serving() if not r.aborted and not r.concluded]
        if kind == "registration" and self._alive_prefills() and self._room_left():
            at = len(self.steps)
            self.open_room(data)
            r = self.rooms[-1]
            self.steps.insert(at, LoseMessages("decode", "registration", room=r.room, count=0))
        elif kind != "registration" and serving:
            r = data.draw(st.sampled_from(serving), label="room")
            if kind == "abort":  # the prefill's scheduler, never told, sends the rest of the room
                r.aborted = True
                self.steps += [LoseMessages("decode", "abort", room=r.room, count=0), Abort(r.room, "decode")]
                if not r.inited:
                    self.steps.append(InitSender(r.room, len(r.src), r.aux_src, prefill=r.prefill))
                self.steps += [SendChunk(r.room, chunk, prefill=r.prefill) for chunk in r.chunks[r.sent:]]
                r.inited, r.sent = True, len(r.chunks)
            else:
                self.steps.append(LoseMessages(r.prefill, "status", room=r.room, count=0))
        else:
            return
        r.lost, self.lost_one = True, True

    @precondition(lambda self: self.may_unschedule and self._alive_prefills() and self._room_left() and not self.unscheduled)
    @rule(data=st.data())
    def register_unscheduled(self, data) -> None:
        """The decode registers a room that no prefill's scheduler ever takes (cancelled there, or
        routed elsewhere): no sender is opened for it.  The prefill must drop the registration at
        the decode's ABORT of it, or once its bootstrap timeout plus slack has passed (R-RESIDUE-2,
        judged in every cell by the generic unscheduled-registration-dropped), and never write
        its pages (every later pool check finds them untouched)."""
        prefill = data.draw(st.sampled_from(self._alive_prefills()), label="prefill")
        room = data.draw(st.integers(ROOM_MIN, 2**62), label="room")
        if any(r.room == room for r in self.rooms) or room in self.unscheduled:
            room = max([r.room for r in self.rooms] + list(self.unscheduled)) + 1
        n = data.draw(st.integers(1, MAX_ROOM_PAGES), label="pages")
        dst, self.free_pages = tuple(self.free_pages[:n]), self.free_pages[n:]
        self.unscheduled[room] = False
        self.steps += [OpenRoom(room, prefill=prefill, open_sender=False), RequestKV(room, dst, self.free_aux.pop(0))]

    @precondition(lambda self: self.killed != "decode" and not all(self.unscheduled.values()))
    @rule(data=st.data())
    def abort_unscheduled(self, data) -> None:
        """The decode's scheduler aborts an unscheduled registration (its client went away, or it
        gave up waiting) and releases it: the receiver ends Failed, the prefill must drop it."""
        self._release_unscheduled(data.draw(st.sampled_from(sorted(r for r, aborted in self.unscheduled.items()
                                                                   if not aborted)), label="unscheduled room"))

    def _release_unscheduled(self, room: int) -> None:
        self.unscheduled[room] = True
        self.steps += [Abort(room, "decode"), AwaitStatus(room, "decode", DONE), Clear(room, "decode")]

    @precondition(lambda self: self.faults and not self.killed and self.restarts and self.rooms and not self._live() and
                  not any(isinstance(s, RestartRole) for s in self.steps))
    @rule(data=st.data())
    def restart_prefill(self, data) -> None:
        """Every room cleared, a prefill is replaced behind the same bootstrap address on
        new ports (a deploy, a crash and restart): the rooms after it must succeed (R-RESTART-1)."""
        self.steps.append(RestartRole(data.draw(st.sampled_from(self.prefills), label="prefill")))

    @precondition(lambda self: self.faults and not self.killed and self.plans < MAX_ENGINE_PLANS)
    @rule(data=st.data())
    def engine_faults(self, data) -> None:
        """A prefill's transfer engine changes: each write waits, the aux data comes late,
        the n-th write from now fails, no write from now completes (a room of that prefill with
        writes to come may be hit: it must then conclude, within the waiting timeout plus 5 s,
        R-TIMEOUT-3, not succeed), the n-th write from now completes OUT_OF_ORDER_S late while
        later ones complete first (its room must still succeed, every byte in place at
        Success, R-XFER-2), or the engine heals."""
        prefill = data.draw(st.sampled_from(self.prefills), label="prefill")
        kind = data.draw(st.sampled_from(("delay", "aux-delay", "fail", "never", "heal", "out-of-order")),
                         label="engine fault")
        plan = (EngineFaults(prefill, delay_s=data.draw(st.sampled_from(ENGINE_DELAYS_S), label="delay"))
                if kind == "delay" else EngineFaults(prefill, aux_delay_s=AUX_DELAY_S) if kind == "aux-delay"
                else EngineFaults(prefill, fail_nth=data.draw(st.sampled_from(FAIL_NTH), label="nth"))
                if kind == "fail" else EngineFaults(prefill, never_complete=True) if kind == "never"
                else EngineFaults(prefill, slow_nth=data.draw(st.sampled_from(FAIL_NTH), label="nth"),
                                  slow_s=OUT_OF_ORDER_S) if kind == "out-of-order"
                else EngineFaults(prefill))
        self.plans += 1
        if kind in ("fail", "never"):  # a room with writes to come may end Failed (R-TIMEOUT-3)
            self.failing.add(prefill)
            for r in self._live():
                r.at_risk = r.at_risk or (not r.concluded and r.prefill == prefill)
        else:
            self.failing.discard(prefill)
        self.slow = self.slow or kind in ("delay", "out-of-order")
        self.steps.append(plan)

    @precondition(lambda self: self.faults and not self.killed)
    @rule(data=st.data(), seconds=st.sampled_from(FREEZES_S))
    def freeze(self, data, seconds: float) -> None:
        """A role stops for a moment (a GC pause, a descheduled VM), well inside the
        heartbeat window: nothing may fail because of it."""
        role = data.draw(st.sampled_from((*self.prefills, "decode")), label="role")
        self.steps += [FreezeRole(role), Sleep(seconds), ThawRole(role)]

    @precondition(lambda self: self.faults and not self.killed and self.injections < MAX_INJECTIONS)
    @rule(data=st.data(), message=MALFORMED)
    def inject_malformed(self, data, message: tuple) -> None:
        """A peer (a scanner, a client of another version) pushes a message the role's control
        loop cannot parse: the loop drops it and goes on, and no room changes (R-LIVE-1), so
        every room still ends as it would have."""
        role = data.draw(st.sampled_from((*self.prefills, "decode")), label="role")
        self.injections += 1
        self.steps.append(InjectFrames(role, (tuple(bytes(f) for f in message),)))

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data(), side=st.sampled_from(("decode", "prefill")))
    def poll(self, data, side: str) -> None:
        """A scheduler reads a room's status once, as its event loop does every iteration, whatever
        it is: a Success or Failed read earlier must still be read now, until the clear (R-TERM-1,
        judged over every read by the generic post-condition every-trail-terminal)."""
        r = data.draw(st.sampled_from(self._live()), label="room")
        roles = [role for role in ("decode", r.prefill) if role != self.killed]
        role = roles[0] if len(roles) == 1 else {"decode": "decode", "prefill": r.prefill}[side]
        self.steps.append(AwaitStatus(r.room, role, ANY_STATUS, timeout_s=0.0, must_come=False))

    @precondition(lambda self: self.may_kill and not self.killed and
                  any(not r.concluded and self.may_kill in (r.prefill, "decode") for r in self._live()) and
                  not any(isinstance(s, RestartRole) for s in self.steps))
    @rule()
    def kill(self) -> None:
        """The role drawn with the first room dies with rooms in flight (SIGKILL: an OOM kill, a
        lost node).  A prefill: the decode's heartbeat must fail each of its rooms still waiting
        on it within the heartbeat window plus 5 s, with a reason naming that prefill (R-HB-1); a
        room whose chunks were all sent, that the decode aborted or that a failed write may reach
        only has to end; the decode polls them at once (a later poll would measure the steps in
        between, not the heartbeat).  A room of the other prefill in flight is untouched and must
        succeed (R-HB-1) unless aborted or in a failed write's reach; that prefill goes on serving.
        The decode: the prefill's scheduler, which knows nothing of it, sends every chunk still to
        send; a room with a chunk written after the death must read Failed on the prefill, the
        others only end there (R-PEER-1)."""
        self.killed = self.may_kill
        for r in self._live():
            if r.concluded:
                continue
            if self.killed == r.prefill:
                r.after_kill = "end" if r.all_sent or r.aborted or r.at_risk else "fail"
            elif self.killed == "decode":
                r.after_kill = "sender-end" if r.all_sent or r.aborted else "sender-fail"
            elif not (r.aborted or r.at_risk):
                r.after_kill = "spared"
        self.steps.append(KillRole(self.killed))
        for r in self._live():
            if r.prefill == self.killed and not r.concluded:
                self._await(r)

    # ---- the program ----------------------------------------------------------------
    def _await(self, r: _Room) -> None:
        """The decode's conclusion poll, the room's bytes right then (a room the decode did
        not abort), the prefill's poll (only the survivor's after a kill)."""
        r.concluded = True
        label = f"L{self.rooms.index(r)}"
        if self.killed == "decode":  # its writes to a dead peer fail or never complete (R-TIMEOUT-3's bound)
            self.steps.append(AwaitStatus(r.room, r.prefill, DONE, label=label, timeout_s=AT_RISK_BOUND_S))
            return
        # a serial transfer worker runs every room's delayed writes in turn: 8 rooms of 4 pages
        # at 0.2 s a write outlast the 6 s bound, so delayed programs get the long one (still bounded)
        bound = {"timeout_s": AT_RISK_BOUND_S} if r.at_risk or r.lost or self.slow else {}
        if r.after_kill in ("fail", "end") and not bound:
            bound = {"timeout_s": KILL_BOUND_S}
        self.steps.append(AwaitStatus(r.room, "decode", DONE, label=label, **bound))
        if not r.aborted:
            others = [o for o in self.rooms if o is not r]
            self.steps.append(VerifyPools(tuple(zip(r.src, r.dst)), ((r.aux_src, r.aux_dst),),
                                          unchecked_kv=tuple(p for o in others for p in o.dst),
                                          unchecked_aux=tuple(o.aux_dst for o in others), settle_s=0.0, label=label))
        if r.prefill != self.killed:
            self.steps.append(AwaitStatus(r.room, r.prefill, DONE, label=label, **bound))

    def program(self) -> Program:
        """The steps so far, then what every scheduler does before it goes idle: each room
        that is not aborted gets its remaining chunks (from a prefill still alive), each room is
        polled to its end, an unscheduled registration is aborted, the decode's pools are checked,
        every room is cleared."""
        for r in self._live():  # a room whose ABORT was lost is still the prefill's to send
            if (not r.aborted or r.lost) and not r.all_sent and r.prefill != self.killed:
                if not r.inited:
                    r.inited = True
                    self.steps.append(InitSender(r.room, len(r.src), r.aux_src, prefill=r.prefill))
                self.steps += [SendChunk(r.room, chunk, prefill=r.prefill) for chunk in r.chunks[r.sent:]]
                r.sent = len(r.chunks)
        for r in self._live():
            if not r.concluded:
                self._await(r)
        for room in [r for r, aborted in self.unscheduled.items() if not aborted and self.killed != "decode"]:
            self._release_unscheduled(room)  # an idle decode scheduler releases its waiting requests too
        exempt = ("fail", "end", "sender-fail", "sender-end")
        judged = [r for r in self.rooms if not r.aborted and not r.at_risk and not r.lost and r.after_kill not in exempt]
        rest = [r for r in self.rooms if r not in judged]
        if self.killed != "decode":
            self.steps.append(VerifyPools(tuple(m for r in judged for m in zip(r.src, r.dst)),
                                          tuple((r.aux_src, r.aux_dst) for r in judged),
                                          unchecked_kv=tuple(p for r in rest for p in r.dst),
                                          unchecked_aux=tuple(r.aux_dst for r in rest)))
        for r in self._live():
            r.cleared = True
            self.steps += [Clear(r.room, role) for role in (r.prefill, "decode") if role != self.killed]
        return Program(tuple(self.steps), tuple((f"L{i}", r.aborted, r.at_risk, r.after_kill, r.lost)
                                                for i, r in enumerate(self.rooms)))


__all__ = ["ProgramMachine", "MALFORMED"]
