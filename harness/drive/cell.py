"""One cell: one implementation x one scenario, run in its own process.  It executes; it does not judge.

``python -m harness.drive.cell --impl NAME --scenario ID --seed N --workdir DIR --base-port P``
starts the scenario's roles through a :class:`harness.drive.launcher.Launcher`,
executes its steps (each through the executor :data:`harness.drive.executors.EXECUTORS`
names for its type), observes every role, stops them, and records all of it in
``DIR/history.jsonl`` (harness.spec.history), from :attr:`Op.CELL_START` to
:attr:`Op.CELL_END`.  The verdict is decided afterwards, in the parent, by
harness.judge.judge from that history alone.  The runner kills the whole process
group at the cell deadline, so nothing here guards against its own hang.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from harness import nofollow
from harness.drive.contain import NETNS_ENV, NETNS_PID_ENV, become_subreaper, isolate_network, kill_descendants
from harness.drive.errors import CellAborted, RoleError, RoleTimeout, ended_early
from harness.drive.executors import execute
from harness.drive.executors.lifecycle import CALL_TIMEOUT_S
from harness.drive.launcher import Launcher, RoleHandle
from harness.drive.load import figures_now
from harness.drive.remote import PlacedLauncher, launcher_for
from harness.drive.role_client import RoleClient
from harness.spec import steps as s
from harness.spec.history import (START_OPS, Event, History, Op, fact, held_rooms, last_observations,
                                  rooms_cleared_everywhere)
from harness.spec.scenario import Scenario, get_scenario


#: the scheduler calls every TP rank of a role makes (CellDriver.call): a server's TP ranks
#: run the same scheduler steps; anything else goes to rank 0
GROUP_OPS = frozenset({"open_sender", "open_receiver", "request_kv", "init_sender", "send_chunk", "clear", "abort"})
#: the nemesis calls that act on every TP rank of a role (each rank has its engine and threads)
NEMESIS_GROUP_OPS = frozenset({"arm_point", "release_point", "set_engine_faults", "lose_messages"})

#: quiescence before residue is judged (R-RESIDUE-1): while a role still holds state of a room
#: cleared on every side, it is observed again every RESIDUE_POLL_S seconds until this long
#: (seconds) has passed, so work still draining is not taken for residue; a round of
#: observations that started in time runs to its end (each call bounded at 10 s)
RESIDUE_SETTLE_S = 2.0
RESIDUE_POLL_S = 0.25


class CellDriver:
    """Executes scenario steps against role processes and records the history.

    Holds what the executors share: the roles' handles and clients by role name, each
    prefill's bootstrap address and setup, each role's control endpoint and
    environment, and the fail-fast state (``stalled_step``, harness.spec.steps.STALL_CUT_S)."""

    def __init__(self, impl: str, launcher: Launcher | None, history: History, base_port: int):
        self.impl = impl
        self.launcher = launcher
        self.history = history
        self.ctx = zmq.Context()
        self.handles: dict[str, RoleHandle] = {}
        self.clients: dict[str, RoleClient] = {}
        self.bootstrap_addr: dict[str, str] = {}
        self.control_endpoint: dict[str, str] = {}  # role -> its manager's control socket
        self.base_port = base_port
        self.ports_used = 0  # of the cell's port block: a bootstrap port per prefill, a rendezvous per PP prefill
        self.prefill_setup: dict[str, tuple[dict, int]] = {}  # prefill -> (layout, bootstrap port)
        self.role_env: dict[str, dict[str, str]] = {}  # role -> the environment it was started with
        self.step_index: int | None = None
        self.cell_rooms: list[int] = []  # every room the steps name (run sets it): residue is looked for in all
        self.full_waits = False  # True: no fail-fast cut of later waits (steps.STALL_CUT_S)
        self.stalled_step: int | None = None  # the first step whose must-come status never came
        # a role started as attention TP ranks -> its rank roles, rank 0 (named as the role) first
        self.groups: dict[str, list[str]] = {}
        # with TP rank groups: for each prefill rank, how many decode ranks take KV from it
        self.destinations: list[int] = []
        self.dp: dict[str, int] = {}  # a role started as DP engines -> how many (its group: engine k at k)
        # a decode of DP engines: the destination pages and aux slots each engine's rooms asked for
        self.dp_requested: dict[str, tuple[set[int], set[int]]] = {}
        self.room_shift = None  # a cell on a warm role pair: how its rooms move (harness.drive.room_shift)

    def address_of(self, name: str) -> str:
        """The address role process ``name`` listens on (its launcher knows its host)."""
        return self.launcher.address_of(name)

    def ranks(self, role: str) -> list[str]:
        """The role processes behind ``role``: its TP ranks, PP stages or DP engines, or the role alone."""
        return self.groups.get(role, [role])

    def route(self, role: str, kwargs: dict) -> list[str]:
        """The processes a call on ``role`` with ``kwargs`` concerns: on DP engines a call that
        names a room goes to engine ``room mod DP`` only (R-DP-1, as sglang's
        follow_bootstrap_room places it); anything else concerns every rank."""
        ranks, dp = self.ranks(role), self.dp.get(role, 1)
        if dp > 1 and isinstance(kwargs.get("room"), int):
            return [ranks[kwargs["room"] % dp]]
        return ranks

    def one(self, role: str, kwargs: dict) -> str:
        """The process a single call on ``role`` goes to: the room's DP engine (:meth:`route`),
        else the role itself (rank 0)."""
        targets = self.route(role, kwargs)
        return targets[0] if len(targets) == 1 else role

    # ---- recording ----------------------------------------------------------
    def record(self, type_: Event, op: Op | str, role: str | None, **fields: Any) -> dict:
        """One history event at the current step."""
        return self.history.record(type_, op, role, self.step_index, **fields)

    def _record_failure(self, role: str, op: str, kwargs: dict, exc: RoleError) -> None:
        self.record(Event.FAIL, op, role, args=kwargs, error=str(exc), unsupported=exc.unsupported,
                    remote_traceback=exc.remote_traceback, timed_out=isinstance(exc, RoleTimeout))

    # ---- calls with history -------------------------------------------------
    def call(self, role: str, op: str, deadline_s: float = CALL_TIMEOUT_S,
             per_rank: dict[str, dict] | None = None, **kwargs: Any) -> Any:
        """Call adapter method ``op`` on ``role``, recording invoke and completion; None when
        it failed (recorded), CellAborted when the adapter says the step is unsupported.  On a
        role of TP ranks a scheduler call (:data:`GROUP_OPS`) goes to every rank at once, each
        with ``kwargs`` and its ``per_rank`` extras: one invoke and one completion under the
        role, the value ``{"ranks": {rank: value}}``, failed when one rank failed (named)."""
        targets = self.route(role, kwargs)
        if len(targets) > 1 and op in GROUP_OPS:
            return self._group_call(role, op, deadline_s, kwargs, per_rank or {})
        target = self.one(role, kwargs)
        kwargs = {**kwargs, **(per_rank or {}).get(target, {})}
        engine = {"engine": target} if target != role else {}
        self.record(Event.INVOKE, op, role, args=kwargs, **engine)
        try:
            value = self.clients[target].call(op, deadline_s, **kwargs)
        except RoleError as exc:
            self._record_failure(role, op, kwargs, exc)
            if exc.unsupported:
                raise CellAborted(f"{role}.{op}: {exc.remote_message or exc}", unsupported=True) from exc
            return None
        self.record(Event.OK, op, role, args=kwargs, value=value, **engine)
        return value

    def _exchange(self, calls: list[tuple[str, str, dict]], deadline_s: float,
                  on_sent: Any = None) -> list[Any]:
        """Send every ``(role, op, kwargs)`` call (to distinct roles) before reading any reply;
        each call's value, or the RoleError it ended with, in order.  ``on_sent(role, op, kwargs)``
        runs before each send (to record the invoke)."""
        sent: list[RoleError | None] = []
        for role, op, kwargs in calls:
            if on_sent:
                on_sent(role, op, kwargs)
            try:
                self.clients[role].send(op, **kwargs)
                sent.append(None)
            except RoleError as exc:
                sent.append(exc)
        out: list[Any] = []
        for (role, _, _), error in zip(calls, sent):
            try:
                if error is not None:
                    raise error
                out.append(self.clients[role].result(deadline_s))
            except RoleError as exc:
                out.append(exc)
        return out

    def rank_results(self, role: str, op: str, deadline_s: float, kwargs: dict,
                     per_rank: dict[str, dict] | None = None) -> dict[str, Any]:
        """``op`` on every rank of ``role`` it concerns (:meth:`route`) at once, unrecorded: each rank's value, by rank;
        RoleError (naming the rank) for the first rank that failed, after every reply is read."""
        ranks, extra = self.route(role, kwargs), per_rank or {}
        if len(ranks) == 1:  # one process: one plain call
            return {ranks[0]: self.clients[ranks[0]].call(op, deadline_s, **{**kwargs, **extra.get(ranks[0], {})})}
        replies = self._exchange([(rank, op, {**kwargs, **extra.get(rank, {})}) for rank in ranks], deadline_s)
        failed = next(((rank, r) for rank, r in zip(ranks, replies) if isinstance(r, RoleError)), None)
        if failed:
            rank, exc = failed
            raise RoleError(f"{rank}: {exc}", unsupported=exc.unsupported, remote_message=exc.remote_message,
                            remote_traceback=exc.remote_traceback) from exc
        return dict(zip(ranks, replies))

    def _group_call(self, role: str, op: str, deadline_s: float, kwargs: dict, per_rank: dict[str, dict]) -> Any:
        self.record(Event.INVOKE, op, role, args=kwargs)
        try:
            values = self.rank_results(role, op, deadline_s, kwargs, per_rank)
        except RoleError as exc:
            self._record_failure(role, op, kwargs, exc)
            if exc.unsupported:
                raise CellAborted(f"{role}.{op}: {exc.remote_message or exc}", unsupported=True) from exc
            return None
        value = {"ranks": values}
        self.record(Event.OK, op, role, args=kwargs, value=value)
        return value

    def call_all(self, calls: list[tuple[str, str, dict]], deadline_s: float = CALL_TIMEOUT_S) -> list[Any]:
        """Run ``(role, op, kwargs)`` calls on distinct roles at the same time; their values in
        order (None for a call that failed, as :meth:`call` records it).  The history gets
        every invoke, then every completion, in the order of ``calls``.  CellAborted (after
        every reply is read) when one of them is unsupported."""
        replies = self._exchange(calls, deadline_s,
                                 on_sent=lambda role, op, kwargs: self.record(Event.INVOKE, op, role, args=kwargs))
        values, unsupported = [], None
        for (role, op, kwargs), reply in zip(calls, replies):
            if isinstance(reply, RoleError):
                self._record_failure(role, op, kwargs, reply)
                if reply.unsupported and unsupported is None:
                    unsupported = f"{role}.{op}: {reply.remote_message or reply}"
                values.append(None)
                continue
            self.record(Event.OK, op, role, args=kwargs, value=reply)
            values.append(reply)
        if unsupported:
            raise CellAborted(unsupported, unsupported=True)
        return values

    def nemesis_call(self, role: str, op: str, what: Op, **kwargs: Any) -> Any:
        """A fault-injection call: recorded on the nemesis channel; an unsupported
        one ends the cell UNSUPPORTED, any other failure a run error.  On a role of TP ranks
        an engine fault plan or an interleaving point (:data:`NEMESIS_GROUP_OPS`) is set in
        every rank (each rank has its engine and its threads); the value is rank 0's."""
        try:
            if op in NEMESIS_GROUP_OPS and len(self.ranks(role)) > 1:  # a room's op goes to its DP engine only
                value = next(iter(self.rank_results(role, op, CALL_TIMEOUT_S, kwargs).values()))
            else:
                value = self.clients[self.one(role, kwargs)].call(op, CALL_TIMEOUT_S, **kwargs)
        except RoleError as exc:
            self.record(Event.FAIL, what, role, args=kwargs, error=str(exc), unsupported=exc.unsupported,
                        timed_out=isinstance(exc, RoleTimeout))
            raise CellAborted(f"{role}.{op}: {exc.remote_message if exc.unsupported and exc.remote_message else exc}",
                              unsupported=exc.unsupported) from exc
        self.record(Event.NEMESIS, what, role, args=kwargs, value=value)
        return value

    def arm(self, step: s.ArmPoint) -> None:
        """Arm an interleaving point in a role (harness.role.faults.Points), on the nemesis channel."""
        self.nemesis_call(step.role, "arm_point", Op.ARM_POINT, point=step.point, action=step.action,
                          frames=[list(m) for m in step.frames], hold_s=step.hold_s)

    def last_error(self, role: str) -> str:
        """The error of ``role``'s most recent failed event ("" when none)."""
        for event in reversed(self.history.events):
            if event["role"] == role and event["type"] == Event.FAIL:
                return event.get("error", "")
        return ""

    def start_facts(self, role: str) -> dict | None:
        """What ``role`` reported when its manager last started (None: it has not)."""
        return next((e.get("value") or {} for e in reversed(self.history.events)
                     if e["role"] == role and e["op"] in START_OPS and e["type"] == Event.OK), None)

    # ---- steps --------------------------------------------------------------
    def run(self, steps: list[s.Step], first: int = 0) -> None:
        """Execute ``steps`` from index ``first`` on, in order (harness.drive.executors; a long-lived
        pair has run step 0 its own way, harness.drive.pair); CellAborted ends the cell."""
        self.cell_rooms = sorted({step.room for step in steps if isinstance(getattr(step, "room", None), int)})
        for index, step in enumerate(steps[first:], first):
            self.step_index = index
            self.record(Event.INFO, Op.STEP, None, args={"step": type(step).__name__})
            self.execute(step)

    def execute(self, step: s.Step) -> None:
        """Execute one step at the current step index (a step may execute others: TransferLayouts)."""
        execute(self, step)

    # ---- end of cell ----------------------------------------------------------
    def observe_all(self) -> None:
        """Observe every launched role; a role that cannot be observed gets a ``fail``
        event saying why, so checks never mistake silence for health."""
        self.step_index = None
        for name in self.clients:
            self.observe(name)
        cleared = rooms_cleared_everywhere(self.history.events)
        if cleared and self._holding(cleared):
            from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

            Retrying(stop=stop_after_delay(RESIDUE_SETTLE_S), wait=wait_fixed(RESIDUE_POLL_S),
                     retry=retry_if_result(bool), retry_error_callback=lambda state: state.outcome.result(),
                     sleep=time.sleep)(self._observe_again, cleared)

    def _holding(self, rooms: set[int]) -> list[str]:
        """The roles whose last observation holds state of one of ``rooms``."""
        return [role for role, e in last_observations(self.history.events).items()
                if role in self.clients and e["type"] == Event.OK and held_rooms(e.get("value"), rooms)]

    def _observe_again(self, rooms: set[int]) -> list[str]:
        """Observe the roles still holding state of ``rooms`` again; those that still do."""
        for name in self._holding(rooms):
            self.observe(name)
        return self._holding(rooms)

    def observe(self, name: str, op: Op = Op.OBSERVE, args: dict | None = None) -> None:
        """Record one role's :class:`harness.role.adapter.Observation` as an ``op`` event, or a
        ``fail`` event saying why it cannot be observed (dead, broken, not answering)."""
        handle, client, args = self.handles[name], self.clients[name], args or {}
        if not handle.alive() or client.broken:
            why = client.broken or f"its process ended ({handle.exit_description()})"
            self.record(Event.FAIL, op, name, args=args, error=f"{name} cannot be observed: {why}",
                        timed_out=client.timed_out)
            return
        try:
            # residue is judged at the end of the cell: a mid-cell Observe (a loop alive?) skips the walk
            value = client.call("observe", 10, rooms=self.cell_rooms, residue=op == Op.OBSERVE)
        except RoleError as exc:
            self.record(Event.FAIL, op, name, args=args, error=str(exc), timed_out=isinstance(exc, RoleTimeout))
            return
        self.record(Event.OK, op, name, args=args, value=value)

    def record_injected(self) -> None:
        """Copy every fault that fired inside the roles (engine faults, point hits)
        into the history as nemesis events, the ABORT_ACKs each decode received and the ABORT
        generations it sent (one ``abort-acks`` / ``aborts-sent`` info event per role with any),
        once every ABORT is answered or old enough to be judged (see :meth:`_settle_acks`)."""
        self._settle_acks()
        self.record_fired(list(self.clients))
        for name, client in self.clients.items():
            if not self.handles[name].alive() or client.broken:
                continue
            for op, what in (("abort_acks", Op.ABORT_ACKS), ("aborts_sent", Op.ABORTS_SENT)):
                try:
                    value = client.call(op, 10)
                except RoleError:
                    continue
                if value:
                    self.history.record(Event.INFO, what, name, None, args={}, value=value)

    def record_fired(self, names: list[str]) -> None:
        """Copy the faults that fired inside the processes ``names`` (engine faults, dropped
        messages, point hits) into the history as nemesis events: at the end of the cell, and
        before a kill or restart takes a process's log with it (harness.judge.fired)."""
        for name in names:
            client = self.clients.get(name)
            if client is None or not self.handles[name].alive() or client.broken:
                continue
            # and what its control sockets received, whole or not (R-LOAD-1): one info event
            for op, what in (("fault_log", Op.ENGINE_FAULT), ("message_log", Op.MESSAGE_LOST),
                             ("point_hits", Op.POINT_HIT), ("message_audit", Op.MESSAGE_AUDIT)):
                try:
                    value = client.call(op, 10)
                except RoleError:
                    continue
                records = [value] if op == "message_audit" else value["log"] if op == "point_hits" else value
                for record in records:
                    kind = Event.INFO if op == "message_audit" else Event.NEMESIS
                    self.history.record(kind, what, name, None, args={}, value=record)

    def _settle_acks(self) -> None:
        """Wait (at most harness.judge.postconditions.ACK_DUE_S seconds, the age at which
        every-abort-answered judges an ABORT) until each live decode with deferred release has
        an ABORT_ACK for every ABORT generation it sent, or that ABORT is that old, so a cell
        that ends right after an ABORT still sees its ACK (R-ABORT-2).  Not after a prefill was
        killed, frozen, restarted or cut off: its ACKs are not owed."""
        from harness.judge.postconditions import ACK_DUE_S, answered, prefill_silenced

        events = self.history.events
        if prefill_silenced(events):
            return
        deadline = time.monotonic() + ACK_DUE_S
        while time.monotonic() < deadline:
            waiting = False
            for name, client in self.clients.items():
                if not self.handles[name].alive() or client.broken or fact(events, name, "deferred_release") is not True:
                    continue
                try:
                    sent, acks = client.call("aborts_sent", 10), client.call("abort_acks", 10)
                except RoleError:
                    continue
                acked = answered(acks)
                waiting = waiting or any(a.get("generation") is not None and (a.get("room"), a.get("generation")) not in acked
                                         and time.time() - a.get("t", 0.0) < ACK_DUE_S for a in sent or ())
            if not waiting:
                return
            time.sleep(0.05)

    def _stop(self, name: str) -> None:
        client, handle = self.clients[name], self.handles[name]
        if handle.alive() and not client.broken and client.pending is None:
            try:
                client.call("shutdown", 5)
            except RoleError:
                pass
        client.close()
        handle.stop(timeout_s=5)

    def retire(self, names: list[str]) -> None:
        """Observe these roles now (their observation is what checks see), then stop
        them, so that a cell that starts many role pairs holds only a few at a time."""
        saved, self.step_index = self.step_index, None
        for name in names:
            if name not in self.clients:
                continue
            self.observe(name)
            self._stop(name)
            del self.clients[name], self.handles[name]
        self.step_index = saved

    def stop_all(self) -> None:
        for name in list(self.clients):
            self._stop(name)
        self.ctx.term()


