"""Generated lifecycle programs: what ``pdconform explore`` runs against an implementation.

A program is a list of steps from the scenario vocabulary (harness.spec.steps) over several
bootstrap rooms of one prefill and one decode, in the orders a real pair of schedulers
can produce: rooms opened and registered while others transfer, chunks of different
rooms interleaved, the decode aborting a room at any point after it registered (its
scheduler's AbortReq), rooms cleared once both sides concluded, and a cleared room id
used again for a new lifecycle (R-REUSE-1).  :class:`ProgramMachine`, a hypothesis
rule-based state machine, writes them: each rule's precondition keeps the program legal
for a scheduler (a chunk only after the sender's init, a clear only after both sides
concluded, never more pages than the pools hold), so shrinking a failing program keeps it
legal.  The program then runs as one cell (harness.explore.session); its checks
(:meth:`Program.checks`) come from the spec: a room nobody aborted reaches Success on
both sides (R-XFER-1), an aborted one concludes on both (R-ABORT-1), every byte lands
where it belongs (R-LAYOUT-1), no loop or thread dies (R-LIVE-2), and the judge adds
the generic post-conditions (terminal statuses, reasons, no residue after clear).

A program is data: :meth:`Program.to_json` / :func:`program_from_json` write and read it,
which is how a cell process gets it and how a found program replays (harness.explore.found).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import msgspec
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from harness.judge import checks as c
from harness.spec.history import Event, Op, completions
from harness.spec.protocol import KVPoll, Layout, kvpoll_name
from harness.spec.rooms import DONE
from harness.spec.steps import (Abort, AwaitStatus, Clear, InitSender, OpenRoom, RequestKV, SendChunk, Sleep,
                                StartRoles, Step, VerifyPools)

#: the pools every program runs on: 32 pages and 8 aux slots, enough for 8 room lifecycles
#: of up to 4 pages that never share a decode page or aux slot (so every byte stays checkable)
LAYOUT = Layout(num_layers=2, num_pages=32, page_size=4, page_bytes=128, aux_slots=8, aux_bytes=32)
MAX_LIFECYCLES = 8
MAX_ROOM_PAGES = 4
SLEEPS_S = (0.05, 0.2, 0.5)  # waits a program may take between steps (seconds): heartbeats and handling run
PROGRAM_TIMEOUT_S = 90.0
ROOM_MIN = 2**40  # the smallest room id a program uses  # a program cell's deadline (seconds); its waits are bounded far below it


@dataclass
class _Room:
    """One lifecycle of a room in the model: its id, pages, aux slots, chunks, and how far it got."""

    room: int
    src: tuple[int, ...]
    dst: tuple[int, ...]
    aux_src: int
    aux_dst: int
    chunks: list[tuple[int, ...]]
    inited: bool = False
    sent: int = 0  # chunks sent
    concluded: bool = False  # both sides awaited to a terminal status
    aborted: bool = False
    cleared: bool = False

    @property
    def all_sent(self) -> bool:
        return self.inited and self.sent == len(self.chunks)


@dataclass(frozen=True)
class Program:
    """A generated program: ``steps`` (the first is StartRoles), ``lifecycles`` (one
    ``(label, aborted)`` per room lifecycle, in the order they opened: the label its
    conclusion polls carry, and whether the decode aborted it) and ``topology``."""

    steps: tuple[Step, ...]
    lifecycles: tuple[tuple[str, bool], ...] = ()
    topology: str = "p1-d1"  # the deployment shape it runs on (harness.spec.topology)

    def checks(self) -> list[c.Check]:
        """The spec's expectations for this program (see the module docstring); the aborted
        rooms' check first, so a stuck abort is not reported as a clean room's."""
        clean = tuple(label for label, aborted in self.lifecycles if not aborted)
        hit = tuple(label for label, aborted in self.lifecycles if aborted)
        return [
            c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
            c.Check("aborted-rooms-conclude", "R-ABORT-1", _all_reached(hit, DONE)),
            c.Check("clean-rooms-succeed", "R-XFER-1", _all_reached(clean, (KVPoll.Success,))),
            c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact()),
            c.Check("loops-alive", "R-LIVE-2", c.loops_alive()),
            c.Check("no-dead-thread", "R-LIVE-2", c.no_dead_threads()),
        ]

    def to_json(self) -> str:
        """The program as one JSON document (steps tagged by their class name)."""
        return json.dumps({"topology": self.topology, "steps": [_encode(s) for s in self.steps],
                           "lifecycles": [list(x) for x in self.lifecycles]}, indent=1)


def _all_reached(labels: tuple[str, ...], statuses: tuple[int, ...]) -> c.Checker:
    """Each lifecycle's conclusion polls (AwaitStatus labelled with it) on the prefill and
    on the decode reached one of ``statuses`` within their bound: every lifecycle of a
    reused room id is judged, not only the last."""
    names = "/".join(kvpoll_name(s) for s in statuses)

    def fn(events: list[dict]):
        for label in labels:
            for role in ("prefill", "decode"):
                polls = [e for e in completions(events, op=Op.AWAIT_STATUS, role=role)
                         if (e.get("args") or {}).get("label") == label]
                if not polls:
                    return False, f"{role} never polled lifecycle {label} to its end"
                last = polls[-1]
                value = last.get("value") or {}
                room = last["args"].get("room")
                if last["type"] != Event.OK or not value.get("reached") or value.get("status") not in statuses:
                    said = value.get("status_name") or last.get("error") or "nothing"
                    return False, f"{role} room {room} (lifecycle {label}) read {said}, not {names}", last["seq"]
        return True, f"{len(labels)} lifecycle(s) reached {names} on both sides"

    return fn


#: the steps a program may hold: what ProgramMachine writes, nothing that starts processes
#: with a file's settings, kills, injects or loads code (a found file is input, not trusted)
PROGRAM_STEPS = (StartRoles, OpenRoom, RequestKV, AwaitStatus, InitSender, SendChunk, Abort, Clear, Sleep, VerifyPools)
MAX_WAIT_S = 30.0  # the longest Sleep or status bound a program file may ask for (seconds)


STEP_TYPES = {kind.__name__: kind for kind in PROGRAM_STEPS}


def _encode(step: Step) -> dict:
    return {"step": type(step).__name__, **json.loads(msgspec.json.encode(step))}


def program_from_json(text: str) -> Program:
    """The program :meth:`Program.to_json` wrote.  ValueError on anything else: a step
    outside :data:`PROGRAM_STEPS`, a field of the wrong type, a StartRoles with settings of
    its own (environment, armed points, other layouts), a wait beyond :data:`MAX_WAIT_S`."""
    try:
        doc = json.loads(text)
        steps = []
        for raw in doc["steps"]:
            kind = STEP_TYPES.get(raw.pop("step"))
            if kind is None:
                raise ValueError("a step a generated program never holds")
            steps.append(msgspec.json.decode(json.dumps(raw), type=kind))
        program = Program(tuple(steps), tuple((str(label), bool(aborted)) for label, aborted in doc["lifecycles"]),
                          str(doc.get("topology", "p1-d1")))
    except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:  # JSON, msgspec: ValueErrors
        raise ValueError(f"not a pdconform program: {type(exc).__name__}: {exc}") from exc
    _check_bounds(program)
    return program


def _check_bounds(program: Program) -> None:
    """ValueError unless ``program`` is one ProgramMachine could have written: StartRoles
    first and only there, with the program layout and nothing else set; every wait bounded."""
    if not program.steps or program.steps[0] != StartRoles(layout=LAYOUT):
        raise ValueError("not a pdconform program: it must start with the program roles, unchanged")
    for step in program.steps[1:]:
        if isinstance(step, StartRoles):
            raise ValueError("not a pdconform program: roles started twice")
        wait = step.seconds if isinstance(step, Sleep) else getattr(step, "timeout_s", 0.0)
        if not 0 <= wait <= MAX_WAIT_S:
            raise ValueError(f"not a pdconform program: a wait of {wait} s (0 to {MAX_WAIT_S:.0f} s)")


class ProgramMachine(RuleBasedStateMachine):
    """Writes one program (see the module docstring); :meth:`program` is what it wrote.
    Nothing runs while it writes: a subclass (harness.explore.session) runs the program
    at ``teardown``, so hypothesis shrinks failing programs rule by rule."""

    def __init__(self):
        super().__init__()
        self.steps: list[Step] = [StartRoles(layout=LAYOUT)]
        self.rooms: list[_Room] = []
        self.free_pages = list(range(LAYOUT.num_pages))
        self.free_aux = list(range(LAYOUT.aux_slots))

    # ---- the model ----------------------------------------------------------------
    def _live(self) -> list[_Room]:
        return [r for r in self.rooms if not r.cleared]

    def _reusable(self) -> list[int]:
        live = {r.room for r in self._live()}
        return sorted({r.room for r in self.rooms if r.cleared} - live)

    # ---- rules: what a pair of schedulers may do next -------------------------------
    @initialize(data=st.data())
    def first_room(self, data) -> None:
        self.open_room(data)

    @precondition(lambda self: len(self.rooms) < MAX_LIFECYCLES)
    @rule(data=st.data())
    def open_room(self, data) -> None:
        """The decode opens a receiver and registers its pages; the prefill's sender waits."""
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
        self.rooms.append(_Room(room, src, dst, aux_src, aux_dst, chunks))
        self.steps += [OpenRoom(room), RequestKV(room, dst, aux_dst),
                       AwaitStatus(room, "prefill", (KVPoll.WaitingForInput, KVPoll.Failed))]

    @precondition(lambda self: any(not r.inited and not r.concluded for r in self._live()))
    @rule(data=st.data())
    def init_sender(self, data) -> None:
        """The prefill's scheduler starts the request: the sender learns its page count."""
        r = data.draw(st.sampled_from([r for r in self._live() if not r.inited and not r.concluded]), label="room")
        r.inited = True
        self.steps.append(InitSender(r.room, len(r.src), r.aux_src))

    @precondition(lambda self: any(r.inited and not r.all_sent and not r.concluded for r in self._live()))
    @rule(data=st.data())
    def send_chunk(self, data) -> None:
        """The prefill sends the room's next chunk (the last one with its aux data), also
        after the decode aborted it, as long as the prefill has not seen it conclude."""
        r = data.draw(st.sampled_from([r for r in self._live() if r.inited and not r.all_sent and not r.concluded]),
                      label="room")
        self.steps.append(SendChunk(r.room, r.chunks[r.sent]))
        r.sent += 1

    @precondition(lambda self: any(not r.aborted and not r.concluded for r in self._live()))
    @rule(data=st.data())
    def abort_on_decode(self, data) -> None:
        """The decode's scheduler aborts the request (its client went away)."""
        r = data.draw(st.sampled_from([r for r in self._live() if not r.aborted and not r.concluded]), label="room")
        r.aborted = True
        self.steps.append(Abort(r.room, "decode"))

    @precondition(lambda self: any((r.all_sent or r.aborted) and not r.concluded for r in self._live()))
    @rule(data=st.data())
    def conclude(self, data) -> None:
        """Both schedulers poll the room until it concludes (Success or Failed)."""
        r = data.draw(st.sampled_from([r for r in self._live() if (r.all_sent or r.aborted) and not r.concluded]),
                      label="room")
        self._await(r)

    @precondition(lambda self: any(r.concluded for r in self._live()))
    @rule(data=st.data())
    def clear(self, data) -> None:
        """Both schedulers release the concluded request."""
        r = data.draw(st.sampled_from([r for r in self._live() if r.concluded]), label="room")
        r.cleared = True
        self.steps += [Clear(r.room, "prefill"), Clear(r.room, "decode")]

    @precondition(lambda self: not isinstance(self.steps[-1], Sleep))
    @rule(seconds=st.sampled_from(SLEEPS_S))
    def wait(self, seconds: float) -> None:
        """Time passes: control messages are handled, heartbeats run."""
        self.steps.append(Sleep(seconds))

    # ---- the program ----------------------------------------------------------------
    def _await(self, r: _Room) -> None:
        r.concluded = True
        label = f"L{self.rooms.index(r)}"
        self.steps += [AwaitStatus(r.room, "prefill", DONE, label=label), AwaitStatus(r.room, "decode", DONE, label=label)]

    def program(self) -> Program:
        """The steps so far, then what every scheduler does before it goes idle: each room
        that is not aborted gets its remaining chunks, each room is polled to its end, the
        decode's pools are checked, every room is cleared."""
        for r in self._live():
            if not r.aborted and not r.all_sent:
                if not r.inited:
                    r.inited = True
                    self.steps.append(InitSender(r.room, len(r.src), r.aux_src))
                self.steps += [SendChunk(r.room, chunk) for chunk in r.chunks[r.sent:]]
                r.sent = len(r.chunks)
        for r in self._live():
            if not r.concluded:
                self._await(r)
        clean = [r for r in self.rooms if not r.aborted]
        hit = [r for r in self.rooms if r.aborted]
        self.steps.append(VerifyPools(tuple(m for r in clean for m in zip(r.src, r.dst)),
                                      tuple((r.aux_src, r.aux_dst) for r in clean),
                                      unchecked_kv=tuple(p for r in hit for p in r.dst),
                                      unchecked_aux=tuple(r.aux_dst for r in hit)))
        for r in self._live():
            r.cleared = True
            self.steps += [Clear(r.room, "prefill"), Clear(r.room, "decode")]
        return Program(tuple(self.steps), tuple((f"L{i}", r.aborted) for i, r in enumerate(self.rooms)))


__all__ = ["LAYOUT", "Program", "ProgramMachine", "program_from_json", "PROGRAM_TIMEOUT_S"]
