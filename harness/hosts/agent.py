"""One agent per host, and the coordinator that finds them (``pdconform agent``).

Rendezvous is torch.distributed's TCPStore, the store torchrun itself uses: the
coordinator hosts it on the address it was told to listen on (a socket it binds itself
and hands over, so the store never listens on every interface); each agent, started by
the cluster's launcher (torchrun, srun, a Kubernetes indexed Job, ssh), connects as a
client, takes its rank from that launcher (``GROUP_RANK`` under torchrun, ``SLURM_NODEID``
under srun, ``JOB_COMPLETION_INDEX`` in an indexed Job, else ``--rank`` or the next free
one) and publishes under ``pdconform/agent/<rank>`` its host name, address and the ZMQ
endpoint it serves the remote launcher on (harness.drive.remote).  Under torchrun the
agents run torchrun's own c10d rendezvous on the same store first (``--rdzv-endpoint`` is
the coordinator), so a missing node fails torchrun's bounded rendezvous, not ours.

An agent serves JSON requests only, and starts only pdconform role processes
(``python -m harness.drive.role_host`` with an implementation the registry knows) with an
environment harness.drive.remote.role_env_allowed allows: whoever reaches its port can start roles,
not commands.  It exits when told to, or when the coordinator's store stops answering for
:data:`ORPHAN_S` seconds: an agent never outlives its run by long.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal as signals
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import zmq

from harness.drive.launcher import LocalLauncher, RoleHandle, RoleSpec
from harness.drive.remote import CALL_TIMEOUT_S, role_env_allowed
from harness.hosts.linkfault import LinkFaults
from harness.target.role_context import BIND_ENV

STORE_PREFIX = "pdconform"
ORPHAN_S = 15.0  # an agent whose coordinator's store has not answered this long exits (seconds)
CHECK_EVERY_S = 2.0  # how often an idle agent asks the store whether the run goes on (seconds)
MAX_LOG_BYTES = 16 * 2**20  # the most of a role's log that goes back (the end of it)
SIGNALS = {int(s) for s in (signals.SIGKILL, signals.SIGSTOP, signals.SIGCONT, signals.SIGTERM, signals.SIGINT)}
NAME = re.compile(r"[A-Za-z0-9._-]{1,80}")
RANK_ENVS = ("GROUP_RANK", "SLURM_NODEID", "JOB_COMPLETION_INDEX")  # torchrun, srun, Kubernetes indexed Job


class HostsError(RuntimeError):
    """The hosts could not be gathered or reached (which, and why, in one line)."""


@dataclass(frozen=True)
class AgentInfo:
    """What an agent publishes: its ``rank``, ``host`` name, ``address`` (the one its roles
    listen on and advertise) and the ``endpoint`` it serves the remote launcher on."""

    rank: int
    host: str
    address: str
    endpoint: str
    pid: int


def parse_address(text: str, any_port: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` too) -> (host, port); ``any_port``: port 0 (any free one,
    for an address to listen on) is allowed.  ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not (0 if any_port else 1) <= int(port) < 65536:
        raise ValueError(f"{text!r}: expected HOST:PORT")
    return host, int(port)


def _store(host: str, port: int, master: bool, timeout_s: float, listen_fd: int | None = None):
    """A TCPStore client or (``master``) server; torch's C++ log kept to fatal errors, since
    a refused connection is reported here in one line, not as a C++ stack trace."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # read when torch is first imported
    from torch.distributed import TCPStore

    kwargs = {"master_listen_fd": listen_fd} if listen_fd is not None else {}
    return TCPStore(host, port, None, master, timeout=datetime.timedelta(seconds=timeout_s),
                    wait_for_workers=False, **kwargs)


