"""One host's faults on the traffic it sends to one other host: the network nemesis
(harness.spec.steps.NetworkFault, R-NET-1 and R-NET-2 in docs/protocol.md), applied by that
host's agent (harness.hosts.agent.AgentServer.op_netem).

A fault is on one **path** between the two hosts:

* ``all``: every packet to the peer;
* ``bootstrap``: TCP to or from a prefill's bootstrap port (sglang's bootstrap server: the
  decode's bootstrap queries and its heartbeat's ``/health`` probes);
* ``control``: TCP to or from a manager's ZMQ control port (``rank_port``: registrations,
  status, ABORT/ABORT_ACK);
* ``data``: every other packet to the peer (the transfer engine's own connections:
  Mooncake's TCP transport, NIXL's UCX; pdconform's reference carries its KV bytes on
  its control sockets, so it has no data path).

Tools, by kind:

* a partition or a loss alone, of every path or one: an nftables rule in a table of this
  agent's own on the output hook (``nft``: Debian's nftables), so every packet is silently
  lost as on a cut link (without nftables a partition of every path falls back to a
  blackhole route, which fails the host's sends at once instead);
* delay, jitter, duplication, reordering and rate (with any loss that comes with them):
  ``tc netem`` in a prio band that only the peer's traffic reaches (by destination, or for
  one path by the packet mark an nftables rule sets), where the host has netem;
* the same on a host without it (no ``tc``, or a kernel without sch_netem or sch_prio: the
  first try's error says so, and it is not tried again): an ``iptables ... -j NFQUEUE``
  rule picking the same packets (harness.hosts.nfqueue.iptables_rules) and a reader thread
  in this agent that holds, drops, reorders and copies them (harness.hosts.nfqueue; needs
  iptables and the NetfilterQueue module).

What a host lacks makes :meth:`LinkFaults.apply` raise NotImplementedError with what would
make it run; the cell is then UNSUPPORTED, never FAIL.  :meth:`LinkFaults.heal` (a
NetworkFault with nothing set, every cell's end, the agent's exit, after an interrupt too)
removes all of it; a host's namespace deleted (``--hosts netns:N``) takes its rules, qdiscs
and queues with it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket

from harness.hosts.netns import NetnsError, run_tool
from harness.hosts.nfqueue import QueueFault, check_path
from harness.spec.steps import NETWORK_PATHS as PATHS

NETEM_LIMITS = {"delay_ms": 60_000, "jitter_ms": 60_000, "loss_pct": 100, "duplicate_pct": 100, "reorder_pct": 100,
                "rate_kbit": 10**8}
NETEM_ONLY = ("delay_ms", "jitter_ms", "duplicate_pct", "reorder_pct", "rate_kbit")  # kinds nftables cannot do
MARK = 0x70CF  # the packet mark that steers one path's packets into the netem band


class NetemMissing(NotImplementedError):
    """This host cannot run ``tc netem`` (no tc, or a kernel without sch_netem or sch_prio):
    the NFQUEUE reader stands in (harness.hosts.nfqueue)."""


def check_spec(spec: dict) -> None:
    """ValueError unless ``spec`` holds only NetworkFault's fault fields (``partition``,
    ``path`` and :data:`NETEM_LIMITS`' names) with values in range."""
    unknown = set(spec) - set(NETEM_LIMITS) - {"partition", "path"}
    if unknown:
        raise ValueError(f"netem: no such setting {sorted(unknown)[0][:40]!r}")
    if spec.get("path", "all") not in PATHS:
        raise ValueError(f"netem: path must be one of {', '.join(PATHS)}")
    for name, top in NETEM_LIMITS.items():
        value = spec.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= top:
            raise ValueError(f"netem: {name} must be a number from 0 to {top}")


def netem_args(spec: dict) -> list[str]:
    """``tc netem`` arguments for a NetworkFault's fields (a partition: every packet lost);
    ValueError as :func:`check_spec`."""
    check_spec(spec)
    if spec.get("partition"):
        return ["loss", "100%"]
    args = []
    if spec.get("delay_ms") or spec.get("reorder_pct"):  # reordering needs a delay to reorder against
        args += ["delay", f"{max(spec.get('delay_ms', 0), 1)}ms"]
        if spec.get("jitter_ms"):
            args.append(f"{spec['jitter_ms']}ms")
    for name, word in (("loss_pct", "loss"), ("duplicate_pct", "duplicate"), ("reorder_pct", "reorder")):
        if spec.get(name):
            args += [word, f"{spec[name]}%"]
    if spec.get("rate_kbit"):
        args += ["rate", f"{int(spec['rate_kbit'])}kbit"]
    return args or ["delay", "0ms"]


