"""Talking to a role process: one call at a time over its ZMQ command socket, checked
against the adapter contract (harness.role.adapter.CONTRACT) before it is sent."""

from __future__ import annotations

import time
from typing import Any

import zmq

from harness.drive.errors import RoleError, RoleTimeout
from harness.drive.launcher import RoleHandle
from harness.role.adapter import check_call


class RoleClient:
    """Calls :class:`harness.role.adapter.RoleAdapter` methods on a role, with a deadline each.

    After a timeout the REQ socket cannot be reused: the client marks itself
    broken and every later call raises RoleError at once; a role whose process
    exits while a call is pending is noticed within ``POLL_SLICE_S``.  ``shift``: a cell on a
    warm role pair moves its rooms on the way in and back on the way out
    (harness.drive.room_shift); None: rooms go as they are.
    """

    POLL_SLICE_S = 0.1

    def __init__(self, ctx: zmq.Context, name: str, endpoint: str, handle: RoleHandle | None = None):
        self.name = name
        self.endpoint = endpoint
        self._ctx = ctx
        self._socket = ctx.socket(zmq.REQ)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(endpoint)
        self._handle = handle
        self.broken: str | None = None
        self.timed_out = False  # a call got no answer within its bound (then ``broken`` says which)
        self._pending: str | None = None
        self.shift = None  # harness.drive.room_shift.RoomShift of the cell now served, or None

    def call(self, op: str, deadline_s: float, **kwargs: Any) -> Any:
        """Run ``op(**kwargs)`` on the role; RoleTimeout after ``deadline_s`` seconds,
        RoleError (with the remote traceback) when the op raised."""
        self.send(op, **kwargs)
        return self.result(deadline_s)

    @property
    def pending(self) -> str | None:
        """The op sent whose reply :meth:`result` has not read yet (None: none)."""
        return self._pending

    def send(self, op: str, **kwargs: Any) -> None:
        """Start ``op(**kwargs)`` on the role without waiting (read its reply with :meth:`result`),
        so that several roles can work at once.  RoleError when the client is broken or a
        reply is still unread; harness.role.adapter.ContractError when the adapter contract
        has no such op or the op takes no such arguments."""
        if self.broken:
            raise RoleError(f"{self.name} is not answering ({self.broken})")
        if self._pending is not None:
            raise RoleError(f"{self.name}: {op} sent while the reply to {self._pending} is unread")
        check_call(op, kwargs)  # a harness bug, raised here, not in the role
        self._socket.send_pyobj({"op": op, "kwargs": self.shift.out(kwargs) if self.shift else kwargs})
        self._pending = op

    def result(self, deadline_s: float) -> Any:
        """The reply to the op :meth:`send` started: its value; RoleTimeout when none came
        within ``deadline_s`` seconds, RoleError when the op raised or the role's process ended."""
        op = self._pending
        if op is None:
            raise RoleError(f"{self.name}: no op is waiting for a reply")
        deadline = time.monotonic() + deadline_s
        while not self._socket.poll(int(self.POLL_SLICE_S * 1000), zmq.POLLIN):
            if self._handle is not None and not self._handle.alive():
                self.broken = f"its process ended ({self._handle.exit_description()}) while {op} was running"
                raise RoleError(f"{self.name}: {self.broken}")
            if time.monotonic() > deadline:
                self.broken = f"{op} got no answer within {deadline_s:.1f} s"
                self.timed_out = True  # the harness's own bound expired (harness.judge.load counts it as timing)
                raise RoleTimeout(f"{self.name}: {self.broken}")
        reply = self._socket.recv_pyobj()
        if self.shift is not None:
            reply = self.shift.back(reply)
        self._pending = None
        if reply.get("ok"):
            return reply.get("value")
        raise RoleError(
            f"{self.name}.{op} raised {reply.get('error')}: {reply.get('message')}",
            remote_error=reply.get("error"),
            remote_traceback=reply.get("traceback", ""),
            unsupported=bool(reply.get("unsupported")),
            remote_message=reply.get("message"),
        )

    def close(self) -> None:
        self._socket.close(0)
