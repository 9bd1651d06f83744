"""The processes of the engine transport contract (harness.bench.contract): which engines have
contract sides, the child that serves them, and :class:`ContractSession`, both sides of one
engine connected (the engine benchmark's children and setup, harness.bench.engines, reused).

An engine's contract sides are ``SIDES`` of its package's ``contract`` module (a
:class:`harness.role.engine_bench.BenchSides` whose classes mix in
harness.bench.contract_sides), found through the implementation registry: the
``engine_contract`` tool of its entry, else the module next to its adapter.

Also here: :class:`StarvedDestination`, which makes the destination's engine threads lose every
contest for a core (question 2's adversarial phase) and undoes it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import subprocess
import sys

from harness.bench import engines as bench
from harness.bench.contract_sides import stamp
from harness.drive.contain import isolation_available
from harness.implementations import implementation, registered


# --------------------------------------------------------------------------- engines and children


def _hook(engine: str) -> str:
    impl = implementation(engine)
    if "engine_contract" in impl.tools:
        return impl.tools["engine_contract"]
    package = impl.adapter.split(":", 1)[0].rsplit(".", 1)[0]
    return f"{package}.contract:SIDES"


def engines() -> list[str]:
    """The registered implementations that have contract sides (an ``engine_contract`` tool, or
    a ``contract`` module next to their adapter)."""
    found = []
    for name, impl in registered().items():
        if impl.test_only or impl.sglang_range is None and "engine_contract" not in impl.tools:
            continue  # the reference and the self-test have no engine
        try:
            if importlib.util.find_spec(_hook(name).split(":", 1)[0]) is not None:
                found.append(name)
        except ImportError:
            continue
    return found


def contract_sides(engine: str):
    """The contract's BenchSides of ``engine`` (imports its module: call it in the child)."""
    module, attribute = _hook(engine).split(":", 1)
    return getattr(importlib.import_module(module), attribute)


def child_main(engine: str, role: str, fd: int) -> None:
    """A contract child: the engine benchmark's own serving loop (network, init, commands, stop,
    ``os._exit``), serving the contract's sides instead of the benchmark's."""
    bench.sides = contract_sides  # this process serves nothing else
    bench._child_main(engine, role, fd)


class _Child(bench._Child):
    """The benchmark's child (replies, bounded waits, kill, close), started on :func:`child_main`."""

    ENTRY = ("harness.bench.contract_session", "child_main")


