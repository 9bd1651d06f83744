"""Several hosts: placement, the agent's limits, agents gathered the way srun starts them,
and (root) `run --hosts netns:2` with torchrun agents in two namespaces: real non-loopback
addresses, prefill and decode on different hosts, and nothing left behind, after an
interrupt too."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.drive.errors import RoleError
from harness.drive.launcher import RoleSpec
from harness.drive.remote import AgentClient, RemoteLauncher, place
from harness.hosts import netns
from harness.hosts.agent import AgentServer, HostsError
from harness.hosts.cluster import gathered, parse_hosts

ROOT = Path(__file__).resolve().parents[1]


def NEEDS_NETNS(test):  # noqa: N802 - a marker; tests making namespaces share one xdist worker (tests/test_netns.py)
    return pytest.mark.xdist_group("netns")(
        pytest.mark.skipif(netns.unavailable() is not None, reason=str(netns.unavailable()))(test))


def test_placement_keeps_prefill_and_decode_apart_and_ranks_with_their_role():
    order = [("prefill", "prefill"), ("decode", "decode"), ("prefill-b", "prefill"), ("decode-2", "decode")]
    assert place(order, 2) == {"prefill": 0, "decode": 1, "prefill-b": 0, "decode-2": 1}
    assert place(order, 3) == {"prefill": 0, "decode": 1, "prefill-b": 2, "decode-2": 0}
    assert set(place(order, 1).values()) == {0}
    assert parse_hosts("netns:2") == ("netns", 2) and parse_hosts("3") == ("cluster", 3)
    for bad in ("netns:0", "two", "netns:", "netns:-1", "100"):
        with pytest.raises(ValueError):
            parse_hosts(bad)


@pytest.fixture
def agent_server(tmp_path):
    (tmp_path / "agent").mkdir()
    with AgentServer("127.0.0.1", tmp_path / "agent") as server:
        stop = threading.Event()
        thread = threading.Thread(target=server.serve, args=(lambda: not stop.is_set(), 0.2), daemon=True)
        thread.start()
        yield server
        stop.set()
        thread.join(timeout=10)


def test_an_agent_starts_pdconform_roles_only_and_survives_what_it_refuses(agent_server, tmp_path):
    client = AgentClient(agent_server.endpoint)
    refused = [dict(name="p", impl="bash", role="prefill", env={}),  # not an implementation
               dict(name="p", impl="reference", role="shell", env={}),  # not a role
               dict(name="p", impl="reference", role="prefill", env={"LD_PRELOAD": "/tmp/x.so"}),
               dict(name="../p", impl="reference", role="prefill", env={})]
    for request in refused:
        with pytest.raises(RoleError, match="start: ValueError"):
            client.call("start", **request)
    with pytest.raises(RoleError, match="no such request"):
        client.call("__init__")
    assert client.call("ping") == "pong"
    launcher = RemoteLauncher(agent_server.endpoint, tmp_path / "cell")
    handle = launcher.start(RoleSpec(name="prefill", impl="reference", role="prefill"))
    assert handle.wait_ready(60).startswith("tcp://127.0.0.1:") and handle.alive()
    with pytest.raises(RoleError, match="not one a role is sent"):
        client.call("signal", name=handle.key, signum=int(signal.SIGUSR1))
    handle.signal(signal.SIGKILL)
    handle.stop(5)
    assert not agent_server.roles and (tmp_path / "cell" / "prefill.log").is_file()  # forgotten, log came back
    assert not list(Path(agent_server.launcher.workdir).iterdir())


def test_agents_started_as_srun_starts_them_join_with_its_node_ids():
    endpoints: list[str] = []

    def note(text: str) -> None:
        endpoints.append(text.split("--coordinator ")[1].split("`")[0])

    agents = []
    with pytest.raises(ValueError, match="--listen"):
        with gathered("2", None, 1.0, note):
            pass

    def start_agents():
        deadline = time.monotonic() + 30
        while not endpoints and time.monotonic() < deadline:
            time.sleep(0.05)
        for rank in (1, 0):  # srun numbers the nodes; the order they come in does not matter
            agents.append(subprocess.Popen([sys.executable, "-m", "harness.cli", "agent", "--coordinator",
                                            endpoints[-1]], env={**os.environ, "SLURM_NODEID": str(rank)}))

    starter = threading.Thread(target=start_agents, daemon=True)
    starter.start()
    with gathered("2", "127.0.0.1:0", 60.0, note) as (bind, hosts):
        assert [h["address"] for h in hosts] == ["127.0.0.1", "127.0.0.1"]
        assert len({h["endpoint"] for h in hosts}) == 2
    starter.join()
    for agent in agents:
        assert agent.wait(timeout=30) == 0  # told to stop at the end of the run, and gone


def test_gathering_too_few_agents_ends_in_time_with_the_missing_ranks():
    begin = time.monotonic()
    with pytest.raises(HostsError, match=r"2 of 2 agent\(s\) did not join .* \(rank 0, 1\)"):
        with gathered("2", "127.0.0.1:0", 1.0, lambda text: None):
            pass
    assert time.monotonic() - begin < 10


def _leftovers(prefix: str) -> list[str]:
    """What the netns run on subnet ``prefix`` ("10.A.B.") left: the namespaces and links of
    its owner token (found by any interface or namespace still holding one of its addresses)
    and its agents.  Only its own: another test's run may be alive on another xdist worker."""
    def holds(argv: list[str]) -> bool:
        entries = json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout or "[]")
        return any(a.get("local", "").startswith(prefix) for e in entries for a in e.get("addr_info", []))

    owners = {netns.LINK_PATTERN.fullmatch(e["ifname"]).group(1)
              for e in json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True,
                                                 timeout=10).stdout or "[]")
              if netns.LINK_PATTERN.fullmatch(e.get("ifname", "")) and holds(["ip", "-j", "addr", "show", e["ifname"]])}
    owners |= {netns.NS_PATTERN.fullmatch(ns).group(1) for ns in netns.namespaces()
               if holds(["ip", "-n", ns, "-j", "addr"])}
    mine = [n for n in netns.namespaces() + netns.links()
            if (netns.NS_PATTERN.fullmatch(n) or netns.LINK_PATTERN.fullmatch(n)).group(1) in owners]
    agents = subprocess.run(["pgrep", "-f", f"harness.cli agent --coordinator {re.escape(prefix)}1:"],
                            capture_output=True, text=True).stdout.split()
    return mine + [f"agent pid {p}" for p in agents]


