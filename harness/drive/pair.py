"""Long-lived role pairs: one cell process whose roles serve many programs, for explore.

A generated program costs little to run and much to start: forking a cell and its roles,
starting their managers and engines.  A real server does not restart per request either: it
serves many requests on one prefill and one decode, each in its own bootstrap room.  So
explore keeps, per implementation and start step (profile and topology), one *pair*: a cell
process started with ``python -m harness.drive.cell --pair`` (:func:`serve_pair`) that
starts its roles with its first program and serves later programs on the same roles.

Each program still gets a history of its own, from :attr:`Op.CELL_START` to
:attr:`Op.CELL_END`, that reads like a fresh cell's: its StartRoles step records the events
the roles' start recorded (the same facts), then each role's ``begin_program`` (the engine
healed, the logs, fault log, points and ABORT_ACKs forgotten, the pools written again;
harness.role.adapter.RoleAdapter.begin_program) as one ``begin-program`` info event per
role.  Rooms isolate programs (explore gives each program's rooms ids no other program of
the pair used).  A pair serves no further program after one it cannot vouch for
(:func:`kept`): a step outside :data:`TRUSTED_STEPS`, a role gone, broken, with a dead
loop or thread, an aborted or crashed cell; the parent (:class:`RolePair`) then starts a
new one.  What reuse gives up is checked by ``tests/test_pair.py`` (the same programs
judged alone and on a pair give the same verdicts) and by explore, which confirms every
failure in a fresh cell before shrinking it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from harness import nofollow
from harness.drive.errors import CellAborted, ended_early
from harness.drive.forkserver_client import OWNER_FILE, ForkServerError, socket_parent
from harness.drive.runner import forget_process, kill_group, log_tail, start_cell_process, track_process
from harness.spec import steps as s
from harness.spec.history import Event, History, Op, append_event, last_observations

#: the steps after which a pair's roles serve the next program: scheduler calls, waits, a freeze
#: that was thawed, a malformed message, engine delays and failed writes (healed by begin_program).
#: Anything else (a restart, a kill, a write that never completes, a partition) ends the pair.
TRUSTED_STEPS = (s.OpenRoom, s.RequestKV, s.AwaitStatus, s.InitSender, s.SendChunk, s.Abort, s.Clear,
                 s.VerifyPools, s.Sleep, s.FreezeRole, s.ThawRole, s.InjectFrames, s.EngineFaults, s.LoseMessages)
#: the steps after which a matrix cell's pair (harness.drive.warm) is retired whatever the roles
#: show (issue 37's list): a kill or restart (a role replaced), an interleaving point (a thread may
#: still be held at it), a network fault, a freeze, an injected frame (a role's state for a peer
#: may have changed), and an engine fault that fails a write (:func:`retires_pair`: Mooncake marks
#: the decode's session dead after one, and fails every later room to it).  After any other step
#: the pair is kept when :func:`kept` vouches for its roles: every process the same and alive, no
#: dead loop or thread, and (:func:`held_writes`) no write or message an engine fault held still
#: in flight.  Each unexpected result is confirmed in a fresh cell, and tests/test_warm.py
#: compares the default set on pairs with the same run isolated.
MATRIX_RETIRING = (s.KillRole, s.RestartRole, s.ArmPoint, s.AwaitPoint, s.ReleasePoint, s.NetworkFault,
                   s.FreezeRole, s.InjectFrames, s.InjectAbort, s.InjectCaptured, s.LoseMessages)

SOCKET_NAME = "pair.sock"
REQUEST_WAIT_S = 0.5  # how often a pair waiting for its next program checks its parent (seconds)
STOP_WAIT_S = 5.0  # a pair asked to stop: how long it may take before its process group is killed (seconds)
REPLY_POLL_S = 0.1  # how often a program's run checks the pair's process and whether it was killed (seconds)
DIR_PREFIX = "pdconform-pair-"  # the temporary folder of each pair (its socket, an owner file as a fork server's)


def retires_pair(steps: list[s.Step]) -> s.Step | None:
    """The first step of a matrix cell's ``steps`` (after StartRoles) after which its pair is
    retired whatever its roles show (:data:`MATRIX_RETIRING`, an EngineFaults that fails a write
    or never completes one); None when :func:`kept` may keep it."""
    return next((step for step in steps[1:] if isinstance(step, MATRIX_RETIRING) or (
        isinstance(step, s.EngineFaults) and (step.never_complete or step.fail_nth is not None
                                              or step.fail_group is not None))), None)


def kept(steps: list[s.Step], outcome: dict, observations: dict[str, dict], alive: bool,
         matrix: bool = False) -> str:
    """Why a pair cannot serve another program after one with ``steps`` ended with ``outcome``
    (run_cell's), its roles' last ``observations`` (role -> event) and ``alive`` (every role
    process running, its client unbroken, the processes those it started); "" when it can.
    ``matrix``: a matrix cell's steps, judged by :data:`MATRIX_RETIRING` rather than
    :data:`TRUSTED_STEPS` (the caller checks :func:`held_writes` too)."""
    if outcome.get("outcome") != "completed":
        return f"the program's cell {outcome.get('outcome')}"
    odd = retires_pair(steps) if matrix else next(
        (step for step in steps[1:] if not isinstance(step, TRUSTED_STEPS)
         or (isinstance(step, s.EngineFaults) and step.never_complete)), None)
    if odd is not None:
        return f"a step after which the roles cannot be vouched for: {type(odd).__name__}"
    if not alive:
        return "a role process ended, was replaced or broke"
    for role, event in observations.items():
        value = event.get("value") or {}
        if event["type"] != Event.OK:
            return f"{role} could not be observed"
        if value.get("dead_threads") or not all((value.get("loops") or {}).values()):
            return f"a thread of {role} died"
    return ""


def held_writes(events: list[dict], now: float) -> str:
    """Why a write or message an engine fault held may still be in flight at wall clock ``now``
    (seconds), from the fault records of ``events`` (each injected at ``t``, held ``delay_s``:
    harness.role.faults.EngineFaultCounter); "" when every one has landed or was given up."""
    late = [r for e in events if e["op"] == Op.ENGINE_FAULT and isinstance(r := e.get("value"), dict)
            and r.get("fault") != "fail" and r.get("t", 0.0) + r.get("delay_s", 0.0) > now]
    return f"{len(late)} write(s) an engine fault held still in flight" if late else ""


class PairServer:
    """The pair's side (in its cell process): starts the roles with the first program, then
    serves each program on them (see the module docstring)."""

    def __init__(self, impl: str, workdir: Path, base_port: int, network: str, make_driver):
        from harness.drive.remote import launcher_for

        self.impl, self.workdir, self.base_port, self.network = impl, workdir, base_port, network
        self.launcher = launcher_for(workdir)
        self.make_driver = make_driver  # (impl, launcher, history, base_port) -> harness.drive.cell.CellDriver
        self.driver = None
        self.start_key = ""
        self.start_events: list[dict] = []
        self.handles: dict[str, Any] = {}
        self.served = 0

    def serve(self, scenario_id: str, workdir: Path, seed: int = 0, full_waits: bool = False,
              matrix: bool = False) -> dict:
        """Run one program (a scenario, by id or path, with ``seed`` and ``full_waits`` as
        harness.drive.cell.run_cell takes them) in ``workdir``, recording its history there;
        ``{"kept": True}`` or ``{"kept": False, "why": ...}`` (then this pair serves no more).
        ``matrix``: a matrix cell (harness.drive.warm): its rooms move by one stride per program
        served before it (harness.drive.room_shift; a program of explore comes moved already)
        and the pair is kept as :func:`kept` and :func:`held_writes` say for a matrix cell."""
        from harness.drive.room_shift import RoomShift
        from harness.spec.scenario import get_scenario

        workdir.mkdir(parents=True, exist_ok=True)
        logs_at = self._log_sizes()
        history = History(workdir / "history.jsonl")
        scenario = get_scenario(scenario_id)
        steps = scenario.steps(seed)
        key = repr(steps[0])
        reused = self.driver is not None
        rooms = {step.room for step in steps if isinstance(getattr(step, "room", None), int)}
        shift = RoomShift(rooms, self.served) if matrix and reused else None
        history.record(Event.INFO, Op.CELL_START, None, None,
                       value={"impl": self.impl, "scenario": scenario.id, "seed": seed, "full_waits": full_waits,
                              "network": self.network, "pair": {"program": self.served, "reused": reused,
                                                                "room_shift": shift.k if shift else 0}})
        if self.driver is None:
            self.driver = self.make_driver(self.impl, self.launcher, history, self.base_port)
        d, outcome = self.driver, {"outcome": "completed"}
        d.history, d.stalled_step, d.dp_requested, d.full_waits, d.room_shift = history, None, {}, full_waits, shift
        for client in d.clients.values():
            client.shift = shift
        try:
            if reused and key != self.start_key:
                raise CellAborted(f"this pair's roles were started by another StartRoles ({self.start_key[:80]})")
            self._start(d, steps[0], key, reused)
            d.run(steps, first=1)
            d.observe_all()
            d.record_injected()
        except Exception as exc:  # CellAborted; anything else is a harness bug: this program's cell crashed
            outcome = ended_early(exc, d.step_index)
        self.served += 1
        why = kept(steps, outcome, last_observations(history.events), self._alive(d), matrix) or (
            held_writes(history.events, time.time()) if matrix else "")
        outcome["pair"] = {"program": self.served - 1, "reused": reused, "kept": not why, "why": why}
        history.record(Event.INFO, Op.CELL_END, None, None, value=outcome)
        history.close()
        self._copy_logs(logs_at, workdir, shift)
        return {"kept": not why, "why": why}

    def _log_sizes(self) -> dict[str, int]:
        """Each role log's size in bytes now (the roles write ``NAME.log`` into the pair's folder)."""
        return {p.name: p.stat().st_size for p in self.workdir.glob("*.log") if p.name != "cell.log" and p.is_file()}

    def _copy_logs(self, since: dict[str, int], workdir: Path, shift) -> None:
        """Into ``workdir``, under each role log's own name, what the roles wrote while one
        program ran (from ``since``'s sizes), with its rooms moved back (``shift``): the cell
        folder holds its role logs as an isolated cell's does (the cell page and the judge's
        readers look there)."""
        if workdir.resolve() == self.workdir.resolve():
            return
        for name in self._log_sizes():
            with open(self.workdir / name, "rb") as src:
                src.seek(since.get(name, 0))
                text = src.read()
            with nofollow.open_write(workdir / name) as out:
                out.write(shift.back(text) if shift else text)

    def _start(self, d, step: s.Step, key: str, reused: bool) -> None:
        """Step 0: start the roles (first program), or record what their start recorded and begin
        the program in every role."""
        d.step_index = 0
        d.record(Event.INFO, Op.STEP, None, args={"step": type(step).__name__})
        if not reused:
            first = len(d.history.events)
            d.execute(step)
            self.start_key, self.start_events = key, d.history.events[first:]
            self.handles = dict(d.handles)
            return
        skip = ("seq", "t", "wall", "step", "op", "role", "type")
        for event in self.start_events:
            d.record(event["type"], event["op"], event["role"], **{k: v for k, v in event.items() if k not in skip})
        for name in d.clients:
            d.record(Event.INFO, "begin-program", name, value=d.clients[name].call("begin_program", 10))

    def _alive(self, d) -> bool:
        return set(d.handles) == set(self.handles) and all(
            d.handles[n] is self.handles[n] and d.handles[n].alive() and not d.clients[n].broken for n in d.handles)

    def close(self) -> None:
        if self.driver is not None:
            self.driver.stop_all()


def serve_pair(impl: str, workdir: Path, base_port: int, network: str, socket_path: str, make_driver) -> None:
    """The pair's loop (in its cell process): answer each request on ``socket_path`` (``{"scenario":
    id or path, "workdir": dir}`` -> :meth:`PairServer.serve`'s reply; ``{"stop": true}`` ends
    it) until a program leaves the pair unkept, then stop the roles.  ``make_driver``: the cell's
    CellDriver class (passed in: harness.drive.cell imports this module, not the other way).  Exits when the parent
    goes (the cell's parent watch)."""
    from harness.drive.contain import kill_descendants

    server = PairServer(impl, workdir, base_port, network, make_driver)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.bind(f"ipc://{socket_path}")
    try:
        while True:
            if not sock.poll(int(REQUEST_WAIT_S * 1000)):
                continue
            request = sock.recv_json()
            if request.get("stop"):
                sock.send_json({"stopped": True})
                break
            try:
                reply = server.serve(request["scenario"], Path(request["workdir"]), request.get("seed", 0),
                                     request.get("full_waits", False), request.get("matrix", False))
            except Exception as exc:  # an unreadable program: this pair ends, the parent is told
                reply = {"kept": False, "why": f"{type(exc).__name__}: {exc}", "error": True}
            sock.send_json(reply)
            if not reply["kept"]:
                break
    finally:
        server.close()
        sock.close(linger=0)
        ctx.term()
        kill_descendants(grace_s=0.2)


class RolePair:
    """The parent's side of one pair: starts its cell process (forked from ``fork_server`` when
    given, else a fresh interpreter), sends it programs, bounds each by its deadline, and ends
    it (its whole process group) when it stops serving, misses a deadline or is closed.

    One thread uses a pair (:meth:`run`, :meth:`close`); any thread may :meth:`kill` it.
    ``stopping``: an event set when the caller is being interrupted; a pair asked to start
    after it is set starts no process and raises KeyboardInterrupt.  Whatever ``__init__``
    raises (also an interrupt), it leaves no process and no folder behind."""

    def __init__(self, impl: str, workdir: Path, target, fork_server=None, stopping: threading.Event | None = None):
        from harness.drive.ports import free_port_block
        from harness.target.role_context import BIND_ENV

        self.impl, self.workdir = impl, workdir
        self.process = None
        self.open, self.busy, self.killed = True, False, False
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.REQ)
        self.socket_dir = ""
        try:
            # a short path of pdconform's own (a unix socket's path is at most 107 bytes), removed by close; its
            # owner file lets an interrupted explorer find the folders it made (forkserver_client.owned_dirs)
            self.socket_dir = tempfile.mkdtemp(prefix=DIR_PREFIX, dir=socket_parent())
            Path(self.socket_dir, OWNER_FILE).write_text(str(os.getpid()))
            workdir.mkdir(parents=True, exist_ok=True)
            socket_path = os.path.join(self.socket_dir, SOCKET_NAME)
            args = ["--impl", impl, "--pair", socket_path, "--workdir", str(workdir),
                    "--base-port", str(free_port_block(host=target.env.get(BIND_ENV)))]
            if fork_server is not None:
                try:  # waited for here, so that one closed by an interrupt is seen before anything starts
                    fork_server.wait_ready()
                except ForkServerError:
                    pass  # start_cell_process says so in the log and starts a fresh interpreter
            if stopping is not None and stopping.is_set():
                raise KeyboardInterrupt("stopping: no pair starts")
            with nofollow.open_write(workdir / "cell.log", append=True) as log:
                self.process = start_cell_process(args, workdir, log, target, fork_server)
            track_process(self.process)  # an interrupted run kills its group too
            self.sock.connect(f"ipc://{socket_path}")
        except BaseException:
            self.kill()
            self.close(grace_s=0)
            raise

    def run(self, scenario_id: str, workdir: Path, deadline_s: float, **request: Any) -> dict:
        """Run one program (scenario id or path) in ``workdir`` within ``deadline_s`` seconds and
        append its :attr:`Op.CELL_EXIT` (as harness.drive.runner does, with the load it ran under
        and the CPU seconds its threads spent, from their run-queue figures); ``request``: what
        else :meth:`PairServer.serve` takes (``seed``, ``full_waits``, ``matrix``); the pair's reply, or
        ``{"kept": False, "why": ...}`` when it missed the deadline, its process ended or it was
        killed (:meth:`kill`: then this returns within :data:`REPLY_POLL_S` seconds); in those
        cases it is closed."""
        self.busy = True
        try:
            return self._run(scenario_id, workdir, deadline_s, request)
        finally:
            self.busy = False

    def _run(self, scenario_id: str, workdir: Path, deadline_s: float, request: dict) -> dict:
        from harness.drive.load import GroupSampler

        shutil.rmtree(workdir, ignore_errors=True)  # an earlier program's cell in the same folder
        workdir.mkdir(parents=True)
        nofollow.open_write(workdir / "history.jsonl", append=True).close()  # CELL_EXIT has a file to go into
        start = time.monotonic()
        reply: dict | None = None
        sampler = GroupSampler(self.process.pid, since_now=True).start()  # this program's share of the pair's threads
        self.sock.send_json({"scenario": scenario_id, "workdir": str(workdir), **request})
        while time.monotonic() - start < deadline_s and not self.killed and self.process.poll() is None:
            if self.sock.poll(int(REPLY_POLL_S * 1000)):
                reply = self.sock.recv_json()
                break
        if reply is not None:
            how = "exited"
        elif self.killed:
            how = "interrupted"  # the judge's word for a cell an interrupted run killed
        else:
            how = "deadline" if self.process.poll() is None else "pair-exited"
        load = sampler.stop()
        if reply is None:
            reply = {"kept": False, "why": {"deadline": "the program passed its deadline",
                                            "interrupted": "the pair was killed (an interrupt)"}.get(
                how, f"the pair's process ended ({self.process.poll()})")}
        exit_ = {"impl": self.impl, "scenario": scenario_id, "seed": request.get("seed", 0), "how": how,
                 "returncode": self.process.poll(), "deadline_s": deadline_s,
                 "duration_s": round(time.monotonic() - start, 3),
                 "cpu_s": round(sum(p["run_s"] for p in load["processes"].values()), 3), "load": load,
                 "log_tail": "", "pair": True}
        if not reply["kept"]:
            self.close()
            exit_["log_tail"] = log_tail(self.workdir)
        append_event(workdir / "history.jsonl", Event.INFO, Op.CELL_EXIT, value=exit_)
        return reply

    def kill(self) -> None:
        """SIGKILL the pair's process group now, waiting for nothing (any thread may call it,
        any number of times: an interrupt).  A :meth:`run` in progress returns within
        :data:`REPLY_POLL_S` seconds and closes the pair; else the thread using it closes it."""
        self.killed = True
        if self.process is not None:
            kill_group(self.process.pid)
            forget_process(self.process)

    def close(self, grace_s: float = STOP_WAIT_S) -> None:
        """Stop the pair (asked once and given up to ``grace_s`` seconds twice: to answer, then to
        exit; 0 or a killed pair: not asked), kill its process group and remove its socket's
        folder.  Only the thread that uses the pair may call it; a second call does nothing."""
        if not self.open:
            return
        self.open = False
        try:
            if grace_s > 0 and not self.killed and self.process is not None and self.process.poll() is None:
                self.sock.send_json({"stop": True}, flags=zmq.NOBLOCK)
                end = time.monotonic() + grace_s
                while not self.killed and time.monotonic() < end and self.process.poll() is None:  # a kill ends it
                    if self.sock.poll(int(REPLY_POLL_S * 1000)):
                        self.sock.recv_json()
                        self.process.wait(timeout=grace_s)
                        break
        except (zmq.ZMQError, subprocess.TimeoutExpired):
            pass
        finally:
            if self.process is not None and not self.killed:  # kill() did it: its group id may be reused by now
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                forget_process(self.process)
            self.sock.close(linger=0)
            self.ctx.term()
            if self.socket_dir:
                shutil.rmtree(self.socket_dir, ignore_errors=True)


__all__ = ["PairServer", "RolePair", "serve_pair", "kept", "held_writes", "retires_pair", "TRUSTED_STEPS", "MATRIX_RETIRING",
           "DIR_PREFIX"]
