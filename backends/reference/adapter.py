"""The reference implementation's real driver: the sans-I/O cores on real I/O.

Runs :class:`PrefillCore` / :class:`DecodeCore` in a role process like any
backend, so it can be killed, frozen and sent malformed frames:

* control and data over ZMQ on loopback: each side binds a PULL socket and
  PUSHes to its peer's; KV bytes travel in WRITE frames and the decode applies
  them to its torch pools (the decode's copy stands for the RDMA write landing);
* an HTTP endpoint on the prefill's bootstrap port: ``/health`` (heartbeat) and
  ``/bootstrap`` (the prefill's control endpoint and KV layout);
* torch CPU pools filled with the :mod:`harness.role.pattern` tags;
* layout pairs from :mod:`backends.reference.planner` (a rejected layout fails
  the room at bootstrap with the reason, R-LAYOUT-2).

Wire frames (ASCII fields, like the Common protocol's)::

    D->P  REGISTER   room decode_endpoint generation dst_pages(csv) aux_slot
    D->P  ABORT      room decode_endpoint generation
    P->D  WRITE      room generation write_id aux(0|1) dst(csv) payload prefill_endpoint
    D->P  WRITE_DONE room write_id ok(0|1) reason
    P->D  STATUS     room generation status reason
    P->D  ABORT_ACK  room generation

A frame that does not parse, or whose handling fails, is dropped with a warning
(R-LIVE-1): nothing a peer sends can stop a control thread.  The decode answers
every WRITE with WRITE_DONE to the endpoint in the frame, whatever the room's
state, as an RDMA completion would.  All core calls happen on the side's
control thread; API calls post work to it and wait for the answer.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import zmq

from backends.reference import decode_core as dc
from backends.reference import prefill_core as pc
from backends.reference.shared_events import Clear
from backends.reference.planner import LayoutSpec, Plan, Rejection, SideLayout, plan
from harness.role import pattern
from harness.role.adapter import BOOTSTRAPPING, FAILED, Layout, RoleAdapter, RoleRecorder
from harness.role.faults import FAIL, EngineFaultCounter, EngineFaultPlan
from harness.role.pools import pattern_pools

log = logging.getLogger("pdconform.reference")


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
HOST = "127.0.0.1"
TICK_S = 0.05
HEALTH_TIMEOUT_S = 1.0


class MalformedFrame(ValueError):
    """A control frame that does not parse."""


ENDPOINT = re.compile(r"^tcp://[A-Za-z0-9.\-]+:\d{1,5}$")


def endpoint(frame: bytes) -> str:
    """A ``tcp://host:port`` endpoint field; MalformedFrame otherwise."""
    text = frame.decode("ascii")
    if not ENDPOINT.match(text):
        raise MalformedFrame(f"bad endpoint {text[:64]!r}")
    return text


def _csv(values) -> bytes:
    return ",".join(str(int(v)) for v in values).encode("ascii")


def _ints(frame: bytes) -> tuple[int, ...]:
    text = frame.decode("ascii")
    return tuple(int(x) for x in text.split(",")) if text else ()


def parse(frames: list[bytes]) -> tuple[str, list[bytes]]:
    """Split a multipart message into its tag and fields; MalformedFrame when the
    tag is unknown or the field count is wrong."""
    arity = {b"REGISTER": 5, b"ABORT": 3, b"WRITE": 7, b"WRITE_DONE": 4, b"STATUS": 4, b"ABORT_ACK": 2}
    if not frames or frames[0] not in arity:
        raise MalformedFrame(f"unknown tag {frames[0][:32]!r}" if frames else "empty message")
    if len(frames) - 1 != arity[frames[0]]:
        raise MalformedFrame(f"{frames[0].decode()} with {len(frames) - 1} fields, expected {arity[frames[0]]}")
    return frames[0].decode(), frames[1:]


