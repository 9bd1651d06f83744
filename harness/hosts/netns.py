"""Hosts on one machine: N network namespaces joined by a bridge over veth pairs, each with
a real non-loopback address (``--hosts netns:N``).

Layout (``pid`` is the creating process's, in hex, so a leftover names its owner):

* bridge ``pdcf<pid>b`` in the caller's namespace, address ``10.A.B.1/24``: the coordinator's;
* namespace ``pdconform-<pid>-h<i>`` for host i, with ``lo`` up and ``eth0`` (the namespace
  end of veth pair ``pdcf<pid>v<i>``) at ``10.A.B.<10 + i>/24``;
* ``A.B`` drawn so that no route of the machine covers the /24.

Everything is made with ``ip`` (iproute2) and removed by :meth:`HostNet.close`: every
process still in a namespace is killed, the namespaces deleted (their veth ends go with
them, and any qdisc on them), the bridge deleted; also after an exception or an interrupt
inside the ``with`` block.  A creator killed outright leaves its namespaces behind:
:func:`sweep_stale` (run before every creation) removes those whose pid is gone.  Needs
root (CAP_NET_ADMIN, CAP_SYS_ADMIN): :func:`unavailable` says why not.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field

IP_TIMEOUT_S = 10.0  # one ``ip`` command, at most (seconds)
HOST_BASE = 10  # host i's last octet is HOST_BASE + i
MAX_HOSTS = 16
NS_PATTERN = re.compile(r"pdconform-([0-9a-f]+)-h(\d+)")
LINK_PATTERN = re.compile(r"pdcf([0-9a-f]+)[bv]\d*")


class NetnsError(RuntimeError):
    """The namespaces could not be made (the ``ip`` command and its message)."""


def _ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS`` (bounded); its stdout.  NetnsError when it fails and ``check``."""
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"ip {' '.join(args)}: {exc}") from exc
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


def unavailable() -> str | None:
    """None when this process can make network namespaces; else why not, in one line."""
    if os.geteuid() != 0:
        return "--hosts netns:N needs root (network namespaces, a bridge and veth pairs): run it as root"
    try:
        _ip("netns", "list")
    except NetnsError as exc:
        return f"--hosts netns:N needs iproute2's ip: {exc}"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
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
    """Remove every namespace and link of creator ``owner`` (hex pid), killing what runs inside."""
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
    """Remove the namespaces and links of creators that are gone (killed outright); their owners."""
    owners = {NS_PATTERN.fullmatch(ns).group(1) for ns in namespaces()}
    owners |= {LINK_PATTERN.fullmatch(name).group(1) for name in links()}
    stale = sorted(o for o in owners if not _alive(int(o, 16)))
    for owner in stale:
        _remove(owner)
    return stale


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.A.B.0/24 that no route of this machine overlaps."""
    used = []
    for entry in json.loads(_ip("-j", "-4", "route", "show", "table", "all", check=False) or "[]"):
        dst = entry.get("dst", "")
        if dst and dst != "default":
            try:
                used.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
            except ValueError:
                continue
    rng = random.Random(os.getpid())
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
    owner: str = field(default_factory=lambda: f"{os.getpid():x}")
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
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def _create(self) -> None:
        net = _free_subnet()
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

    def leftovers(self) -> list[str]:
        """This HostNet's namespaces and links that still exist (empty once closed)."""
        mine = [ns for ns in namespaces() if NS_PATTERN.fullmatch(ns).group(1) == self.owner]
        return mine + [name for name in links() if LINK_PATTERN.fullmatch(name).group(1) == self.owner]

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["HostNet", "NetnsError", "unavailable", "sweep_stale", "namespaces", "links"]