class Coordinator:
    """Hosts the rendezvous store on ``address:port`` (port 0: any free one) and gathers
    ``n`` agents.  Use as a context manager: on exit the agents are told to stop."""

    def __init__(self, address: str, n: int, port: int = 0):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((address, port))
            listener.listen(128)
            self.address, self.port, self.n = address, listener.getsockname()[1], n
        except BaseException:
            listener.close()
            raise
        # the store owns the descriptor from here (it closes it): detached, never closed twice
        self.store = _store(address, self.port, True, 30.0, listener.detach())

    @property
    def endpoint(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"

    def wait_agents(self, timeout_s: float) -> list[AgentInfo]:
        """Every agent's info, by rank, once all ``n`` have published (bounded).  HostsError
        naming the ranks still missing after ``timeout_s`` seconds."""
        keys = [f"{STORE_PREFIX}/agent/{rank}" for rank in range(self.n)]
        deadline = time.monotonic() + timeout_s
        while True:
            missing = [k for k in keys if not self.store.check([k])]
            if not missing:
                return [AgentInfo(**json.loads(self.store.get(k))) for k in keys]
            if time.monotonic() > deadline:
                ranks = ", ".join(k.rsplit("/", 1)[1] for k in missing)
                raise HostsError(f"{len(missing)} of {self.n} agent(s) did not join {self.endpoint} within "
                                 f"{timeout_s:.0f} s (rank {ranks})")
            time.sleep(0.1)

    def close(self) -> None:
        """Tell the agents to stop (they see it within CHECK_EVERY_S, or the store gone); idempotent."""
        store, self.store = self.store, None
        if store is None:
            return
        try:
            store.set(f"{STORE_PREFIX}/stop", "1")
        except Exception:  # noqa: BLE001 - the store is going away anyway
            pass
        del store  # the server stops and closes its listening descriptor

    def __enter__(self) -> "Coordinator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AgentServer:
    """Serves one host's roles (see the module docstring) on ``tcp://address:<free port>``;
    role logs and ready files go to ``folder``.  Use as a context manager: on exit every
    role it started is stopped."""

    def __init__(self, address: str, folder: str | os.PathLike):
        self.address = address
        self.ctx = zmq.Context()
        self.socket = self.ctx.socket(zmq.REP)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, 1 << 20)  # a request is a few hundred bytes
        host = f"[{address}]" if ":" in address else address
        if ":" in address:
            self.socket.setsockopt(zmq.IPV6, 1)
        self.socket.bind(f"tcp://{host}:0")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.launcher = LocalLauncher(folder)
        self.roles: dict[str, RoleHandle] = {}
        self.interface = interface_of(address)
        self.faults = LinkFaults(self.interface)  # removed at exit

    def serve(self, goes_on: Callable[[], bool], check_every_s: float = 2.0) -> None:
        """Answer requests until a ``shutdown`` request or ``goes_on()`` says False (asked
        every ``check_every_s`` seconds)."""
        next_check = time.monotonic() + check_every_s
        while True:
            if self.socket.poll(int(check_every_s * 1000) // 4):
                try:
                    frames = self.socket.recv_multipart()
                    # one JSON frame per request; anything else is answered, never fatal
                    reply, done = self._answer(frames[0]) if len(frames) == 1 else \
                        ({"ok": False, "error": "ValueError: a request is one JSON frame"}, False)
                    self.socket.send(json.dumps(reply).encode())
                except zmq.ZMQError:
                    continue  # a peer that went away mid-request: the next one is served
                if done:
                    return
            if time.monotonic() >= next_check:
                if not goes_on():
                    return
                next_check = time.monotonic() + check_every_s

    def _answer(self, raw: bytes) -> tuple[dict, bool]:
        try:
            request = json.loads(raw)
            op = request.pop("op")
            if op == "shutdown":
                return {"ok": True, "value": None}, True
            handler = getattr(self, f"op_{op}", None) if isinstance(op, str) and op.isidentifier() else None
            if handler is None:
                raise ValueError(f"no such request {str(op)[:40]!r}")
            return {"ok": True, "value": handler(**request)}, False
        except Exception as exc:  # noqa: BLE001 - every error goes back to the caller, the agent goes on
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, False

    def _role(self, name: str) -> RoleHandle:
        if name not in self.roles:
            raise KeyError(f"no role {str(name)[:80]!r} on this agent")
        return self.roles[name]

    def op_ping(self) -> str:
        return "pong"

    def op_start(self, name: str, impl: str, role: str, env: dict[str, str]) -> str:
        """Start a pdconform role process; only a known implementation, prefill or decode, and
        an environment harness.drive.remote.role_env_allowed allows."""
        from harness.implementations import registered

        if not NAME.fullmatch(str(name)) or name in self.roles:
            raise ValueError(f"role name {str(name)[:80]!r}: [A-Za-z0-9._-], new on this agent")
        if impl not in registered() or role not in ("prefill", "decode"):
            raise ValueError(f"{str(impl)[:40]!r} as {str(role)[:20]!r}: not a role this agent starts")
        bad = [k for k in env if not role_env_allowed(str(k))]
        if bad:
            raise ValueError(f"environment {bad[0][:60]!r}: not one a role may be given")
        # the host's own settings: its address, and (UCX, NIXL's transport) the interface that holds it
        env = {**{str(k): str(v) for k, v in env.items()}, BIND_ENV: self.address,
               **({"UCX_NET_DEVICES": self.interface} if self.interface else {})}
        self.roles[name] = self.launcher.start(RoleSpec(name=name, impl=impl, role=role, env=env))
        return name

    def op_ready(self, name: str) -> dict:
        """``endpoint`` once the role serves, ``exited`` (its log tail) if it died first."""
        handle = self._role(name)
        if handle.ready_file.exists():  # written whole by the role (harness.drive.role_host)
            return {"endpoint": handle.wait_ready(1.0)}
        if not handle.alive():
            return {"endpoint": None, "exited": f"exited ({handle.exit_description()}) before it was ready:\n"
                                                f"{handle.log_tail()}"}
        return {"endpoint": None}

    def op_alive(self, name: str) -> bool:
        return self._role(name).alive()

    def op_exit_description(self, name: str) -> str:
        return self._role(name).exit_description()

    def op_signal(self, name: str, signum: int) -> None:
        if int(signum) not in SIGNALS:
            raise ValueError(f"signal {signum}: not one a role is sent")
        self._role(name).signal(int(signum))

    def op_stop(self, name: str, timeout_s: float) -> None:
        self._role(name).stop(min(float(timeout_s), CALL_TIMEOUT_S / 2))

    def op_netem(self, peer: str, spec: dict | None, ports: list[int] | None = None) -> int | None:
        """Fault this host's traffic to ``peer`` (an IPv4 address) as ``spec`` says
        (NetworkFault's fields, ``path`` among them; ``ports``: the cell's bootstrap and
        control ports), or (None) heal every fault this agent set
        (harness.hosts.linkfault.LinkFaults) and return how many packets the healed fault
        applied to (None: not counted).  NotImplementedError when this host lacks what the
        fault needs (the cell is then UNSUPPORTED)."""
        if not self.interface or self.interface == "lo":
            raise ValueError("this agent listens on loopback: there is no network to fault (--hosts netns:N)")
        if spec is None:
            return self.faults.heal()
        self.faults.apply(peer, spec, [int(p) for p in ports or []])
        return None

    def op_forget(self, name: str) -> None:
        """Drop a stopped role: its handle, log and ready file (an agent serves a whole run)."""
        handle = self._role(name)
        if handle.alive():
            raise ValueError(f"{name} is still running: stop it first")
        del self.roles[name]
        for path in (handle.log_path, handle.ready_file):
            Path(path).unlink(missing_ok=True)

    def op_log(self, name: str, lines: int = 0) -> str:
        """The role's log: its last ``lines`` lines, or (0) the end of it up to MAX_LOG_BYTES."""
        handle = self._role(name)
        if int(lines) > 0:
            return handle.log_tail(min(int(lines), 10_000))
        with open(handle.log_path, "rb") as log:
            log.seek(max(0, os.path.getsize(handle.log_path) - MAX_LOG_BYTES))
            return log.read().decode("utf-8", "replace")

    def __enter__(self) -> "AgentServer":
        return self

    def __exit__(self, *exc) -> None:
        self.faults.heal()
        for handle in self.roles.values():
            handle.signal(signals.SIGCONT)
            handle.signal(signals.SIGKILL)
            handle.stop(2.0)
        self.socket.close()
        self.ctx.term()


def interface_of(address: str) -> str | None:
    """The name of this host's network interface that holds IPv4 ``address`` (None: none does)."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(probe.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def launcher_rank(explicit: int | None = None) -> int | None:
    """This agent's rank as its launcher numbered it (``--rank``, then :data:`RANK_ENVS`); None: none did."""
    if explicit is not None:
        return explicit
    for name in RANK_ENVS:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def route_address(host: str, port: int) -> str:
    """The address of this host's interface that routes to ``host`` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return probe.getsockname()[0]


def run_agent(coordinator: str, rank: int | None = None, address: str | None = None, join_timeout_s: float = 60.0,
              workdir: str | None = None) -> int:
    """Join the coordinator ``HOST:PORT`` and serve the remote launcher until told to stop
    or orphaned (see the module docstring); the exit code.  HostsError when the store cannot
    be reached within ``join_timeout_s``; ValueError for a malformed address."""
    import tempfile

    host, port = parse_address(coordinator)
    try:
        store = _store(host, port, False, join_timeout_s)
    except Exception as exc:  # noqa: BLE001 - torch raises its own DistStoreError / RuntimeError
        raise HostsError(f"cannot reach the coordinator at {coordinator}: {str(exc).splitlines()[0]}") from exc
    store.set_timeout(datetime.timedelta(seconds=ORPHAN_S))  # from now on a silent store means an orphan
    address = address or route_address(host, port)
    with tempfile.TemporaryDirectory(prefix="pdconform-agent-") as scratch:
        with AgentServer(address, workdir or scratch) as server:  # bound before a rank is taken: a
            rank = launcher_rank(rank)                              # failed start wastes no rank number
            if rank is None:
                rank = store.add(f"{STORE_PREFIX}/next-rank", 1) - 1
            info = AgentInfo(rank, socket.gethostname(), address, server.endpoint, os.getpid())
            store.set(f"{STORE_PREFIX}/agent/{rank}", json.dumps(asdict(info)))
            server.serve(lambda: _run_goes_on(store), CHECK_EVERY_S)
    return 0


def _run_goes_on(store) -> bool:
    """False once the coordinator said stop or its store stopped answering."""
    try:
        return not store.check([f"{STORE_PREFIX}/stop"])
    except Exception:  # noqa: BLE001 - a store that does not answer: the coordinator is gone
        return False


__all__ = ["AgentInfo", "Coordinator", "HostsError", "run_agent", "parse_address", "launcher_rank", "AgentServer"]
