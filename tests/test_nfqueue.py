"""The network nemesis without netem (harness.hosts.nfqueue): when each packet goes out, which
packets each path's iptables rules queue, the fall back from a missing netem, and (root,
iptables, NetfilterQueue) that the reader delays, reorders and copies one path's packets
between two namespaces and leaves nothing behind: not at a heal, not when its agent or the
whole ``run`` is interrupted."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.hosts import linkfault, netns, nfqueue
from harness.hosts.linkfault import LinkFaults, NetemMissing
from harness.hosts.nfqueue import COPY_MARK, Schedule, iptables_rules

ROOT = Path(__file__).resolve().parents[1]
WHY_NOT = netns.unavailable() or nfqueue.missing()


def NEEDS_NFQUEUE(test):  # noqa: N802 - a marker; tests making namespaces share one xdist worker (tests/test_netns.py)
    return pytest.mark.xdist_group("netns")(pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))(test))


def _many(spec: dict, n: int = 4000, size: int = 1500) -> list[tuple[str, float, bool]]:
    schedule = Schedule(spec, random.Random(7))
    return [schedule.verdict(100.0, size) for _ in range(n)]


def test_each_packet_is_lost_sent_at_once_or_held_its_delay_plus_or_minus_the_jitter():
    got = _many({"delay_ms": 150, "jitter_ms": 50, "loss_pct": 2, "duplicate_pct": 2, "reorder_pct": 10})
    lost = [g for g in got if g[0] == "drop"]
    sent = [g for g in got if g[0] == "accept"]
    at_once = [g for g in sent if g[1] == 100.0]
    assert 40 <= len(lost) <= 130 and 250 <= len(at_once) <= 550  # 2 % lost, 10 % of the rest reordered
    assert all(0.1 <= due - 100.0 <= 0.2 for _, due, _ in sent if due != 100.0)  # 150 +/- 50 ms, uniform
    spread = sorted(due for _, due, _ in sent if due != 100.0)
    assert spread[0] < 100.11 and spread[-1] > 100.19  # the whole jitter range is used
    assert 40 <= sum(copy for _, _, copy in sent) <= 130


def test_jitter_needs_a_delay_and_reordering_gets_one_as_netem_s_do():
    assert {due for _, due, _ in _many({"jitter_ms": 50}, 200)} == {100.0}
    held = {round(due - 100.0, 6) for _, due, _ in _many({"reorder_pct": 50}, 200) if due != 100.0}
    assert held == {0.001}


def test_a_rate_serialises_the_packets_behind_each_other():
    schedule = Schedule({"rate_kbit": 8}, random.Random(1))  # 1000 bytes a second
    assert [schedule.verdict(0.0, 500)[1] for _ in range(3)] == [0.5, 1.0, 1.5]
    assert schedule.verdict(10.0, 100)[1] == pytest.approx(10.1)  # an idle link starts afresh


def test_each_path_queues_the_packets_nft_ruleset_picks():
    def text(path, ports):
        return [" ".join(rule) for rule in iptables_rules("PDCF_1", "10.1.2.3", path, ports, 7)]

    enqueue = "-j NFQUEUE --queue-num 7 --queue-bypass"
    for path, ports in (("all", []), ("data", [5000]), ("bootstrap", [5000])):
        assert text(path, ports)[0] == f"-A PDCF_1 -m mark --mark {COPY_MARK:#x} -j RETURN"  # the reader's copies
    assert text("all", [])[1:] == [f"-A PDCF_1 -d 10.1.2.3/32 {enqueue}"]
    data = text("data", [7000, 5000, 7000])
    assert data[1:5] == [f"-A PDCF_1 -d 10.1.2.3/32 -p tcp --{d}port {p} -j RETURN" for p in (5000, 7000)
                         for d in ("d", "s")]
    assert data[5:] == [f"-A PDCF_1 -d 10.1.2.3/32 {enqueue}"]  # every other packet, after the ports left
    assert text("control", [6000])[1:] == [f"-A PDCF_1 -d 10.1.2.3/32 -p tcp --dport 6000 {enqueue}",
                                           f"-A PDCF_1 -d 10.1.2.3/32 -p tcp --sport 6000 {enqueue}"]


@pytest.mark.parametrize("peer, path, ports, queue", [
    ("10.1.2.3 -j ACCEPT", "data", [1], 7), ("10.1.2.3", "everything", [1], 7), ("10.1.2.3", "data", [0], 7),
    ("10.1.2.3", "control", [], 7), ("10.1.2.3", "data", ["5000 -j DROP"], 7), ("10.1.2.3", "all", [], 70000),
    ("10.1.2.3", "all", [], True),
])
def test_rules_are_never_built_from_a_bad_address_path_port_or_queue(peer, path, ports, queue):
    with pytest.raises(ValueError):
        iptables_rules("PDCF_1", peer, path, ports, queue)


class _Started:
    """A QueueFault stand-in that records what it was asked to do."""

    made: list["_Started"] = []

    def __init__(self, peer, spec, ports):
        self.peer, self.spec, self.ports, self.stopped = peer, spec, ports, False
        self.counts = {"drop": 1, "now": 3, "held": 2, "copy": 1}  # as QueueFault's: a copy is no packet of its own
        _Started.made.append(self)

    def start(self):
        if self.spec.get("delay_ms") == 13:
            raise NotImplementedError("host h: the NFQUEUE fallback needs iptables")

    def stop(self):
        self.stopped = True


def test_a_host_without_netem_falls_back_to_the_reader_once_and_says_what_both_need(monkeypatch):
    tries = []

    def no_netem(self, peer, args, by_mark):
        tries.append(args)
        raise NetemMissing("the kernel of host h lacks sch_netem")

    monkeypatch.setattr(LinkFaults, "_netem", no_netem)
    monkeypatch.setattr(linkfault, "QueueFault", _Started)
    monkeypatch.setattr(_Started, "made", [])
    faults = LinkFaults("eth0")
    faults.apply("10.1.2.3", {"delay_ms": 20, "reorder_pct": 25, "path": "data"}, [5000])
    faults.apply("10.1.2.3", {"delay_ms": 30, "path": "bootstrap"}, [5000])
    assert len(tries) == 1  # netem's absence is found once
    first, second = _Started.made
    assert first.stopped and not second.stopped and second.ports == [5000] and faults.queue is second
    assert faults.heal() == 6  # the packets the reader gave a verdict: its evidence that the fault fired
    assert second.stopped and faults.queue is None and not faults.nft_on
    with pytest.raises(NotImplementedError, match="lacks sch_netem; and host h: the NFQUEUE fallback needs iptables"):
        faults.apply("10.1.2.3", {"delay_ms": 13}, [])
    assert faults.queue is None


PROBE = textwrap.dedent("""
    import json, socket, sys, threading, time
    from harness.hosts.agent import interface_of
    from harness.hosts.linkfault import LinkFaults
    from harness.hosts.netns import run_tool

    me, peer, ports = sys.argv[1], sys.argv[2], [int(p) for p in sys.argv[3:]]

    def connect_s(port):
        begin = time.monotonic()
        socket.create_connection((peer, port), timeout=5).close()
        return round(time.monotonic() - begin, 3)

    faults, seen = LinkFaults(interface_of(me)), {}
    faults.netem_missing = "forced by the test"  # the NFQUEUE reader, whether or not this kernel has netem
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            [connect_s(p) for p in ports]
            break
        except OSError:
            time.sleep(0.1)  # the peer's listeners come up
    faults.apply(peer, {"delay_ms": 300, "path": "data"}, ports[:1])  # the first port is control
    seen["rules"] = run_tool(["iptables", "-S"])
    seen["queues"] = open("/proc/net/netfilter/nfnetlink_queue").read()
    seen["data-slow"] = [connect_s(p) for p in ports]
    faults.apply(peer, {"delay_ms": 30, "jitter_ms": 10, "reorder_pct": 50, "duplicate_pct": 50, "path": "all"}, [])
    seen["mixed"] = [connect_s(ports[1]) for _ in range(10)]
    seen["counts"] = dict(faults.queue.counts)
    faults.heal()
    seen["healed"] = [connect_s(p) for p in ports]
    seen["rules-after"] = run_tool(["iptables", "-S"])
    seen["queues-after"] = open("/proc/net/netfilter/nfnetlink_queue").read()
    seen["threads-after"] = [t.name for t in threading.enumerate()]
    print(json.dumps(seen))