def nft_ruleset(table: str, peer: str, path: str, ports: list[int], action: str) -> str:
    """The nftables script of one fault: table ``inet <table>`` with an output chain that
    applies ``action`` (an nft statement: ``drop``, a random drop, a mark) to this host's
    packets to ``peer`` (IPv4) on ``path`` (:data:`PATHS`), where ``ports`` are the
    bootstrap and control ports of that path (``data``: those it leaves out).
    ValueError for a bad address, path or port."""
    check_path(peer, path, ports)
    listed = "{ " + ", ".join(str(p) for p in sorted(set(ports))) + " }"
    action = f"counter {action}"  # every packet the fault applies to, before a random drop picks: its evidence
    if path == "all":
        rules = [f"ip daddr {peer} {action}"]
    elif path == "data":  # everything but the bootstrap and control connections, which pass first
        # (not "dport != P sport != P": nft merges the two adjacent fields into one compare,
        # which then matches when either differs)
        rules = [f"ip daddr {peer} tcp dport {listed} accept", f"ip daddr {peer} tcp sport {listed} accept",
                 f"ip daddr {peer} {action}"]
    else:
        rules = [f"ip daddr {peer} tcp dport {listed} {action}", f"ip daddr {peer} tcp sport {listed} {action}"]
    body = "\n".join(f"    {rule}" for rule in rules)
    return (f"table inet {table} {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n"
            f"{body}\n  }}\n}}\n")


