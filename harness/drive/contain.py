"""Keeping a cell's processes to themselves: a private loopback-only network, and no orphan left.

Network: sglang's Mooncake engine listens on 0.0.0.0 and [::] whatever it is told (its
P2P handshake RPC and its TCP transport; ``MC_TCP_BIND_ADDRESS`` changes neither in
mooncake-transfer-engine 0.3.13), so when the cell process may (root), it moves itself
into a network namespace of its own whose only interface is ``lo``, and every role of the
cell joins it: forked roles enter it (:func:`enter_network_of`), fresh ones inherit it.
Nothing outside the cell can reach a role's listener, whatever address it binds.

Processes: a process that a backend starts in a new session leaves the cell's process
group, so a group kill misses it.  Each cell and role process is a child subreaper
(``PR_SET_CHILD_SUBREAPER``): such an orphan is re-parented to it instead of init, and
:func:`kill_descendants` ends it (and says which ones it ended).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import socket
import struct
import time

CLONE_NEWNET = 0x40000000
PR_SET_CHILD_SUBREAPER = 36
SIOCGIFFLAGS, SIOCSIFFLAGS = 0x8913, 0x8914
IFF_UP = 0x1
NETNS_ENV = "PDCONFORM_CELL_NETNS"  # "1": the cell isolates its network (the runner's choice)
NETNS_PID_ENV = "PDCONFORM_CELL_NETNS_PID"  # set in an isolated cell: the process whose namespace its roles join

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def isolation_available() -> str | None:
    """None when this process could give a cell a private network namespace (root with
    CAP_SYS_ADMIN); otherwise why not (checked in a child, so nothing here changes)."""
    if os.geteuid() != 0:
        return "not root: cells share the host's network (Mooncake's listeners bind 0.0.0.0)"
    pid = os.fork()
    if pid == 0:
        try:
            _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            os._exit(0)
        except OSError:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return None
    return "unshare(CLONE_NEWNET) is refused here: cells share the host's network"


def _loopback_up() -> None:
    """Bring ``lo`` up in this (new) network namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14s", b"lo", 0, b"\0" * 14)
        flags = struct.unpack("16sH14s", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b"\0" * 14))


def isolate_network() -> str:
    """Move this process into a new network namespace with only ``lo`` (up); call it while
    the process has one thread.  Returns what the cell's network is, in words; OSError
    when the kernel refuses."""
    _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    _loopback_up()
    return "private network namespace, loopback only"


def enter_network_of(pid: int) -> None:
    """Join the network namespace of process ``pid`` (a role joining its cell's); OSError when it cannot."""
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        _check(_libc.setns(fd, CLONE_NEWNET), f"setns(network of pid {pid})")
    finally:
        os.close(fd)


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its children (prctl); False when refused."""
    return _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def children(pid: int | None = None) -> list[int]:
    """The live children of process ``pid`` (default: this one), from /proc."""
    pid = pid or os.getpid()
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(x) for x in f.read().split()]
        except OSError:
            continue
    return found


def describe(pid: int) -> str:
    """``pid`` and its command line (for reports)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"{pid} ({cmd[:120]})"


def kill_descendants(keep: set[int] = frozenset(), grace_s: float = 0.0) -> list[str]:
    """SIGKILL every child of this process not in ``keep`` (after ``grace_s`` seconds for them
    to end on their own), and reap them; what was killed, as :func:`describe` says it."""
    if grace_s:
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and [c for c in children() if c not in keep]:
            time.sleep(0.05)
    killed = []
    for _ in range(5):  # a killed child's own orphans come back to us: repeat until none is left
        strays = [c for c in children() if c not in keep]
        if not strays:
            break
        for pid in strays:
            killed.append(describe(pid))
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in strays:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            except OSError as exc:
                if exc.errno != errno.ECHILD:
                    raise
    return killed
