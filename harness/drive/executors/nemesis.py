"""Executors of the nemesis steps: process faults, injected frames and ABORTs, prefill
restarts, interleaving points and engine faults (harness.spec.steps).  Every fault is
recorded on its own channel (history events of type ``nemesis``)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.drive.errors import CellAborted, RoleError
from harness.drive.executors.lifecycle import CALL_TIMEOUT_S, connect, start_prefill
from harness.drive.launcher import RoleSpec
from harness.role.faults import push_frames
from harness.spec import steps as s
from harness.spec.history import Event, Op, fact

if TYPE_CHECKING:
    from harness.drive.cell import CellDriver

POLL_INTERVAL_S = 0.05  # between reads of a role's point hits (seconds)
KILL_WAIT_S = 5.0  # how long a kill waits for the killed processes to be gone (seconds)


def _signal(d: "CellDriver", role: str, signum: int, what: Op) -> None:
    """Signal every process of ``role`` (each of its TP ranks: the server as a whole)."""
    ranks = d.ranks(role)
    for rank in ranks:
        d.handles[rank].signal(signum)
    d.record(Event.NEMESIS, what, role, args={"signal": signal.Signals(signum).name,
                                              **({"ranks": ranks} if len(ranks) > 1 else {})})


def kill_role(d: "CellDriver", step: s.KillRole) -> None:
    """SIGKILL every process of ``step.role``, then wait (at most KILL_WAIT_S) until they are
    gone: a dying process keeps its sockets open while the kernel tears down its memory, so a
    step right after the kill would otherwise race that teardown (a write accepted by a socket
    nobody reads) and a cell's outcome would depend on the machine's load.  Processes still
    there after the wait are noted in the history (an info event), not waited for longer."""
    d.record_fired(d.ranks(step.role))  # its fault log dies with it
    _signal(d, step.role, signal.SIGKILL, Op.KILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while (alive := [rank for rank in d.ranks(step.role) if d.handles[rank].alive()]) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S / 5)
    if alive:  # the next steps may race its teardown after all: say so in the history
        d.record(Event.INFO, Op.KILL, step.role, args={"still_alive_after_s": KILL_WAIT_S, "ranks": alive})


def freeze_role(d: "CellDriver", step: s.FreezeRole) -> None:
    _signal(d, step.role, signal.SIGSTOP, Op.FREEZE)


def thaw_role(d: "CellDriver", step: s.ThawRole) -> None:
    _signal(d, step.role, signal.SIGCONT, Op.THAW)


NETEM_FIELDS = ("partition", "delay_ms", "jitter_ms", "loss_pct", "duplicate_pct", "reorder_pct", "rate_kbit")


def network_fault(d: "CellDriver", step: s.NetworkFault) -> None:
    """Fault (or heal) the link between the hosts of ``step.a`` and ``step.b`` through their
    agents (harness.drive.remote.PlacedLauncher.netem, harness.hosts.linkfault), on
    ``step.path``; UNSUPPORTED when the roles do not run on two hosts, or a host lacks what
    the fault needs."""
    import os

    from harness.drive.remote import PlacedLauncher
    from harness.target.role_context import BIND_ENV

    if step.path not in s.NETWORK_PATHS:  # a typo is the scenario's error, wherever it runs
        raise CellAborted(f"NetworkFault: no such path {step.path!r} (one of {', '.join(s.NETWORK_PATHS)})")
    launcher = d.launcher
    if not isinstance(launcher, PlacedLauncher):
        raise CellAborted("a network fault needs roles on several hosts: run with --hosts netns:2 (root) or "
                          "--hosts N (docs/cluster.md)", unsupported=True)
    hosts = [launcher.placement.get(name) for name in (step.a, step.b)]
    if None in hosts or hosts[0] == hosts[1]:
        raise CellAborted(f"NetworkFault: {step.a} and {step.b} do not run on two hosts ({hosts})", unsupported=True)
    coordinator = os.environ.get(BIND_ENV, "")  # the run's own address (harness.session.cell_network)
    if coordinator in (launcher.hosts[h]["address"] for h in hosts):
        raise CellAborted(f"NetworkFault: the coordinator listens on {coordinator}, the address of a faulted host: "
                          "the fault would cut the harness's own calls; run the coordinator on another address "
                          "(docs/cluster.md)", unsupported=True)
    # the data path is the one the KV bytes take: a role that carries them on its control
    # connections (the reference: "data_path" false) has no other, and a fault on nothing fires never
    path = "control" if step.path == "data" and any(
        fact(d.history.events, r, "data_path") is False for r in (step.a, step.b)) else step.path
    spec = {name: getattr(step, name) for name in NETEM_FIELDS if getattr(step, name)}
    ports = path_ports(d, path)
    if spec:
        spec["path"] = path
    packets = {}  # a heal: how many packets the fault it ends applied to, per direction (harness.judge.fired)
    try:
        packets[f"{step.a}->{step.b}"] = launcher.netem(hosts[0], hosts[1], spec or None, ports)
        if step.both_ways:
            packets[f"{step.b}->{step.a}"] = launcher.netem(hosts[1], hosts[0], spec or None, ports)
    except RoleError as exc:  # a host that cannot run the fault: not the implementation's failure
        raise CellAborted(f"NetworkFault: {exc}", unsupported="NotImplementedError" in str(exc)) from exc
    d.record(Event.NEMESIS, Op.NETWORK, step.a, args={"a": step.a, "b": step.b, "hosts": hosts,
                                                      "both_ways": step.both_ways, **(spec or {"heal": True}),
                                                      **({"ports": ports} if spec and ports else {}),
                                                      **({} if spec else {"packets": packets})})


def path_ports(d: "CellDriver", path: str) -> list[int]:
    """The TCP ports that pick out ``path`` (harness.hosts.linkfault): every prefill's
    bootstrap port for ``bootstrap``, every role's control port for ``control``, both for
    ``data`` (the packets it leaves out); none for ``all``."""
    bootstrap = [int(addr.rpartition(":")[2]) for addr in d.bootstrap_addr.values()]
    control = [int(endpoint.rpartition(":")[2]) for endpoint in d.control_endpoint.values()]
    chosen = {"all": [], "bootstrap": bootstrap, "control": control, "data": bootstrap + control}[path]
    return sorted(set(chosen))


def inject_frames(d: "CellDriver", step: s.InjectFrames) -> None:
    _inject(d, step.role, list(step.frames), what=Op.INJECT)


def inject_abort(d: "CellDriver", step: s.InjectAbort) -> None:
    frames = d.nemesis_call(step.decode, "abort_frames", Op.ABORT_FRAMES, room=step.room)
    _inject(d, step.prefill, [tuple(frames)], what=Op.INJECT_ABORT, room=step.room, known=step.known)


def capture_frames(d: "CellDriver", step: s.CaptureFrames) -> None:
    """Record the message ``step.role``'s implementation builds (hex frames, on the nemesis
    channel under ``step.label``); the cell is UNSUPPORTED where it cannot build it."""
    if any(e["op"] == Op.CAPTURE and e["args"].get("label") == step.label for e in d.history.events):
        raise CellAborted(f"CaptureFrames: the label {step.label!r} is already taken in this cell")
    if step.kind == "abort":
        frames = _build(d, step, "abort_frames", room=step.room)
    else:  # "status" (CaptureFrames checks its kind and status)
        frames = _build(d, step, "status_frames", room=step.room, status=int(step.status))
    d.record(Event.NEMESIS, Op.CAPTURE, step.role,
             args={"label": step.label, "room": step.room, "kind": step.kind, "status": step.status},
             value=[bytes(f).hex() for f in frames])


def _build(d: "CellDriver", step: s.CaptureFrames, op: str, **kwargs: Any) -> list[bytes]:
    try:
        return d.clients[d.one(step.role, kwargs)].call(op, CALL_TIMEOUT_S, **kwargs)
    except RoleError as exc:
        d.record(Event.FAIL, Op.CAPTURE, step.role, args={"label": step.label, **kwargs}, error=str(exc),
                 unsupported=exc.unsupported)
        raise CellAborted(f"{step.role}.{op}: {exc.remote_message if exc.unsupported and exc.remote_message else exc}",
                          unsupported=exc.unsupported) from exc


def inject_captured(d: "CellDriver", step: s.InjectCaptured) -> None:
    """Push the message captured under ``step.label`` into ``step.role``'s control socket."""
    captured = [e for e in d.history.events if e["op"] == Op.CAPTURE and e["type"] == Event.NEMESIS
                and e["args"].get("label") == step.label]
    if not captured:
        raise CellAborted(f"InjectCaptured: nothing was captured under {step.label!r}")
    frames = tuple(bytes.fromhex(f) for f in captured[-1]["value"])
    _inject(d, step.role, [frames], what=Op.INJECT_CAPTURED, label=step.label, room=captured[-1]["args"]["room"])


