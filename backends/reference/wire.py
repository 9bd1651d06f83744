"""The reference's wire: its frames, their parsing, and the control loop each side runs.

Wire frames (ASCII fields, like the Common protocol's)::

    D->P  REGISTER   room decode_endpoint generation dst_pages(csv) aux_slot
    D->P  ABORT      room decode_endpoint generation
    P->D  WRITE      room generation write_id aux(0|1) dst(csv) payload prefill_endpoint
    D->P  WRITE_DONE room write_id ok(0|1) reason
    P->D  STATUS     room generation status reason [prefill_endpoint]
    P->D  ABORT_ACK  room generation [prefill_endpoint]

(a prefill of several pipeline stages has one endpoint per stage; the decode tells
the stages' STATUS and ABORT_ACK apart by it, and takes a message without it as stage 0's)

A frame that does not parse, or whose handling fails, is dropped with a warning
(R-LIVE-1): nothing a peer sends can stop a control thread.  The decode answers
every WRITE with WRITE_DONE to the endpoint in the frame, whatever the room's
state, as an RDMA completion would.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from harness.target.role_context import bind_address

log = logging.getLogger("pdconform.reference")


def status_frame(room: int, generation: int, status: int, reason: str = "", prefill_endpoint: str = "") -> list[bytes]:
    """P->D ``STATUS``: the prefill's (stage's, at ``prefill_endpoint``) status of the decode's lifecycle ``generation``."""
    return [b"STATUS", str(room).encode(), str(generation).encode(), str(int(status)).encode(), reason.encode(),
            prefill_endpoint.encode()]


def abort_frame(room: int, decode_endpoint: str, generation: int) -> list[bytes]:
    """D->P ``ABORT`` of the decode's lifecycle ``generation``; ABORT_ACK goes to ``decode_endpoint``."""
    return [b"ABORT", str(room).encode(), decode_endpoint.encode(), str(generation).encode()]


def abort_ack_frame(room: int, generation: int, prefill_endpoint: str) -> list[bytes]:
    """P->D ``ABORT_ACK`` of the decode's lifecycle ``generation``, from the stage at ``prefill_endpoint``."""
    return [b"ABORT_ACK", str(room).encode(), str(generation).encode(), prefill_endpoint.encode()]


def register_frame(room: int, decode_endpoint: str, generation: int, dst_pages, aux_slot: int) -> list[bytes]:
    """D->P ``REGISTER``: the decode's lifecycle ``generation`` of ``room`` wants ``dst_pages`` and ``aux_slot``."""
    return [b"REGISTER", str(room).encode(), decode_endpoint.encode(), str(generation).encode(), csv(dst_pages),
            str(aux_slot).encode()]


def env_seconds(name: str, default: float) -> float:
    """A timeout knob from the role's environment (sglang's variable names, so one
    scenario setting reaches every implementation); ValueError names a bad value."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"{name}={raw!r} must be above 0 seconds")
    return value


def env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else raw.strip().lower() in ("1", "true", "yes", "on")


TICK_S = 0.05
# a health probe's bound on connecting and on each read (seconds): as patient as sglang's probe (2 s to
# connect, 3 s to read), so a slow link that TCP rides out is no missed probe (R-NET-2; network-heartbeat-delay)
HEALTH_TIMEOUT_S = 3.0


class MalformedFrame(ValueError):
    """A control frame that does not parse."""


ENDPOINT = re.compile(r"^tcp://[A-Za-z0-9.\-]+:\d{1,5}$")


def endpoint(frame: bytes) -> str:
    """A ``tcp://host:port`` endpoint field; MalformedFrame otherwise."""
    text = frame.decode("ascii")
    if not ENDPOINT.match(text):
        raise MalformedFrame(f"bad endpoint {text[:64]!r}")
    return text


def csv(values) -> bytes:
    return ",".join(str(int(v)) for v in values).encode("ascii")


def ints(frame: bytes) -> tuple[int, ...]:
    text = frame.decode("ascii")
    return tuple(int(x) for x in text.split(",")) if text else ()


def parse(frames: list[bytes]) -> tuple[str, list[bytes]]:
    """Split a multipart message into its tag and fields; MalformedFrame when the
    tag is unknown or the field count is wrong."""
    arity = {b"REGISTER": 5, b"ABORT": 3, b"WRITE": 7, b"WRITE_DONE": 4, b"STATUS": 4, b"ABORT_ACK": 2}
    optional = {b"STATUS": 1, b"ABORT_ACK": 1}  # the sending stage's endpoint
    if not frames or frames[0] not in arity:
        raise MalformedFrame(f"unknown tag {frames[0][:32]!r}" if frames else "empty message")
    least = arity[frames[0]]
    if not least <= len(frames) - 1 <= least + optional.get(frames[0], 0):
        most = least + optional.get(frames[0], 0)
        raise MalformedFrame(f"{frames[0].decode()} with {len(frames) - 1} fields, expected {least}"
                             + (f" or {most}" if most != least else ""))
    return frames[0].decode(), frames[1:]


#: what a PUSH socket's monitor reports when its peer is gone: the connection closed (the peer's
#: process ended, so its kernel closed the socket), or a connection attempt failed and is retried
#: (nothing listens on the endpoint any more)
PEER_LOST_EVENTS = {zmq.EVENT_DISCONNECTED: "its connection closed",
                    zmq.EVENT_CONNECT_RETRIED: "it refuses connections"}


