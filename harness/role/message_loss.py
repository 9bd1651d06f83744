"""Message loss by kind: a role process drops chosen control messages it sends (R-LOSS-1).

The nemesis step :class:`harness.spec.steps.LoseMessages` asks a role to lose the ``nth``
message of one *kind* it sends on the control path (``count`` of them from there on; 0:
every later one), optionally only those of one bootstrap room: a STATUS lost on its way to
the decode, a registration on its way to the prefill, an ABORT, an ABORT_ACK, an AUX_DATA
message, a WATERMARK or STAGING_RSP.  sglang #29978 is such a loss: a lost STAGING_RSP or
WATERMARK hung its transfer for ever.

Where: every control message of sglang's Common managers and of pdconform's reference
leaves its process through :meth:`zmq.Socket.send_multipart` (sglang's ``_connect`` and the
receivers' ``_connect`` hand out PUSH sockets; Mori's ``_connect_threadsafe`` too; the
reference's ``ControlSide.send``).  :func:`install` wraps that method once per process; a
dropped message is not sent at all and the call returns as if it had been (lost on the
wire).  The harness's own calls to a role use plain ``send``, never this path.

What is what: :func:`classify` reads a message's kind and room from its frames, by the wire
formats of ``sglang/srt/disaggregation/common/conn.py`` (the tagged ``ABORT``, ``ABORT_ACK``,
``KV_STATUS``, ``AUX_DATA``, ``WATERMARK``, ``STAGING_RSP``, ``CHUNK_READY`` and deferred
``BOOTSTRAP`` messages; the untagged KV status ``[room, status, rank(, reason)]``; a decode's
registration ``[room or "None", ip, port, ...]``; either behind NIXL's ``NixlMsgGuard`` or Mori's
``MoriMsgGuard`` frame there)
and of the reference (backends/reference/wire.py: ``REGISTER``, ``STATUS``; its aux travels
in a ``WRITE`` frame with the aux flag set, which counts as its ``aux_data`` message, while
its KV ``WRITE`` frames are its engine and no message kind).  A registration
with room ``None`` is the decode's KV-args registration (kind ``kv_args``), not a room's.
"""

from __future__ import annotations

import threading
import time

#: the kinds a LoseMessages step may name
KINDS = ("registration", "kv_args", "status", "abort", "abort_ack", "aux_data", "watermark", "staging_rsp",
         "chunk_ready")
_TAGS = {b"ABORT": "abort", b"ABORT_ACK": "abort_ack", b"KV_STATUS": "status", b"STATUS": "status",
         b"AUX_DATA": "aux_data", b"WATERMARK": "watermark", b"STAGING_RSP": "staging_rsp",
         b"CHUNK_READY": "chunk_ready", b"BOOTSTRAP": "registration", b"REGISTER": "registration"}
_GUARD = b"MsgGuard"  # NIXL's ``NixlMsgGuard``, Mori's ``MoriMsgGuard``


def _int(frame) -> int | None:
    try:
        text = bytes(frame).decode("ascii")
        return int(text) if text.strip() == text and text.lstrip("-").isdigit() else None
    except (UnicodeDecodeError, ValueError, TypeError):
        return None


def classify(parts) -> tuple[str, int | None] | None:
    """``(kind, room)`` of a multipart control message (``room`` None when it names none), or
    None for a message of no kind in :data:`KINDS` (see the module docstring)."""
    frames = [bytes(p) for p in parts]
    if not frames:
        return None
    if frames[0].endswith(_GUARD):  # a backend's guard frame (NIXL's, Mori's) before an untagged message
        frames = frames[1:]
    kind = _TAGS.get(frames[0]) if frames else None
    if frames and frames[0] == b"WRITE":  # the reference's writes: its aux write is its aux message
        return ("aux_data", _int(frames[1])) if len(frames) > 4 and frames[4] == b"1" else None
    if kind is not None:
        room = _int(frames[1]) if len(frames) > 1 and kind != "watermark" else None
        return kind, room
    if len(frames) in (3, 4) and all(_int(f) is not None for f in frames[:3]):
        return "status", _int(frames[0])  # Common's untagged KV status (Mooncake, Mori)
    if len(frames) >= 5 and (frames[0] == b"None" or _int(frames[0]) is not None) and _int(frames[2]) is not None:
        return ("kv_args", None) if frames[0] == b"None" else ("registration", _int(frames[0]))
    return None


