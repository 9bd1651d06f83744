"""A fork server: import sglang and the engines once, fork a fresh process per cell and per role.

Importing sglang's disaggregation modules costs seconds per process, and every cell
starts two to four role processes.  The fork server is one long-lived process per run
(and per sglang target) that imports them once, while it is still single-threaded,
then forks:

* a **cell** process (``harness.drive.cell``) in a new process group of its own, and
* the cell's **role** processes (``harness.drive.role_host``), each joining its cell's
  process group, so that killing the group still removes the cell and every role.

Isolation is the same as with a fresh interpreter per process: the fork server never
creates a thread (beyond the one torch's import starts), a ZMQ context or an engine;
each child starts from that clean state and leaves with ``os._exit``.  Engines whose
import starts native threads (``mooncake.engine``) are not preloaded; the child
imports them (tens of milliseconds).

An implementation whose engine is costly to load and changes the process when it loads
(NIXL: loading its UCX plugin takes 0.4 s of CPU and patches libc's ``mmap`` family) gets
a fork server of its own, forked from this one once it has imported everything: the
engine loads there once (``Implementation.own_fork_server``), and no other
implementation's role inherits it.

Protocol: a UNIX stream socket; one JSON line per request, one JSON line per reply
(see :class:`ForkServerClient`).  The fork server reaps its children and keeps their exit
status until asked.  It exits when its parent (the runner) goes away.

Started with ``python -m harness.drive.forkserver --socket PATH`` by
:class:`harness.drive.forkserver_client.ForkServer`, with the target's interpreter and
environment (harness.target.sglang); the client side of the protocol is there too.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

from harness.drive.contain import become_subreaper, describe, enter_network_of
from harness.drive.contain import children as contain_children

POLL_S = 0.05
_WAKE_FDS: list[int] = []  # the SIGCHLD self-pipe of serve(), closed in each child  # how often the server checks its parent and reaps children (seconds)


def preload(impls: list[str]) -> list[str]:
    """Import what the roles of ``impls`` need: each implementation's ``preload`` modules
    (harness.implementations; sglang's disaggregation modules, torch, the adapter), after
    its ``prepare`` hook; nothing of an implementation whose declared range excludes the
    sglang being driven (its roles import nothing).

    Returns the imports that failed, as "module: error" (their roles then import them
    themselves and fail there, with the error in their log).
    """
    from harness.implementations import implementation
    from harness.target.version import sglang_version

    failed: list[str] = []
    import harness.drive.cell  # noqa: F401
    import harness.drive.role_host  # noqa: F401
    from harness.spec.scenario import all_scenarios

    all_scenarios(include_test_only=True)  # every scenario module: a cell looks its scenario up first
    import harness.spec.frames  # noqa: F401 - hypothesis, for the cells that sample layouts or frames
    import harness.spec.layouts  # noqa: F401
    import harness.role.residue  # noqa: F401 - every role's observe walks its manager with it
    import encodings.idna  # noqa: F401 - requests' first URL in a role (sglang's bootstrap client)

    version = sglang_version()
    chosen = [implementation(name) for name in impls]
    chosen = [impl for impl in chosen if impl.unsupported_sglang(version) is None]
    if any(impl.imports_sglang for impl in chosen):
        from harness.target import gpu_import_shims

        gpu_import_shims.install()
    for impl in chosen:
        try:
            if impl.prepare:
                impl.hook("prepare")()
        except Exception as exc:  # noqa: BLE001 - reported, the role will fail with it itself
            failed.append(f"{impl.prepare}: {type(exc).__name__}: {exc}")
    for name in dict.fromkeys(m for impl in chosen for m in impl.preload):
        try:
            __import__(name)
        except Exception as exc:  # noqa: BLE001 - reported, the role will fail with it itself
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    return failed


def _leave_server(listener: socket.socket, clients: list[socket.socket]) -> None:
    """In a forked child: drop the server's sockets, its SIGCHLD self-pipe and its handlers."""
    listener.close()
    for c in clients:
        c.close()
    signal.set_wakeup_fd(-1)
    for wake in _WAKE_FDS:  # the server's SIGCHLD self-pipe is not the child's
        os.close(wake)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _flush_and_exit(code: int) -> None:
    """Leave a forked child: its output flushed, no atexit handler or thread joined."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _child(request: dict, listener: socket.socket, clients: list[socket.socket]) -> None:
    """In the forked child: become the requested cell or role; never returns."""
    code = 70
    try:
        _leave_server(listener, clients)
        if request.get("netns"):  # a role joins its cell's private network
            enter_network_of(int(request["netns"]))
        os.setpgid(0, request.get("pgid") or 0)
        os.chdir(request["cwd"])
        os.environ.update(request.get("env") or {})
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
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
        _flush_and_exit(code)


class _Children:
    """The processes the server forked: their exit statuses and the CPU seconds of each process group."""

    def __init__(self):
        self.running: set[int] = set()
        self.exited: dict[int, int] = {}  # pid -> returncode (negative: killed by that signal)
        self.group_of: dict[int, int] = {}  # pid -> its process group (a cell's pid for the cell and its roles)
        self.group_cpu: dict[int, float] = {}  # process group -> CPU seconds (user + system) of its reaped processes
        self.ending: set[int] = set()  # adopted orphans sent SIGKILL, not reaped yet

    def reap(self) -> None:
        """Collect every child that has ended (forked ones and adopted orphans), never waiting."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.ending.discard(pid)
            if pid not in self.running:
                continue  # an adopted orphan, ended by end_adopted
            self.running.discard(pid)
            self.exited[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            group = self.group_of.pop(pid, pid)
            self.group_cpu[group] = self.group_cpu.get(group, 0.0) + usage.ru_utime + usage.ru_stime

    def add(self, pid: int, group: int) -> None:
        self.running.add(pid)
        self.exited.pop(pid, None)  # a reused pid: an older child's exit status is not this one's
        self.group_of[pid] = group
        if group == pid:
            self.group_cpu.pop(pid, None)  # a reused pid: an older group's CPU is not this one's

    def end_adopted(self) -> None:
        """Kill every child this server did not fork (reap() collects them): orphans re-parented
        to it (a process a role started in a session of its own, left when the role ended)."""
        for pid in [c for c in contain_children() if c not in self.running and c not in self.ending]:
            print(f"fork server: ended a process a role left behind: {describe(pid)}", flush=True)
            try:
                os.kill(pid, signal.SIGKILL)  # reaped by reap(), without waiting here: the server keeps answering
                self.ending.add(pid)
            except ProcessLookupError:
                pass

    def end_unclaimed(self, pid: int) -> None:
        """Kill the process group of a child whose fork reply never reached its client."""
        print(f"fork server: ended child {pid}: the client that asked for it had gone", flush=True)
        try:
            if self.group_of.get(pid, pid) == pid:  # a cell: its own group, with any role it started
                os.killpg(pid, signal.SIGKILL)
            else:  # a role: the rest of its cell goes on, and fails to reach it
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill_all(self) -> None:
        for pid in list(self.running):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _drop(sock: socket.socket, clients: list[socket.socket], buffers: dict) -> None:
    clients.remove(sock)
    buffers.pop(sock, None)
    sock.close()


def _status(children: _Children, pid: int) -> dict:
    if pid in children.exited:
        return {"ok": True, "returncode": children.exited[pid]}
    return {"ok": True, "returncode": None if pid in children.running else "unknown"}


def _sub_server(request: dict, listener: socket.socket, clients: list[socket.socket]) -> None:
    """In the forked child: become a fork server of one implementation's own (see
    :func:`_answer`'s ``server``): run its ``own_fork_server`` hook, listen on the requested
    socket, say ready, serve until this server is gone; never returns."""
    code = 70
    try:
        parent = os.getppid()
        _leave_server(listener, clients)
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        from harness.implementations import implementation

        impl = implementation(request["impl"])
        impl.apply_role_env()  # what its roles would have set before the engine loads
        own = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        own.bind(request["socket"])
        own.listen(socket.SOMAXCONN)
        impl.hook("own_fork_server")()
        gc.collect()
        gc.freeze()
        collapse_to_huge_pages()
        _say_ready(request["ready_file"], [])
        serve(own, parent)
        code = 0
    except BaseException:  # noqa: BLE001 - the log says what went wrong; the client sees no ready file
        traceback.print_exc()
    finally:
        _flush_and_exit(code)


def _answer(request: dict, children: _Children, listener: socket.socket, clients: list[socket.socket]) -> dict:
    """The reply to one request: ``ping``, ``fork`` (a new cell or role process), ``server``
    (a fork server of one implementation's own, forked from this one: its engine loads
    there, not here, when loading it changes the process for every other implementation's
    roles, e.g. NIXL's UCX patching libc's mmap family), ``status`` (a child's return code;
    ``wait``: the same, held by :func:`serve` while the child runs), ``group_cpu`` (CPU
    seconds of a process group's exited members)."""
    op = request.get("op")
    if op == "ping":
        return {"ok": True, "pid": os.getpid()}
    if op == "server":
        pid = os.fork()
        if pid == 0:
            _sub_server(request, listener, clients)
        children.add(pid, os.getpgid(0))  # in this server's group: ended with it
        return {"ok": True, "pid": pid}
    if op == "fork":
        pid = os.fork()
        if pid == 0:
            _child(request, listener, clients)
        try:  # the child does it too; here as well, so a kill of the group cannot come before the group
            os.setpgid(pid, request.get("pgid") or pid)
        except OSError:  # the child got there first (and may have exec'd into its main already)
            pass
        children.add(pid, request.get("pgid") or pid)
        return {"ok": True, "pid": pid}
    if op in ("status", "wait"):  # a wait reaching here: its child had already exited
        children.reap()
        return _status(children, int(request["pid"]))
    if op == "group_cpu":
        children.reap()
        group = int(request["pgid"])
        running = sum(1 for pid in children.running if children.group_of.get(pid) == group)
        return {"ok": True, "cpu_s": round(children.group_cpu.get(group, 0.0), 3), "running": running}
    return {"ok": False, "error": f"unknown op {op!r}"}


def serve(listener: socket.socket, parent_pid: int) -> None:
    """Answer fork/status/wait requests (one JSON line each) on the bound, listening UNIX
    socket ``listener`` until the parent is gone; then kill every child's process group.

    A ``wait`` is answered when its child exits or its ``timeout_s`` passes, so a client
    waiting for a cell or role holds one idle connection instead of asking ``status`` 20
    times a second (12,000 requests in a 78-cell matrix; docs/performance.md).  SIGCHLD
    wakes the loop through a self-pipe, so an exit is answered at once."""
    clients: list[socket.socket] = []
    buffers: dict[socket.socket, bytes] = {}
    children = _Children()
    waiters = _Waiters()
    become_subreaper()  # what a role's process leaves behind is re-parented here, and ended
    wake_r, wake_w = os.pipe()
    _WAKE_FDS[:] = [wake_r, wake_w]
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
    while os.getppid() == parent_pid:
        children.reap()
        children.end_adopted()
        waiters.answer(children, clients, buffers)
        readable, _, _ = select.select([listener, wake_r, *clients], [], [], waiters.timeout(POLL_S))
        for sock in readable:
            if sock is wake_r:
                _drain(wake_r)
                continue
            if sock is listener:
                conn, _ = listener.accept()
                clients.append(conn)
                buffers[conn] = b""
                continue
            _read(sock, children, waiters, listener, clients, buffers)
    children.kill_all()  # the runner is gone: so are its cells


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _read(sock: socket.socket, children: "_Children", waiters: "_Waiters", listener: socket.socket,
          clients: list[socket.socket], buffers: dict) -> None:
    """Read what a client sent and answer each complete request line (a ``wait`` may be deferred)."""
    try:
        data = sock.recv(65536)
    except OSError:  # reset by a client that gave up
        data = b""
    if not data:
        waiters.forget(sock)
        _drop(sock, clients, buffers)
        return
    buffers[sock] += data
    while sock in buffers and b"\n" in buffers[sock]:
        line, buffers[sock] = buffers[sock].split(b"\n", 1)
        request: dict = {}
        try:
            request = json.loads(line)
            if request.get("op") == "wait" and waiters.defer(request, sock, children):
                continue
            reply = _answer(request, children, listener, clients)
        except Exception as exc:  # noqa: BLE001 - a bad request must not end the fork server
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        if not _reply(sock, reply, clients, buffers) and request.get("op") in ("fork", "server") and reply.get("ok"):
            children.end_unclaimed(reply["pid"])  # nobody knows this child: it must not run unseen


def _reply(sock: socket.socket, reply: dict, clients: list[socket.socket], buffers: dict) -> bool:
    """Send one reply line; False (and the connection dropped) when the client has gone."""
    try:
        sock.sendall(json.dumps(reply).encode() + b"\n")
        return True
    except OSError:  # the client gave up waiting (a call timeout): the fork server goes on
        if sock in clients:
            _drop(sock, clients, buffers)
        return False


class _Waiters:
    """Deferred ``wait`` requests: (pid, client socket, deadline on the monotonic clock)."""

    def __init__(self):
        self.pending: list[tuple[int, socket.socket, float]] = []

    def defer(self, request: dict, sock: socket.socket, children: "_Children") -> bool:
        """Hold the request when its child still runs; False: answer it now (as ``status``)."""
        children.reap()
        pid = int(request["pid"])
        if pid not in children.running:
            return False
        self.pending.append((pid, sock, time.monotonic() + max(0.0, float(request.get("timeout_s", 0.0)))))
        return True

    def forget(self, sock: socket.socket) -> None:
        self.pending = [w for w in self.pending if w[1] is not sock]

    def timeout(self, longest: float) -> float:
        """How long the loop may sleep before the next deadline (at most ``longest`` seconds)."""
        if not self.pending:
            return longest
        return max(0.0, min(longest, min(w[2] for w in self.pending) - time.monotonic()))

    def answer(self, children: "_Children", clients: list[socket.socket], buffers: dict) -> None:
        now = time.monotonic()
        still: list[tuple[int, socket.socket, float]] = []
        for pid, sock, deadline in self.pending:
            if pid in children.running and now < deadline:
                still.append((pid, sock, deadline))
                continue
            if sock in clients:
                _reply(sock, _status(children, pid), clients, buffers)
        self.pending = still


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
        print(f"fork server: preload failed: {line}", flush=True)
    # Every child starts with the preloaded objects: moved out of the collector's reach, a
    # child's collections never walk (and copy-on-write fault) the ~1M objects sglang and
    # torch import: a full collection in a child costs 17 ms of CPU instead of 430 ms
    # (docs/performance.md).
    gc.collect()
    gc.freeze()
    collapse_to_huge_pages()
    _say_ready(args.ready_file, failed)
    serve(listener, parent)
    return 0


HUGE_PAGE = 2 << 20  # bytes: the x86-64 PMD size
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # linux/mman.h (MADV_COLLAPSE: Linux 6.1)


def collapse_to_huge_pages() -> int:
    """Back this process's private anonymous memory (the heap and the arenas holding the
    preloaded objects, some 375 MB with sglang) with transparent huge pages, now: each fork
    then copies one page-table entry per 2 MB instead of 512 and each child's exit frees
    as few, 20 -> 6 ms of the server's time per fork and 21 -> 9 ms of the child's
    (docs/performance.md).  A child writing into such a page gets a 4 KB copy, as before.
    Best effort: a kernel without ``MADV_COLLAPSE`` (before 6.1) or THP set to ``never``
    changes nothing.  Returns the bytes collapsed."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = 0
    for line in lines:
        fields = line.split()
        if not fields[1].startswith("rw") or fields[1][3] != "p" or (len(fields) > 5 and fields[5] != "[heap]"):
            continue  # only private writable anonymous memory: never a file's pages or a stack
        low, high = (int(x, 16) for x in fields[0].split("-"))
        start, end = -(-low // HUGE_PAGE) * HUGE_PAGE, high // HUGE_PAGE * HUGE_PAGE
        if end - start < HUGE_PAGE:
            continue
        libc.madvise(start, end - start, MADV_HUGEPAGE)
        if libc.madvise(start, end - start, MADV_COLLAPSE) == 0:
            done += end - start
    return done


def _say_ready(ready_file: str, failed: list[str]) -> None:
    """Write the ready file atomically: this pid, its thread count (a fork server must have
    one: threads do not survive fork) and the preloads that failed."""
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    tmp = ready_file + ".tmp"
    Path(tmp).write_text(json.dumps({"pid": os.getpid(), "threads": threads, "failed": failed}))
    os.replace(tmp, ready_file)


if __name__ == "__main__":
    sys.exit(main())
