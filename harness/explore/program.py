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
import typing
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
    """A generated program: ``steps`` (the first is StartRoles), ``clean`` (the room ids
    whose last lifecycle no fault touched: Success expected on both sides), ``aborted``
    (room ids whose last lifecycle the decode aborted: both sides must conclude) and the
    pages those lifecycles' writes may have reached (``unchecked_kv``/``unchecked_aux``)."""

    steps: tuple[Step, ...]
    clean: tuple[int, ...] = ()
    aborted: tuple[int, ...] = ()
    topology: str = "p1-d1"  # the deployment shape it runs on (harness.spec.topology)

    def checks(self) -> list[c.Check]:
        """The spec's expectations for this program (see the module docstring)."""
        return [
            c.Check("steps-complete", "R-XFER-1", c.steps_completed()),
            c.Check("clean-rooms-succeed", "R-XFER-1", _all_reached(self.clean, (KVPoll.Success,))),
            c.Check("aborted-rooms-conclude", "R-ABORT-1", _all_reached(self.aborted, DONE)),
            c.Check("bytes-exact", "R-LAYOUT-1", c.pools_exact()),
            c.Check("loops-alive", "R-LIVE-2", c.loops_alive()),
            c.Check("no-dead-thread", "R-LIVE-2", c.no_dead_threads()),
        ]

    def to_json(self) -> str:
        """The program as one JSON document (steps tagged by their class name)."""
        return json.dumps({"topology": self.topology, "steps": [_encode(s) for s in self.steps],
                           "clean": list(self.clean), "aborted": list(self.aborted)}, indent=1)


def _all_reached(rooms: tuple[int, ...], statuses: tuple[int, ...]) -> c.Checker:
    """Every room's last poll on the prefill and on the decode read one of ``statuses``."""
    names = "/".join(kvpoll_name(s) for s in statuses)

    def fn(events: list[dict]):
        for room in rooms:
            for role in ("prefill", "decode"):
                waits = [e for e in completions(events, op=Op.AWAIT_STATUS, role=role, room=room)
                         if e["type"] == Event.OK]
                seen = (waits[-1].get("value") or {}).get("status") if waits else None
                if seen not in statuses:
                    said = "never concluded" if seen is None else f"ended {kvpoll_name(seen)}"
                    return False, f"{role} room {room} {said}, not {names}", waits[-1]["seq"] if waits else None
        return True, f"{len(rooms)} room(s) reached {names} on both sides"

    return fn


STEP_TYPES = {kind.__name__: kind for kind in typing.get_args(Step)}  # the vocabulary: nothing else is a step


def _encode(step: Step) -> dict:
    return {"step": type(step).__name__, **json.loads(msgspec.json.encode(step))}


def program_from_json(text: str) -> Program:
    """The program :meth:`Program.to_json` wrote.  ValueError on anything else (a step the
    vocabulary lacks, a field of the wrong type)."""
    try:
        doc = json.loads(text)
        steps = []
        for raw in doc["steps"]:
            kind = STEP_TYPES.get(raw.pop("step"))
            if kind is None:
                raise ValueError("a step the scenario vocabulary lacks")
            steps.append(msgspec.json.decode(json.dumps(raw), type=kind))
        return Program(tuple(steps), tuple(int(r) for r in doc.get("clean", ())),
                       tuple(int(r) for r in doc.get("aborted", ())), str(doc.get("topology", "p1-d1")))
    except (KeyError, TypeError, AttributeError, ValueError) as exc:  # JSON and msgspec errors are ValueErrors
        raise ValueError(f"not a pdconform program: {exc}") from exc


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
        self.steps += [AwaitStatus(r.room, "prefill", DONE), AwaitStatus(r.room, "decode", DONE)]

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
        last = {}
        for r in self.rooms:  # a room id's last lifecycle decides what its last polls must read
            last[r.room] = r
        return Program(tuple(self.steps), tuple(room for room, r in last.items() if not r.aborted),
                       tuple(room for room, r in last.items() if r.aborted))


__all__ = ["LAYOUT", "Program", "ProgramMachine", "program_from_json", "PROGRAM_TIMEOUT_S"]