class MessageLoss:
    """The loss plan of one role process and the log of what it dropped.  Thread-safe: any
    thread of the implementation may send."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.plan: dict | None = None
        self.seen = 0
        self.log: list[dict] = []

    def set(self, kind: str | None, room: int | None = None, nth: int = 1, count: int = 1) -> dict:
        """Lose messages of ``kind`` (of ``room`` only when given) from the ``nth`` (1-based)
        on, ``count`` of them (0: every later one); ``kind`` None heals.  ValueError for an
        unknown kind or counts out of range."""
        if kind is not None and kind not in KINDS:
            raise ValueError(f"no message kind {kind!r} (kinds: {', '.join(KINDS)})")
        for name, value, low in (("nth", nth, 1), ("count", count, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        with self._lock:
            self.plan = None if kind is None else {"kind": kind, "room": room, "nth": nth, "count": count}
            self.seen = 0
            return dict(self.plan or {})

    def drops(self, parts) -> bool:
        """Whether to lose this message (and log it when so)."""
        plan = self.plan
        if plan is None:
            return False
        found = classify(parts)
        if found is None or found[0] != plan["kind"] or (plan["room"] is not None and found[1] != plan["room"]):
            return False
        with self._lock:
            self.seen += 1
            nth, count = plan["nth"], plan["count"]
            lose = self.seen >= nth and (count == 0 or self.seen < nth + count)
            if lose:
                self.log.append({"fault": "message-lost", "kind": found[0], "room": found[1], "nth": self.seen,
                                 "what": f"{found[0]} message #{self.seen}"
                                         + (f" of room {found[1]}" if found[1] is not None else "") + " lost",
                                 "t": time.time()})
            return lose

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.log)

    def forget(self) -> None:
        """Heal and forget the log (a warm role's next program, harness.drive.pair); the
        receive audit starts again too."""
        with self._lock:
            self.plan, self.seen, self.log = None, 0, []
        AUDIT.forget()


#: messages of no kind above that a control socket may still carry whole: the reference's KV
#: writes and their answers, staging's prefetch request
OTHER_TAGS = (b"WRITE", b"WRITE_DONE", b"STAGING_REQ")


def _address(frame: bytes) -> bool:
    """Whether a frame reads as a host or address (a registration's second field): a name or an
    IPv4/IPv6 address (a zone id too), not a number and not another message's tag."""
    try:
        text = frame.decode("ascii")
    except UnicodeDecodeError:
        return False
    if not text or _int(frame) is not None or frame in _TAGS or frame in OTHER_TAGS or frame.endswith(_GUARD):
        return False
    return all(c.isalnum() or c in ".:-[]_/%" for c in text)


def whole(parts) -> bool:
    """Whether a received multipart message is one whole message of a known kind: no frames of
    two messages interleaved on a shared socket (sglang #29984).  Its kind must be known
    (:func:`classify`, or :data:`OTHER_TAGS`), a status must read ``room, status (0-4), rank``
    with at most a reason after, and an untagged registration must name an address second."""
    frames = [bytes(p) for p in parts]
    found = classify(frames)
    if found is None:
        return bool(frames) and frames[0] in OTHER_TAGS
    body = frames[1:] if frames[0].endswith(_GUARD) or frames[0] in (b"KV_STATUS",) else frames
    if found[0] == "status" and frames[0] != b"STATUS":
        return len(body) in (3, 4) and _int(body[1]) in range(5) and _int(body[2]) is not None
    if found[0] in ("registration", "kv_args") and frames[0] not in _TAGS:
        return len(body) >= 4 and _address(body[1])
    return True


class Audit:
    """What one role process's control sockets received: a count and the messages that were
    not :func:`whole` (the first few, as text).  Thread-safe."""

    KEEP = 5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.received = 0
        self.broken: list[str] = []
        self.broken_count = 0

    def see(self, parts) -> None:
        ok = whole(parts)
        with self._lock:
            self.received += 1
            if not ok:
                self.broken_count += 1
                if len(self.broken) < self.KEEP:
                    self.broken.append(repr([bytes(p)[:40] for p in parts][:8])[:300])

    def snapshot(self) -> dict:
        with self._lock:
            return {"received": self.received, "not_whole": self.broken_count, "examples": list(self.broken)}

    def forget(self) -> None:
        with self._lock:
            self.received, self.broken, self.broken_count = 0, [], 0


#: the process's one loss plan (a role process is one role) and its receive audit
LOSS = MessageLoss()
AUDIT = Audit()
_installed = threading.Lock()
_INSTALLED: list[bool] = []


def install() -> None:
    """Wrap :meth:`zmq.Socket.send_multipart` (once per process) so that every message
    :data:`LOSS` drops is not sent, and :meth:`zmq.Socket.recv_multipart` so that :data:`AUDIT`
    sees every message a PULL socket receives (a role's control sockets; its monitor sockets
    and the harness's own calls are not PULL)."""
    import zmq

    with _installed:
        if _INSTALLED:
            return
        original, received = zmq.Socket.send_multipart, zmq.Socket.recv_multipart

        def send_multipart(self, msg_parts, *args, **kwargs):
            if LOSS.plan is not None and LOSS.drops(msg_parts):
                return None  # lost on the wire: the sender cannot tell
            return original(self, msg_parts, *args, **kwargs)

        def recv_multipart(self, *args, **kwargs):
            parts = received(self, *args, **kwargs)
            if self.type == zmq.PULL:
                AUDIT.see(parts)
            return parts

        zmq.Socket.send_multipart, zmq.Socket.recv_multipart = send_multipart, recv_multipart
        _INSTALLED.append(True)