def _subnet(run_dir: Path) -> str:
    """The subnet prefix ("10.A.B.") of the hosts a finished run recorded."""
    address = json.loads((run_dir / "results.json").read_text())["hosts"][0]["address"]
    return address.rsplit(".", 1)[0] + "."


def _subnet_of_agents(pid: int) -> str:
    """The subnet prefix of the coordinator a running ``run --hosts netns:N`` (``pid``) started agents for."""
    import psutil

    for process in psutil.Process(pid).children(recursive=True):
        argv = process.cmdline()
        if "--coordinator" in argv:
            return argv[argv.index("--coordinator") + 1].rsplit(".", 1)[0] + "."
    raise AssertionError("the run started no agent")


@NEEDS_NETNS
@pytest.mark.nightly
def test_run_across_two_namespaces_places_prefill_and_decode_apart_and_leaves_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--hosts", "netns:2", "--impl", "reference",
                           "--impl", "mooncake", "--scenario", "happy-path", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = json.loads((tmp_path / "latest" / "results.json").read_text())
    addresses = [h["address"] for h in run["hosts"]]
    assert len(set(addresses)) == 2 and not any(a.startswith("127.") for a in addresses)
    assert {c["verdict"] for c in run["cells"]} == {"PASS"} and "2 hosts" in run["network"]
    for cell in (tmp_path / "latest" / "cells").iterdir():
        end = [json.loads(line) for line in (cell / "history.jsonl").read_text().splitlines()
               if '"cell-end"' in line][-1]
        assert end["value"]["placement"] == {"prefill": 0, "decode": 1}
        logs = [(cell / f"{role}.log").stat().st_size for role in ("prefill", "decode")]
        assert min(logs) > 0 or cell.name.endswith("--reference")  # a Mooncake role's log came back from its host
    assert not _leftovers(_subnet(tmp_path / "latest"))


@NEEDS_NETNS
@pytest.mark.nightly  # about a minute under make test's load; make nightly's runs across hosts need it most
def test_an_interrupted_run_across_namespaces_leaves_nothing(tmp_path):
    child = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "--hosts", "netns:2", "--impl", "reference",
                              "--scenario", "happy-path", "--scenario", "multi-chunk-long-prompt", "--out",
                              str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(tmp_path.glob("runs/*/cells/*/prefill.log")):
        time.sleep(0.2)  # the agents joined and a cell has started its roles on them
    assert child.poll() is None, child.stderr.read()
    prefix = _subnet_of_agents(child.pid)
    assert _leftovers(prefix)  # the scan sees this run's namespaces while they live
    child.send_signal(signal.SIGINT)
    child.wait(timeout=60)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _leftovers(prefix):
        time.sleep(0.2)
    assert not _leftovers(prefix)