def _inject(d: "CellDriver", role: str, messages: list, what: Op, **args: Any) -> None:
    """Push ``messages`` into the control socket of ``role`` (rank 0), of the room's DP engine
    when ``args`` name a room, or of every DP engine when they name none (each engine's loops
    must survive them)."""
    targets = d.route(role, args) if d.dp.get(role, 1) > 1 else [role]
    endpoints = [d.control_endpoint.get(t) for t in targets]
    if None in endpoints:
        raise CellAborted(f"{role} published no control socket to inject frames into", unsupported=True)
    wire = d.room_shift.out(messages) if d.room_shift else messages  # a cell on a pair: its rooms as the roles know them
    for endpoint in endpoints:
        push_frames(endpoint, wire, d.ctx)
    where = {"endpoint": endpoints[0]} if len(endpoints) == 1 else {"endpoints": endpoints}
    d.record(Event.NEMESIS, what, role, args={**where, "messages": len(messages), **args,
                                              "sample": [[f[:40].hex() for f in m] for m in messages[:5]]})


def restart_role(d: "CellDriver", step: s.RestartRole) -> None:
    """Launch the replacement prefill first, then SIGKILL the old one and start the new
    manager behind the same bootstrap port.  CellAborted (old prefill left running) when
    the replacement does not come up."""
    name = step.role
    if len(d.ranks(name)) > 1:
        raise CellAborted(f"RestartRole: restarting {name}'s {len(d.ranks(name))} TP ranks is not built", unsupported=True)
    if name not in d.prefill_setup:
        raise CellAborted(f"RestartRole: {name} is not a started prefill")
    layout, port = d.prefill_setup[name]
    d.record_fired([name])  # the old process's fault log dies with it
    old_handle, old_client = d.handles[name], d.clients[name]
    old_endpoint = d.control_endpoint.get(name)
    env = d.role_env.get(name, {}) if step.env is None else dict(step.env)
    restarts = sum(1 for e in d.history.events
                   if e["type"] == Event.NEMESIS and e["op"] == Op.RESTART and e["role"] == name)
    workdir = getattr(d.launcher, "workdir", None)
    spec = RoleSpec(name=name, impl=d.impl, role="prefill", env=env,
                    log_path=str(Path(workdir) / f"{name}.restart{restarts + 1}.log") if workdir else None)
    new_handle = d.launcher.start(spec)
    try:
        connect(d, name, new_handle, step.ready_timeout_s, restart=restarts + 1)
    except CellAborted as exc:  # the old prefill keeps serving; the cell cannot go on
        new_handle.stop(timeout_s=5)
        raise CellAborted(f"the replacement for {name} did not start: {exc}") from exc
    old_handle.signal(signal.SIGKILL)
    old_handle.stop(timeout_s=5)  # gone, and its ports with it, before the new manager binds
    old_client.close()
    d.record(Event.NEMESIS, Op.RESTART, name, args={"bootstrap_port": port, "old_control_endpoint": old_endpoint})
    d.handles[name] = new_handle
    d.role_env[name] = env
    start_prefill(d, name, layout, port)


