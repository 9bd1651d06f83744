"""Fork servers kept for the life of one process, for processes that run many small runs.

A run starts a fork server per group (harness.drive.fork_servers.start_fork_servers) and each
one imports its implementations before it forks a cell: about 2 s of CPU for the
reference's, 6-7 s for sglang's (docs/performance.md).  The test suite makes some hundred
small runs in each pytest process, so those imports were about 40 % of its CPU.  With
:func:`keep` on (tests/conftest's fixture; never in ``pdconform`` itself, whose run owns and
ends its fork servers and logs them in its folder), a run takes the kept fork server of the
same interpreter, environment and group when it is still alive, and leaves it running at its
end.  What a cell sees does not change: a fork server only forks, and each cell is a fresh
child of the state it had when it finished importing.

At most :data:`MAX_KEPT` are kept (the oldest is closed first: each holds a few hundred MB).
Each logs into its own socket folder (with its owner file, so a later start removes it when
this process was killed: harness.drive.forkserver_client.remove_stale_dirs); :func:`close_all`
(registered with atexit) ends them, and a fork server also ends when its parent process does
(harness.drive.forkserver.serve).  One run at a time per process: an interrupted run closes
the kept servers it used, whoever else uses them.
"""

from __future__ import annotations

import atexit
import threading
from collections import OrderedDict

from harness.drive.forkserver_client import ForkServer, OwnForkServer, _running

MAX_KEPT = 6  # fork servers (bases and implementations' own): the test suite uses about four at a time

_lock = threading.Lock()
_kept: "OrderedDict[tuple, ForkServer | OwnForkServer]" = OrderedDict()
_state: dict = {"on": False, "atexit": False}


def keep(on: bool) -> None:
    """Turn keeping on or off for the runs this process starts from now on (kept ones stay
    until :func:`close_all` or eviction); the first call registers :func:`close_all` with atexit."""
    with _lock:
        if on and not _state["atexit"]:
            atexit.register(close_all)
            _state["atexit"] = True
        _state["on"] = on


def on() -> bool:
    """Whether runs keep their fork servers (:func:`keep`)."""
    return _state["on"]


def key(python: str, env: dict[str, str], group: str, preload: list[str]) -> tuple:
    """What a kept fork server must match to serve a run: interpreter, the cells' whole
    environment (a cell inherits its fork server's), group (harness.drive.fork_servers.fork_group)
    and the implementations it preloads (a preload may change the server's state, as Mori's
    stand-in does: a run gets the server a fresh start would give it)."""
    # pytest names the running test in the environment: a cell does not read it, and with it no two tests would share
    return (python, tuple(sorted((k, v) for k, v in env.items() if k != "PYTEST_CURRENT_TEST")), group,
            tuple(sorted(preload)))


def _alive(server: ForkServer | OwnForkServer) -> bool:
    if server._closed or server._error is not None:
        return False
    if isinstance(server, OwnForkServer):
        return _alive(server.base) and (server.pid is None or _running(server.pid))
    return server.process is not None and server.process.poll() is None


def take(k: tuple) -> ForkServer | OwnForkServer | None:
    """The kept, still alive fork server for key ``k``, or None (a dead one is closed and forgotten)."""
    with _lock:
        server = _kept.get(k)
        if server is None:
            return None
        if _alive(server):
            _kept.move_to_end(k)
            return server
        del _kept[k]
    server.close()
    return None


def put(k: tuple, server: ForkServer | OwnForkServer) -> None:
    """Keep ``server`` under ``k`` (when keeping is on); past :data:`MAX_KEPT`, close the least
    recently used (an implementation's own server before the base it came from)."""
    if not on():
        return
    evicted = []
    with _lock:
        _kept[k] = server
        _kept.move_to_end(k)
        while len(_kept) > MAX_KEPT:
            _, old = _kept.popitem(last=False)
            evicted.append(old)
            own = [kk for kk, s in _kept.items() if isinstance(s, OwnForkServer) and s.base is old]
            evicted += [_kept.pop(kk) for kk in own]
    for server in reversed(evicted):
        server.close()


def is_kept(server) -> bool:
    """Whether ``server`` is kept (its run leaves it running)."""
    with _lock:
        return any(s is server for s in _kept.values())


def drop(server) -> None:
    """Forget ``server`` (it is being closed: an interrupted run)."""
    with _lock:
        for k in [k for k, s in _kept.items() if s is server]:
            del _kept[k]


def pids() -> set[int]:
    """The process ids of the kept base fork servers (children of this process that a run's
    end must not take for strays, harness.drive.contain.kill_descendants)."""
    with _lock:
        return {s.process.pid for s in _kept.values() if isinstance(s, ForkServer) and s.process is not None}


def close_all() -> None:
    """End every kept fork server (implementations' own first; at most about 10 s each, their
    ``close``) and remove their folders; keeping is off afterwards."""
    with _lock:
        servers = list(_kept.values())
        _kept.clear()
        _state["on"] = False
    for server in sorted(servers, key=lambda s: not isinstance(s, OwnForkServer)):
        server.close()
