"""A role process: hosts one adapter and serves the cell driver's commands.

Started by a :class:`harness.drive.launcher.Launcher` as
``python -m harness.drive.role_host --impl NAME --role prefill|decode --ready-file PATH``.
It binds a ZMQ REP command socket on loopback, imports the adapter (which
imports sglang and the engine: several seconds), then writes the socket's
endpoint to the ready file.  Requests and replies are pickled dicts (trusted,
harness-internal traffic):

* request: ``{"op": <RoleAdapter method>, "kwargs": {...}}``
* reply: ``{"ok": True, "value": ...}`` or
  ``{"ok": False, "error": <exception class name>, "message": str, "traceback": str}``

The process exits on the ``shutdown`` op, when its watched parent process goes
away, or when killed; it never outlives the cell that started it.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import threading
import time
import traceback

import zmq

from harness.drive.contain import become_subreaper, children, describe, kill_descendants
from harness.role import message_loss
from harness.role.adapter import CONTRACT, SHUTDOWN, RoleAdapter, Unsupported
from harness.role.recorder import RoleRecorder
from harness.target.role_context import bind_address

# Ops a driver may call: exactly the RoleAdapter contract.
ALLOWED_OPS = frozenset(CONTRACT)


def _watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Exit this process as soon as ``parent_pid`` is gone (no orphans)."""

    def loop() -> None:
        while True:
            time.sleep(interval_s)
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                os._exit(3)
            if os.getppid() == 1 and parent_pid != 1:
                os._exit(3)

    threading.Thread(target=loop, name="pdconform-parent-watch", daemon=True).start()


def _reply_error(exc: BaseException) -> dict:
    return {
        "ok": False,
        "error": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc))[-6000:],
        "unsupported": isinstance(exc, Unsupported),
    }


def _open_statuses(adapter: RoleAdapter, rooms) -> dict[int, dict]:
    """Each of ``rooms`` this role still has open, read afresh as at a clear
    (RoleAdapter.status_before_clear): R-TERM-1 judged on the last read of every room."""
    out = {}
    for room in rooms:
        read = adapter.status_before_clear(int(room))
        if read:
            out[int(room)] = read
    return out


def serve(adapter: RoleAdapter, socket: zmq.Socket) -> None:
    """Answer commands until ``shutdown``; each command runs to completion in turn."""
    while True:
        request = socket.recv_pyobj()
        op = request.get("op")
        if op == SHUTDOWN:
            # No adapter.teardown() here: the process exits next, which frees every
            # engine resource, and sglang's teardown can block on its own daemon
            # threads (Mooncake's joins for 3 s), a cost paid by every role of every cell.
            socket.send_pyobj({"ok": True, "value": None})
            return
        if op not in ALLOWED_OPS:
            socket.send_pyobj(_reply_error(ValueError(f"unknown role op {op!r}")))
            continue
        try:
            if op == "request_kv":  # the rows whose bytes are copied at this room's Success (R-XFER-2)
                kwargs = request.get("kwargs", {})
                adapter.success_bytes.requested(kwargs["room"], kwargs["pages"], kwargs["aux_slot"])
            before = adapter.status_before_clear(request["kwargs"]["room"]) if op == "clear" else None
            value = getattr(adapter, op)(**request.get("kwargs", {}))
            if op == "clear" and value is None:  # the statuses the lifecycle ended on (R-TERM-1)
                value = {"before": before}
            if op == "observe" and isinstance(value, dict):  # processes the implementation started, still alive
                value["processes"] = [describe(pid) for pid in children()]
                if request.get("kwargs", {}).get("residue", True):  # the end of the cell: each open room's statuses
                    value["statuses"] = _open_statuses(adapter, request["kwargs"].get("rooms") or ())
            payload = pickle.dumps({"ok": True, "value": value})
        except BaseException as exc:  # reported to the driver, never fatal here
            payload = pickle.dumps(_reply_error(exc))
        socket.send(payload)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.drive.role_host")
    parser.add_argument("--impl", required=True)
    parser.add_argument("--role", required=True, choices=["prefill", "decode"])
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--parent-pid", type=int, default=os.getppid())
    parser.add_argument("--host", default=None, help="address to listen on (default: the run's, bind_address())")
    args = parser.parse_args(argv)
    args.host = args.host or bind_address()

    _watch_parent(args.parent_pid)
    become_subreaper()  # a process the implementation starts in a new session stays ours, and is ended
    recorder = RoleRecorder().install()

    from harness.implementations import load_role_adapter

    adapter = load_role_adapter(args.impl, role=args.role, recorder=recorder)
    message_loss.install()  # every control message received is audited; a loss plan can be set (R-LOSS-1, R-LOAD-1)

    ctx = zmq.Context()
    socket = ctx.socket(zmq.REP)
    socket.setsockopt(zmq.LINGER, 0)
    port = socket.bind_to_random_port(f"tcp://{args.host}")
    from harness.nofollow import write_atomic

    write_atomic(args.ready_file, f"tcp://{args.host}:{port}\n{os.getpid()}\n".encode())  # no link followed
    try:
        serve(adapter, socket)
    finally:
        socket.close(0)
        ctx.term()
        for stray in kill_descendants():  # none may outlive the role
            print(f"role host: ended a process the implementation left running: {stray}", flush=True)
    # sglang's daemon threads may block in recv forever: leave without joining them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
