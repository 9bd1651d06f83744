"""The network nemesis's tools (harness.hosts.linkfault): which packets each path picks,
and (root, nftables) that a fault on one path between two namespaces drops that path's
connections and no other, loses packets at random, and heals to nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.hosts import netns
from harness.hosts.linkfault import check_spec, nft_ruleset

ROOT = Path(__file__).resolve().parents[1]
WHY_NOT = netns.unavailable() or (None if shutil.which("nft") else "nftables' nft is not installed (make setup, as root)")


def test_each_path_picks_its_packets_by_port():
    data = nft_ruleset("pdconform_1", "10.1.2.3", "data", [7000, 5000, 7000], "drop")
    assert data.index("tcp dport { 5000, 7000 } accept") < data.index("ip daddr 10.1.2.3 counter drop")
    assert data.index("tcp sport { 5000, 7000 } accept") < data.index("ip daddr 10.1.2.3 counter drop")
    control = nft_ruleset("pdconform_1", "10.1.2.3", "control", [6000], "meta mark set 0x70cf")
    assert "tcp dport { 6000 } counter meta mark set 0x70cf" in control and "tcp sport { 6000 } counter meta" in control
    assert "!=" not in control
    assert "ip daddr 10.1.2.3 counter drop" in nft_ruleset("pdconform_1", "10.1.2.3", "all", [], "drop")


@pytest.mark.parametrize("peer, path, ports", [
    ("10.1.2.3; flush ruleset", "data", [1]), ("10.1.2.3", "everything", [1]), ("10.1.2.3", "data", [0]),
    ("10.1.2.3", "control", []), ("10.1.2.3", "data", ["5000 }; flush ruleset; {"]), ("10.1.2.3", "data", [True]),
])
def test_a_ruleset_is_never_built_from_a_bad_address_path_or_port(peer, path, ports):
    with pytest.raises(ValueError):
        nft_ruleset("pdconform_1", peer, path, ports, "drop")


def test_a_fault_spec_outside_the_step_s_fields_is_refused():
    check_spec({"partition": True, "path": "bootstrap", "loss_pct": 5})
    for bad in ({"path": "disk"}, {"loss_pct": 101}, {"mark": 1}, {"delay_ms": True}):
        with pytest.raises(ValueError, match="netem"):
            check_spec(bad)


PROBE = textwrap.dedent("""
    import json, socket, sys, time
    from harness.hosts.agent import interface_of
    from harness.hosts.linkfault import LinkFaults

    me, peer, ports = sys.argv[1], sys.argv[2], [int(p) for p in sys.argv[3:]]

    def reach(port, tries=1):
        got = 0
        for _ in range(tries):
            try:
                socket.create_connection((peer, port), timeout=0.5).close()
                got += 1
            except OSError:
                pass
        return got

    faults, seen = LinkFaults(interface_of(me)), {}
    deadline = time.monotonic() + 10
    while sum(reach(p) for p in ports) < len(ports) and time.monotonic() < deadline:
        time.sleep(0.1)  # the peer's listeners come up
    seen["before"] = [reach(p) for p in ports]
    faults.apply(peer, {"partition": True, "path": "data"}, ports[:1])  # the first port is control
    seen["data-cut"] = [reach(p) for p in ports]
    faults.apply(peer, {"partition": True, "path": "control"}, ports[:1])
    seen["control-cut"] = [reach(p) for p in ports]
    faults.apply(peer, {"loss_pct": 50, "path": "all"}, [])
    seen["half-lost"] = reach(ports[1], tries=40)
    seen["half-lost-counted"] = faults.packets()  # every packet the rule saw, lost or not
    faults.apply(peer, {"loss_pct": 100, "path": "control"}, ports[:1])
    seen["control-all-lost"] = [reach(p) for p in ports]
    faults.apply(peer, {"partition": True}, [])
    try:
        socket.create_connection((peer, ports[1]), timeout=0.5).close()
        seen["cut-link"] = "connected"
    except OSError as exc:  # a cut link leaves the connect unanswered; it does not refuse it at once
        seen["cut-link"] = type(exc).__name__
    seen["cut-link-counted"] = faults.heal()
    seen["healed"] = [reach(p) for p in ports]
    seen["after-heal"] = faults.packets()
    print(json.dumps(seen))
""")
SERVE = "import socket, sys, time\nss = []\nfor p in sys.argv[2:]:\n    s = socket.socket()\n" \
        "    s.bind((sys.argv[1], int(p)))\n    s.listen(64)\n    ss.append(s)\ntime.sleep(60)\n"


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_a_fault_on_one_path_between_two_namespaces_drops_that_path_only_and_heals_to_nothing():
    with netns.HostNet(2) as net:
        a, b = net.addresses
        ports = ["46001", "46002"]
        server = subprocess.Popen(["ip", "netns", "exec", net.hosts[1], sys.executable, "-c", SERVE, b, *ports])
        try:
            done = subprocess.run(["ip", "netns", "exec", net.hosts[0], sys.executable, "-c", PROBE, a, b, *ports],
                                  capture_output=True, text=True, timeout=60, cwd=ROOT)
            assert done.returncode == 0, done.stderr[-2000:]
            seen = json.loads(done.stdout)
            tables = netns.run_tool(["ip", "netns", "exec", net.hosts[0], "nft", "list", "tables"])
        finally:
            server.kill()
            server.wait()
    assert seen["before"] == [1, 1], seen
    assert seen["data-cut"] == [1, 0], seen  # the control port still answers; every other one is cut
    assert seen["control-cut"] == [0, 1]
    assert 5 <= seen["half-lost"] <= 35  # the SYN is lost half the time: some connects, not all
    assert seen["control-all-lost"] == [0, 1]
    assert seen["cut-link"] == "TimeoutError"
    assert seen["half-lost-counted"] >= 40 and seen["cut-link-counted"] >= 1 and seen["after-heal"] == 0
    assert seen["healed"] == [1, 1]
    assert "pdconform" not in tables
