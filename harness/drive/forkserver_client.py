"""The client side of the fork server (harness.drive.forkserver): start one, fork through it.

:class:`Zygote` starts and owns a fork server process; :class:`ZygoteClient` sends it
requests (one JSON line each way per connection, so it is safe across fork and
threads); :class:`ForkedProcess` is a process it forked, with the parts of
``subprocess.Popen`` the harness uses.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import ROOT

ZYGOTE_ENV = "PDCONFORM_ZYGOTE"  # set in a forked cell: the socket its launcher forks roles through
READY_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 10.0
POLL_S = 0.05


class ZygoteError(RuntimeError):
    """The zygote could not be started, or did not answer."""


class ZygoteClient:
    """Talks to a zygote: one connection per request, so it is safe across fork and threads."""

    def __init__(self, path: str):
        self.path = path

    def call(self, request: dict, timeout_s: float = CALL_TIMEOUT_S) -> dict:
        """Send ``request``; return the reply.  ZygoteError when unreachable, silent or refusing."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout_s)
                sock.connect(self.path)
                sock.sendall(json.dumps(request).encode() + b"\n")
                data = b""
                while not data.endswith(b"\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
        except OSError as exc:
            raise ZygoteError(f"zygote at {self.path} did not answer {request.get('op')}: {exc}") from exc
        try:
            reply = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ZygoteError(f"zygote at {self.path} answered {request.get('op')} with {data[:200]!r}") from exc
        if not reply.get("ok"):
            raise ZygoteError(f"zygote refused {request.get('op')}: {reply.get('error')}")
        return reply

    def fork(self, kind: str, argv: list[str], log: str | os.PathLike, env: dict[str, str] | None = None,
             pgid: int | None = None, cwd: str | os.PathLike | None = None) -> "ForkedProcess":
        """Fork a ``kind`` ("cell" or "role") process running ``main(argv)`` with stdout/stderr to ``log``.

        ``pgid``: the process group to join (a role joins its cell's); None: a new group.
        """
        if kind not in ("cell", "role"):
            raise ValueError(f"kind must be 'cell' or 'role', got {kind!r}")
        reply = self.call({"op": "fork", "kind": kind, "argv": list(argv), "log": str(log), "env": env or {},
                           "pgid": pgid, "cwd": str(cwd or ROOT)})
        return ForkedProcess(self, reply["pid"])


class ForkedProcess:
    """A process the zygote forked, with the parts of ``subprocess.Popen`` the harness uses."""

    def __init__(self, client: ZygoteClient, pid: int):
        self.client = client
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            code = self.client.call({"op": "status", "pid": self.pid})["returncode"]
        except ZygoteError:
            code = None if _exists(self.pid) else -signal.SIGKILL  # zygote gone: it took its children along
        if code == "unknown":
            code = -signal.SIGKILL
        self.returncode = code
        return code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(POLL_S)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def group_cpu_s(self, timeout_s: float = 2.0) -> float | None:
        """CPU seconds (user + system) this process and the others of its process group used,
        once all of them have exited (waits up to ``timeout_s``); None when the zygote cannot
        say (it is gone, or some are still running at the deadline)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = self.client.call({"op": "group_cpu", "pgid": self.pid})
            except ZygoteError:
                return None
            if not reply["running"]:
                return reply["cpu_s"]
            if time.monotonic() > deadline:
                return None
            time.sleep(POLL_S)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Zygote:
    """Starts and owns one zygote process (a context manager); ``client`` forks through it.

    ``python``/``env``: the interpreter and environment of the sglang target; ``impls``:
    the implementations whose imports to preload (:data:`PRELOAD`); its log is
    ``log_dir/log_name``.  With ``wait`` (default) the constructor returns once the zygote
    is ready; without, it returns at once and :meth:`wait_ready` waits (so that a run can
    start the cells of one zygote while another still imports).  ZygoteError when it is
    not ready within ``ready_timeout_s`` seconds of its start, or exits while importing.
    """

    def __init__(self, python: str = sys.executable, env: dict[str, str] | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S, log_dir: str | os.PathLike | None = None,
                 impls: list[str] | tuple[str, ...] = (), wait: bool = True, log_name: str = "zygote.log"):
        import tempfile
        import threading

        self._dir = tempfile.mkdtemp(prefix="pdconform-zygote-")
        self.socket_path = os.path.join(self._dir, "zygote.sock")
        self._ready = Path(self._dir) / "ready.json"
        self.log_path = Path(log_dir or self._dir) / log_name
        self._log = open(self.log_path, "wb")
        self._deadline = time.monotonic() + ready_timeout_s
        self._timeout_s = ready_timeout_s
        self._lock = threading.Lock()
        self._error: ZygoteError | None = None
        self.client: ZygoteClient | None = None
        self.info: dict[str, Any] = {}
        self.process = subprocess.Popen(
            [python, "-m", "harness.drive.forkserver", "--socket", self.socket_path, "--ready-file", str(self._ready),
             "--preload", ",".join(impls)],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env, process_group=0,
            cwd=str(ROOT))
        if wait:
            try:
                self.wait_ready()
            except BaseException:  # also an interrupt while it imports: nothing may stay behind
                self.close()
                raise

    def ready_now(self) -> bool:
        """Whether the zygote has finished importing (never blocks)."""
        return self.client is not None or self._ready.exists()

    def wait_ready(self) -> "ZygoteClient":
        """Block until the zygote is ready (thread-safe; at once when it already is); its client.

        ZygoteError when it exited while importing or was not ready by its deadline (the
        same error for every later call)."""
        with self._lock:
            if self.client is not None:
                return self.client
            if self._error is not None:
                raise self._error
            while not self._ready.exists():
                if self.process.poll() is not None:
                    self._error = ZygoteError(f"zygote exited with code {self.process.returncode} while "
                                              f"importing (log: {self.log_path})")
                    raise self._error
                if time.monotonic() > self._deadline:
                    self._error = ZygoteError(f"zygote not ready within {self._timeout_s:.0f} s "
                                              f"(log: {self.log_path})")
                    raise self._error
                time.sleep(POLL_S)
            self.info = json.loads(self._ready.read_text())
            self.client = ZygoteClient(self.socket_path)
            return self.client

    def close(self) -> None:
        """Stop the zygote (its group) and remove its socket."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()
        import shutil

        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "Zygote":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