class ContractSession:
    """Both sides of one engine, connected, after one verified warm-up transfer; the destination
    can be killed (question 5) and started again (:meth:`respawn_destination`)."""

    def __init__(self, engine: str, total_bytes: int, block_bytes: int, timeout_s: float):
        self.engine, self.total_bytes, self.block_bytes, self.timeout_s = engine, total_bytes, block_bytes, timeout_s
        self.blocks = total_bytes // block_bytes
        self.children: list[_Child] = []
        self.isolated = isolation_available() is None
        try:
            self.dst = self._spawn("destination")
            self.src = self._spawn("source")
            if self.isolated:  # both sides in one private loopback-only network
                self.dst.call("network", bench.STARTUP_TIMEOUT_S, join=None)
                self.src.call("network", bench.STARTUP_TIMEOUT_S, join=self.dst.proc.pid)
            for child in (self.dst, self.src):
                child.send("init", total_bytes=total_bytes, block_bytes=block_bytes)
            self.peer = self.dst.reply("init", bench.STARTUP_TIMEOUT_S)
            self.expected_crc = self.src.reply("init", bench.STARTUP_TIMEOUT_S)["expected_crc"]
            self.src.call("connect", timeout_s, peer=self.peer)
            self.sentinels = self.src.call("expected_sentinels", timeout_s)
            self.contiguous_crc = self.src.call("contiguous_crc", timeout_s)
            self.facts = self.src.call("contract_facts", timeout_s)
            self.respawns = 0
            self.transfer(self.src.call("submit_apis", timeout_s)[0])  # warm-up: opens the connections
        except BaseException:
            self.close()
            raise

    def _spawn(self, role: str) -> _Child:
        child = _Child(self.engine, role)
        self.children.append(child)
        return child

    def transfer(self, api: str) -> dict:
        """One verified transfer through ``api`` (the source's ``time_submit``)."""
        self.dst.call("clear", self.timeout_s)
        result = self.src.call("time_submit", self.timeout_s + 5, api=api, timeout_s=self.timeout_s)
        result["verified"] = self.verified(result["layout"])
        if not result["verified"]:
            raise bench.EngineBenchError(f"{self.engine}: {api} did not deliver the expected bytes: {result}")
        return result

    def verified(self, layout: str) -> bool:
        """Whether the destination holds the expected image of a ``permuted`` or ``contiguous`` copy."""
        crc = self.dst.call("checksum", self.timeout_s)
        return crc == (self.expected_crc if layout == "permuted" else self.contiguous_crc)

    def dst_alive(self) -> bool:
        return self.dst.proc.poll() is None

    def kill_destination(self) -> tuple[float, float]:
        """SIGKILL the destination; returns the :func:`stamp` just before the signal and the one
        when the process was gone (reaped: its sockets closed)."""
        at = stamp()
        os.kill(self.dst.proc.pid, signal.SIGKILL)
        self.dst.proc.wait(timeout=bench.STOP_TIMEOUT_S)
        return at, stamp()

    def respawn_destination(self) -> None:
        """A fresh destination (in the source's network), connected to the source."""
        self.dst.close()
        self.children.remove(self.dst)
        self.dst = self._spawn("destination")
        if self.isolated:
            self.dst.call("network", bench.STARTUP_TIMEOUT_S, join=self.src.proc.pid)
        self.peer = self.dst.call("init", bench.STARTUP_TIMEOUT_S, total_bytes=self.total_bytes,
                                  block_bytes=self.block_bytes)
        self.src.call("connect", self.timeout_s, peer=self.peer)
        self.respawns += 1

    def close(self) -> None:
        for child in reversed(self.children):
            child.close()
        self.children = []


def _pin(pid: int, tid_cores, policy) -> None:
    for tid in (int(t) for t in os.listdir(f"/proc/{pid}/task")):
        try:
            os.sched_setaffinity(tid, tid_cores(tid))
            os.sched_setscheduler(tid, policy(tid), os.sched_param(0))
        except (ProcessLookupError, PermissionError):
            continue  # a thread that ended meanwhile


class StarvedDestination:
    """While in this context, the destination's engine threads (every thread of the destination
    but its main one, which answers the parent and checks the buffer) run on one core at
    ``SCHED_IDLE`` beside a busy loop, so they get a core only when nothing else wants it; the
    destination's main thread and the source run on another core.  On exit every thread of
    both is back at ``SCHED_OTHER`` on every core this process may use, and the busy loop is
    killed.  ``reason`` is None when it could be set up, else why not (fewer than 2 cores)."""

    def __init__(self, session: "ContractSession"):
        self.session, self.hog = session, None
        self.cores = sorted(os.sched_getaffinity(0))
        self.reason = None if len(self.cores) >= 2 else f"needs 2 cores, this process may use {len(self.cores)}"

    def __enter__(self) -> "StarvedDestination":
        if self.reason is None:
            check, engine = {self.cores[0]}, {self.cores[1]}
            dst = self.session.dst.proc.pid
            try:
                self.hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
                os.sched_setaffinity(self.hog.pid, engine)
                _pin(self.session.src.proc.pid, lambda tid: check, lambda tid: os.SCHED_OTHER)
                _pin(dst, lambda tid: check if tid == dst else engine,
                     lambda tid: os.SCHED_OTHER if tid == dst else os.SCHED_IDLE)
            except BaseException:
                self.__exit__()
                raise
        return self

    def __exit__(self, *exc) -> None:
        if self.hog is not None:
            self.hog.kill()
            self.hog.wait(timeout=bench.STOP_TIMEOUT_S)
        everywhere = set(self.cores)
        for child in (self.session.src, self.session.dst):
            if child.proc.poll() is None:
                _pin(child.proc.pid, lambda tid: everywhere, lambda tid: os.SCHED_OTHER)