""")
SERVE = "import socket, sys, time\nss = []\nfor p in sys.argv[2:]:\n    s = socket.socket()\n" \
        "    s.bind((sys.argv[1], int(p)))\n    s.listen(64)\n    ss.append(s)\ntime.sleep(60)\n"


@NEEDS_NFQUEUE
def test_the_reader_delays_one_path_reorders_and_copies_and_heals_to_nothing():
    with netns.HostNet(2) as net:
        a, b = net.addresses
        ports = ["46101", "46102"]
        server = subprocess.Popen([*net.exec_args(1), sys.executable, "-c", SERVE, b, *ports])
        try:
            done = subprocess.run([*net.exec_args(0), sys.executable, "-c", PROBE, a, b, *ports],
                                  capture_output=True, text=True, timeout=60, cwd=ROOT)
        finally:
            server.kill()
            server.wait()
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout)
    assert "-j NFQUEUE --queue-num" in seen["rules"] and "--queue-bypass" in seen["rules"]
    assert len(seen["queues"].splitlines()) == 1  # one queue bound, this process's
    control, data = seen["data-slow"]
    assert control < 0.25 and data >= 0.3  # the SYN waits 300 ms on the data path only
    assert seen["counts"]["now"] and seen["counts"]["held"] and seen["counts"]["copy"]
    assert all(s < 1.0 for s in seen["mixed"]) and max(seen["mixed"]) >= 0.02
    assert max(seen["healed"]) < 0.25
    assert "PDCF" not in seen["rules-after"] and seen["queues-after"] == ""
    assert not [name for name in seen["threads-after"] if name.startswith("nfqueue")]


AGENT = textwrap.dedent("""
    import json, sys, threading
    from harness.hosts.agent import AgentServer

    me, peer, folder = sys.argv[1:4]
    with AgentServer(me, folder) as server:
        server.faults.netem_missing = "forced by the test"  # the NFQUEUE reader, whatever the kernel has
        server.op_netem(peer, {"delay_ms": 200, "jitter_ms": 50, "duplicate_pct": 5, "path": "all"}, [])
        print(json.dumps([t.name for t in threading.enumerate()]), flush=True)
        server.serve(lambda: True, 0.2)  # until SIGINT
