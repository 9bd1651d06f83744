"""Starting role processes, and talking to them.

The cell driver never assumes a role is its own child: it asks a
:class:`Launcher` for a :class:`RoleHandle`, talks to it through
:class:`harness.drive.role_client.RoleClient` over the handle's ZMQ endpoint, and applies process faults
through the handle (``signal``: SIGKILL, SIGSTOP, SIGCONT).  :class:`LocalLauncher`
starts roles as local processes; harness.drive.remote's RemoteLauncher and PlacedLauncher
implement the same two classes for roles on other hosts (through each host's agent).

Every wait here is bounded; on timeout the caller gets :class:`RoleTimeout`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from harness import ROOT, nofollow
from harness.drive.contain import NETNS_PID_ENV
from harness.drive.errors import RoleError, RoleTimeout
from harness.drive.forkserver_client import FORK_SERVER_ENV, ForkServerClient
from harness.target.role_context import bind_address

READY_POLL_S = 0.5  # how often a starting role is asked whether it died (seconds); its ready file is read every 20 ms


@dataclass(frozen=True)
class RoleSpec:
    """What to run: implementation ``impl`` in role ``role`` (prefill/decode).

    ``env`` is added to the process environment; ``log_path`` receives the
    role's stdout and stderr.
    """

    name: str
    impl: str
    role: str
    env: dict[str, str] = field(default_factory=dict)
    log_path: str | None = None


class RoleHandle(ABC):
    """A started role, wherever it runs."""

    spec: RoleSpec

    @abstractmethod
    def wait_ready(self, timeout_s: float) -> str:
        """Block until the role serves commands; return its endpoint.
        Raises RoleTimeout or RoleError (with the log tail) when it cannot."""

    @abstractmethod
    def alive(self) -> bool:
        """Whether the role's process is still running."""

    @property
    def pid(self) -> int | None:
        """The role process's pid on this machine (None: it runs on another host)."""
        return None

    @abstractmethod
    def signal(self, signum: int) -> None:
        """Send a signal: SIGKILL (kill), SIGSTOP (freeze), SIGCONT (thaw)."""

    @abstractmethod
    def exit_description(self) -> str:
        """How the role ended ("exit code 3", "killed by SIGKILL"), or "running"."""

    @abstractmethod
    def stop(self, timeout_s: float) -> None:
        """Make sure the role is gone: ask, then kill.  Bounded by ``timeout_s``."""

    @abstractmethod
    def log_tail(self, lines: int = 30) -> str:
        """The last lines the role printed (for error reasons)."""


class Launcher(ABC):
    """Starts role processes.  Implementations: :class:`LocalLauncher`, harness.drive.remote's
    RemoteLauncher and PlacedLauncher."""

    @abstractmethod
    def start(self, spec: RoleSpec) -> RoleHandle:
        """Start ``spec`` without waiting for it to be ready."""

    def address_of(self, name: str) -> str:
        """The address role process ``name`` listens on and advertises: the run's bind
        address for roles on this machine (a launcher for other hosts says its host's)."""
        return bind_address()


class LocalRoleHandle(RoleHandle):
    def __init__(self, spec: RoleSpec, process: subprocess.Popen, ready_file: Path, log_path: Path):
        self.spec = spec
        self.process = process
        self.ready_file = ready_file
        self.log_path = log_path
        self.endpoint: str | None = None

    def wait_ready(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        next_poll = time.monotonic()
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                self.endpoint = self.ready_file.read_text().split("\n")[0].strip()
                return self.endpoint
            # the ready file is a local stat; whether the role died is a fork server request: less often
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + READY_POLL_S
                if self.process.poll() is not None:
                    raise RoleError(
                        f"{self.spec.name} exited with code {self.process.returncode} before it was ready:\n"
                        + self.log_tail()
                    )
            time.sleep(0.02)
        raise RoleTimeout(f"{self.spec.name} was not ready within {timeout_s:.0f} s:\n" + self.log_tail())

    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def exit_description(self) -> str:
        code = self.process.poll()
        if code is None:
            return "running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def signal(self, signum: int) -> None:
        if self.alive():
            self.process.send_signal(signum)

    def stop(self, timeout_s: float = 5.0) -> None:
        if not self.alive():
            return
        try:  # a role asked to shut down exits by itself within moments
            self.process.wait(timeout=min(1.0, timeout_s))
            return
        except subprocess.TimeoutExpired:
            pass
        self.process.send_signal(signal.SIGCONT)  # a frozen role cannot exit
        self.process.kill()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class LocalLauncher(Launcher):
    """Runs each role as a local process in this cell's process group.

    With ``PDCONFORM_ZYGOTE`` set (a cell forked by harness.drive.forkserver), roles are forked
    by the fork server, which has sglang and the engines imported already, and join this
    process group; otherwise each is a fresh ``python -m harness.drive.role_host`` child.
    ``workdir`` receives one ``<role name>.log`` per role.
    """

    def __init__(self, workdir: str | os.PathLike):
        self.workdir = Path(workdir)
        os.close(nofollow.open_dir(self.workdir, create=True))  # no link followed on the way

    def start(self, spec: RoleSpec) -> LocalRoleHandle:
        log_path = Path(spec.log_path) if spec.log_path else self.workdir / f"{spec.name}.log"
        ready_file = self.workdir / f"{spec.name}.endpoint"
        ready_file.unlink(missing_ok=True)
        args = ["--impl", spec.impl, "--role", spec.role,
                "--ready-file", str(ready_file), "--parent-pid", str(os.getpid())]
        fork_server = os.environ.get(FORK_SERVER_ENV)
        if fork_server:
            nofollow.open_write(log_path).close()  # made empty; the forked role appends to it
            netns = os.environ.get(NETNS_PID_ENV)  # the cell's private network, when it has one
            process = ForkServerClient(fork_server).fork("role", args, log_path, env=dict(spec.env), pgid=os.getpgid(0),
                                                         netns=int(netns) if netns else None)
            return LocalRoleHandle(spec, process, ready_file, log_path)
        env = dict(os.environ)
        env.update(spec.env)
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [sys.executable, "-m", "harness.drive.role_host", *args]
        with nofollow.open_write(log_path) as log:
            process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=str(ROOT),
            )
        return LocalRoleHandle(spec, process, ready_file, log_path)
