"""Roles on other hosts, the client side: the launcher that starts them through a host's
agent (harness.hosts.agent serves it), the same Launcher/RoleHandle contract as the local
one (harness.drive.launcher), and the placement of a cell's roles on the hosts.

The wire is ZMQ REQ/REP carrying JSON (never pickle: an agent listens on a network).  A
request is ``{"op": ..., ...}``, a reply ``{"ok": true, "value": ...}`` or ``{"ok": false,
"error": "..."}``.  Every call is bounded (:data:`CALL_TIMEOUT_S`); a role's readiness is
polled, so an agent is never blocked by one slow role.  A stopped role's log comes back
into the cell's folder: one result tree, wherever the roles ran.

Placement (:func:`place`): the i-th prefill of a cell on host ``2i mod N``, the i-th decode
on host ``2i + 1 mod N``, every TP rank, PP stage or DP engine process of a role with it:
with two hosts prefill and decode never share one, with three a second prefill gets the
third.  ``PDCONFORM_HOSTS`` (JSON: each host's ``endpoint`` and ``address``) tells a cell
where the agents are; without it every role is local.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path

import zmq

from harness import nofollow
from harness.drive.contain import NETNS_ENV, NETNS_PID_ENV
from harness.drive.errors import RoleError, RoleTimeout
from harness.drive.forkserver_client import FORK_SERVER_ENV
from harness.drive.launcher import Launcher, LocalLauncher, RoleHandle, RoleSpec
from harness.target.role_context import BIND_ENV

HOSTS_ENV = "PDCONFORM_HOSTS"  # JSON list of {"endpoint", "address", "host"}: the run's agents, by rank
CALL_TIMEOUT_S = 10.0  # one request to an agent, at most (seconds)
READY_POLL_S = 0.05  # how often a starting remote role is asked whether it is ready (seconds)
#: what the environment of a role an agent starts may set (engine, sglang and pdconform settings)
ENV_PREFIXES = ("PDCONFORM_", "SGLANG_", "MC_", "UCX_", "NIXL_", "MORI_")
ENV_NAMES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "MOONCAKE_PROTOCOL")
#: parts of a name that point a loader at files (a plugin or module folder, a library path): never sent
ENV_LOADER_WORDS = ("PLUGIN", "MODULE", "LIBRARY", "PRELOAD", "_PATH", "_DIR", "FORK_SERVER")
#: the coordinator's own settings that must not reach a role on another host
LOCAL_ONLY = (FORK_SERVER_ENV, NETNS_ENV, NETNS_PID_ENV, BIND_ENV, HOSTS_ENV)


def role_env_allowed(name: str) -> bool:
    """Whether a role on another host may be given environment variable ``name``: a setting
    of pdconform, sglang or an engine (:data:`ENV_PREFIXES`, :data:`ENV_NAMES`), never one
    that points a loader at files (:data:`ENV_LOADER_WORDS`), a token, or a local-only one."""
    return ((name.startswith(ENV_PREFIXES) or name in ENV_NAMES) and name not in LOCAL_ONLY
            and not any(word in name for word in ENV_LOADER_WORDS))


class AgentClient:
    """Calls one agent, one request at a time (a lock: the cell driver's threads share it);
    RoleError when it fails or does not answer within CALL_TIMEOUT_S (the client is then
    broken: a REQ socket cannot go on after a lost reply)."""

    def __init__(self, endpoint: str, name: str = "agent"):
        self.endpoint, self.name = endpoint, name
        self._ctx = zmq.Context.instance()
        self._socket = self._ctx.socket(zmq.REQ)
        self._socket.setsockopt(zmq.LINGER, 0)
        if endpoint.startswith("tcp://["):
            self._socket.setsockopt(zmq.IPV6, 1)
        self._socket.connect(endpoint)
        self._lock = threading.Lock()
        self.broken: str | None = None

    def call(self, op: str, deadline_s: float = CALL_TIMEOUT_S, **args):
        with self._lock:
            if self.broken:
                raise RoleError(f"{self.name} at {self.endpoint} is not answering ({self.broken})")
            self._socket.send(json.dumps({"op": op, **args}).encode())
            if not self._socket.poll(int(deadline_s * 1000)):
                self.broken = f"no reply to {op} within {deadline_s:.0f} s"
                raise RoleError(f"{self.name} at {self.endpoint}: {self.broken}")
            reply = json.loads(self._socket.recv())
        if not reply.get("ok"):
            raise RoleError(f"{self.name} at {self.endpoint}: {op}: {reply.get('error')}")
        return reply.get("value")

    def close(self) -> None:
        self._socket.close()


class RemoteRoleHandle(RoleHandle):
    """A role an agent started (as ``key``: unique on that agent, whose roles outlive no cell);
    its log comes back into ``log_path`` when it is stopped, and the agent then forgets it."""

    def __init__(self, spec: RoleSpec, client: AgentClient, log_path: Path, key: str):
        self.spec, self.client, self.log_path, self.key = spec, client, log_path, key
        self.endpoint: str | None = None

    def wait_ready(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.client.call("ready", name=self.key)
            if state.get("endpoint"):
                self.endpoint = state["endpoint"]
                return self.endpoint
            if state.get("exited"):
                raise RoleError(f"{self.spec.name} on {self.client.name}: {state['exited']}")
            if time.monotonic() > deadline:
                raise RoleTimeout(f"{self.spec.name} on {self.client.name} was not ready within {timeout_s:.0f} s:\n"
                                  + self.log_tail())
            time.sleep(READY_POLL_S)

    def alive(self) -> bool:
        return bool(self.client.call("alive", name=self.key))

    def signal(self, signum: int) -> None:
        self.client.call("signal", name=self.key, signum=int(signum))

    def exit_description(self) -> str:
        return str(self.client.call("exit_description", name=self.key))

    def stop(self, timeout_s: float = 5.0) -> None:
        try:
            self.client.call("stop", name=self.key, timeout_s=timeout_s)
        finally:
            self.fetch_log()
        self.client.call("forget", name=self.key)

    def fetch_log(self) -> None:
        """Copy the role's log from its host into ``log_path`` (a failure is written there instead)."""
        try:
            text = self.client.call("log", name=self.key)
        except RoleError as exc:
            text = f"[pdconform] the log of {self.spec.name} could not be fetched: {exc}\n"
        nofollow.write_atomic(self.log_path, text.encode("utf-8", "replace"))

    def log_tail(self, lines: int = 30) -> str:
        try:
            return str(self.client.call("log", name=self.key, lines=lines))
        except RoleError as exc:
            return f"(no log: {exc})"


class RemoteLauncher(Launcher):
    """Starts roles through an agent (its ZMQ ``endpoint``); logs land in ``workdir`` as
    ``<role name>.log``, as the local launcher's do.  The role gets ``spec.env`` and this
    process's pdconform, sglang and engine settings (:func:`role_env_allowed`)."""

    def __init__(self, endpoint: str, workdir: str | os.PathLike, host: str = "agent"):
        self.client = AgentClient(endpoint, host)
        self.workdir = Path(workdir)
        os.close(nofollow.open_dir(self.workdir, create=True))  # no link followed on the way

    def start(self, spec: RoleSpec) -> RemoteRoleHandle:
        inherited = {k: v for k, v in os.environ.items() if role_env_allowed(k)}
        env = {**inherited, **{k: v for k, v in spec.env.items() if role_env_allowed(k)}}
        key = f"{uuid.uuid4().hex[:12]}.{spec.name}"  # agents serve many cells, each with its own "prefill"
        self.client.call("start", name=key, impl=spec.impl, role=spec.role, env=env)
        log_path = Path(spec.log_path) if spec.log_path else self.workdir / f"{spec.name}.log"
        return RemoteRoleHandle(spec, self.client, log_path, key)

    def close(self) -> None:
        self.client.close()


def place(order: list[tuple[str, str]], n: int) -> dict[str, int]:
    """Host rank of each logical role, ``order`` being ``(name, "prefill"|"decode")`` in the
    order the cell starts them (see the module docstring)."""
    seen = {"prefill": 0, "decode": 0}
    out = {}
    for name, kind in order:
        out[name] = (2 * seen[kind] + (kind == "decode")) % n
        seen[kind] += 1
    return out


class PlacedLauncher(Launcher):
    """Starts each role on its host's agent (:func:`place`), as ``hosts`` (the parsed
    HOSTS_ENV) lists them; records where each went in ``placement`` (role -> host rank)."""

    def __init__(self, hosts: list[dict], workdir: str | os.PathLike):
        self.hosts = hosts
        self.launchers = [RemoteLauncher(h["endpoint"], workdir, h.get("host") or f"host{i}")
                          for i, h in enumerate(hosts)]
        self.order: list[tuple[str, str]] = []
        self.placement: dict[str, int] = {}
        self.faulted: set[int] = set()  # hosts whose outgoing traffic a NetworkFault changed

    def start(self, spec: RoleSpec) -> RoleHandle:
        logical = spec.name.split(".")[0]  # harness.spec.topology.rank_name: ROLE.tp1 goes with ROLE
        if logical not in dict(self.order):
            self.order.append((logical, spec.role))
        rank = place(self.order, len(self.hosts))[logical]
        self.placement[spec.name] = rank
        return self.launchers[rank].start(spec)

    def address_of(self, name: str) -> str:
        """The address of the host role process ``name`` was placed on (the run's bind
        address for a name this launcher did not start)."""
        if name in self.placement:
            return self.hosts[self.placement[name]]["address"]
        return super().address_of(name)

    def netem(self, src: int, dst: int, spec: dict | None, ports: list[int] = ()) -> int | None:
        """Fault the traffic host ``src`` sends to host ``dst`` as ``spec`` says (None: heal it,
        and return how many packets the healed fault applied to, None when not counted;
        ``ports``: those that pick out its path), through ``src``'s agent
        (harness.hosts.agent.AgentServer.op_netem)."""
        self.faulted.add(src)
        return self.launchers[src].client.call("netem", peer=self.hosts[dst]["address"], spec=spec, ports=list(ports))

    def heal(self) -> None:
        """Heal every link this cell faulted (a cell leaves no qdisc to the next one)."""
        for src in sorted(self.faulted):
            try:
                self.launchers[src].client.call("netem", peer="", spec=None)
            except RoleError:
                pass  # an agent that does not answer: its host's next run starts clean (agent exit heals)
        self.faulted.clear()

    def close(self) -> None:
        self.heal()
        for launcher in self.launchers:
            launcher.close()


def launcher_for(workdir: str | os.PathLike) -> Launcher:
    """The launcher a cell uses: through the agents HOSTS_ENV names, else local."""
    hosts = os.environ.get(HOSTS_ENV)
    return PlacedLauncher(json.loads(hosts), workdir) if hosts else LocalLauncher(workdir)


__all__ = ["AgentClient", "RemoteLauncher", "RemoteRoleHandle", "PlacedLauncher", "place", "launcher_for", "HOSTS_ENV",
           "ENV_PREFIXES", "LOCAL_ONLY", "role_env_allowed"]
