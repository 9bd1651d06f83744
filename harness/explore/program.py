"""Generated lifecycle programs: what ``pdconform explore`` runs against an implementation.

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
prefill's writes the rooms of a dead decode), and (a profile drawn first) deferred KV
release with its ABORT_ACKs.
:class:`ProgramMachine`, a hypothesis
rule-based state machine, writes them: each rule's precondition keeps the program legal
for a scheduler (a chunk only after the sender's init, a clear only after both sides
concluded, never more pages than the pools hold), so shrinking a failing program keeps it
legal.  The program then runs as one cell (harness.explore.session); its checks come from
the spec (harness.explore.program_checks lists them, in the order a failure's signature
takes the first), and the judge adds the generic post-conditions.

A program is data: :meth:`Program.to_json` / harness.explore.program_file.program_from_json
write and read it, which is how a cell process gets it and how a found program replays (harness.explore.found).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import msgspec
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from harness.explore.program_checks import KILL_SLACK_S, lifecycle_checks
from harness.judge import checks as c
from harness.spec import frames
from harness.spec.protocol import KVPoll, Layout
from harness.spec.rooms import DONE, MAX_SHIFTS, ROOM_STRIDE  # noqa: F401 (MAX_SHIFTS: explore's)
from harness.spec.steps import (Abort, AwaitStatus, Clear, EngineFaults, FreezeRole, InitSender, InjectFrames, KillRole,
                                OpenRoom, RequestKV, RestartRole, SendChunk, Sleep, StartRoles, Step, ThawRole,
                                VerifyPools)

#: the pools every program runs on: 32 pages and 8 aux slots, enough for 8 room lifecycles
#: of up to 4 pages that never share a decode page or aux slot (so every byte stays checkable)
LAYOUT = Layout(num_layers=2, num_pages=32, page_size=4, page_bytes=128, aux_slots=8, aux_bytes=32)
MAX_LIFECYCLES = 8
MAX_ROOM_PAGES = 4
SLEEPS_S = (0.05, 0.2, 0.5)  # waits a program may take between steps (seconds): heartbeats and handling run
BOOTSTRAP_TIMEOUT_S = 3  # the prefill's bootstrap timeout in programs (R-TIMEOUT-1)
LONG_WAIT_S = BOOTSTRAP_TIMEOUT_S + 1.0  # one wait in ten outlasts it: only Bootstrapping rooms may fail of it
FREEZES_S = (0.3, 1.0)  # how long a role stays frozen (seconds): far inside the 4 s heartbeat window
ENGINE_DELAYS_S = (0.05, 0.2)  # what each prefill write waits (seconds)
AUX_DELAY_S = 0.3  # how late the aux data reaches the decode (seconds)
FAIL_NTH = (1, 2, 3)  # which write, counted from the plan, the prefill's engine fails
OUT_OF_ORDER_S = 0.5  # how late the n-th write completes, after the writes issued after it (seconds)
MAX_ENGINE_PLANS = 3  # engine fault plans a program sets, at most
MAX_INJECTIONS = 3  # malformed messages a program pushes, at most
MAX_MESSAGE_FRAMES = 16  # the frames of one injected message, at most (MALFORMED draws up to 15)
MAX_MESSAGE_BYTES = 4096  # the bytes of one injected message, at most: a found file stays small
#: the messages a program injects: frames.malformed's kinds but the 2 MiB one (malformed-frame sends it)
MALFORMED = st.one_of(frames.truncated(), frames.unknown_tag(), frames.non_ascii(), frames.non_numeric(),
                      frames.empty(), frames.extra_frames(), frames.well_formed_unknown_room())
WAITING_TIMEOUT_S = 20  # the decode's waiting timeout in programs (R-TIMEOUT-2): a failed write's room ends by then
AT_RISK_BOUND_S = WAITING_TIMEOUT_S + 5.0  # the conclusion polls' bound for a room a failed write may reach
#: the decode's conclusion poll of a room in flight at the prefill's kill: the window (4 s,
#: harness.target.role_context) plus the slack, and a second for the poll itself
KILL_BOUND_S = 4.0 + KILL_SLACK_S + 1.0
#: a lifecycle's mark when a role was killed while it was in flight: "fail" / "end" at the
#: prefill's kill (judged on the decode, R-HB-1), "sender-fail" / "sender-end" at the decode's
#: (judged on the prefill, R-PEER-1), "spared" for a room of the other prefill at a prefill's
#: kill (it must succeed, R-HB-1), "" for the rest
AFTER_KILL = ("", "fail", "end", "sender-fail", "sender-end", "spared")
ANY_STATUS = tuple(KVPoll)  # a poll that takes whatever it reads
PROGRAM_TIMEOUT_S = 120.0  # a program cell's deadline (seconds); its waits are bounded far below it
ROOM_MIN = 2**40  # the smallest room id a program uses (they are drawn up to 2^62)
WAITING_ENV = (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAITING_TIMEOUT_S)),
               ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", str(BOOTSTRAP_TIMEOUT_S)))
DEFERRED_ENV = (*WAITING_ENV, ("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", "1"))
PREFILLS = ("prefill", "prefill-b")  # the prefills of a program with two (one decode sends to both)
#: the roles a program may start: plain or with deferred KV release (the profile), one prefill or
#: two; the bare one is what programs written before the waiting timeout was set hold
PROFILES = {"plain": StartRoles(layout=LAYOUT, env=WAITING_ENV),
            "deferred-release": StartRoles(layout=LAYOUT, env=DEFERRED_ENV),
            "two-prefills": StartRoles(prefills=PREFILLS, layout=LAYOUT, env=WAITING_ENV),
            "two-prefills-deferred-release": StartRoles(prefills=PREFILLS, layout=LAYOUT, env=DEFERRED_ENV),
            "bare": StartRoles(layout=LAYOUT)}


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

    @property
    def all_sent(self) -> bool:
        return self.inited and self.sent == len(self.chunks)


@dataclass(frozen=True)
class Program:
    """A generated program: ``steps`` (the first is StartRoles), ``lifecycles`` (one
    ``(label, aborted[, at_risk[, after_kill]])`` per room lifecycle, in the order they opened:
    the label its conclusion polls carry, whether the decode aborted it, whether a failed write
    may reach it, and its mark when it was in flight at a kill (:data:`AFTER_KILL`))
    and ``topology``."""

    steps: tuple[Step, ...]
    lifecycles: tuple[tuple, ...] = ()
    topology: str = "p1-d1"  # the deployment shape it runs on (harness.spec.topology)

    def checks(self) -> list[c.Check]:
        """The spec's expectations for this program (harness.explore.program_checks)."""
        def kind(x: tuple) -> str:
            mark = x[3] if len(x) > 3 else ""
            if mark and mark != "spared":
                return f"killed-{mark}"
            # a spared room the decode aborted after the kill is judged as aborted
            return ("aborted" if x[1] else "at-risk" if len(x) > 2 and x[2] else
                    "killed-spared" if mark == "spared" else "clean")

        labels = {k: tuple(x[0] for x in self.lifecycles if kind(x) == k)
                  for k in ("clean", "aborted", "at-risk", *(f"killed-{m}" for m in AFTER_KILL[1:]))}
        kill = next((s for s in self.steps if isinstance(s, KillRole)), None)
        aborted_rooms = tuple(s.room for s in self.steps if isinstance(s, Abort))
        # a clean lifecycle opened on a prefill after its restart stands for R-RESTART-1 (lifecycle i is the
        # i-th OpenRoom); one opened on the other prefill is an ordinary clean room
        opened = [(i, s.prefill) for i, s in enumerate(self.steps) if isinstance(s, OpenRoom)]
        restart = next(((i, s.role) for i, s in enumerate(self.steps) if isinstance(s, RestartRole)),
                       (len(self.steps), ""))
        later = {f"L{n}" for n, (i, prefill) in enumerate(opened) if i > restart[0] and prefill == restart[1]}
        return lifecycle_checks(tuple(x for x in labels["clean"] if x not in later), labels["aborted"],
                                labels["at-risk"], aborted_rooms, deferred=DEFERRED_ENV[-1] in self.steps[0].env,
                                after_restart=tuple(x for x in labels["clean"] if x in later),
                                killed=(labels["killed-fail"], labels["killed-end"]),
                                orphaned=(labels["killed-sender-fail"], labels["killed-sender-end"]),
                                decode_killed=kill is not None and kill.role == "decode",
                                spared=labels["killed-spared"], dead_prefill=kill.role if kill else "prefill")

    @property
    def size(self) -> tuple[int, int]:
        """How big the program is, for keeping the smallest of a shrink: its steps, then its prefills."""
        return len(self.steps), len(self.steps[0].prefills)

    def shifted(self, k: int) -> "Program":
        """The same program with every room id moved up by ``k`` strides of :data:`ROOM_STRIDE`:
        the rooms of the ``k``-th program a long-lived role pair serves (harness.drive.pair),
        which no other program of the pair used.  A stride is a multiple of every DP size up to
        8, so each room keeps its DP engine (R-DP-1); ids stay below 2^63.  ValueError for a
        ``k`` beyond :data:`MAX_SHIFTS`."""
        if not 0 <= k <= MAX_SHIFTS:
            raise ValueError(f"a shift of {k} strides (0 to {MAX_SHIFTS})")
        return replace(self, steps=tuple(replace(st, room=st.room + k * ROOM_STRIDE)
                                         if isinstance(getattr(st, "room", None), int) else st for st in self.steps))

    def to_json(self) -> str:
        """The program as one JSON document (steps tagged by their class name)."""
        return json.dumps({"topology": self.topology, "steps": [_encode(s) for s in self.steps],
                           "lifecycles": [list(x) for x in self.lifecycles]}, indent=1)