def arm_point(d: "CellDriver", step: s.ArmPoint) -> None:
    d.arm(step)


def await_point(d: "CellDriver", step: s.AwaitPoint) -> None:
    """Poll ``step.role``'s point hits until a thread reached ``step.point`` (or the bound
    passed); on a role of TP ranks, a thread of every rank; of DP engines, of one engine."""
    args = {"point": step.point, "timeout_s": step.timeout_s}
    start = time.monotonic()
    while True:
        try:
            by_rank = d.rank_results(step.role, "point_hits", CALL_TIMEOUT_S, {})
        except RoleError as exc:
            d.record(Event.FAIL, Op.AWAIT_POINT, step.role, args=args, error=str(exc))
            return
        # TP ranks and PP stages each run the room's work; of DP engines only the room's does
        every = any if d.dp.get(step.role, 1) > 1 else all
        reached = every(step.point in hits["paused"] or any(h["point"] == step.point for h in hits["log"])
                        for hits in by_rank.values())
        if reached or time.monotonic() - start > step.timeout_s:
            break
        time.sleep(POLL_INTERVAL_S)
    if reached:
        d.record(Event.OK, Op.AWAIT_POINT, step.role, args=args,
                 value={"reached": True, "waited_s": round(time.monotonic() - start, 3)})
    else:
        d.record(Event.FAIL, Op.AWAIT_POINT, step.role, args=args,
                 error=f"no thread reached {step.point} within {step.timeout_s} s")


def release_point(d: "CellDriver", step: s.ReleasePoint) -> None:
    d.nemesis_call(step.role, "release_point", Op.RELEASE_POINT, point=step.point)


def engine_faults(d: "CellDriver", step: s.EngineFaults) -> None:
    target, ranks = step.role, d.ranks(step.role)
    if step.rank is not None:
        if not -len(ranks) <= step.rank < len(ranks):
            raise CellAborted(f"EngineFaults: {step.role} runs {len(ranks)} process(es), it has no rank {step.rank}")
        target = ranks[step.rank]
    d.nemesis_call(target, "set_engine_faults", Op.ENGINE_FAULTS, fail_nth=step.fail_nth,
                   delay_s=step.delay_s, never_complete=step.never_complete, fail_group=step.fail_group,
                   aux_delay_s=step.aux_delay_s, slow_nth=step.slow_nth, slow_s=step.slow_s,
                   **({"error": step.error} if step.error else {}))


def lose_messages(d: "CellDriver", step: s.LoseMessages) -> None:
    """Install a message loss plan in every process of ``step.role`` (R-LOSS-1)."""
    d.nemesis_call(step.role, "lose_messages", Op.LOSE_MESSAGES, kind=step.kind, room=step.room, nth=step.nth,
                   count=step.count)
