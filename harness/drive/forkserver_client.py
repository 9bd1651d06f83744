"""The client side of the fork server (harness.drive.forkserver): start one, fork through it.

:class:`ForkServer` starts and owns a fork server process; :class:`OwnForkServer` one forked
from it for one implementation's own cells; :class:`ForkServerClient` sends either
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

FORK_SERVER_ENV = "PDCONFORM_FORK_SERVER"  # set in a forked cell: the socket its launcher forks roles through
READY_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 10.0
# a fork waits behind every other queued fork (a busy run's TP x 4 cells start 8 roles each at
# once, each fork of the sglang server some 35 ms of its time): bounded by the role start bound
FORK_TIMEOUT_S = 60.0
POLL_S = 0.05
WAIT_SLICE_S = 30.0  # the longest one wait request is held by the fork server (seconds)


DIR_PREFIX = "pdconform-forkserver-"  # the temporary folder of each fork server (its socket, its ready file)
OWNER_FILE = "owner.pid"  # in that folder: the pid of the process that started the fork server


SOCKET_PARENT_MAX = 60  # characters: the folder, our name (~31) and fork_server.sock within a unix socket's 107


def socket_parent() -> str:
    """Where pdconform makes the temporary folders that hold unix sockets (a fork server's, a
    role pair's): the temporary folder (TMPDIR) when its path is short enough for a socket
    path, else /tmp.  Always the same for a process, so its folders are found again."""
    import tempfile

    folder = tempfile.gettempdir()
    return folder if len(folder) <= SOCKET_PARENT_MAX else "/tmp"


def remove_stale_dirs() -> list[Path]:
    """Remove the temporary folders of fork servers whose starting process is gone (a run
    that was SIGKILLed could not remove its own); only folders with our name and owner file.
    The removed paths."""
    import shutil
    import tempfile

    removed = []
    for folder in Path(socket_parent()).glob(DIR_PREFIX + "*"):
        try:
            owner = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being made
        if folder.is_symlink() or _exists(owner):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def owned_dirs(prefix: str = DIR_PREFIX) -> set[Path]:
    """The temporary folders named ``prefix``* whose owner file names this process (a fork
    server's, or another folder pdconform writes one into: harness.drive.pair); an interrupted
    caller removes those it made, whatever was interrupted before it could record them."""
    import tempfile

    mine = set()
    for folder in Path(socket_parent()).glob(prefix + "*"):
        try:
            if not folder.is_symlink() and int((folder / OWNER_FILE).read_text()) == os.getpid():
                mine.add(folder)
        except (OSError, ValueError):
            continue  # not ours, or still being made
    return mine


class ForkServerError(RuntimeError):
    """The fork server could not be started, or did not answer."""


class ForkServerClient:
    """Talks to a fork server: one connection per request, so it is safe across fork and threads."""

    def __init__(self, path: str):
        self.path = path

    def call(self, request: dict, timeout_s: float = CALL_TIMEOUT_S) -> dict:
        """Send ``request``; return the reply.  ForkServerError when unreachable, silent or refusing."""
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
            raise ForkServerError(f"fork server at {self.path} did not answer {request.get('op')}: {exc}") from exc
        try:
            reply = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ForkServerError(f"fork server at {self.path} answered {request.get('op')} with {data[:200]!r}") from exc
        if not reply.get("ok"):
            raise ForkServerError(f"fork server refused {request.get('op')}: {reply.get('error')}")
        return reply

    def fork(self, kind: str, argv: list[str], log: str | os.PathLike, env: dict[str, str] | None = None,
             pgid: int | None = None, cwd: str | os.PathLike | None = None,
             netns: int | None = None) -> "ForkedProcess":
        """Fork a ``kind`` ("cell" or "role") process running ``main(argv)`` with stdout/stderr to ``log``.

        ``pgid``: the process group to join (a role joins its cell's); None: a new group.
        ``netns``: a process whose network namespace the child joins first (a role joins its cell's).
        """
        if kind not in ("cell", "role"):
            raise ValueError(f"kind must be 'cell' or 'role', got {kind!r}")
        reply = self.call({"op": "fork", "kind": kind, "argv": list(argv), "log": str(log), "env": env or {},
                           "pgid": pgid, "cwd": str(cwd or ROOT), "netns": netns}, timeout_s=FORK_TIMEOUT_S)
        return ForkedProcess(self, reply["pid"])


class ForkedProcess:
    """A process the fork server forked, with the parts of ``subprocess.Popen`` the harness uses."""

    def __init__(self, client: ForkServerClient, pid: int):
        self.client = client
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            code = self.client.call({"op": "status", "pid": self.pid})["returncode"]
        except ForkServerError:  # the fork server is gone: it took its children along
            code = _orphan_returncode(self.pid)
        if code == "unknown":
            code = -signal.SIGKILL
        self.returncode = code
        return code

    def wait(self, timeout: float | None = None) -> int:
        """The return code once the process exits; subprocess.TimeoutExpired after ``timeout``
        seconds.  The fork server holds the request until then (one idle connection, no polling)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = WAIT_SLICE_S if deadline is None else deadline - time.monotonic()
            if left <= 0 and self.poll() is None:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            if self.returncode is not None:  # found exited by poll() at the deadline: no wait with no time left
                break
            slice_s = min(left, WAIT_SLICE_S)
            try:
                code = self.client.call({"op": "wait", "pid": self.pid, "timeout_s": slice_s},
                                        timeout_s=slice_s + CALL_TIMEOUT_S)["returncode"]
            except ForkServerError:
                self.poll()  # gone with the fork server, or the server did not answer: the orphan path
                if self.returncode is None:
                    time.sleep(POLL_S)
                continue
            if code is not None:
                self.returncode = -signal.SIGKILL if code == "unknown" else code
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
        once all of them have exited (waits up to ``timeout_s``); None when the fork server cannot
        say (it is gone, or some are still running at the deadline)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = self.client.call({"op": "group_cpu", "pgid": self.pid})
            except ForkServerError:
                return None
            if not reply["running"]:
                return reply["cpu_s"]
            if time.monotonic() > deadline:
                return None
            time.sleep(POLL_S)


def _orphan_returncode(pid: int) -> int | None:
    """The return code of ``pid`` once its fork server is gone: the runner is a subreaper, so
    the orphan is its child now and is reaped here (a zombie waits for no one); None while
    it runs; -SIGKILL when it is gone and not ours to reap."""
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None if _exists(pid) else -signal.SIGKILL
    if reaped == 0:
        return None
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ForkServer:
    """Starts and owns one fork server process (a context manager); ``client`` forks through it.

    ``python``/``env``: the interpreter and environment of the sglang target; ``impls``:
    the implementations whose imports to preload (their ``Implementation.preload``); its log is
    ``log_dir/log_name``.  With ``wait`` (default) the constructor returns once the fork server
    is ready; without, it returns at once and :meth:`wait_ready` waits (so that a run can
    start the cells of one fork server while another still imports).  ForkServerError when it is
    not ready within ``ready_timeout_s`` seconds of its start, or exits while importing.
    """

    def __init__(self, python: str = sys.executable, env: dict[str, str] | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S, log_dir: str | os.PathLike | None = None,
                 impls: list[str] | tuple[str, ...] = (), wait: bool = True, log_name: str = "forkserver.log"):
        import tempfile
        import threading

        remove_stale_dirs()
        self.process: subprocess.Popen | None = None
        self._log = None
        self._closed = False  # set by close: a wait_ready in another thread gives up at once
        self._dir = tempfile.mkdtemp(prefix=DIR_PREFIX, dir=socket_parent())
        try:  # whatever stops the start (also an interrupt), nothing may stay behind
            Path(self._dir, OWNER_FILE).write_text(str(os.getpid()))
            self.socket_path = os.path.join(self._dir, "fork_server.sock")
            self._ready = Path(self._dir) / "ready.json"
            self.log_path = Path(log_dir or self._dir) / log_name
            self._log = open(self.log_path, "wb")
            self._deadline = time.monotonic() + ready_timeout_s
            self._timeout_s = ready_timeout_s
            self._lock = threading.Lock()
            self._error: ForkServerError | None = None
            self.client: ForkServerClient | None = None
            self.info: dict[str, Any] = {}
            self.process = subprocess.Popen(
                [python, "-m", "harness.drive.forkserver", "--socket", self.socket_path, "--ready-file",
                 str(self._ready), "--preload", ",".join(impls)],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env, process_group=0,
                cwd=str(ROOT))
            if wait:
                self.wait_ready()
        except BaseException:
            self.close()
            raise

    def ready_now(self) -> bool:
        """Whether the fork server has finished importing (never blocks)."""
        return self.client is not None or self._ready.exists()

    def wait_ready(self) -> "ForkServerClient":
        """Block until the fork server is ready (thread-safe; at once when it already is); its client.

        ForkServerError when it exited while importing or was not ready by its deadline (the
        same error for every later call)."""
        with self._lock:
            if self.client is not None:
                return self.client
            if self._error is not None:
                raise self._error
            while not self._ready.exists():
                if self._closed:  # an interrupt closed it while this thread waited
                    raise ForkServerError(f"fork server closed while importing (log: {self.log_path})")
                if self.process.poll() is not None:
                    self._error = ForkServerError(f"fork server exited with code {self.process.returncode} while "
                                              f"importing (log: {self.log_path})")
                    raise self._error
                if time.monotonic() > self._deadline:
                    self._error = ForkServerError(f"fork server not ready within {self._timeout_s:.0f} s "
                                              f"(log: {self.log_path})")
                    raise self._error
                time.sleep(POLL_S)
            self.info = json.loads(self._ready.read_text())
            self.client = ForkServerClient(self.socket_path)
            return self.client

    def close(self) -> None:
        """Stop the fork server (its group; waits at most 10 s for it to exit) and remove its
        socket's folder; a thread waiting in :meth:`wait_ready` gets ForkServerError at once.
        Safe to call more than once, and on a start that failed half-way."""
        first, self._closed = not self._closed, True
        if self.process is not None and first:  # once: a reaped leader's group id may be another's by now
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self._log is not None:
            self._log.close()
        import shutil

        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class OwnForkServer:
    """A fork server of one implementation's own, forked from ``base`` (a :class:`ForkServer`
    that preloaded it) once ``base`` is ready; there it runs the implementation's
    ``own_fork_server`` hook (harness.implementations) and serves that implementation's
    cells.  The same surface as :class:`ForkServer`: ``socket_path``, :meth:`ready_now`,
    :meth:`wait_ready` (ForkServerError when ``base`` failed, or the child exited or was
    not ready within ``ready_timeout_s`` seconds of the request), :meth:`close`."""

    def __init__(self, base: ForkServer, impl: str, log_dir: str | os.PathLike | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S, log_name: str | None = None):
        import tempfile
        import threading

        self.base, self.impl, self._timeout_s = base, impl, ready_timeout_s
        self.pid: int | None = None
        self._closed = False  # set by close: a wait_ready in another thread gives up at once
        self._dir = tempfile.mkdtemp(prefix=DIR_PREFIX, dir=socket_parent())
        try:
            Path(self._dir, OWNER_FILE).write_text(str(os.getpid()))
        except BaseException:  # also an interrupt: the folder is not left behind
            self.close()
            raise
        self.socket_path = os.path.join(self._dir, "fork_server.sock")
        self._ready = Path(self._dir) / "ready.json"
        self.log_path = Path(log_dir or self._dir) / (log_name or f"forkserver-{impl}.log")
        self._lock = threading.Lock()
        self._error: ForkServerError | None = None
        self.client: ForkServerClient | None = None
        self.info: dict[str, Any] = {}

    def ready_now(self) -> bool:
        """Whether a cell could start on it at once (never blocks): it serves, or ``base`` is
        ready to fork it (which takes a fraction of a second)."""
        return self.client is not None or self.base.ready_now()

    def wait_ready(self) -> ForkServerClient:
        """Ask ``base`` for it (once; waits while ``base`` imports), then wait for its ready
        file; its client (thread-safe; the same error for every later call)."""
        with self._lock:
            if self.client is not None:
                return self.client
            if self._error is not None:
                raise self._error
            try:
                self.client = self._start()
            except ForkServerError as exc:
                self._error = exc
                raise
            return self.client

    def _start(self) -> ForkServerClient:
        base = self.base.wait_ready()
        if self.pid is None:
            self.pid = base.call({"op": "server", "impl": self.impl, "socket": self.socket_path,
                                  "ready_file": str(self._ready), "log": str(self.log_path)})["pid"]
        deadline = time.monotonic() + self._timeout_s
        while not self._ready.exists():
            if self._closed:  # an interrupt closed it while this thread waited
                raise ForkServerError(f"the {self.impl} fork server was closed while loading its engine")
            if base.call({"op": "status", "pid": self.pid})["returncode"] is not None:
                raise ForkServerError(f"the {self.impl} fork server exited while loading its engine (log: {self.log_path})")
            if time.monotonic() > deadline:
                raise ForkServerError(f"the {self.impl} fork server was not ready within {self._timeout_s:.0f} s "
                                      f"(log: {self.log_path})")
            time.sleep(POLL_S)
        self.info = json.loads(self._ready.read_text())
        return ForkServerClient(self.socket_path)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop it (its cells notice it gone and end), wait up to ``timeout_s`` seconds until it
        has (base, its parent, reaps it), and remove its socket's folder; a thread waiting in
        :meth:`wait_ready` gets ForkServerError within a poll.  Safe to call more than once."""
        first, self._closed = not self._closed, True
        if self.pid is not None and first:  # once: a reaped pid may be another process's by now
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout_s
            while _running(self.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        import shutil

        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "OwnForkServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