class ControlSide:
    """A control thread that owns one core, one PULL socket and the PUSH sockets.

    ``on_peer_lost(endpoint, why)``, when given, is called on the control thread once a peer the
    side pushes to is gone (:data:`PEER_LOST_EVENTS`, seen by a monitor on each PUSH socket): the
    socket is closed first, dropping every frame still queued for that peer, so nothing sent
    before the loss reaches a peer that later listens on the same endpoint; the next frame to it
    connects afresh.  The prefill's engine reports its writes to a lost decode failed there
    (R-PEER-1: a prefill learns of its decode's death only through its writes)."""

    def __init__(self, name: str, handle_frames, on_tick, on_peer_lost=None):
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        host = bind_address()  # loopback unless ``run --bind``
        self.port = self.pull.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{host}:{self.port}"
        self.push: dict[str, zmq.Socket] = {}
        self.inbox: queue.Queue = queue.Queue()
        # a byte on this pipe wakes the loop for inbox work (instead of waiting out TICK_S)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self.poller = zmq.Poller()
        self.poller.register(self.pull, zmq.POLLIN)
        self.poller.register(self._wake_r, zmq.POLLIN)
        self.handle_frames = handle_frames
        self.on_tick = on_tick
        self.on_peer_lost = on_peer_lost
        self.monitors: dict[zmq.Socket, str] = {}  # a PUSH socket's monitor -> the endpoint it connects to
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"reference-{name}-control", daemon=True)

    def submit(self, fn) -> None:
        """Run ``fn()`` on the control thread, as soon as it finishes what it is doing (any thread)."""
        self.inbox.put(fn)
        try:
            os.write(self._wake_w, b"w")
        except BlockingIOError:  # the pipe is full of wake-ups already
            pass
        except OSError:  # closed: the side is stopping
            pass

    def send(self, endpoint: str, frames: list[bytes]) -> None:
        sock = self.push.get(endpoint)
        if sock is None:
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 10000)
            lost = zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
            monitor = sock.get_monitor_socket(lost) if self.on_peer_lost else None
            try:
                sock.connect(endpoint)
            except zmq.ZMQError as exc:
                self._close_push(sock, monitor)
                log.warning("cannot connect to %s: %s", endpoint, exc)
                if self.on_peer_lost:  # later: send may run inside the handling of another event
                    self.submit(lambda why=f"cannot connect: {exc}": self.on_peer_lost(endpoint, why))
                return
            self.push[endpoint] = sock
            if monitor is not None:
                self.monitors[monitor] = endpoint
                self.poller.register(monitor, zmq.POLLIN)
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("dropped a %s frame to %s: send queue full", frames[0][:16], endpoint)
        except zmq.ZMQError as exc:
            log.warning("could not send a %s frame to %s: %s", frames[0][:16], endpoint, exc)

    @staticmethod
    def _close_push(sock: zmq.Socket, monitor: zmq.Socket | None) -> None:
        """Close a PUSH socket at once (LINGER 0: its queued frames are dropped) and its monitor."""
        if monitor is not None:
            sock.disable_monitor()
            monitor.close(0)
        sock.close(0)

    def _peer_event(self, monitor: zmq.Socket) -> None:
        """Read one event of a PUSH socket's monitor; when it says the peer is gone, close that
        socket and tell :attr:`on_peer_lost` (see the class docstring)."""
        event = recv_monitor_message(monitor, zmq.NOBLOCK)
        why = PEER_LOST_EVENTS.get(event["event"])
        endpoint = self.monitors.get(monitor)
        if why is None or endpoint is None:
            return
        self.poller.unregister(monitor)
        del self.monitors[monitor]
        self._close_push(self.push.pop(endpoint), monitor)
        log.warning("peer %s is gone: %s", endpoint, why)
        self.on_peer_lost(endpoint, why)

    def _loop(self) -> None:
        next_tick = time.monotonic()
        while not self.stop.is_set():
            ready = dict(self.poller.poll(int(max(0.0, next_tick - time.monotonic()) * 1000)))
            for monitor in [m for m in self.monitors if ready.get(m)]:
                try:
                    self._peer_event(monitor)
                except zmq.Again:  # the event was read already
                    pass
                except Exception as exc:  # never fatal to the loop (R-LIVE-2)
                    log.error("peer monitor failed: %r", exc)
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
            # API calls first: one submitted before this wake-up returned to its caller before any
            # frame now waiting could be a reply to it (sglang's senders are made synchronously), so
            # a frame never overtakes the call that made the room it names
            while True:
                try:
                    fn = self.inbox.get_nowait()
                except queue.Empty:
                    break
                try:
                    fn()
                except Exception as exc:  # an API call's own error goes back to its caller via _sync
                    log.error("control work failed: %r", exc)
            if ready.get(self.pull):
                frames = self.pull.recv_multipart()
                try:
                    self.handle_frames(frames)
                except (MalformedFrame, UnicodeDecodeError, ValueError) as exc:
                    log.warning("dropped a malformed control frame: %s", exc)  # R-LIVE-1
                except Exception as exc:  # handling failed: still never fatal (R-LIVE-1)
                    log.warning("dropped a control frame it could not handle: %r", exc)
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + TICK_S
                self.on_tick(time.monotonic())

    def close(self) -> None:
        self.stop.set()
        self.submit(lambda: None)  # wake the loop now
        self.thread.join(timeout=2)
        if not self.thread.is_alive():
            os.close(self._wake_r)
            os.close(self._wake_w)
        for monitor in list(self.monitors):  # every socket closed, or term() would wait for it
            monitor.close(0)
        for sock in self.push.values():
            sock.close(0)
        self.pull.close(0)
        self.ctx.term()