def _encode(step: Step) -> dict:
    return {"step": type(step).__name__, **json.loads(msgspec.json.encode(step))}


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

    # ---- the model ----------------------------------------------------------------
    def _live(self) -> list[_Room]:
        return [r for r in self.rooms if not r.cleared]

    def _serving(self) -> list[_Room]:
        """The live rooms whose prefill and decode are both alive: the ones schedulers still drive."""
        return [r for r in self._live() if self.killed not in (r.prefill, "decode")]

    def _alive_prefills(self) -> list[str]:
        return [] if self.killed == "decode" else [p for p in self.prefills if p != self.killed]

    def _reusable(self) -> list[int]:
        live = {r.room for r in self._live()}
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
        self.open_room(data)

    @precondition(lambda self: self._alive_prefills() and len(self.rooms) < MAX_LIFECYCLES)
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
            if any(r.room == room for r in self.rooms):
                room = max(r.room for r in self.rooms) + 1
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

    @precondition(lambda self: any(not r.aborted and not r.concluded for r in self._serving()))
    @rule(data=st.data())
    def abort_on_decode(self, data) -> None:
        """The decode's scheduler aborts the request (its client went away)."""
        r = data.draw(st.sampled_from([r for r in self._serving() if not r.aborted and not r.concluded]), label="room")
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
        bound = {"timeout_s": AT_RISK_BOUND_S} if r.at_risk or self.slow else {}
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
        polled to its end, the decode's pools are checked, every room is cleared."""
        for r in self._live():
            if not r.aborted and not r.all_sent and r.prefill != self.killed:
                if not r.inited:
                    r.inited = True
                    self.steps.append(InitSender(r.room, len(r.src), r.aux_src, prefill=r.prefill))
                self.steps += [SendChunk(r.room, chunk, prefill=r.prefill) for chunk in r.chunks[r.sent:]]
                r.sent = len(r.chunks)
        for r in self._live():
            if not r.concluded:
                self._await(r)
        exempt = ("fail", "end", "sender-fail", "sender-end")
        judged = [r for r in self.rooms if not r.aborted and not r.at_risk and r.after_kill not in exempt]
        rest = [r for r in self.rooms if r not in judged]
        if self.killed != "decode":
            self.steps.append(VerifyPools(tuple(m for r in judged for m in zip(r.src, r.dst)),
                                          tuple((r.aux_src, r.aux_dst) for r in judged),
                                          unchecked_kv=tuple(p for r in rest for p in r.dst),
                                          unchecked_aux=tuple(r.aux_dst for r in rest)))
        for r in self._live():
            r.cleared = True
            self.steps += [Clear(r.room, role) for role in (r.prefill, "decode") if role != self.killed]
        return Program(tuple(self.steps), tuple((f"L{i}", r.aborted, r.at_risk, r.after_kill)
                                                for i, r in enumerate(self.rooms)))


__all__ = ["AFTER_KILL", "LAYOUT", "PREFILLS", "PROFILES", "Program", "ProgramMachine", "PROGRAM_TIMEOUT_S"]