class _Side:
    """A control thread that owns one core, one PULL socket and the PUSH sockets."""

    def __init__(self, name: str, handle_frames, on_tick):
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.port = self.pull.bind_to_random_port(f"tcp://{HOST}")
        self.endpoint = f"tcp://{HOST}:{self.port}"
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
            try:
                sock.connect(endpoint)
            except zmq.ZMQError as exc:
                sock.close(0)
                log.warning("cannot connect to %s: %s", endpoint, exc)
                return
            self.push[endpoint] = sock
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("dropped a %s frame to %s: send queue full", frames[0][:16], endpoint)
        except zmq.ZMQError as exc:
            log.warning("could not send a %s frame to %s: %s", frames[0][:16], endpoint, exc)

    def _loop(self) -> None:
        next_tick = time.monotonic()
        while not self.stop.is_set():
            ready = dict(self.poller.poll(int(max(0.0, next_tick - time.monotonic()) * 1000)))
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
            if ready.get(self.pull):
                frames = self.pull.recv_multipart()
                try:
                    self.handle_frames(frames)
                except (MalformedFrame, UnicodeDecodeError, ValueError) as exc:
                    log.warning("dropped a malformed control frame: %s", exc)  # R-LIVE-1
                except Exception as exc:  # handling failed: still never fatal (R-LIVE-1)
                    log.warning("dropped a control frame it could not handle: %r", exc)
            while True:
                try:
                    fn = self.inbox.get_nowait()
                except queue.Empty:
                    break
                try:
                    fn()
                except Exception as exc:  # an API call's own error goes back to its caller via _sync
                    log.error("control work failed: %r", exc)
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
        for sock in self.push.values():
            sock.close(0)
        self.pull.close(0)
        self.ctx.term()


