"""Hosts on one machine: N network namespaces joined by a bridge over veth pairs, each with
a real non-loopback address (``--hosts netns:N``).

Layout (``owner`` is a random token of the ``HostNet`` that made them, so a leftover names it):

* bridge ``pdcf<owner>b`` in the caller's namespace, address ``10.A.B.1/24``: the coordinator's;
* namespace ``pdconform-<owner>-h<i>`` for host i, with ``lo`` up and ``eth0`` (the namespace
  end of veth pair ``pdcf<owner>v<i>``) at ``10.A.B.<10 + i>/24``;
* ``A.B`` drawn so that no route of the machine covers the /24.

Everything is made with ``ip`` (iproute2) and removed by :meth:`HostNet.close`: every
process still in a namespace is killed, the namespaces deleted (their veth ends go with
them, and any qdisc on them), the bridge deleted; also after an exception or an interrupt
inside the ``with`` block.  While a ``HostNet`` lives it holds an exclusive ``flock`` on
``/run/pdconform/netns-<owner>.lock``; a creator killed outright leaves its namespaces
behind, and :func:`sweep_stale` (run before every creation) removes those whose lock file
exists and is no longer held (a lock works across pid namespaces; without a lock file a
namespace is not ours to judge, and is left).  Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN):
:func:`unavailable` says why not.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import random
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

IP_TIMEOUT_S = 10.0  # one ``ip`` or ``tc`` command, at most (seconds)
HOST_BASE = 10  # host i's last octet is HOST_BASE + i
MAX_HOSTS = 16
LOCK_DIR = Path("/run/pdconform")
NS_PATTERN = re.compile(r"pdconform-([0-9a-f]+)-h(\d+)")
LINK_PATTERN = re.compile(r"pdcf([0-9a-f]+)[bv]\d*")


class NetnsError(RuntimeError):
    """The namespaces could not be made (the ``ip`` command and its message)."""


def run_tool(argv: list[str], check: bool = True, stdin: str | None = None) -> str:
    """Run a network tool (``ip``, ``tc``, ``nft``) with ``stdin`` as its input, bounded by
    IP_TIMEOUT_S; its stdout.  NetnsError when it cannot run, or fails and ``check``."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S, input=stdin)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


def _ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS`` (:func:`run_tool`)."""
    return run_tool(["ip", *args], check)


def unavailable() -> str | None:
    """None when this process can make network namespaces; else why not, in one line."""
    if os.geteuid() != 0:
        return "--hosts netns:N needs root (network namespaces, a bridge and veth pairs): run it as root"
    try:
        _ip("netns", "list")
    except NetnsError as exc:
        return f"--hosts netns:N needs iproute2's ip: {exc}"
    return None


def _lock_path(owner: str) -> Path:
    return LOCK_DIR / f"netns-{owner}.lock"


def _take_lock(owner: str) -> int | None:
    """An exclusive flock on ``owner``'s lock file (made if missing); its fd, or None when held."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(_lock_path(owner), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _abandoned(owner: str) -> bool:
    """Whether ``owner``'s HostNet is gone: its lock file exists and nobody holds it."""
    if not _lock_path(owner).exists():
        return False
    fd = _take_lock(owner)
    if fd is None:
        return False
    os.close(fd)
    return True


def namespaces() -> list[str]:
    """The names of every network namespace pdconform made that still exists."""
    return [line.split()[0] for line in _ip("netns", "list", check=False).splitlines()
            if line.split() and NS_PATTERN.fullmatch(line.split()[0])]


def links() -> list[str]:
    """The names of every bridge or veth end pdconform made in this namespace."""
    out = []
    for entry in json.loads(_ip("-j", "link", "show", check=False) or "[]"):
        name = entry.get("ifname", "")
        if LINK_PATTERN.fullmatch(name):
            out.append(name)
    return out


