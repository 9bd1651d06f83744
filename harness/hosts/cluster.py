"""Gathering the hosts of a run (``run --hosts``): on one machine as network namespaces
with an agent each started by torchrun, or on a cluster whose launcher starts the agents.

``netns:N``: N namespaces (harness.hosts.netns); the coordinator listens on the bridge's
address; in namespace i, ``python -m torch.distributed.run --nnodes N --node-rank i
--rdzv-backend c10d --rdzv-endpoint COORDINATOR -m harness.cli agent --coordinator
COORDINATOR`` (torchrun's own rendezvous runs on the coordinator's store, then each agent
publishes itself there).  ``N``: the coordinator listens on ``--listen ADDRESS[:PORT]``
and waits for N agents started by srun, torchrun, a Kubernetes Job or ssh
(docs/cluster.md).  Either way the wait is bounded, and everything is undone at the end,
after an error or an interrupt too: agents told to stop, then (netns) killed with their
namespaces.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from harness.hosts.agent import Coordinator, HostsError, parse_address
from harness.hosts.netns import HostNet, NetnsError, unavailable

DEFAULT_PORT = 29400  # torchrun's default rendezvous port
AGENT_EXIT_S = 10.0  # how long agents get to stop by themselves at the end (seconds)


def parse_hosts(spec: str) -> tuple[str, int]:
    """``netns:N`` -> ("netns", N); ``N`` -> ("cluster", N); ValueError otherwise (N from 1 to 64)."""
    match = re.fullmatch(r"(netns:)?(\d{1,2})", spec.strip())
    if not match or not 1 <= int(match.group(2)) <= 64:
        raise ValueError(f"--hosts {spec!r}: N (agents started by your launcher) or netns:N (namespaces here), N >= 1")
    return ("netns" if match.group(1) else "cluster"), int(match.group(2))


def _bare_address(text: str) -> bool:
    """Whether ``text`` is an address without a port (``10.0.0.5``, ``fd00::5``, ``[fd00::5]``)."""
    import ipaddress

    try:
        ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return False
    return True


def agent_command(coordinator: str, n: int, rank: int, workdir: Path | None = None) -> list[str]:
    """The torchrun command that starts host ``rank``'s agent (one of ``n``), its roles'
    files in ``workdir`` (default: the agent's own temporary folder)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n), "--node-rank", str(rank),
            "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", coordinator,
            "--rdzv-id", f"pdconform-{os.getpid()}", "--max-restarts", "0",
            "-m", "harness.cli", "agent", "--coordinator", coordinator,
            *(["--workdir", str(workdir)] if workdir else [])]


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def gathered(spec: str, listen: str | None = None, join_timeout_s: float = 120.0,
             note: Callable[[str], None] = print) -> Iterator[tuple[str, tuple[dict, ...]]]:
    """Gather the hosts ``spec`` names (:func:`parse_hosts`); yields the coordinator's
    address (the cells' bind address) and each agent's ``endpoint``, ``address``, ``host``
    by rank.  ValueError for a bad ``spec`` or ``listen``; HostsError when the hosts cannot
    be made or do not all join in time (with what their agents printed)."""
    kind, n = parse_hosts(spec)
    if kind == "cluster":
        if not listen:
            raise ValueError("--hosts N needs --listen ADDRESS[:PORT]: the address the agents reach this machine on")
        host, port = parse_address(listen if not _bare_address(listen) else f"[{listen.strip('[]')}]:{DEFAULT_PORT}",
                                   any_port=True)
        with Coordinator(host, n, port) as coordinator:
            note(f"waiting {join_timeout_s:.0f} s for {n} agent(s): on each host run "
                 f"`pdconform agent --coordinator {coordinator.endpoint}` (docs/cluster.md)")
            yield host, tuple(_as_host(a) for a in coordinator.wait_agents(join_timeout_s))
        return
    why = unavailable()
    if why:
        raise HostsError(why)
    try:
        with HostNet(n) as net, tempfile.TemporaryDirectory(prefix="pdconform-agents-") as logs:
            yield from _netns_hosts(net, n, Path(logs), join_timeout_s)
    except NetnsError as exc:
        raise HostsError(f"netns:{n}: {exc}") from exc


def _netns_hosts(net: HostNet, n: int, logs: Path, join_timeout_s: float) -> Iterator[tuple[str, tuple[dict, ...]]]:
    agents: list[subprocess.Popen] = []
    with Coordinator(net.coordinator, n) as coordinator:
        try:
            for i in range(n):  # each agent's files under the coordinator's folder: gone at the end, however it ends
                (logs / f"agent{i}").mkdir()
                with open(logs / f"agent{i}.log", "wb") as log:
                    agents.append(subprocess.Popen([*net.exec_args(i), *agent_command(coordinator.endpoint, n, i,
                                                                                      logs / f"agent{i}")],
                                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                   env={**os.environ, "TORCH_CPP_LOG_LEVEL": "FATAL"}))
            try:
                infos = coordinator.wait_agents(join_timeout_s)
            except HostsError as exc:
                said = "; ".join(f"agent {i}: {_tail(logs / f'agent{i}.log')}" for i in range(n))
                raise HostsError(f"{exc}; {said}") from None
            yield net.coordinator, tuple(_as_host(a) for a in infos)
        finally:
            coordinator.close()  # agents see the stop and exit; torchrun follows its worker
            deadline = time.monotonic() + AGENT_EXIT_S
            for agent in agents:
                try:
                    agent.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    agent.kill()  # HostNet.close kills whatever is left in the namespaces too
                    agent.wait(timeout=5)


def _as_host(agent) -> dict:
    return {"endpoint": agent.endpoint, "address": agent.address, "host": agent.host}


__all__ = ["gathered", "parse_hosts", "agent_command", "DEFAULT_PORT"]