class ReferenceRole(RoleAdapter):
    """The reference implementation's role adapter (engine: ``reference``).

    Chunks go through a transfer worker thread (``reference-prefill-transfer``)
    before they reach the core, as the backends' chunks go through their transfer
    queues; the worker is where the ``worker-take-chunk`` point pauses.  The
    reference's "engine" is its WRITE frames: each KV or aux write is one transfer
    for :meth:`set_engine_faults`.
    """

    impl = "reference"
    POINTS = {
        "prefill-control-started": "ReferenceRole.start_prefill: the prefill control thread has just started",
        "decode-control-started": "ReferenceRole.start_decode: the decode control thread has just started",
        "worker-take-chunk": "the prefill transfer worker has taken a chunk from its queue and not yet handed it "
                             "to the core",
    }

    def __init__(self, role: str, recorder: RoleRecorder):
        self.role = role
        self.recorder = recorder
        self.recorder.logger_prefixes = tuple(recorder.logger_prefixes) + ("pdconform.reference",)
        self.side: _Side | None = None
        self.http: ThreadingHTTPServer | None = None
        self.buffers: list[tuple[pattern.BufferSpec, Any]] = []
        self.layout: Layout | None = None
        self.status: dict[int, int] = {}
        self.reasons: dict[int, str] = {}
        self.rooms_seen: list[int] = []
        self.threads: list[threading.Thread] = []
        self.prefill: pc.PrefillCore | None = None
        self.decode: dc.DecodeCore | None = None
        self.peer: dict[int, str] = {}  # decode: room -> prefill control endpoint
        self.plans: dict[int, Plan] = {}
        self.chunks: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.fault_counter: EngineFaultCounter | None = None
        self.past_counters: list[EngineFaultCounter] = []
        self.acks: list[dict] = []  # decode: ABORT_ACKs received
        self.bootstrap_timeout_s = env_seconds("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 30.0)
        self.waiting_timeout_s = env_seconds("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0)
        self.deferred_release = env_flag("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", True)

    def engine(self) -> str:
        return "reference"

    # ---- pools -------------------------------------------------------------------
    def _pools(self, side: int, layout: Layout) -> None:
        kv, aux = pattern_pools(side, layout)
        self.buffers = kv + [aux]

    def _layout_plan(self, prefill: Layout) -> Plan | Rejection:
        """Plan the room's buffer pairs by identity with :func:`backends.reference.planner.plan`
        (pipeline stages and draft KV included), or reject a layout this pair cannot serve
        (R-LAYOUT-2): a different attention kind, model, page geometry or heads."""
        mine = self.layout
        for field_name in ("mla", "num_layers", "page_size", "page_bytes", "aux_bytes", "kv_heads"):
            theirs, ours = getattr(prefill, field_name), getattr(mine, field_name)
            if theirs != ours:
                return Rejection(f"prefill {field_name}={theirs} but decode {field_name}={ours}")

        def side(layout: Layout) -> SideLayout:
            return SideLayout(layout.main_layers.start, layout.main_layers.stop, layout.draft_layers)

        return plan(LayoutSpec("MLA" if mine.mla else "MHA", mine.num_layers, side(prefill), side(mine),
                               mine.page_size, mine.kv_heads))

    def _record(self, room: int, status: int, reason: str) -> None:
        self.status[room] = status
        if status == FAILED:
            self.reasons[room] = reason

    # ---- prefill -----------------------------------------------------------------
    def start_prefill(self, layout: dict, bootstrap_port: int) -> dict:
        self.layout = Layout(**layout)
        self._pools(pattern.PREFILL, self.layout)
        # A write that never completes fails its room after the waiting timeout, the
        # longest its decode would wait for the result (R-TIMEOUT-3).
        self.prefill = pc.PrefillCore(bootstrap_timeout_s=self.bootstrap_timeout_s,
                                      deferred_release=self.deferred_release,
                                      transfer_timeout_s=self.waiting_timeout_s)
        self.side = _Side("prefill", self._prefill_frames, lambda now: self._prefill_event(pc.Tick(now)))
        info = json.dumps({"endpoint": self.side.endpoint, "layout": layout}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server API)
                body = b"ok" if self.path == "/health" else info if self.path == "/bootstrap" else None
                self.send_response(200 if body else 404)
                self.end_headers()
                if body:
                    self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer((HOST, bootstrap_port), Handler)
        http_thread = threading.Thread(target=self.http.serve_forever, name="reference-bootstrap-http", daemon=True)
        http_thread.start()
        worker = threading.Thread(target=self._transfer_worker, name="reference-prefill-transfer", daemon=True)
        worker.start()
        self.side.thread.start()
        self.points.hit("prefill-control-started", endpoint=self.side.endpoint)
        self.threads = [self.side.thread, http_thread, worker]
        return {"mode": "prefill", "bootstrap_addr": f"{HOST}:{bootstrap_port}", "engine": self.engine(),
                "rank_port": self.side.port, "deferred_release": self.deferred_release,
                "bootstrap_timeout_s": self.bootstrap_timeout_s}

    def _prefill_event(self, event) -> None:
        for action in self.prefill.handle(event):
            if isinstance(action, pc.StartWrite):
                self._start_write(action)
            elif isinstance(action, pc.SendStatus):
                self.side.send(action.decode, [b"STATUS", str(action.room).encode(), str(action.generation).encode(),
                                               str(action.status).encode(), action.reason.encode()])
            elif isinstance(action, pc.SendAbortAck):
                self.side.send(action.decode, [b"ABORT_ACK", str(action.room).encode(),
                                               str(action.generation).encode()])
            elif isinstance(action, pc.StatusChanged):
                self._record(action.room, action.status, action.reason)
            elif isinstance(action, pc.Log):
                getattr(log, action.level if action.level != "debug" else "debug")(action.message)

    def _transfer_worker(self) -> None:
        while not self.stopping.is_set():
            try:
                room, pages = self.chunks.get(timeout=0.1)
            except queue.Empty:
                continue
            self.points.hit("worker-take-chunk", room=room)
            self.side.submit(lambda room=room, pages=pages: self._send_chunk_now(room, pages))

    def _send_chunk_now(self, room: int, pages: list[int]) -> None:
        r = self.prefill.rooms.get(room)
        last = r is not None and r.num_pages is not None and r.sent + len(pages) >= r.num_pages
        self._prefill_event(pc.SendChunk(room, tuple(pages), last))

    def set_engine_faults(self, **plan) -> dict:
        """Faults on the reference's writes (each KV or aux WRITE is one transfer and
        one group): a failed write is not sent and completes with ok=0; a delayed one
        is sent ``delay_s`` later; one that never completes is never sent."""
        counter = EngineFaultCounter(EngineFaultPlan(**plan))
        if self.fault_counter is not None:  # a new plan counts afresh; the old one's log is kept
            self.past_counters.append(self.fault_counter)
        self.fault_counter = counter
        return counter.plan.to_dict()

    def fault_log(self) -> list[dict]:
        counters = self.past_counters + ([self.fault_counter] if self.fault_counter else [])
        return [entry for counter in counters for entry in counter.snapshot()]

    def plan_layouts(self, specs: list[dict]) -> list[dict]:
        """The reference planner (:func:`backends.reference.planner.plan`) on each spec."""
        from harness.spec.layouts import to_spec

        out = []
        for spec in specs:
            result = plan(to_spec(spec))
            out.append({"pairs": [[p.src, p.dst] for p in result.pairs]} if isinstance(result, Plan)
                       else {"rejected": result.reason})
        return out

    def _start_write(self, w: pc.StartWrite) -> None:
        if self.fault_counter is None:
            self._send_write(w)
            return
        counter = self.fault_counter
        what = f"{'aux' if w.aux else 'KV'} write {w.write_id} of room {w.room}"
        nth = counter.transfers + 1
        verdict = counter.next_transfer(what, counter.next_group(), sleep=False)  # numbered in issue order
        if verdict == FAIL:
            done = pc.WriteDone(w.room, w.write_id, False, f"engine fault injected on transfer {nth}")
            self.side.submit(lambda: self._prefill_event(done))
        elif verdict is None and counter.plan.delay_s:
            threading.Timer(counter.plan.delay_s, lambda: self.side.submit(lambda: self._send_write(w))).start()
        elif verdict is None:
            self._send_write(w)

    def _send_write(self, w: pc.StartWrite) -> None:
        if w.write_id not in self.prefill.issued:
            return  # declared lost at the transfer timeout: the reference's engine cancels it, so it never lands
        generation = w.generation
        if w.aux:
            payload = b"".join(t[list(w.src)].numpy().tobytes() for s, t in self.buffers if s.kind == pattern.AUX)
        else:
            payload = b"".join(t[list(w.src)].numpy().tobytes() for s, t in self.buffers if s.kind != pattern.AUX)
        self.side.send(w.decode, [b"WRITE", str(w.room).encode(), str(generation).encode(), str(w.write_id).encode(),
                                  b"1" if w.aux else b"0", _csv(w.dst), payload, self.side.endpoint.encode()])

    def _prefill_frames(self, frames: list[bytes]) -> None:
        tag, f = parse(frames)
        if tag == "REGISTER":
            self._prefill_event(pc.DecodeRegistered(int(f[0]), endpoint(f[1]), _ints(f[3]), int(f[4]), int(f[2])))
        elif tag == "ABORT":
            self._prefill_event(pc.AbortReceived(int(f[0]), endpoint(f[1]), int(f[2])))
        elif tag == "WRITE_DONE":
            self._prefill_event(pc.WriteDone(int(f[0]), int(f[1]), f[2] == b"1", f[3].decode("utf-8", "replace")))
        else:
            raise MalformedFrame(f"{tag} is not a message a prefill receives")

    def open_sender(self, room: int, bootstrap_addr: str, destinations: int = 1) -> None:
        self.rooms_seen.append(room)
        self.status.setdefault(room, BOOTSTRAPPING)
        self.side.submit(lambda: self._prefill_event(pc.OpenSender(room, time.monotonic(), destinations)))

    def init_sender(self, room: int, num_pages: int, aux_slot: int) -> None:
        self.side.submit(lambda: self._prefill_event(pc.InitSender(room, num_pages, aux_slot)))

    def send_chunk(self, room: int, pages: list[int]) -> None:
        self.chunks.put((room, list(pages)))

    # ---- decode ------------------------------------------------------------------
    def start_decode(self, layout: dict, bootstrap_port: int, attn_tp: tuple[int, int] = (1, 0)) -> dict:
        # The reference's prefill takes the destination count from open_sender; a
        # decode rank needs no rank of its own (MLA: each rank gets the whole KV).
        self.layout = Layout(**layout)
        self._pools(pattern.DECODE, self.layout)
        self.decode = dc.DecodeCore(
            waiting_timeout_s=self.waiting_timeout_s,
            heartbeat_interval_s=max(env_seconds("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 2.0), 2.0),
            heartbeat_max_failures=max(int(env_seconds("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)), 1),
            deferred_release=self.deferred_release)
        self.side = _Side("decode", self._decode_frames, lambda now: self._decode_event(dc.Tick(now)))
        self.probes: queue.Queue = queue.Queue()
        probe_thread = threading.Thread(target=self._probe_loop, name="reference-heartbeat", daemon=True)
        probe_thread.start()
        self.side.thread.start()
        self.points.hit("decode-control-started", endpoint=self.side.endpoint)
        self.threads = [self.side.thread, probe_thread]
        return {"mode": "decode", "engine": self.engine(), "rank_port": self.side.port,
                "heartbeat_window_s": self.decode.heartbeat_interval_s * self.decode.heartbeat_max_failures,
                "waiting_timeout_s": self.waiting_timeout_s, "deferred_release": self.deferred_release}

    def _probe_loop(self) -> None:
        while True:
            prefill = self.probes.get()
            try:
                with urllib.request.urlopen(f"http://{prefill}/health", timeout=HEALTH_TIMEOUT_S) as reply:
                    ok = reply.status == 200
            except OSError:
                ok = False
            now = time.monotonic()
            self.side.submit(lambda p=prefill, ok=ok, now=now: self._decode_event(dc.HeartbeatResult(p, ok, now)))

    def _decode_event(self, event) -> None:
        for action in self.decode.handle(event):
            if isinstance(action, dc.SendRegistration):
                self.side.send(self.peer[action.room], [
                    b"REGISTER", str(action.room).encode(), self.side.endpoint.encode(),
                    str(action.generation).encode(), _csv(action.dst_pages), str(action.aux_slot).encode()])
            elif isinstance(action, dc.SendAbort):
                self.side.send(self.peer[action.room], [b"ABORT", str(action.room).encode(),
                                                        self.side.endpoint.encode(), str(action.generation).encode()])
            elif isinstance(action, dc.ProbeHealth):
                self.probes.put(action.prefill)
            elif isinstance(action, dc.StatusChanged):
                self._record(action.room, action.status, action.reason)

    def _decode_frames(self, frames: list[bytes]) -> None:
        tag, f = parse(frames)
        if tag == "WRITE":
            room, write_id, aux, dst, payload = int(f[0]), int(f[2]), f[3] == b"1", _ints(f[4]), f[5]
            reply_to = endpoint(f[6])
            ok, reason = self._apply_write(room, aux, dst, payload)
            self.side.send(reply_to, [b"WRITE_DONE", str(room).encode(), str(write_id).encode(),
                                      b"1" if ok else b"0", reason.encode()])
        elif tag == "STATUS":
            room = int(f[0])
            prefill = self.decode.rooms[room].prefill if room in self.decode.rooms else ""
            self._decode_event(dc.StatusReceived(room, prefill, int(f[2]), f[3].decode("utf-8", "replace"), int(f[1])))
        elif tag == "ABORT_ACK":
            self.acks.append({"room": int(f[0]), "generation": int(f[1]), "t": time.time()})
            self._decode_event(dc.AbortAckReceived(int(f[0]), int(f[1])))
        else:
            raise MalformedFrame(f"{tag} is not a message a decode receives")

    def _apply_write(self, room: int, aux: bool, dst: tuple[int, ...], payload: bytes) -> tuple[bool, str]:
        """Land a WRITE in the pools, buffer by buffer following the room's plan."""
        import torch

        targets = [(s, t) for s, t in self.buffers if (s.kind == pattern.AUX) == aux]
        if not aux and room in self.plans:
            order = [p.dst for p in self.plans[room].pairs]
            kv = [b for b in self.buffers if b[0].kind != pattern.AUX]
            targets = [kv[i] for i in order]
        row = targets[0][1].shape[1] if targets else 0
        if len(payload) != row * len(dst) * len(targets):
            return False, f"payload of {len(payload)} bytes does not fit {len(dst)} pages x {len(targets)} buffers"
        if any(not 0 <= d < t.shape[0] for d in dst for _, t in targets):
            return False, f"destination {dst} outside the pool"
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(len(targets), len(dst), row)
        for i, (_, tensor) in enumerate(targets):
            tensor[list(dst)] = data[i]
        return True, ""

    def open_receiver(self, room: int, bootstrap_addr: str, timeout_s: float) -> None:
        self.rooms_seen.append(room)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"http://{bootstrap_addr}/bootstrap", timeout=HEALTH_TIMEOUT_S) as reply:
                    info = json.loads(reply.read())
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"prefill bootstrap at {bootstrap_addr} did not answer within {timeout_s:.0f} s")
                time.sleep(0.05)
        self.peer[room] = info["endpoint"]
        result = self._layout_plan(Layout(**info["layout"]))
        self.status.setdefault(room, BOOTSTRAPPING)

        def open_room() -> None:
            self._decode_event(dc.OpenReceiver(room, bootstrap_addr, time.monotonic()))
            if isinstance(result, Plan):
                self.plans[room] = result
            else:  # R-LAYOUT-2: rejected at bootstrap, visibly
                log.error("room %s: layout rejected: %s", room, result.reason)
                self.decode.rooms[room].status = FAILED
                self._record(room, FAILED, f"layout rejected: {result.reason}")

        self.side.submit(open_room)

    def request_kv(self, room: int, pages: list[int], aux_slot: int) -> None:
        self.side.submit(lambda: self._decode_event(dc.RequestKV(room, tuple(pages), aux_slot, time.monotonic())))

    def verify(self, kv_moves: list, aux_moves: list, unchecked_kv: list = (), unchecked_aux: list = (),
               sent_layers: list | None = None) -> dict:
        # on the control thread: no write lands while the pools are read
        return self._sync(lambda: pattern.verify_pools(self.buffers, [tuple(m) for m in kv_moves],
                                                       [tuple(m) for m in aux_moves],
                                                       unchecked_kv, unchecked_aux, sent_layers).to_dict())

    # ---- either side -----------------------------------------------------------
    def _sync(self, fn, timeout_s: float = 10.0):
        """Run ``fn`` on the control thread and return its result (or raise its error)."""
        done = threading.Event()
        box: dict = {}

        def work() -> None:
            try:
                box["value"] = fn()
            except Exception as exc:
                box["error"] = exc
            finally:
                done.set()

        self.side.submit(work)
        if not done.wait(timeout_s):
            raise TimeoutError(f"the {self.role} control thread did not answer within {timeout_s:.0f} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def poll(self, room: int) -> int:
        if room not in self.status:
            raise KeyError(f"room {room} is not open on this {self.role}")
        return self._sync(lambda: self.status[room])

    def failure_reason(self, room: int) -> str | None:
        return self._sync(lambda: self.reasons.get(room))

    def clear(self, room: int) -> None:
        event = Clear(room)
        handler = self._prefill_event if self.role == "prefill" else self._decode_event

        def clear() -> None:
            handler(event)
            self.status.pop(room, None)
            self.reasons.pop(room, None)
            self.plans.pop(room, None)
            if self.role == "decode":
                self.peer.pop(room, None)

        self._sync(lambda: clear())

    def abort(self, room: int) -> None:
        event = pc.LocalAbort(room) if self.role == "prefill" else dc.Abort(room)
        handler = self._prefill_event if self.role == "prefill" else self._decode_event
        self._sync(lambda: handler(event))

    # ---- wire messages for field scenarios ---------------------------------------
    def abort_frames(self, room: int) -> list[bytes]:
        """The reference decode's ABORT for ``room``'s current lifecycle (generation 0
        when this decode holds no receiver for it)."""
        def build() -> list[bytes]:
            r = self.decode.rooms.get(room)
            return [b"ABORT", str(room).encode(), self.side.endpoint.encode(),
                    str(r.generation if r is not None else 0).encode()]

        return self._sync(build)

    def abort_acks(self) -> list[dict]:
        return self._sync(lambda: list(self.acks))

    def observe(self) -> dict:
        core = self.prefill or self.decode
        residue = self._sync(core.residue) if core else {}
        rooms: dict[int, list[str]] = {}
        remembered: dict[int, list[str]] = {}
        for attr, held in residue.items():
            into = remembered if attr in pc.ENDED_GENERATION_MEMORY else rooms
            for room in held:
                if isinstance(room, int):
                    into.setdefault(room, []).append(attr)
        return self.recorder.observation(self.role, self.threads, rooms, remembered)

    def teardown(self) -> None:
        self.stopping.set()
        if self.http is not None:
            self.http.shutdown()
        if self.side is not None:
            self.side.close()