""")


def _in(net: netns.HostNet, i: int, *argv: str) -> str:
    return subprocess.run([*net.exec_args(i), *argv], capture_output=True, text=True, timeout=20).stdout


@NEEDS_NFQUEUE
def test_an_interrupted_agent_removes_its_rules_and_reader_while_its_host_lives(tmp_path):
    with netns.HostNet(2) as net:
        agent = subprocess.Popen([*net.exec_args(0), sys.executable, "-c", AGENT, *net.addresses, str(tmp_path)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            threads = json.loads(agent.stdout.readline() or "[]")
            assert [name for name in threads if name.startswith("nfqueue")], agent.stderr.read() if agent.poll() else ""
            assert "NFQUEUE" in _in(net, 0, "iptables", "-S") and _in(net, 0, "cat", NFQ_PROC).strip()
            agent.send_signal(signal.SIGINT)
            agent.wait(timeout=20)
        finally:
            agent.kill()
            agent.wait()
        # the namespace still lives: what is gone, the agent removed itself
        assert "PDCF" not in _in(net, 0, "iptables", "-S") and _in(net, 0, "cat", NFQ_PROC) == ""
    assert not net.leftovers()


NFQ_PROC = "/proc/net/netfilter/nfnetlink_queue"


def _kernel_has_netem() -> bool:
    """Whether ``tc netem`` runs here (tried in a throwaway namespace, so no real link is touched)."""
    with netns.HostNet(1) as net:
        tried = subprocess.run([*net.exec_args(0), "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                               capture_output=True, text=True, timeout=20)
    return tried.returncode == 0


def _faulted(out: Path) -> bool:
    """Whether a cell of the run under ``out`` has faulted its link (its history says so)."""
    for history in out.glob("runs/*/cells/*/history.jsonl"):
        for line in history.read_text(errors="replace").splitlines():
            if '"op": "network"' in line and '"delay_ms"' in line:
                return True
    return False


@NEEDS_NFQUEUE
@pytest.mark.nightly  # a minute or so: a run across two namespaces, interrupted mid-fault
def test_an_interrupted_run_mid_fault_leaves_no_reader_rule_or_namespace(tmp_path):
    from test_hosts import _leftovers, _subnet_of_agents

    if _kernel_has_netem():
        pytest.skip("this kernel has netem: the run would not take the NFQUEUE path")
    child = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "--hosts", "netns:2", "--impl", "reference",
                              "--scenario", "network-delay", "--expectations", "none", "--out", str(tmp_path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and child.poll() is None and not _faulted(tmp_path):
        time.sleep(0.2)
    assert child.poll() is None, child.stderr.read()
    prefix = _subnet_of_agents(child.pid)
    mine = [ns for ns in netns.namespaces()
            if prefix in subprocess.run(["ip", "-n", ns, "-4", "addr"], capture_output=True, text=True).stdout]
    rules = [subprocess.run(["ip", "netns", "exec", ns, "iptables", "-S"], capture_output=True, text=True).stdout
             for ns in mine]
    assert len(mine) == 2 and all("NFQUEUE" in r for r in rules), rules  # both hosts fault their sends
    child.send_signal(signal.SIGINT)
    child.wait(timeout=60)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _leftovers(prefix):
        time.sleep(0.2)
    # no namespace (and with it no rule or queue), no link, no agent (whose threads the readers were)
    assert not _leftovers(prefix)
    assert not set(mine) & set(netns.namespaces())
    assert "PDCF" not in subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
