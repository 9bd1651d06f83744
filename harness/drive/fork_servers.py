"""The fork servers a run starts: one per group of implementations (those whose roles import
sglang, the rest, and an implementation with a server of its own, forked from its group's),
started together and closed last first (harness.drive.scheduler, harness.explore.session).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from harness.drive import kept_servers
from harness.drive.forkserver_client import ForkServer, ForkServerError, OwnForkServer
from harness.implementations import implementation
from harness.target.sglang import SglangTarget


def fork_group(impl: str) -> str:
    """Which fork server starts ``impl``'s cells: "sglang" (its roles import sglang),
    "plain", or "sglang-IMPL" / "plain-IMPL" for an implementation with a fork server of
    its own (``Implementation.own_fork_server``), forked from the shared one."""
    spec = implementation(impl)
    base = "sglang" if spec.imports_sglang else "plain"
    return f"{base}-{impl}" if spec.own_fork_server else base


def fork_groups(impls: list[str]) -> dict[str, list[str]]:
    """The started fork servers a run needs: group name -> the implementations it preloads
    (an implementation with a server of its own is preloaded by the shared one it forks from)."""
    groups: dict[str, list[str]] = {}
    for impl in impls:
        groups.setdefault(fork_group(impl).split("-", 1)[0], []).append(impl)
    return groups


def start_fork_servers(impls: list[str], target: SglangTarget, out_dir: Path,
                       note: Callable[[str], None], kept: bool = False) -> dict[str, ForkServer | OwnForkServer]:
    """The fork servers ``impls`` need, by group (:func:`fork_group`), started together and
    not waited for; a group that cannot start is noted (its cells start fresh interpreters).
    The caller closes them, last first (an implementation's own server before its base).
    With ``kept``, while this process keeps fork servers (harness.drive.kept_servers: the test
    suite), a live kept one of the same interpreter, environment and group is taken instead of
    starting one, and a started one is kept."""
    servers: dict[str, ForkServer | OwnForkServer] = {}
    kept = kept and kept_servers.on()
    env = target.cell_env()
    for group, names in fork_groups(impls).items():
        k = kept_servers.key(target.python, env, group, names)
        base = kept_servers.take(k) if kept else None
        if base is None:
            try:  # a kept one logs in its own socket folder (removed with it, also after a kill)
                base = ForkServer(target.python, env, log_dir=None if kept else out_dir, impls=names,
                                  wait=False, log_name=f"forkserver-{group}.log")
            except (ForkServerError, OSError) as exc:
                note(f"{group} cells start as fresh interpreters: {exc}")
                continue
            if kept:
                kept_servers.put(k, base)
        servers[group] = base
        for impl in names:  # forked from base once it is ready (OwnForkServer.wait_ready)
            if fork_group(impl) != group:
                own = kept_servers.take(k + (impl,)) if kept else None  # alive only while its base is
                if own is None:
                    own = OwnForkServer(base, impl, log_dir=None if kept else out_dir)
                    if kept:
                        kept_servers.put(k + (impl,), own)
                servers[fork_group(impl)] = own
    return servers


def close_fork_servers(servers: dict[str, ForkServer | OwnForkServer], interrupted: bool = False) -> None:
    """Close what :func:`start_fork_servers` started, last first: an implementation's own
    fork server before the base it was forked from (close is idempotent).  A kept one
    (harness.drive.kept_servers) stays running, unless ``interrupted``."""
    for server in reversed(servers.values()):
        if kept_servers.is_kept(server):
            if not interrupted:
                continue
            kept_servers.drop(server)
        server.close()