def run_cell(impl: str, scenario: Scenario, seed: int, workdir: Path, base_port: int,
             full_waits: bool = False, network: str = "the host's network") -> None:
    """Run one cell in this process (roles in child processes), recording everything in
    ``workdir/history.jsonl``: :attr:`Op.CELL_START` first, :attr:`Op.CELL_END` last
    (``outcome`` completed | aborted | unsupported | crashed, with the ``reason`` of the last
    three; crashed: an exception other than CellAborted, which propagates; ``load``: this
    process's and its roles' run-queue wait as they end, harness.drive.load.figures_now).

    ``full_waits``: every AwaitStatus waits its whole bound, even after a must-come
    status never came (default: later waits are cut, see harness.spec.steps.STALL_CUT_S)."""
    os.close(nofollow.open_dir(workdir, create=True))  # no link followed on the way (harness.nofollow)
    history = History(workdir / "history.jsonl")
    history.record(Event.INFO, Op.CELL_START, None, None,
                   value={"impl": impl, "scenario": scenario.id, "seed": seed, "full_waits": full_waits,
                          "network": network})
    launcher = launcher_for(workdir)  # local, or through the run's agents on other hosts (harness.drive.remote)
    driver = CellDriver(impl, launcher, history, base_port)
    driver.full_waits = full_waits
    outcome: dict[str, Any] = {"outcome": "completed"}
    try:
        driver.run(scenario.steps(seed))
        driver.observe_all()
        driver.record_injected()
    except CellAborted as exc:
        outcome = ended_early(exc, driver.step_index)
    except BaseException as exc:  # a harness bug or an interrupt: the cell did not run to its end
        outcome = ended_early(exc, driver.step_index)
        raise
    finally:
        # this process's and its roles' run-queue wait, read while their threads are all still there
        outcome["load"] = figures_now([os.getpid(), *(h.pid for h in driver.handles.values() if h.pid)])
        driver.stop_all()
        strays = kill_descendants(grace_s=0.2)  # orphans a role's process left behind (re-parented here)
        if strays:
            outcome["stray_processes"] = strays
        if isinstance(launcher, PlacedLauncher):  # which host each role process ran on (rank)
            outcome["placement"] = dict(launcher.placement)
            launcher.close()
        history.record(Event.INFO, Op.CELL_END, None, None, value=outcome)
        history.close()