def test_netem_arguments_are_what_tc_takes_and_nothing_else():
    from harness.hosts.linkfault import netem_args

    assert netem_args({"partition": True}) == ["loss", "100%"]
    assert netem_args({"delay_ms": 150, "jitter_ms": 50, "loss_pct": 2, "reorder_pct": 10}) == \
        ["delay", "150ms", "50ms", "loss", "2%", "reorder", "10%"]
    assert netem_args({"reorder_pct": 5})[:2] == ["delay", "1ms"]  # netem reorders only against a delay
    for bad in ({"delay_ms": -1}, {"loss_pct": 101}, {"delay_ms": "1; reboot"}, {"qdisc": "x"}, {"loss_pct": True}):
        with pytest.raises(ValueError, match="netem"):
            netem_args(bad)


def test_a_network_scenario_on_one_host_is_unsupported_not_failed(tmp_path):
    from cellruns import run_one

    cell = run_one("reference", "network-partition", tmp_path)
    assert cell.verdict == "UNSUPPORTED" and "--hosts netns:2" in cell.reason


@NEEDS_NETNS
@pytest.mark.nightly  # 80 s under make test's load: the longest test, and R-NET-1 is a nightly (two-host) concern
def test_network_partition_catches_a_prefill_that_waits_for_a_partitioned_decode_forever(tmp_path, monkeypatch):
    """R-NET-1's planted bug (mutant partitioned-write-waited-forever) FAILs network-partition
    across two namespaces, on the check that cites it; the reference PASSes it."""
    monkeypatch.setenv("PDCONFORM_MUTANTS", "1")
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--hosts", "netns:2", "--impl", "reference",
                           "--impl", "mutant.partitioned-write-waited-forever", "--scenario", "network-partition",
                           "--expectations", "none", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=400, cwd=ROOT)
    cells = {c["impl"]: c for c in json.loads((tmp_path / "latest" / "results.json").read_text())["cells"]}
    assert cells["reference"]["verdict"] == "PASS", done.stdout[-3000:]
    mutant = cells["mutant.partitioned-write-waited-forever"]
    failed = [ch["name"] for ch in mutant["checks"] if ch["ok"] is False and ch["requirement"] == "R-NET-1"]
    assert mutant["verdict"] == "FAIL" and "cut-prefill-fails" in failed, mutant["reason"]
    assert not _leftovers(_subnet(tmp_path / "latest"))


@NEEDS_NETNS
@pytest.mark.nightly
@pytest.mark.skipif(shutil.which("nft") is None, reason="nftables' nft is not installed (make setup, as root)")
def test_an_unreachable_bootstrap_server_fails_the_rooms_by_heartbeat_and_a_decode_without_one_is_caught(
        tmp_path, monkeypatch):
    """network-bootstrap-unreachable cuts only the prefill's bootstrap port between two namespaces:
    the reference's decode fails both rooms by its heartbeat, naming the prefill (R-HB-1), and a
    new room succeeds after the heal; R-HB-1's planted bug (mutant no-heartbeat-checker), whose
    control and data paths still work, is caught on the check that cites it."""
    monkeypatch.setenv("PDCONFORM_MUTANTS", "1")
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--hosts", "netns:2", "--impl", "reference",
                           "--impl", "mutant.no-heartbeat-checker", "--scenario", "network-bootstrap-unreachable",
                           "--expectations", "none", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=400, cwd=ROOT)
    run = json.loads((tmp_path / "latest" / "results.json").read_text())
    cells = {c["impl"]: c for c in run["cells"]}
    reference = cells["reference"]
    assert reference["verdict"] == "PASS", done.stdout[-3000:]
    named = [ch["detail"] for ch in reference["checks"] if ch["name"] == "waiting-room-failed"]
    assert "stopped answering" in named[0] and run["hosts"][0]["address"] in named[0]
    mutant = cells["mutant.no-heartbeat-checker"]
    failed = {ch["name"] for ch in mutant["checks"] if ch["ok"] is False and ch["requirement"] == "R-HB-1"}
    assert mutant["verdict"] == "FAIL" and {"waiting-room-failed", "transferring-room-failed"} <= failed
    assert "run --hosts netns:2 --scenario network-bootstrap-unreachable" in done.stdout  # how to rerun it
    assert not _leftovers(_subnet(tmp_path / "latest"))
