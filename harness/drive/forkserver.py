"""A fork server: import sglang and the engines once, fork a fresh process per cell and per role.

Importing sglang's disaggregation modules costs seconds per process, and every cell
starts two to four role processes.  The zygote is one long-lived process per run
(and per sglang target) that imports them once, while it is still single-threaded,
then forks:

* a **cell** process (``harness.drive.cell``) in a new process group of its own, and
* the cell's **role** processes (``harness.drive.role_host``), each joining its cell's
  process group, so that killing the group still removes the cell and every role.

Isolation is the same as with a fresh interpreter per process: the zygote never
creates a thread (beyond the one torch's import starts), a ZMQ context or an engine;
each child starts from that clean state and leaves with ``os._exit``.  Engines whose
import starts native threads (``mooncake.engine``) are not preloaded; the child
imports them (tens of milliseconds).

Protocol: a UNIX stream socket; one JSON line per request, one JSON line per reply
(see :class:`ZygoteClient`).  The zygote reaps its children and keeps their exit
status until asked.  It exits when its parent (the runner) goes away.

Started with ``python -m harness.drive.forkserver --socket PATH`` by :class:`Zygote`, with
the target's interpreter and environment (harness.target.sglang).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any
from harness import ROOT

ZYGOTE_ENV = "PDCONFORM_ZYGOTE"  # set in a forked cell: the socket its launcher forks roles through
READY_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 10.0
POLL_S = 0.05


class ZygoteError(RuntimeError):
    """The zygote could not be started, or did not answer."""


# --------------------------------------------------------------------------- server


# What each implementation's roles import, preloaded once (harness.implementations names).
PRELOAD = {
    "reference": ["torch", "zmq", "backends.reference.adapter"],
    "mooncake": ["torch", "zmq", "sglang.srt.disaggregation.common.conn", "sglang.srt.disaggregation.mooncake.conn",
                 "backends.mooncake.adapter"],
    "nixl": ["torch", "zmq", "sglang.srt.disaggregation.common.conn", "sglang.srt.disaggregation.nixl.conn",
             "backends.nixl.adapter"],
    "mori": ["torch", "zmq", "sglang.srt.disaggregation.common.conn", "backends.mori.adapter"],
}


def preload(impls: list[str]) -> list[str]:
    """Import what the roles of ``impls`` need (sglang's disaggregation modules, torch, the adapters).

    Returns the imports that failed, as "module: error" (their roles then import them
    themselves and fail there, with the error in their log).  Never imports
    ``mooncake.engine``: its import starts native threads, which a fork would not carry over.
    """
    failed: list[str] = []
    import harness.drive.cell  # noqa: F401
    import harness.drive.role_host  # noqa: F401
    from harness.spec.scenario import all_scenarios

    all_scenarios(include_test_only=True)  # every scenario module: a cell looks its scenario up first
    import harness.spec.frames  # noqa: F401 - hypothesis, for the cells that sample layouts or frames
    import harness.spec.layouts  # noqa: F401

    modules = list(dict.fromkeys(m for impl in impls for m in PRELOAD.get(impl, [])))
    if any(m.startswith("sglang") for m in modules):
        from harness.target import gpu_import_shims

        gpu_import_shims.install()
    for name in modules:
        try:
            __import__(name)
        except Exception as exc:  # noqa: BLE001 - reported, the role will fail with it itself
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    if "mori" in impls:
        try:  # Mori's conn module imports whichever mori the adapter would pick: the real one or the stand-in
            from backends.mori.adapter import STANDIN_PATH, real_mori_error

            if real_mori_error():
                sys.path.insert(0, str(STANDIN_PATH))
                __import__("sglang.srt.disaggregation.mori.conn")
        except Exception as exc:  # noqa: BLE001
            failed.append(f"sglang.srt.disaggregation.mori.conn: {type(exc).__name__}: {exc}")
    return failed


def _child(request: dict, listener: socket.socket, clients: list[socket.socket]) -> None:
    """In the forked child: become the requested cell or role; never returns."""
    code = 70
    try:
        listener.close()
        for c in clients:
            c.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setpgid(0, request.get("pgid") or 0)
        os.chdir(request["cwd"])
        os.environ.update(request.get("env") or {})
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        if request["kind"] == "cell":
            from harness.drive.cell import main
        else:
            from harness.drive.role_host import main
        code = main(request["argv"]) or 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the log says what went wrong
        traceback.print_exc()
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(listener: socket.socket, parent_pid: int) -> None:
    """Answer fork/status requests on the bound, listening UNIX socket ``listener``
    until the parent is gone."""
    clients: list[socket.socket] = []
    buffers: dict[socket.socket, bytes] = {}
    exited: dict[int, int] = {}  # pid -> returncode (negative: killed by that signal)
    children: set[int] = set()
    group_of: dict[int, int] = {}  # pid -> its process group (a cell's pid for the cell and its roles)
    group_cpu: dict[int, float] = {}  # process group -> CPU seconds (user + system) of its reaped processes

    def reap() -> None:
        while children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            exited[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            group = group_of.pop(pid, pid)
            group_cpu[group] = group_cpu.get(group, 0.0) + usage.ru_utime + usage.ru_stime

    def answer(request: dict) -> dict:
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}
        if op == "fork":
            pid = os.fork()
            if pid == 0:
                _child(request, listener, clients)
            children.add(pid)
            exited.pop(pid, None)  # a reused pid: an older child's exit status is not this one's
            group = request.get("pgid") or pid
            group_of[pid] = group
            if group == pid:
                group_cpu.pop(pid, None)  # a reused pid: an older group's CPU is not this one's
            return {"ok": True, "pid": pid}
        if op == "status":
            reap()
            pid = int(request["pid"])
            if pid in exited:
                return {"ok": True, "returncode": exited[pid]}
            return {"ok": True, "returncode": None if pid in children else "unknown"}
        if op == "group_cpu":  # CPU seconds of a process group's exited members (a cell and its roles)
            reap()
            group = int(request["pgid"])
            running = sum(1 for pid in children if group_of.get(pid) == group)
            return {"ok": True, "cpu_s": round(group_cpu.get(group, 0.0), 3), "running": running}
        return {"ok": False, "error": f"unknown op {op!r}"}

    while True:
        if os.getppid() != parent_pid:
            for pid in list(children):  # the runner is gone: so are its cells
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return
        reap()
        readable, _, _ = select.select([listener, *clients], [], [], POLL_S)
        for sock in readable:
            if sock is listener:
                conn, _ = listener.accept()
                clients.append(conn)
                buffers[conn] = b""
                continue
            data = sock.recv(65536)
            if not data:
                clients.remove(sock)
                buffers.pop(sock, None)
                sock.close()
                continue
            buffers[sock] += data
            while b"\n" in buffers[sock]:
                line, buffers[sock] = buffers[sock].split(b"\n", 1)
                try:
                    reply = answer(json.loads(line))
                except Exception as exc:  # noqa: BLE001 - a bad request must not end the zygote
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                sock.sendall(json.dumps(reply).encode() + b"\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.drive.forkserver")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--preload", default="", help="comma-separated implementations whose imports to preload")
    args = parser.parse_args(argv)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)  # before "ready": a path the kernel refuses fails the start, not the first fork
    listener.listen(socket.SOMAXCONN)  # every cell and role of a run may connect at once
    failed = preload([i for i in args.preload.split(",") if i])
    for line in failed:
        print(f"zygote: preload failed: {line}", flush=True)
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    tmp = args.ready_file + ".tmp"
    Path(tmp).write_text(json.dumps({"pid": os.getpid(), "threads": threads, "failed": failed}))
    os.replace(tmp, args.ready_file)
    serve(listener, parent)
    return 0


# --------------------------------------------------------------------------- client


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


if __name__ == "__main__":
    sys.exit(main())