class LinkFaults:
    """The faults one agent set on the traffic its host sends to peers, on ``interface``
    (the one holding the agent's address); :meth:`heal` removes every route, table, qdisc,
    iptables chain and NFQUEUE reader it added, and nothing else (its nftables table and
    iptables chain are named after its process)."""

    def __init__(self, interface: str):
        self.interface = interface
        self.table = f"pdconform_{os.getpid()}"
        self.blackholes: list[str] = []  # peers whose routes drop everything (a partition of every path)
        self.nft_on = False
        self.netem_on = False
        self.netem_missing: str | None = None  # why tc netem cannot run here, once a try found out
        self.queue: QueueFault | None = None  # the NFQUEUE reader standing in for netem

    def apply(self, peer: str, spec: dict, ports: list[int]) -> None:
        """Fault this host's traffic to ``peer`` as ``spec`` says (NetworkFault's fields, with
        ``path``), replacing whatever fault this agent had set; ``ports``: the bootstrap and
        control ports of the cell (see :func:`nft_ruleset`).  ValueError for a bad spec;
        NotImplementedError when this host lacks the tool or kernel part it needs; NetnsError
        when a tool fails."""
        ipaddress.IPv4Address(peer)
        check_spec(spec)
        self.heal()
        path = spec.get("path", "all")
        if spec.get("partition") and path == "all" and shutil.which("nft") is None:
            # without nftables: a blackhole route, which fails this host's sends at once
            # (EINVAL) where a real partition leaves them unanswered
            run_tool(["ip", "route", "add", "blackhole", f"{peer}/32"])
            self.blackholes.append(peer)
        elif spec.get("partition"):  # every packet silently lost, as on a cut link
            self._nft(nft_ruleset(self.table, peer, path, ports, "drop"))
        elif not any(spec.get(kind) for kind in NETEM_ONLY):  # a loss alone: nftables drops at random
            per_10k = round(float(spec.get("loss_pct", 0)) * 100)
            action = "drop" if per_10k >= 10000 else f"numgen random mod 10000 < {per_10k} drop"
            self._nft(nft_ruleset(self.table, peer, path, ports, action))
        else:
            self._delay(peer, spec, path, ports)

    def _delay(self, peer: str, spec: dict, path: str, ports: list[int]) -> None:
        """Delay and the like: netem where the host has it (the first try finds out, once),
        else the NFQUEUE reader (harness.hosts.nfqueue); NotImplementedError naming what
        either would need when neither runs."""
        if self.netem_missing is None:
            try:  # netem first: a host without it then needs no nftables for the marks
                self._netem(peer, netem_args(spec), by_mark=path != "all")
                if path != "all":
                    self._nft(nft_ruleset(self.table, peer, path, ports, f"meta mark set {MARK:#x}"))
                return
            except NetemMissing as exc:
                self.netem_missing = str(exc)  # the kernel will not grow sch_netem: not asked again
                self.heal()  # the prio qdisc the failed try left
            except BaseException:
                self.heal()  # no half-made fault stays behind
                raise
        fault = QueueFault(peer, spec, ports)
        try:
            fault.start()
        except NotImplementedError as exc:
            raise NotImplementedError(f"{self.netem_missing}; and {exc}") from None
        self.queue = fault

    def _nft(self, script: str) -> None:
        if shutil.which("nft") is None:
            raise NotImplementedError(f"host {socket.gethostname()} has no nft: a fault on one path or a loss needs "
                                      "nftables (Debian package nftables; make setup installs it as root)")
        self.nft_on = True
        run_tool(["nft", "-f", "-"], stdin=script)

    def _netem(self, peer: str, args: list[str], by_mark: bool) -> None:
        """A prio qdisc whose third band (netem) only the peer's packets reach: by destination,
        or by :data:`MARK` for one path."""
        dev = ["dev", self.interface]
        if shutil.which("tc") is None:
            raise NetemMissing(f"host {socket.gethostname()} has no tc (Debian package iproute2): delay, "
                               "jitter, duplication, reordering and rate need tc netem")
        match = ["handle", str(MARK), "fw"] if by_mark else ["u32", "match", "ip", "dst", f"{peer}/32"]
        try:
            run_tool(["tc", "qdisc", "add", *dev, "root", "handle", "1:", "prio", "bands", "3",
                      "priomap", *["0"] * 16])  # every packet to band 1, untouched, but the filter's
            self.netem_on = True
            run_tool(["tc", "qdisc", "add", *dev, "parent", "1:3", "handle", "30:", "netem", *args])
            run_tool(["tc", "filter", "add", *dev, "protocol", "ip", "parent", "1:", "prio", "1", *match,
                      "flowid", "1:3"])
        except NetnsError as exc:
            if "kind is unknown" in str(exc) or "classifier not found" in str(exc):  # a module the kernel lacks
                raise NetemMissing(
                    f"the kernel of host {socket.gethostname()} lacks a part netem faults need (sch_prio, "
                    "sch_netem, cls_u32 or cls_fw): delay, jitter, duplication, reordering and rate need a kernel "
                    f"with netem ({exc})") from None
            raise

    def packets(self) -> int | None:
        """How many packets the fault in force has applied to so far (its evidence that it fired,
        harness.judge.fired): the NFQUEUE reader's verdicts, else the nftables rules' counters,
        else the netem qdisc's; None when no tool counts them (a blackhole route) or the count
        cannot be read; 0 with no fault."""
        try:
            if self.queue is not None:
                return sum(self.queue.counts[k] for k in ("drop", "now", "held"))
            if self.nft_on:
                listed = json.loads(run_tool(["nft", "-j", "list", "table", "inet", self.table]))
                return sum(int(e["counter"]["packets"]) for item in listed.get("nftables", ()) if "rule" in item
                           for e in item["rule"].get("expr", ()) if isinstance(e, dict) and "counter" in e)
            if self.netem_on:
                shown = json.loads(run_tool(["tc", "-s", "-j", "qdisc", "show", "dev", self.interface]))
                return sum(int(q.get("packets", 0)) + int(q.get("drops", 0)) for q in shown if q.get("kind") == "netem")
        except (NetnsError, ValueError, KeyError, TypeError):
            return None
        return None if self.blackholes else 0

    def heal(self) -> int | None:
        """Remove every route, nftables table, qdisc, iptables chain and NFQUEUE reader this
        agent added (the reader's held packets are delivered); returns :meth:`packets` of the
        fault it removed, read first."""
        packets = self.packets()
        if self.queue is not None:
            self.queue.stop()  # its rules first, then the reader
            self.queue = None
        for peer in self.blackholes:
            run_tool(["ip", "route", "del", "blackhole", f"{peer}/32"], check=False)
        self.blackholes = []
        if self.nft_on:
            run_tool(["nft", "delete", "table", "inet", self.table], check=False)
            self.nft_on = False
        if self.netem_on:
            run_tool(["tc", "qdisc", "del", "dev", self.interface, "root"], check=False)
            self.netem_on = False
        return packets


__all__ = ["LinkFaults", "NetemMissing", "PATHS", "MARK", "NETEM_LIMITS", "check_spec", "netem_args", "nft_ruleset"]