def _die_with_parent(interval_s: float = 0.5) -> None:
    """Kill this cell's whole process group (roles included) if the runner goes away,
    however it ended (SIGKILL leaves it no chance to clean up)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="pdconform-cell-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.drive.cell")
    parser.add_argument("--impl", required=True)
    parser.add_argument("--scenario")
    parser.add_argument("--pair", metavar="SOCKET", help="serve programs on long-lived roles (harness.drive.pair)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--base-port", type=int, required=True)
    parser.add_argument("--full-waits", action="store_true")
    args = parser.parse_args(argv)
    network = contain_cell()  # while this process has one thread
    _die_with_parent()
    if args.pair:
        from harness.drive.pair import serve_pair

        serve_pair(args.impl, Path(args.workdir), args.base_port, network, args.pair, CellDriver)
        return 0
    if not args.scenario:
        parser.error("--scenario is required (or --pair)")
    run_cell(args.impl, get_scenario(args.scenario), args.seed, Path(args.workdir), args.base_port,
             full_waits=args.full_waits, network=network)
    return 0


def contain_cell() -> str:
    """Isolate this cell's network when the runner asks for it (harness.drive.contain: the roles
    join it; ``NETNS_PID_ENV`` tells the launcher whose namespace) and make this process a child
    subreaper; what the cell's network is, in words."""
    network = "the host's network"
    if os.environ.get(NETNS_ENV) == "1":
        try:
            network = isolate_network()
            os.environ[NETNS_PID_ENV] = str(os.getpid())
        except OSError as exc:
            network = f"the host's network (isolation refused: {exc.strerror or exc})"
    become_subreaper()
    return network


if __name__ == "__main__":
    sys.exit(main())
