"""A cell's processes stay to themselves: nothing outside the cell reaches a role's listener
(each cell has a private loopback-only network when the runner may make one), and a
process a backend starts in a session of its own is reported and ended with the cell."""

import contextlib
import os
import socket
import threading
import time

import psutil
import pytest

from cellruns import run_cells
from harness.drive.contain import isolation_available
from harness.spec.scenario import get_scenario
from procs import harness_processes

ISOLATED = isolation_available() is None


def _listeners(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, from its own network namespace's tables."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return []
    found = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        try:
            rows = open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            raw = bytes.fromhex(addr_hex)
            if width == 8:
                addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:
                addr = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            found.append((addr, int(port_hex, 16)))
    return found


@contextlib.contextmanager
def sampling(workdir):
    """Sample the listeners of every harness process of ``workdir`` every 20 ms while in the
    ``with`` (each role is seen while it is up): {(pid, its network namespace): {(addr, port)}}."""
    sampled: dict[tuple[int, str], set] = {}
    done = threading.Event()

    def sample():
        while not done.wait(0.02):
            for proc in harness_processes(workdir):
                try:
                    key = (proc.pid, os.readlink(f"/proc/{proc.pid}/ns/net"))
                except OSError:
                    continue
                sampled.setdefault(key, set()).update(_listeners(proc.pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield sampled
    finally:
        done.set()
        sampler.join()


def _lingering(scenario_id: str, seconds: float = 3.0):
    """The scenario with its roles kept up ``seconds`` longer at the end, so the 20 ms sampler
    sees every listener even when other tests load the machine (make test runs two workers per core)."""
    from dataclasses import replace

    from harness.spec.steps import Sleep

    scenario = get_scenario(scenario_id)
    return replace(scenario, steps=lambda seed: [*scenario.steps(seed), Sleep(seconds)])


def _host_addresses() -> list[str]:
    """This machine's own non-loopback IPv4 addresses (what a neighbour would connect to)."""
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")]


@pytest.mark.skipif(not ISOLATED, reason=f"no private network per cell here: {isolation_available()}")
def test_no_role_listener_is_reachable_from_outside_the_cell(tmp_path):
    """Mooncake's engine listens on 0.0.0.0 and [::]: the sampler sees those listeners during a
    happy-path cell, in the cell's own namespace, and none answers on the host's addresses."""
    host_net = os.readlink("/proc/self/ns/net")
    with sampling(tmp_path) as sampled:
        run = run_cells(["mooncake"], [_lingering("happy-path")], tmp_path)
    assert run.cells[0].verdict == "PASS", run.cells[0].reason
    assert "private loopback-only network namespace" in run.network
    wide = [(pid, addr, port, ns) for (pid, ns), found in sampled.items() for addr, port in found
            if addr not in ("127.0.0.1", "::1")]
    assert wide, "Mooncake's 0.0.0.0 listeners were not sampled: the sampler saw nothing to judge"
    for pid, addr, port, ns in wide:
        assert ns != host_net, f"pid {pid} listens on {addr}:{port} in the host's network"
        devices = [line.split(":")[0].strip() for line in open(f"/proc/{pid}/net/dev").read().splitlines()[2:]] \
            if psutil.pid_exists(pid) else ["lo"]
        assert devices == ["lo"], devices
    for host in _host_addresses():
        for _, _, port, _ in wide:
            with socket.socket() as s:
                s.settimeout(0.5)
                assert s.connect_ex((host, port)) != 0, f"{host}:{port} answered from outside the cell"


@pytest.mark.skipif(not _host_addresses(), reason="this machine has no non-loopback IPv4 address")
def test_bind_puts_every_reference_listener_on_that_address(tmp_path):
    """``run --bind ADDR`` (roles on several hosts): no private namespace, and every listener of
    the reference's roles (role host, bootstrap server, control sockets) is on ADDR, which the
    roles also advertise; the sampler would see one left on loopback."""
    addr = _host_addresses()[0]
    with sampling(tmp_path) as sampled:
        run = run_cells(["reference"], [_lingering("happy-path")], tmp_path, bind=addr)
    assert run.cells[0].verdict == "PASS", run.cells[0].reason
    assert f"roles listen on {addr} (--bind)" in run.network
    listeners = [entry for found in sampled.values() for entry in found]
    assert len(listeners) >= 4, sampled  # two role hosts, a bootstrap server, control sockets
    assert {a for a, _ in listeners} == {addr}, listeners
    history = (tmp_path / "cells" / "happy-path--reference" / "history.jsonl").read_text()
    assert f'"bootstrap_addr": "{addr}:' in history


@pytest.mark.parametrize("addr", ["::1", "not-an-address", "192.0.2.254"])
def test_bind_refuses_what_this_machine_cannot_listen_on(tmp_path, addr):
    import subprocess
    import sys

    if addr == "192.0.2.254" and addr in _host_addresses():
        pytest.skip("that address is this machine's")
    out = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--impl", "reference", "--scenario",
                          "happy-path", "--out", str(tmp_path / "out"), "--bind", addr],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--bind" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()  # checked before anything was written


@pytest.mark.parametrize("fork", [True, False])
def test_a_process_started_in_a_new_session_is_reported_and_ended(tmp_path, fork):
    run = run_cells(["selftest"], [get_scenario("selftest-escapee")], tmp_path, fork=fork)
    assert run.cells[0].verdict == "PASS", run.cells[0].reason
    from harness.spec import history

    mid = [e["value"] for e in history.load(tmp_path / "cells" / "selftest-escapee--selftest" / "history.jsonl")
           if e["op"] == "observe-mid" and e["role"] == "prefill" and e["type"] == "ok"]
    assert any("sleep 3017" in p for p in mid[0]["processes"]), mid  # seen while the cell ran
    time.sleep(0.5)
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "3017"]]
    assert not left, f"the escapee outlived its cell: {left}"
