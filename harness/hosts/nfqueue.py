"""Delay, jitter, loss, duplication, reordering and rate on a kernel without netem: an
``iptables ... -j NFQUEUE`` rule hands the packets a fault picks to a reader thread in the
agent, which gives each one its verdict when the fault says.  harness.hosts.linkfault falls
back to this when ``tc netem`` is missing (no ``tc``, or a kernel without sch_netem/sch_prio).

Needs, on the host: ``iptables`` (Debian package iptables) with the kernel's xtables NFQUEUE
target (nft's own ``queue`` statement is another kernel option, often missing where the
xtables target is built in), and the PyPI package NetfilterQueue (it compiles against Debian's
libnetfilter-queue-dev).  :func:`missing` says what is absent, in one line.

What the reader does with each packet (:class:`Schedule`; netem's semantics):

* loses ``loss_pct`` percent: verdict drop, at once;
* sends ``reorder_pct`` percent of the rest at once, so they overtake the held ones (as
  netem, reordering needs a delay: at least 1 ms);
* holds every other one ``delay_ms`` +/- ``jitter_ms`` (uniform), and with ``rate_kbit``
  also until the link, serialising the packets before it, is free;
* duplicates ``duplicate_pct`` percent: the packet is accepted when due and a copy of it (IP
  header included) goes out through a raw socket marked :data:`COPY_MARK`, which the rules
  let through so the copy is not queued again.

The rules live in a chain of this process's own (``PDCF_<pid>`` in the filter table), jumped
to from OUTPUT, with ``--queue-bypass``: while no reader is bound (it stopped, or the agent
was killed) the packets pass untouched instead of being dropped.  :meth:`QueueFault.stop`
removes the jump and the chain first, then the reader releases (accepts) every packet it
still holds and unbinds its queue.  Queue numbers are per network namespace; a deleted
namespace takes its rules and queues with it.
"""

from __future__ import annotations

import heapq
import importlib.util
import ipaddress
import os
import random
import select
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field

from harness.hosts.netns import NetnsError, run_tool
from harness.spec.steps import NETWORK_PATHS as PATHS

COPY_MARK = 0x70D0  # the packet mark of the reader's duplicates: the chain returns them unqueued
QUEUE_FIRST = 0x70C0  # the first queue number tried; the next free one of QUEUE_TRIES is taken
QUEUE_TRIES = 64
MAX_HELD = 10_000  # packets awaiting a verdict at once; the kernel drops beyond (netem: 1000)
POLL_S = 0.05  # the longest the reader waits on its socket before it looks at its stop flag (seconds)
STOP_S = 5.0  # how long stop() waits for the reader to release everything and end (seconds)
IPTABLES_WAIT_S = 5  # iptables -w: how long one call waits for the xtables lock (seconds)


def missing() -> str | None:
    """None when this host has what the NFQUEUE fallback needs (iptables, the NetfilterQueue
    module, root); else what would make it run, in one line."""
    lacks = []
    if shutil.which("iptables") is None:
        lacks.append("iptables (Debian package iptables)")
    if importlib.util.find_spec("netfilterqueue") is None:
        lacks.append("the Python module netfilterqueue (pip install NetfilterQueue, after the Debian package "
                     "libnetfilter-queue-dev; make setup installs both as root)")
    if os.geteuid() != 0:
        lacks.append("root (CAP_NET_ADMIN)")
    return "; ".join(lacks) or None


@dataclass
class Schedule:
    """When each packet of one fault goes out.  ``spec``: NetworkFault's fields
    (harness.hosts.linkfault.check_spec has vetted them); ``rng``: the randomness (seeded in
    tests).  Not thread-safe: one reader thread owns it."""

    spec: dict
    rng: random.Random = field(default_factory=random.Random)
    link_free_at: float = 0.0  # when the rate-limited link has sent what it was given (monotonic seconds)

    def _chance(self, name: str) -> bool:
        return self.rng.random() * 100 < float(self.spec.get(name, 0))

    def verdict(self, now: float, size: int) -> tuple[str, float, bool]:
        """For a packet of ``size`` bytes that arrived at ``now`` (monotonic seconds):
        (``"drop"``, now, False) when it is lost, else (``"accept"``, when it goes out
        (monotonic seconds, never before ``now``), whether a copy goes with it)."""
        if self._chance("loss_pct"):
            return "drop", now, False
        duplicate = self._chance("duplicate_pct")
        if self._chance("reorder_pct"):  # out at once: it overtakes every packet held
            return "accept", now, duplicate
        start = now
        rate = float(self.spec.get("rate_kbit", 0))
        if rate:  # serialised behind the packets before it on a link of that many kbit/s
            start = max(now, self.link_free_at) + size * 8 / (rate * 1000)
            self.link_free_at = start
        delay_ms = float(self.spec.get("delay_ms", 0))
        if self.spec.get("reorder_pct"):
            delay_ms = max(delay_ms, 1.0)  # netem reorders only against a delay (linkfault.netem_args)
        if delay_ms:  # as netem, jitter only spreads a delay
            delay_ms += self.rng.uniform(-1, 1) * float(self.spec.get("jitter_ms", 0))
        return "accept", start + max(delay_ms, 0.0) / 1000, duplicate