def _remove(owner: str) -> None:
    """Remove every namespace and link of ``owner`` (a HostNet's token), killing what runs inside."""
    for ns in namespaces():
        match = NS_PATTERN.fullmatch(ns)
        if match and match.group(1) == owner:
            for pid in _ip("netns", "pids", ns, check=False).split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "delete", ns, check=False)
    for name in links():
        match = LINK_PATTERN.fullmatch(name)
        if match and match.group(1) == owner:
            _ip("link", "delete", name, check=False)


def sweep_stale() -> list[str]:
    """Remove the namespaces and links of HostNets that are gone (killed outright); their owners."""
    owners = {NS_PATTERN.fullmatch(ns).group(1) for ns in namespaces()}
    owners |= {LINK_PATTERN.fullmatch(name).group(1) for name in links()}
    stale = sorted(o for o in owners if _abandoned(o))
    for owner in stale:
        _remove(owner)
        _lock_path(owner).unlink(missing_ok=True)
    return stale


def _free_subnet(seed: str) -> ipaddress.IPv4Network:
    """A 10.A.B.0/24 that no route of this machine overlaps."""
    used = []
    for entry in json.loads(_ip("-j", "-4", "route", "show", "table", "all", check=False) or "[]"):
        dst = entry.get("dst", "")
        if dst and dst != "default":
            try:
                used.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
            except ValueError:
                continue
    rng = random.Random(seed)
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{rng.randrange(1, 255)}.{rng.randrange(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetnsError("no free 10.x.y.0/24 for the hosts' bridge")


@dataclass
class HostNet:
    """N hosts as network namespaces on one bridge (see the module docstring): ``hosts[i]``
    is host i's namespace name, ``addresses[i]`` its address, ``coordinator`` the bridge's.
    Use as a context manager; :meth:`close` is idempotent."""

    n: int
    owner: str = field(default_factory=lambda: secrets.token_hex(3))
    _lock: int | None = None
    hosts: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    coordinator: str = ""
    subnet: str = ""

    @property
    def bridge(self) -> str:
        return f"pdcf{self.owner}b"

    def __enter__(self) -> "HostNet":
        if not 1 <= self.n <= MAX_HOSTS:
            raise NetnsError(f"netns:{self.n}: 1 to {MAX_HOSTS} hosts")
        why = unavailable()
        if why:
            raise NetnsError(why)
        sweep_stale()
        self._lock = _take_lock(self.owner)
        if self._lock is None:
            raise NetnsError(f"hosts {self.owner}: another HostNet holds this token")
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def _create(self) -> None:
        net = _free_subnet(self.owner)
        hosts = list(net.hosts())
        self.subnet, self.coordinator = str(net), str(hosts[0])
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.coordinator}/{net.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.n):
            ns, veth, address = f"pdconform-{self.owner}-h{i}", f"pdcf{self.owner}v{i}", str(hosts[HOST_BASE + i - 1])
            _ip("netns", "add", ns)
            self.hosts.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{address}/{net.prefixlen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            self.addresses.append(address)

    def exec_args(self, i: int) -> list[str]:
        """The argv prefix that runs a command in host ``i``'s namespace."""
        return ["ip", "netns", "exec", self.hosts[i]]

    def close(self) -> None:
        """Kill every process in the namespaces, delete them and the bridge; wait until gone."""
        _remove(self.owner)
        deadline = time.monotonic() + IP_TIMEOUT_S
        while time.monotonic() < deadline and (self.leftovers()):
            time.sleep(0.05)
            _remove(self.owner)
        if self._lock is not None:
            if not self.leftovers():  # else the lock file stays, and the next sweep finds them abandoned
                _lock_path(self.owner).unlink(missing_ok=True)
            os.close(self._lock)
            self._lock = None

    def leftovers(self) -> list[str]:
        """This HostNet's namespaces and links that still exist (empty once closed)."""
        mine = [ns for ns in namespaces() if NS_PATTERN.fullmatch(ns).group(1) == self.owner]
        return mine + [name for name in links() if LINK_PATTERN.fullmatch(name).group(1) == self.owner]

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["HostNet", "NetnsError", "unavailable", "sweep_stale", "namespaces", "links", "run_tool"]
