"""Generated lifecycle programs as data: the pools and profiles every program runs on, the
bounds the program writer (harness.explore.program.ProgramMachine) keeps, and
:class:`Program`, the steps and room lifecycles it wrote, with their checks.

Apart from the writer so that reading or replaying a program (a found program is a scenario
of every ``pdconform`` run: harness.explore.found) does not import hypothesis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import msgspec

from harness.explore.program_checks import KILL_SLACK_S, lifecycle_checks
from harness.judge import checks as c
from harness.spec import load_plan
from harness.spec.protocol import KVPoll, Layout
from harness.spec.rooms import MAX_SHIFTS, ROOM_STRIDE
from harness.spec.steps import Abort, KillRole, OpenRoom, RestartRole, StartRoles, Step

#: the pools every program runs on: 32 pages and 8 aux slots, enough for 8 room lifecycles
#: of up to 4 pages that never share a decode page or aux slot (so every byte stays checkable)
LAYOUT = Layout(num_layers=2, num_pages=32, page_size=4, page_bytes=128, aux_slots=8, aux_bytes=32)
MAX_LIFECYCLES = 8
LOAD_ROOMS = 256  # the most rooms a load program holds in flight at once (its pools fit them; R-LOAD-1)
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
MAX_MESSAGE_FRAMES = 16  # the frames of one injected message, at most (harness.explore.program.MALFORMED draws up to 15)
MAX_MESSAGE_BYTES = 4096  # the bytes of one injected message, at most: a found file stays small
WAITING_TIMEOUT_S = 20  # the decode's waiting timeout in programs (R-TIMEOUT-2): a failed write's room ends by then
AT_RISK_BOUND_S = WAITING_TIMEOUT_S + 5.0  # the conclusion polls' bound for a room a failed write may reach
#: the control messages a program may lose, one kind of one room (R-LOSS-1; ProgramMachine.lose_*)
LOSS_KINDS = ("abort", "status", "registration")
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
            "bare": StartRoles(layout=LAYOUT),
            # a burst of up to LOAD_ROOMS rooms through several transfer workers (R-LOAD-1; ProgramMachine.load_burst)
            "load": StartRoles(layout=load_plan.layout(LOAD_ROOMS), env=(*WAITING_ENV, *load_plan.ENV))}


@dataclass(frozen=True)
class Program:
    """A generated program: ``steps`` (the first is StartRoles), ``lifecycles`` (one
    ``(label, aborted[, at_risk[, after_kill[, lost]]])`` per room lifecycle, in the order they
    opened: the label its conclusion polls carry, whether the decode aborted it, whether a failed
    write may reach it, its mark when it was in flight at a kill (:data:`AFTER_KILL`), and
    whether one of its control messages was lost (R-LOSS-1))
    and ``topology``."""

    steps: tuple[Step, ...]
    lifecycles: tuple[tuple, ...] = ()
    topology: str = "p1-d1"  # the deployment shape it runs on (harness.spec.topology)

    def checks(self) -> list[c.Check]:
        """The spec's expectations for this program (harness.explore.program_checks)."""
        def kind(x: tuple) -> str:
            mark = x[3] if len(x) > 3 else ""
            if len(x) > 4 and x[4]:
                return "lost"
            if mark and mark != "spared":
                return f"killed-{mark}"
            # a spared room the decode aborted after the kill is judged as aborted
            return ("aborted" if x[1] else "at-risk" if len(x) > 2 and x[2] else
                    "killed-spared" if mark == "spared" else "clean")

        labels = {k: tuple(x[0] for x in self.lifecycles if kind(x) == k)
                  for k in ("clean", "aborted", "at-risk", "lost", *(f"killed-{m}" for m in AFTER_KILL[1:]))}
        kill = next((s for s in self.steps if isinstance(s, KillRole)), None)
        aborted_rooms = tuple(s.room for s in self.steps if isinstance(s, Abort))
        # a clean lifecycle opened on a prefill after its restart stands for R-RESTART-1 (lifecycle i is the
        # i-th OpenRoom that opens a sender: an unscheduled registration's is no lifecycle); one opened on the
        # other prefill is an ordinary clean room
        opened = [(i, s.prefill) for i, s in enumerate(self.steps) if isinstance(s, OpenRoom) and s.open_sender]
        restart = next(((i, s.role) for i, s in enumerate(self.steps) if isinstance(s, RestartRole)),
                       (len(self.steps), ""))
        later = {f"L{n}" for n, (i, prefill) in enumerate(opened) if i > restart[0] and prefill == restart[1]}
        return lifecycle_checks(tuple(x for x in labels["clean"] if x not in later), labels["aborted"],
                                labels["at-risk"], aborted_rooms, deferred=DEFERRED_ENV[-1] in self.steps[0].env,
                                after_restart=tuple(x for x in labels["clean"] if x in later),
                                killed=(labels["killed-fail"], labels["killed-end"]),
                                orphaned=(labels["killed-sender-fail"], labels["killed-sender-end"]),
                                decode_killed=kill is not None and kill.role == "decode",
                                spared=labels["killed-spared"], dead_prefill=kill.role if kill else "prefill",
                                lost=labels["lost"])

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


__all__ = ["AFTER_KILL", "LAYOUT", "PREFILLS", "PROFILES", "Program", "PROGRAM_TIMEOUT_S"]