def chain_name() -> str:
    """This process's iptables chain (28 characters at most, as iptables allows)."""
    return f"PDCF_{os.getpid()}"


def check_path(peer: str, path: str, ports: list[int]) -> None:
    """ValueError unless ``peer`` is an IPv4 address, ``path`` one of PATHS and ``ports`` TCP
    port numbers (which a path other than ``all`` needs): what one fault's rules pick, for the
    nftables rules (harness.hosts.linkfault.nft_ruleset) and the iptables ones alike."""
    ipaddress.IPv4Address(peer)
    if path not in PATHS:
        raise ValueError(f"no such path {str(path)[:20]!r}")
    if any(isinstance(p, bool) or not isinstance(p, int) or not 0 < p < 65536 for p in ports):
        raise ValueError("ports must be TCP port numbers")
    if path != "all" and not ports:
        raise ValueError(f"the {path} path needs its ports")


def iptables_rules(chain: str, peer: str, path: str, ports: list[int], queue: int) -> list[list[str]]:
    """The ``iptables -A`` arguments of ``chain``'s rules: this host's packets to ``peer``
    (IPv4) on ``path`` (linkfault.PATHS) go to NFQUEUE ``queue``, picked as linkfault's
    nft_ruleset picks them (``ports``: the bootstrap and control ports; ``data`` is every
    packet but theirs); the reader's own copies (:data:`COPY_MARK`) return first.
    ValueError for a bad address, path, port or queue number."""
    check_path(peer, path, ports)
    if isinstance(queue, bool) or not isinstance(queue, int) or not 0 <= queue < 65536:
        raise ValueError("queue must be a number from 0 to 65535")
    to_peer = ["-A", chain, "-d", f"{peer}/32"]
    # bypass: with no reader bound the packets pass instead of being dropped
    enqueue = ["-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]
    by_port = [[flag, str(p)] for p in sorted(set(ports)) for flag in ("--dport", "--sport")]
    rules = [["-A", chain, "-m", "mark", "--mark", f"{COPY_MARK:#x}", "-j", "RETURN"]]
    if path == "all":
        rules.append(to_peer + enqueue)
    elif path == "data":  # the bootstrap and control connections leave first, every other packet is queued
        rules += [to_peer + ["-p", "tcp", *match, "-j", "RETURN"] for match in by_port]
        rules.append(to_peer + enqueue)
    else:
        rules += [to_peer + ["-p", "tcp", *match, *enqueue] for match in by_port]
    return rules


def _iptables(*args: str, check: bool = True) -> str:
    """Run ``iptables -w N ARGS`` (netns.run_tool); NetnsError when it fails and ``check``."""
    return run_tool(["iptables", "-w", str(IPTABLES_WAIT_S), *args], check=check)


class QueueFault:
    """One fault through NFQUEUE (see the module docstring) on the traffic this host sends
    to ``peer``: :meth:`start` binds a queue, starts the reader and adds the rules;
    :meth:`stop` undoes all three.  ``rng``: the schedule's randomness."""

    def __init__(self, peer: str, spec: dict, ports: list[int], rng: random.Random | None = None):
        self.peer, self.spec, self.ports = peer, dict(spec), list(ports)
        self.chain = chain_name()
        self.schedule = Schedule(self.spec, rng or random.Random())
        self.queue_num: int | None = None
        self.held: list[tuple[float, int, object, bool]] = []  # (due, arrival order, packet, duplicate): a heap
        self.arrivals = 0
        self.counts = {"drop": 0, "now": 0, "held": 0, "copy": 0}  # what the reader did, for tests and logs
        self.late_max_s = 0.0  # the most a held packet went out after its due time (seconds): a starved reader
        self._queue = None
        self._copies: socket.socket | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._rules_on = False

    def start(self) -> None:
        """Bind a free queue, start the reader, then add the rules (packets reach a reader
        that is already listening).  NotImplementedError when the host lacks what it needs
        (:func:`missing`, or a kernel without the NFQUEUE target); NetnsError when iptables
        fails otherwise; anything started is stopped again on failure."""
        why = missing()
        if why:
            raise NotImplementedError(f"host {socket.gethostname()}: the NFQUEUE fallback needs {why}")
        try:
            self._bind()
            self._copies = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
            self._copies.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_MARK", 36), COPY_MARK)
            self._thread = threading.Thread(target=self._read, name=f"nfqueue-{self.queue_num}", daemon=True)
            self._thread.start()
            self._add_rules()
        except BaseException:
            self.stop()
            raise

    def _bind(self) -> None:
        """Bind the first free queue number of QUEUE_TRIES; NotImplementedError when none is."""
        from netfilterqueue import NetfilterQueue

        queue = NetfilterQueue()
        for number in range(QUEUE_FIRST, QUEUE_FIRST + QUEUE_TRIES):
            try:
                queue.bind(number, self._on_packet, max_len=MAX_HELD)
            except OSError:
                continue  # taken (by another agent in this namespace), try the next
            self._queue, self.queue_num = queue, number
            return
        raise NotImplementedError(f"host {socket.gethostname()}: no free NFQUEUE number in "
                                  f"{QUEUE_FIRST}..{QUEUE_FIRST + QUEUE_TRIES - 1}")

    def _add_rules(self) -> None:
        """This fault's chain, its rules, then OUTPUT's jump to it.  NotImplementedError for a
        kernel without the NFQUEUE target; NetnsError when iptables fails otherwise."""
        self._rules_on = True
        self._remove_rules()  # a chain of this process's that an agent stopped mid-heal left
        _iptables("-N", self.chain)
        self._rules_on = True
        try:
            for rule in iptables_rules(self.chain, self.peer, self.spec.get("path", "all"), self.ports,
                                       self.queue_num):
                _iptables(*rule)
            _iptables("-I", "OUTPUT", "1", "-j", self.chain)
        except NetnsError as exc:
            said = str(exc)
            if "NFQUEUE" in said and any(w in said for w in ("No chain", "not supported", "Couldn't load")):
                raise NotImplementedError(f"the kernel of host {socket.gethostname()} lacks the xtables NFQUEUE "
                                          f"target (CONFIG_NETFILTER_XT_TARGET_NFQUEUE): {said}") from None
            raise

    def _remove_rules(self) -> None:
        if self._rules_on:
            # the jump first: from then on nothing new reaches the queue
            _iptables("-D", "OUTPUT", "-j", self.chain, check=False)
            _iptables("-F", self.chain, check=False)
            _iptables("-X", self.chain, check=False)
            self._rules_on = False

    def stop(self) -> None:
        """Remove the rules, let the reader release every held packet (accepted: what
        waited is delivered) and end within STOP_S seconds, unbind the queue; idempotent,
        never raises for a rule already gone."""
        self._remove_rules()
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(STOP_S)
            self._thread = None
        elif self._queue is not None:  # bound, but the reader never started
            self._queue.unbind()
        self._queue = None
        if self._copies is not None:
            self._copies.close()
            self._copies = None

    @property
    def alive(self) -> bool:
        """Whether the reader thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def _read(self) -> None:
        """The reader: every verdict is given from this thread (libnetfilter_queue's handle
        is not shared across threads), each wait bounded by POLL_S."""
        queue = self._queue
        fd = queue.get_fd()
        try:
            while not self._stopping.is_set():
                wait = POLL_S if not self.held else min(POLL_S, max(self.held[0][0] - time.monotonic(), 0.0))
                if select.select([fd], [], [], wait)[0]:
                    queue.run(block=False)  # every packet waiting, then back (EAGAIN)
                self._release(time.monotonic())
            queue.run(block=False)  # those queued before the rules went: accepted at once
        finally:  # stopped, or the socket broke: what is held goes out (a verdict that fails is dropped)
            self._release(float("inf"))
            queue.unbind()

    def _on_packet(self, packet) -> None:
        """NetfilterQueue's callback (in the reader's thread): a verdict now, or held."""
        try:
            if self._stopping.is_set():
                packet.accept()
                return
            now = time.monotonic()
            action, due, duplicate = self.schedule.verdict(now, packet.get_payload_len())
            if action == "drop":
                self.counts["drop"] += 1
                packet.drop()
                return
            if duplicate:
                packet.retain()  # the payload outlives this callback only if kept
            if due <= now:
                self.counts["now"] += 1
                self._send(packet, duplicate)
                return
            self.counts["held"] += 1
            self.arrivals += 1
            heapq.heappush(self.held, (due, self.arrivals, packet, duplicate))
            self._release(now)  # run() reads until the socket is empty: a burst must not hold back the due
        except Exception:  # noqa: BLE001 - an exception must not cross into the C callback; let it pass
            try:
                packet.accept()
            except Exception:  # noqa: BLE001 - a verdict already given, or the queue gone
                pass

    def _release(self, until: float) -> None:
        """Send every held packet due by ``until`` (monotonic seconds), in due order."""
        while self.held and self.held[0][0] <= until:
            due, _, packet, duplicate = heapq.heappop(self.held)
            if until != float("inf"):  # not the release-everything of a stop
                self.late_max_s = max(self.late_max_s, time.monotonic() - due)
            try:
                self._send(packet, duplicate)
            except Exception:  # noqa: BLE001 - the queue went away: the kernel dropped it already
                pass

    def _send(self, packet, duplicate: bool) -> None:
        """Accept ``packet`` and, for a duplicate, send a copy of it whole (a payload cut at
        the queue's copy range is not copied: it would be a shorter, corrupt packet)."""
        packet.accept()
        if duplicate and self._copies is not None:
            payload = packet.get_payload()
            if len(payload) >= 20 and int.from_bytes(payload[2:4], "big") == len(payload):
                try:
                    self._copies.sendto(payload, (self.peer, 0))
                    self.counts["copy"] += 1
                except OSError:
                    pass  # a copy that cannot go is a duplicate the link did not make


__all__ = ["QueueFault", "Schedule", "iptables_rules", "missing", "chain_name", "COPY_MARK"]
