"""One cell: one implementation x one scenario, run in its own process.

``python -m harness.drive.cell --impl NAME --scenario ID --seed N --workdir DIR``
starts the scenario's roles through a :class:`harness.drive.launcher.Launcher`,
executes its steps, observes every role, stops them, runs the checks on the
history and writes ``DIR/cell.json`` (a :class:`harness.judge.results.CellResult`)
and ``DIR/history.jsonl``.  The runner kills the whole process group at the
cell deadline, so nothing here needs to guard against its own hang.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from harness.spec import steps as s
from harness.role.adapter import FAILED, kvpoll_name
from harness.judge.checks import verdict_of
from harness.role.faults import push_frames
from harness.judge.history import History
from harness.drive.launcher import LocalLauncher, Launcher, RoleClient, RoleError, RoleHandle, RoleSpec
from harness.judge.results import CellResult
from harness.spec.scenario import Scenario, get_scenario

CALL_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.05  # between KVPoll reads of an AwaitStatus (seconds): a 50 ms latency floor, not 20 ms of pickled round trips


class CellAborted(Exception):
    """The cell cannot go on (a role failed to start, or a step is unsupported)."""

    def __init__(self, message: str, unsupported: bool = False):
        super().__init__(message)
        self.unsupported = unsupported


class CellDriver:
    """Executes scenario steps against role processes and records the history."""

    def __init__(self, impl: str, launcher: Launcher, history: History, base_port: int):
        self.impl = impl
        self.launcher = launcher
        self.history = history
        self.ctx = zmq.Context()
        self.handles: dict[str, RoleHandle] = {}
        self.clients: dict[str, RoleClient] = {}
        self.bootstrap_addr: dict[str, str] = {}
        self.control_endpoint: dict[str, str] = {}  # role -> its manager's control socket
        self.engine: str | None = None
        self.base_port = base_port
        self.prefills_started = 0
        self.prefill_setup: dict[str, tuple[dict, int]] = {}  # prefill -> (layout, bootstrap port)
        self.role_env: dict[str, dict[str, str]] = {}  # role -> the environment it was started with
        self.step_index: int | None = None
        self.full_waits = False  # True: no fail-fast cut of later waits (steps.STALL_CUT_S)
        self.stalled_step: int | None = None  # the first step whose must-come status never came

    # ---- calls with history ----------------------------------------------
    def call(self, role: str, op: str, deadline_s: float = CALL_TIMEOUT_S, **kwargs: Any) -> Any:
        self.history.record("invoke", op, role, self.step_index, args=kwargs)
        try:
            value = self.clients[role].call(op, deadline_s, **kwargs)
        except RoleError as exc:
            self.history.record("fail", op, role, self.step_index, args=kwargs, error=str(exc),
                                unsupported=exc.unsupported, remote_traceback=exc.remote_traceback)
            if exc.unsupported:
                raise CellAborted(f"{role}.{op}: {exc}", unsupported=True) from exc
            return None
        self.history.record("ok", op, role, self.step_index, args=kwargs, value=value)
        return value

    def call_all(self, calls: list[tuple[str, str, dict]], deadline_s: float = CALL_TIMEOUT_S) -> list[Any]:
        """Run ``(role, op, kwargs)`` calls on distinct roles at the same time; their values in
        order (None for a call that failed, as :meth:`call` records it).  The history gets
        every invoke, then every completion, in the order of ``calls``.  CellAborted (after
        every reply is read) when one of them is unsupported."""
        sent = []
        for role, op, kwargs in calls:
            self.history.record("invoke", op, role, self.step_index, args=kwargs)
            try:
                self.clients[role].send(op, **kwargs)
                sent.append(None)
            except RoleError as exc:
                sent.append(exc)
        values, unsupported = [], None
        for (role, op, kwargs), error in zip(calls, sent):
            try:
                if error is not None:
                    raise error
                value = self.clients[role].result(deadline_s)
            except RoleError as exc:
                self.history.record("fail", op, role, self.step_index, args=kwargs, error=str(exc),
                                    unsupported=exc.unsupported, remote_traceback=exc.remote_traceback)
                if exc.unsupported and unsupported is None:
                    unsupported = f"{role}.{op}: {exc}"
                values.append(None)
                continue
            self.history.record("ok", op, role, self.step_index, args=kwargs, value=value)
            values.append(value)
        if unsupported:
            raise CellAborted(unsupported, unsupported=True)
        return values

    # ---- steps -------------------------------------------------------------
    def run(self, steps: list[s.Step]) -> None:
        for index, step in enumerate(steps):
            self.step_index = index
            self.history.record("info", "step", None, index, args={"step": type(step).__name__})
            getattr(self, f"_do_{type(step).__name__}")(step)

    def _do_StartRoles(self, step: s.StartRoles) -> None:
        names = [(n, "prefill") for n in step.prefills] + [(n, "decode") for n in step.decodes]
        env = dict(step.env)
        for name, role in names:
            self.role_env[name] = env
            self.handles[name] = self.launcher.start(RoleSpec(name=name, impl=self.impl, role=role, env=env))
        for name, _ in names:
            self._await_launch(name, self.handles[name], step.ready_timeout_s)
        for arm in step.arm:
            self._do_ArmPoint(arm)
        # Every role starts its manager and engine at once (the decodes do not need the
        # prefills yet); the history records the calls in the step's order.
        layout = step.layout.to_dict()
        starts: list[tuple[str, str, dict]] = []
        for name in step.prefills:
            port = self.base_port + self.prefills_started  # each prefill's bootstrap port, unique in the cell
            self.prefills_started += 1
            starts.append((name, "start_prefill", {"layout": layout, "bootstrap_port": port}))
        decode_layout = (step.decode_layout or step.layout).to_dict()
        for i, name in enumerate(step.decodes):
            extra = {"attn_tp": (step.decode_attn_tp, i % step.decode_attn_tp)} if step.decode_attn_tp > 1 else {}
            starts.append((name, "start_decode", {"layout": decode_layout, "bootstrap_port": self.base_port,
                                                  **extra}))
        for (name, op, kwargs), facts in zip(starts, self.call_all(starts, deadline_s=60)):
            if facts is None:
                raise CellAborted(f"{op.split('_')[1]} {name} failed to start: {self._last_error(name)}")
            if op == "start_prefill":
                self._prefill_started(name, kwargs["layout"], kwargs["bootstrap_port"], facts)
            else:
                self._note_control_endpoint(name, facts)
                self.engine = facts.get("engine", self.engine)

    def _await_launch(self, name: str, handle: RoleHandle, timeout_s: float) -> None:
        """Wait for a launched role process to serve commands; connect a client to it."""
        self.history.record("invoke", "launch", name, self.step_index, args={})
        try:
            endpoint = handle.wait_ready(timeout_s)
        except RoleError as exc:
            self.history.record("fail", "launch", name, self.step_index, args={}, error=str(exc))
            raise CellAborted(f"role {name} did not start: {exc}") from exc
        self.history.record("ok", "launch", name, self.step_index, args={}, value={"endpoint": endpoint})
        self.clients[name] = RoleClient(self.ctx, name, endpoint, handle=handle)

    def _start_prefill(self, name: str, layout: dict, port: int) -> None:
        facts = self.call(name, "start_prefill", deadline_s=60, layout=layout, bootstrap_port=port)
        if facts is None:
            raise CellAborted(f"prefill {name} failed to start: {self._last_error(name)}")
        self._prefill_started(name, layout, port, facts)

    def _prefill_started(self, name: str, layout: dict, port: int, facts: dict) -> None:
        self.prefill_setup[name] = (layout, port)
        self.bootstrap_addr[name] = facts["bootstrap_addr"]
        self._note_control_endpoint(name, facts)
        self.engine = facts.get("engine", self.engine)

    def _note_control_endpoint(self, name: str, facts: dict) -> None:
        if facts.get("rank_port"):
            self.control_endpoint[name] = f"tcp://127.0.0.1:{facts['rank_port']}"

    def _last_error(self, role: str) -> str:
        for event in reversed(self.history.events):
            if event["role"] == role and event["type"] == "fail":
                return event.get("error", "")
        return ""

    def _do_OpenRoom(self, step: s.OpenRoom) -> None:
        addr = self.bootstrap_addr[step.prefill]
        if step.open_sender:
            self.call(step.prefill, "open_sender", room=step.room, bootstrap_addr=addr)
        self.call(step.decode, "open_receiver", deadline_s=step.timeout_s + 5,
                  room=step.room, bootstrap_addr=addr, timeout_s=step.timeout_s)

    def _do_OpenSender(self, step: s.OpenSender) -> None:
        extra = {"destinations": step.destinations} if step.destinations != 1 else {}
        self.call(step.prefill, "open_sender", room=step.room, bootstrap_addr=self.bootstrap_addr[step.prefill],
                  **extra)

    def _do_RequestKV(self, step: s.RequestKV) -> None:
        self.call(step.decode, "request_kv", room=step.room, pages=list(step.pages), aux_slot=step.aux_slot)

    def _do_InitSender(self, step: s.InitSender) -> None:
        self.call(step.prefill, "init_sender", room=step.room, num_pages=step.num_pages, aux_slot=step.aux_slot)

    def _do_SendChunk(self, step: s.SendChunk) -> None:
        self.call(step.prefill, "send_chunk", room=step.room, pages=list(step.pages))

    def _do_AwaitStatus(self, step: s.AwaitStatus) -> None:
        bound = step.timeout_s
        args: dict[str, Any] = {"room": step.room, "statuses": [kvpoll_name(x) for x in step.statuses],
                                "timeout_s": bound}
        if self.stalled_step is not None and bound > s.STALL_CUT_S:  # fail fast (steps.STALL_CUT_S)
            bound = s.STALL_CUT_S
            args.update(timeout_s=bound, cut={"from_s": step.timeout_s, "after_step": self.stalled_step})
        self.history.record("invoke", "await_status", step.role, self.step_index, args=args)
        client = self.clients[step.role]
        try:
            seen = client.call("await_status", bound + CALL_TIMEOUT_S, room=step.room,
                               statuses=list(step.statuses), timeout_s=bound)
            status = seen["status"]
            reason = client.call("failure_reason", CALL_TIMEOUT_S, room=step.room) if status == FAILED else None
        except RoleError as exc:
            self.history.record("fail", "await_status", step.role, self.step_index, args=args, error=str(exc))
            return
        reached = status in step.statuses
        if not reached and step.timeout_s >= s.STEP_TIMEOUT_S and not self.full_waits \
                and self.stalled_step is None:
            self.stalled_step = self.step_index
        value = {"status": status, "status_name": kvpoll_name(status), "reached": reached,
                 "waited_s": seen["waited_s"], "trail": seen["trail"], "failure_reason": reason}
        self.history.record("ok", "await_status", step.role, self.step_index, args=args, value=value)

    def _do_VerifyPools(self, step: s.VerifyPools) -> None:
        self.call(step.decode, "verify", kv_moves=[list(m) for m in step.kv_moves],
                  aux_moves=[list(m) for m in step.aux_moves], unchecked_kv=list(step.unchecked_kv),
                  unchecked_aux=list(step.unchecked_aux),
                  sent_layers=None if step.sent_layers is None else list(step.sent_layers))

    # ---- nemesis (faults are recorded on their own channel: type "nemesis") --------
    def _signal(self, role: str, signum: int, what: str) -> None:
        self.handles[role].signal(signum)
        self.history.record("nemesis", what, role, self.step_index, args={"signal": signal.Signals(signum).name})

    def _do_KillRole(self, step: s.KillRole) -> None:
        self._signal(step.role, signal.SIGKILL, "kill")

    def _do_FreezeRole(self, step: s.FreezeRole) -> None:
        self._signal(step.role, signal.SIGSTOP, "freeze")

    def _do_ThawRole(self, step: s.ThawRole) -> None:
        self._signal(step.role, signal.SIGCONT, "thaw")

    def _do_InjectFrames(self, step: s.InjectFrames) -> None:
        self._inject(step.role, list(step.frames), what="inject")

    def _do_RequireFact(self, step: s.RequireFact) -> None:
        facts = next((e.get("value") or {} for e in reversed(self.history.events)
                      if e["role"] == step.role and e["op"] in ("start_prefill", "start_decode") and e["type"] == "ok"),
                     None)
        if facts is None:
            raise CellAborted(f"RequireFact: {step.role} has not started")
        if not facts.get(step.fact):
            release = f" on sglang {facts['sglang']}" if facts.get("sglang") else ""
            raise CellAborted(f"{step.reason} ({step.role} reports {step.fact}={facts.get(step.fact)!r}{release})",
                              unsupported=True)

    def _do_RestartRole(self, step: s.RestartRole) -> None:
        name = step.role
        if name not in self.prefill_setup:
            raise CellAborted(f"RestartRole: {name} is not a started prefill")
        layout, port = self.prefill_setup[name]
        old_handle, old_client = self.handles[name], self.clients[name]
        old_endpoint = self.control_endpoint.get(name)
        env = self.role_env.get(name, {}) if step.env is None else dict(step.env)
        restarts = sum(1 for e in self.history.events
                       if e["type"] == "nemesis" and e["op"] == "restart" and e["role"] == name)
        workdir = getattr(self.launcher, "workdir", None)
        spec = RoleSpec(name=name, impl=self.impl, role="prefill", env=env,
                        log_path=str(Path(workdir) / f"{name}.restart{restarts + 1}.log") if workdir else None)
        new_handle = self.launcher.start(spec)
        self.history.record("invoke", "launch", name, self.step_index, args={"restart": restarts + 1})
        try:
            endpoint = new_handle.wait_ready(step.ready_timeout_s)
        except RoleError as exc:  # the old prefill keeps serving; the cell cannot go on
            new_handle.stop(timeout_s=5)
            self.history.record("fail", "launch", name, self.step_index, args={"restart": restarts + 1},
                                error=str(exc))
            raise CellAborted(f"the replacement for {name} did not start: {exc}") from exc
        self.history.record("ok", "launch", name, self.step_index, args={"restart": restarts + 1},
                            value={"endpoint": endpoint})
        old_handle.signal(signal.SIGKILL)
        old_handle.stop(timeout_s=5)  # gone, and its ports with it, before the new manager binds
        old_client.close()
        self.history.record("nemesis", "restart", name, self.step_index,
                            args={"bootstrap_port": port, "old_control_endpoint": old_endpoint})
        self.handles[name] = new_handle
        self.clients[name] = RoleClient(self.ctx, name, endpoint, handle=new_handle)
        self.role_env[name] = env
        self._start_prefill(name, layout, port)

    def _do_InjectAbort(self, step: s.InjectAbort) -> None:
        frames = self._nemesis_call(step.decode, "abort_frames", "abort-frames", room=step.room)
        self._inject(step.prefill, [tuple(frames)], what="inject-abort", room=step.room, known=step.known)

    def _inject(self, role: str, messages: list, what: str, **args: Any) -> None:
        endpoint = self.control_endpoint.get(role)
        if endpoint is None:
            raise CellAborted(f"{role} published no control socket to inject frames into", unsupported=True)
        push_frames(endpoint, messages, self.ctx)
        self.history.record("nemesis", what, role, self.step_index,
                            args={"endpoint": endpoint, "messages": len(messages), **args,
                                  "sample": [[f[:40].hex() for f in m] for m in messages[:5]]})

    def _do_Sleep(self, step: s.Sleep) -> None:
        time.sleep(step.seconds)

    def _do_Observe(self, step: s.Observe) -> None:
        time.sleep(step.settle_s)
        for role in step.roles:
            self._observe(role, op="observe-mid", args={"label": step.label})

    def _do_PlanLayouts(self, step: s.PlanLayouts) -> None:
        from hypothesis import HealthCheck, find, settings
        from hypothesis.errors import NoSuchExample

        from harness.spec import layouts
        from harness.spec.frames import sample

        specs = sample(layouts.layout_specs(), step.count, step.seed)
        results = self.call(step.role, "plan_layouts", specs=specs)
        if results is None:
            return
        failures = {}
        for spec, result in zip(specs, results):
            problem = layouts.judge(spec, result)
            if problem is not None:
                failures.setdefault(layouts.kind_of(problem), (spec, problem))
        shrunk = []
        client = self.clients[step.role]
        for kind, (spec, problem) in list(failures.items())[: step.max_shrinks]:
            def still_fails(candidate, kind=kind):
                answer = client.call("plan_layouts", CALL_TIMEOUT_S, specs=[candidate])[0]
                found = layouts.judge(candidate, answer)
                return found is not None and layouts.kind_of(found) == kind
            try:
                small = find(layouts.layout_specs(), still_fails,
                             settings=settings(max_examples=100, database=None, deadline=None, derandomize=True,
                                               suppress_health_check=list(HealthCheck)))
            except (NoSuchExample, RoleError):
                small = spec
            answer = client.call("plan_layouts", CALL_TIMEOUT_S, specs=[small])[0]
            shrunk.append({"spec": small, "layout": layouts.describe(small), "problem": layouts.judge(small, answer),
                           "first_seen": layouts.describe(spec)})
        self.history.record("info", "layout-shrink", step.role, self.step_index, args={"count": len(specs)},
                            value={"specs": specs, "results": results, "shrunk": shrunk})

    def _do_TransferLayouts(self, step: s.TransferLayouts) -> None:
        from harness.spec import layouts
        from harness.spec.frames import sample

        chosen = sample(layouts.single_stage_specs(), step.count, step.seed)
        shrunk = [e["value"]["shrunk"] for e in self.history.events if e["op"] == "layout-shrink"]
        chosen += [entry["spec"] for entry in (shrunk[-1] if shrunk else []) if entry["spec"]["stages"] == 1][:3]
        for i, spec in enumerate(chosen):
            prefill_layout, decode_layout = layouts.role_layouts(spec)
            prefill, decode = f"prefill-L{i}", f"decode-L{i}"
            why_not = self.call("prefill", "unsupported_layout", spec=spec) if "prefill" in self.clients else None
            self.history.record("info", "layout-transfer", prefill, self.step_index,
                                args={"layout": layouts.describe(spec), "spec": spec, "skipped": why_not})
            if why_not:
                continue
            try:
                self._do_StartRoles(s.StartRoles(prefills=(prefill,), decodes=(decode,), layout=prefill_layout,
                                                 decode_layout=decode_layout))
            except CellAborted as exc:  # this layout's roles did not start: its own problem, not the cell's
                self.history.record("fail", "layout-start", prefill, self.step_index, args={}, error=str(exc))
                self.retire([n for n in (prefill, decode) if n in self.clients])
                continue
            try:
                for sub_step in layouts.transfer_steps(spec, prefill, decode, seed=step.seed + i):
                    getattr(self, f"_do_{type(sub_step).__name__}")(sub_step)
            finally:
                self.retire([prefill, decode])

    def _do_Clear(self, step: s.Clear) -> None:
        self.call(step.role, "clear", room=step.room)

    def _do_Abort(self, step: s.Abort) -> None:
        self.call(step.role, "abort", room=step.room)

    def _nemesis_call(self, role: str, op: str, what: str, **kwargs: Any) -> Any:
        """A fault-injection call: recorded on the nemesis channel; an unsupported
        one ends the cell UNSUPPORTED, any other failure a run error."""
        try:
            value = self.clients[role].call(op, CALL_TIMEOUT_S, **kwargs)
        except RoleError as exc:
            self.history.record("fail", what, role, self.step_index, args=kwargs, error=str(exc),
                                unsupported=exc.unsupported)
            raise CellAborted(f"{role}.{op}: {exc}", unsupported=exc.unsupported) from exc
        self.history.record("nemesis", what, role, self.step_index, args=kwargs, value=value)
        return value

    def _do_ArmPoint(self, step: s.ArmPoint) -> None:
        frames = [list(m) for m in step.frames]
        self._nemesis_call(step.role, "arm_point", "arm-point", point=step.point, action=step.action,
                           frames=frames, hold_s=step.hold_s)

    def _do_AwaitPoint(self, step: s.AwaitPoint) -> None:
        args = {"point": step.point, "timeout_s": step.timeout_s}
        start = time.monotonic()
        while True:
            try:
                hits = self.clients[step.role].call("point_hits", CALL_TIMEOUT_S)
            except RoleError as exc:
                self.history.record("fail", "await_point", step.role, self.step_index, args=args, error=str(exc))
                return
            reached = step.point in hits["paused"] or any(h["point"] == step.point for h in hits["log"])
            if reached or time.monotonic() - start > step.timeout_s:
                break
            time.sleep(POLL_INTERVAL_S)
        value = {"reached": reached, "waited_s": round(time.monotonic() - start, 3)}
        if reached:
            self.history.record("ok", "await_point", step.role, self.step_index, args=args, value=value)
        else:
            self.history.record("fail", "await_point", step.role, self.step_index, args=args,
                                error=f"no thread reached {step.point} within {step.timeout_s} s")

    def _do_ReleasePoint(self, step: s.ReleasePoint) -> None:
        self._nemesis_call(step.role, "release_point", "release-point", point=step.point)

    def _do_EngineFaults(self, step: s.EngineFaults) -> None:
        self._nemesis_call(step.role, "set_engine_faults", "engine-faults", fail_nth=step.fail_nth,
                           delay_s=step.delay_s, never_complete=step.never_complete, fail_group=step.fail_group)

    def record_injected(self) -> None:
        """Copy every fault that fired inside the roles (engine faults, point hits)
        into the history as nemesis events, and the ABORT_ACKs each decode received
        (one ``abort-acks`` info event per role that received any)."""
        for name, client in self.clients.items():
            if not self.handles[name].alive() or client.broken:
                continue
            for op, what in (("fault_log", "engine-fault"), ("point_hits", "point-hit")):
                try:
                    value = client.call(op, 10)
                except RoleError:
                    continue
                for record in (value["log"] if op == "point_hits" else value):
                    self.history.record("nemesis", what, name, None, args={}, value=record)
            try:
                acks = client.call("abort_acks", 10)
            except RoleError:
                continue
            if acks:
                self.history.record("info", "abort-acks", name, None, args={}, value=acks)

    # ---- end of cell -------------------------------------------------------
    def observe_all(self) -> None:
        """Observe every launched role; a role that cannot be observed gets a ``fail``
        event saying why, so checks never mistake silence for health."""
        self.step_index = None
        for name in self.clients:
            self._observe(name)

    def _observe(self, name: str, op: str = "observe", args: dict | None = None) -> None:
        """Record one role's :class:`harness.role.adapter.Observation` as an ``op`` event, or a
        ``fail`` event saying why it cannot be observed (dead, broken, not answering)."""
        handle, client, args = self.handles[name], self.clients[name], args or {}
        if not handle.alive() or client.broken:
            why = client.broken or f"its process ended ({handle.exit_description()})"
            self.history.record("fail", op, name, self.step_index, args=args, error=f"{name} cannot be observed: {why}")
            return
        try:
            value = client.call("observe", 10)
        except RoleError as exc:
            self.history.record("fail", op, name, self.step_index, args=args, error=str(exc))
            return
        self.history.record("ok", op, name, self.step_index, args=args, value=value)

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
            self._observe(name)
            self._stop(name)
            del self.clients[name], self.handles[name]
        self.step_index = saved

    def stop_all(self) -> None:
        for name in list(self.clients):
            self._stop(name)
        self.ctx.term()


def run_cell(impl: str, scenario: Scenario, seed: int, workdir: Path, base_port: int,
             full_waits: bool = False) -> CellResult:
    """Run one cell in this process (roles in child processes); return its result.

    ``full_waits``: every AwaitStatus waits its whole bound, even after a must-come
    status never came (default: later waits are cut, see harness.spec.steps.STALL_CUT_S)."""
    workdir.mkdir(parents=True, exist_ok=True)
    history = History(workdir / "history.jsonl")
    driver = CellDriver(impl, LocalLauncher(workdir), history, base_port)
    driver.full_waits = full_waits
    start = time.monotonic()
    run_error = unsupported = None
    try:
        driver.run(scenario.steps(seed))
        driver.observe_all()
        driver.record_injected()
    except CellAborted as exc:
        if exc.unsupported:
            unsupported = str(exc)
        else:
            run_error = str(exc)
    finally:
        driver.stop_all()
        history.close()
    results = [check.run(history.events) for check in scenario.checks(seed)]
    verdict, reason = verdict_of(results, run_error=run_error, unsupported=unsupported)
    cut = sum(1 for e in history.events if e["op"] == "await_status" and e["type"] == "invoke"
              and "cut" in (e.get("args") or {}))
    if cut:
        reason += (f" (fail fast: step {driver.stalled_step}'s status never came, so {cut} later wait(s) "
                   f"were cut to {s.STALL_CUT_S:g} s; --full-waits runs them in full)")
    bytes_verified = sum(
        (e.get("value") or {}).get("bytes_verified", 0)
        for e in history.events if e["op"] == "verify" and e["type"] == "ok"
    )
    return CellResult(
        impl=impl, scenario=scenario.id, verdict=verdict, expected="PASS", engine=driver.engine,
        duration_s=round(time.monotonic() - start, 3), bytes_verified=bytes_verified, reason=reason,
        divergence=None, checks=[r.to_dict() for r in results], workdir=str(workdir),
    )


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
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--base-port", type=int, required=True)
    parser.add_argument("--full-waits", action="store_true")
    args = parser.parse_args(argv)
    _die_with_parent()
    result = run_cell(args.impl, get_scenario(args.scenario), args.seed, Path(args.workdir), args.base_port,
                      full_waits=args.full_waits)
    Path(args.workdir, "cell.json").write_text(json.dumps(result.to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
