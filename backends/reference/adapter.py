"""The reference implementation's real driver: the sans-I/O cores on real I/O.

Runs :class:`PrefillCore` / :class:`DecodeCore` in a role process like any backend, so it
can be killed, frozen and sent malformed frames:

* control and data over ZMQ on loopback: each side binds a PULL socket and PUSHes to its
  peer's; KV bytes travel in WRITE frames and the decode applies them to its torch pools
  (the decode's copy stands for the RDMA write landing);
* an HTTP endpoint on the prefill's bootstrap port: ``/health`` and ``/bootstrap``;
* torch CPU pools with :mod:`harness.role.pattern` tags; layout pairs from :mod:`harness.spec.layout_plan`.

Wire frames and the control loop: :mod:`backends.reference.wire`.  All core calls happen on
the side's control thread; API calls post work to it and wait for the answer.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import urllib.request
from typing import Any

from backends.reference import decode_core as dc
from backends.reference import landing
from backends.reference import prefill_core as pc
from backends.reference.bootstrap import REGISTER_TIMEOUT_S, BootstrapServer, fetch_stages, register_stage, room_engine
from backends.reference.shared_events import Clear
from backends.reference.wire import (  # noqa: F401
    HEALTH_TIMEOUT_S, ControlSide, MalformedFrame, abort_ack_frame, abort_frame, csv, endpoint, env_flag, env_seconds,
    ints, parse, register_frame, status_frame)
from harness.role import pattern
from harness.role.adapter import RoleAdapter
from harness.role.faults import ENGINE_ERRORS, FAIL, SLOW, EngineFaultCounter
from harness.role.pools import pattern_pools, refill
from harness.role.recorder import RoleRecorder
from harness.spec.layout_plan import Plan, plan
from harness.spec.protocol import KVPoll, Layout
from harness.target.role_context import bind_address, staging_on

log = logging.getLogger("pdconform.reference")


class ReferenceRole(RoleAdapter):
    """The reference implementation's role adapter (engine: ``reference``).  Chunks go through
    a transfer worker thread (``reference-prefill-transfer``) before they reach the core, as
    the backends' chunks go through their transfer queues; the worker is where the
    ``worker-take-chunk`` point pauses.  The reference's "engine" is its WRITE frames: each
    KV or aux write is one transfer for :meth:`set_engine_faults`; an aux WRITE is its ``aux_data``."""

    impl, ENGINE_ERRORS = "reference", ENGINE_ERRORS  # its engine names any error kind in the failed write's reason
    MESSAGE_KINDS = ("registration", "status", "abort", "abort_ack", "aux_data")
    POINTS = {
        "prefill-control-started": "ReferenceRole.start_prefill: the prefill control thread has just started",
        "decode-control-started": "ReferenceRole.start_decode: the decode control thread has just started",
        "worker-take-chunk": "the prefill transfer worker has taken a chunk from its queue and not yet handed it "
                             "to the core",
    }

    def __init__(self, role: str, recorder: RoleRecorder):
        from backends.reference import mutants  # a planted bug, when this role runs one (pdconform mutants)

        mutants.apply_from_env()
        self.role = role
        self.recorder = recorder
        self.recorder.logger_prefixes = tuple(recorder.logger_prefixes) + ("pdconform.reference",)
        self.side: ControlSide | None = None
        self.http: BootstrapServer | None = None
        self.buffers: list[tuple[pattern.BufferSpec, Any]] = []
        self.layout: Layout | None = None
        self.status: dict[int, int] = {}
        self.reasons: dict[int, str] = {}
        self.rooms_seen: list[int] = []
        self.threads: list[threading.Thread] = []
        self.prefill: pc.PrefillCore | None = None
        self.decode: dc.DecodeCore | None = None
        self.peer: dict[int, str] = {}  # decode: room -> prefill control endpoint
        self.sources: dict[int, list[Layout]] = {}  # decode: room -> the layout of each prefill rank it takes KV from
        self.plans: dict[int, Plan] = {}
        self.chunks: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.fault_counter: EngineFaultCounter | None = None
        self.past_counters: list[EngineFaultCounter] = []
        self.acks, self.aborts, self.since = [], [], recorder.mark()  # decode: ABORT_ACKs in, ABORTs out; R-LIVE-2
        self.bootstrap_timeout_s = env_seconds("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 30.0)
        self.waiting_timeout_s = env_seconds("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0)
        self.deferred_release = env_flag("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", True)
        # staging (SGLANG_DISAGG_STAGING_BUFFER): no bytes go through staging buffers, but a
        # context counts the WATERMARKs, made before the control thread starts (R-LIVE-4)
        self.staging = staging_on()
        self.staging_ctx: dict | None = None

    def engine(self) -> str:  # no engine of its own: KV rides the control sockets, so no data path ("data_path")
        return "reference"

    # ---- pools -------------------------------------------------------------------
    def _pools(self, side: int, layout: Layout) -> None:
        kv, aux = pattern_pools(side, layout)
        self.buffers, self.pool_side = kv + [aux], side

    def _record(self, room: int, status: int, reason: str) -> None:
        self.status[room] = status
        if status == KVPoll.Failed:
            self.reasons[room] = reason

    # ---- prefill -----------------------------------------------------------------
    def start_prefill(self, layout: dict, bootstrap_port: int, pp: tuple[int, int, str] = (1, 0, ""),
                      attn_tp: tuple[int, int] = (1, 0), dp: tuple[int, int] = (1, 0)) -> dict:
        """Stage ``pp[1]`` of a prefill of ``pp[0]`` pipeline stages, attention-TP rank
        ``attn_tp[1]`` of ``attn_tp[0]``, DP engine ``dp[1]`` of ``dp[0]`` (one process each; the
        reference needs no rendezvous, ``pp[2]``): rank 0 of stage 0 of engine 0 serves the
        bootstrap server (backends/reference/bootstrap.py), every rank registers its endpoint and layout."""
        pp_size, pp_rank = int(pp[0]), int(pp[1])
        tp_size, tp_rank = int(attn_tp[0]), int(attn_tp[1])
        dp_size, dp_rank = int(dp[0]), int(dp[1])
        self.layout = Layout(**layout)
        self._pools(pattern.PREFILL, self.layout)
        # A write that never completes fails its room after the waiting timeout, the
        # longest its decode would wait for the result (R-TIMEOUT-3).
        self.prefill = pc.PrefillCore(bootstrap_timeout_s=self.bootstrap_timeout_s,
                                      deferred_release=self.deferred_release,
                                      transfer_timeout_s=self.waiting_timeout_s)
        # the reference's engine: a decode whose connection closed or is refused (killed) fails its writes
        self.side = ControlSide("prefill", self._prefill_frames, lambda now: self._prefill_event(pc.Tick(now)),
                                on_peer_lost=lambda decode, why: self._prefill_event(pc.DecodeLost(decode, why)))
        self.staging_ctx = {"watermarks": 0} if self.staging else None  # before the control thread starts
        worker = threading.Thread(target=self._transfer_worker, name="reference-prefill-transfer", daemon=True)
        self.threads = [self.side.thread, worker]
        addr = f"{bind_address()}:{bootstrap_port}"
        if pp_rank == 0 and tp_rank == 0 and dp_rank == 0:
            self.http = BootstrapServer(bootstrap_port, pp_size, tp_size, dp_size)
            self.http.register(0, self.side.endpoint, layout)
            self.http.thread.start()
            self.threads.append(self.http.thread)
        else:
            register_stage(addr, pp_rank, self.side.endpoint, layout, timeout_s=REGISTER_TIMEOUT_S, tp_rank=tp_rank,
                           dp_rank=dp_rank)
        worker.start()
        self.side.thread.start()
        self.points.hit("prefill-control-started", endpoint=self.side.endpoint)
        return {"mode": "prefill", "bootstrap_addr": addr, "engine": self.engine(), "pp": [pp_size, pp_rank],
                **({"attn_tp": [tp_size, tp_rank]} if tp_size > 1 else {}),
                **({"dp": [dp_size, dp_rank]} if dp_size > 1 else {}),
                "rank_port": self.side.port, "deferred_release": self.deferred_release,
                "bootstrap_timeout_s": self.bootstrap_timeout_s, "staging": self.staging, "data_path": False}

    def _prefill_event(self, event) -> None:
        for action in self.prefill.handle(event):
            if isinstance(action, pc.StartWrite):
                self._start_write(action)
            elif isinstance(action, pc.SendStatus):
                self.side.send(action.decode, status_frame(action.room, action.generation, action.status, action.reason,
                                                           self.side.endpoint))
            elif isinstance(action, pc.SendAbortAck):
                self.side.send(action.decode, abort_ack_frame(action.room, action.generation, self.side.endpoint))
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
        is sent ``delay_s`` later (an aux WRITE ``aux_delay_s`` more); one that never
        completes is never sent."""
        counter = EngineFaultCounter(self._engine_plan(plan))
        if self.fault_counter is not None:  # a new plan counts afresh; the old one's log is kept
            self.past_counters.append(self.fault_counter)
        self.fault_counter = counter
        return counter.plan.to_dict()

    def fault_log(self) -> list[dict]:
        counters = self.past_counters + ([self.fault_counter] if self.fault_counter else [])
        return [entry for counter in counters for entry in counter.snapshot()]

    def plan_layouts(self, specs: list[dict]) -> list[dict]:
        """The reference planner (:func:`harness.spec.layout_plan.plan`) on each spec."""
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
        what, nth = f"{'aux' if w.aux else 'KV'} write {w.write_id} of room {w.room}", counter.transfers + 1
        verdict = counter.next_transfer(what, counter.next_group(), sleep=False, defer_slow=True)  # in issue order
        if verdict == FAIL:
            done = pc.WriteDone(w.room, w.write_id, False, f"engine fault injected on transfer {nth}"
                                + (f": {counter.plan.error}" if counter.plan.error else ""))
            self.side.submit(lambda: self._prefill_event(done))
        elif verdict in (None, SLOW) and (delay := counter.plan.delay_s + (counter.plan.aux_delay_s if w.aux else 0.0)
                                          + (counter.plan.slow_s if verdict == SLOW else 0.0)):
            if w.aux and counter.plan.aux_delay_s:
                counter.note_aux_delay(what)  # and a slow write lands late while later ones go on (out of order)
            threading.Timer(delay, lambda: self.side.submit(lambda: self._send_write(w))).start()
        elif verdict is None:
            self._send_write(w)

    def _send_write(self, w: pc.StartWrite) -> None:
        if w.write_id not in self.prefill.issued:
            return  # declared lost at the transfer timeout: the reference's engine cancels it, so it never lands
        generation = w.generation
        if w.aux:
            payload = b"".join(t[list(w.src)].cpu().numpy().tobytes()
                               for s, t in self.buffers if s.kind == pattern.AUX)
        else:
            payload = b"".join(t[list(w.src)].cpu().numpy().tobytes()
                               for s, t in self.buffers if s.kind != pattern.AUX)
        self.side.send(w.decode, [b"WRITE", str(w.room).encode(), str(generation).encode(), str(w.write_id).encode(),
                                  b"1" if w.aux else b"0", csv(w.dst), payload, self.side.endpoint.encode()])

    def _prefill_frames(self, frames: list[bytes]) -> None:
        if frames and frames[0] == b"WATERMARK":  # R-LIVE-3: never fatal, staging on or off
            if self.staging_ctx is None:
                log.info("WATERMARK dropped: staging is off")
            else:
                self.staging_ctx["watermarks"] += 1
            return
        tag, f = parse(frames)
        if tag == "REGISTER":
            self._prefill_event(pc.DecodeRegistered(int(f[0]), endpoint(f[1]), ints(f[3]), int(f[4]), int(f[2])))
        elif tag == "ABORT":
            self._prefill_event(pc.AbortReceived(int(f[0]), endpoint(f[1]), int(f[2])))
        elif tag == "WRITE_DONE":
            self._prefill_event(pc.WriteDone(int(f[0]), int(f[1]), f[2] == b"1", f[3].decode("utf-8", "replace")))
        else:
            raise MalformedFrame(f"{tag} is not a message a prefill receives")

    def open_sender(self, room: int, bootstrap_addr: str, destinations: int = 1) -> None:
        self.rooms_seen.append(room)
        self.status.setdefault(room, KVPoll.Bootstrapping)
        self.side.submit(lambda: self._prefill_event(pc.OpenSender(room, time.monotonic(), destinations)))

    def init_sender(self, room: int, num_pages: int, aux_slot: int) -> None:
        self.side.submit(lambda: self._prefill_event(pc.InitSender(room, num_pages, aux_slot)))

    def send_chunk(self, room: int, pages: list[int]) -> None:
        self.chunks.put((room, list(pages)))

    # ---- decode ------------------------------------------------------------------
    def start_decode(self, layout: dict, bootstrap_port: int, attn_tp: tuple[int, int] = (1, 0),
                     dp: tuple[int, int] = (1, 0)) -> dict:
        # The reference's prefill takes the destination count from open_sender; a
        # decode rank needs no rank of its own (MLA: each rank gets the whole KV).
        self.layout = Layout(**layout)
        self._pools(pattern.DECODE, self.layout)
        self.decode = dc.DecodeCore(
            waiting_timeout_s=self.waiting_timeout_s,
            heartbeat_interval_s=max(env_seconds("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 2.0), 2.0),
            heartbeat_max_failures=max(int(env_seconds("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)), 1),
            deferred_release=self.deferred_release)
        self.side = ControlSide("decode", self._decode_frames, lambda now: self._decode_event(dc.Tick(now)))
        self.probes: queue.Queue = queue.Queue()
        probe_thread = threading.Thread(target=self._probe_loop, name="reference-heartbeat", daemon=True)
        probe_thread.start()
        self.side.thread.start()
        self.points.hit("decode-control-started", endpoint=self.side.endpoint)
        self.threads = [self.side.thread, probe_thread]
        return {"mode": "decode", "engine": self.engine(), "rank_port": self.side.port, "data_path": False,
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
            if isinstance(action, dc.SendRegistration):  # to every pipeline stage of the prefill
                for stage in self.peer[action.room]:
                    self.side.send(stage, register_frame(action.room, self.side.endpoint, action.generation,
                                                         action.dst_pages, action.aux_slot))
            elif isinstance(action, dc.SendAbort):
                self.aborts.append({"room": action.room, "generation": action.generation, "t": time.time()})
                for stage in self.peer[action.room]:
                    self.side.send(stage, abort_frame(action.room, self.side.endpoint, action.generation))
            elif isinstance(action, dc.ProbeHealth):
                self.probes.put(action.prefill)
            elif isinstance(action, dc.StatusChanged):
                self._record(action.room, action.status, action.reason)

    def _decode_frames(self, frames: list[bytes]) -> None:
        tag, f = parse(frames)
        if tag == "WRITE":
            room, write_id, aux, dst, payload = int(f[0]), int(f[2]), f[3] == b"1", ints(f[4]), f[5]
            reply_to = endpoint(f[6])
            ok, reason = self._apply_write(room, aux, dst, payload, self._stage(room, reply_to))
            self.side.send(reply_to, [b"WRITE_DONE", str(room).encode(), str(write_id).encode(),
                                      b"1" if ok else b"0", reason.encode()])
        elif tag == "STATUS":
            room = int(f[0])
            prefill = self.decode.rooms[room].prefill if room in self.decode.rooms else ""
            stage = self._stage(room, f[4].decode("ascii", "replace") if len(f) > 4 else "")
            self._decode_event(dc.StatusReceived(room, prefill, int(f[2]), f[3].decode("utf-8", "replace"), int(f[1]),
                                                 stage))
        elif tag == "ABORT_ACK":
            room, generation = int(f[0]), int(f[1])
            stage = self._stage(room, f[2].decode("ascii", "replace") if len(f) > 2 else "")
            self.acks.append({"room": room, "generation": generation, "sender": stage, "t": time.time()})
            self._decode_event(dc.AbortAckReceived(room, generation, stage))
        else:
            raise MalformedFrame(f"{tag} is not a message a decode receives")

    def _stage(self, room: int, prefill_endpoint: str) -> int:
        """Which pipeline stage of ``room``'s prefill sent from ``prefill_endpoint`` (0 when unknown)."""
        stages = self.peer.get(room) or []
        return stages.index(prefill_endpoint) if prefill_endpoint in stages else 0

    def _apply_write(self, room: int, aux: bool, dst: tuple[int, ...], payload: bytes, stage: int = 0
                     ) -> tuple[bool, str]:
        """Land a WRITE in the pools, following the plan of the room's prefill rank ``stage``
        (backends/reference/landing.py)."""
        plan_ = self.plans[room][stage] if not aux and room in self.plans else None
        source = (self.sources.get(room) or [self.layout])[stage] if not aux else None
        return landing.apply_write(self.buffers, self.layout, plan_, source, aux, dst, payload)

    def open_receiver(self, room: int, bootstrap_addr: str, timeout_s: float) -> None:
        self.rooms_seen.append(room)
        stages = landing.chosen_ranks(room_engine(fetch_stages(bootstrap_addr, timeout_s), room), self.layout)
        self.peer[room] = [stage["endpoint"] for stage in stages]
        self.sources[room] = [Layout(**stage["layout"]) for stage in stages]
        results = [landing.layout_plan(layout, self.layout) for layout in self.sources[room]]
        rejected = next((r for r in results if not isinstance(r, Plan)), None)
        self.status.setdefault(room, KVPoll.Bootstrapping)

        def open_room() -> None:
            self._decode_event(dc.OpenReceiver(room, bootstrap_addr, time.monotonic(), stages=len(stages)))
            if rejected is None:
                self.plans[room] = results
            else:  # R-LAYOUT-2: rejected at bootstrap, visibly
                log.error("room %s: layout rejected: %s", room, rejected.reason)
                self.decode.rooms[room].status = KVPoll.Failed
                self._record(room, KVPoll.Failed, f"layout rejected: {rejected.reason}")

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
        """Run ``fn`` on the control thread and return its result (or raise its error); at
        once on the calling thread when the control thread has died (nothing races it then,
        and a dead loop must not make every poll wait ``timeout_s``)."""
        if not self.side.thread.is_alive():
            return fn()
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
                self.sources.pop(room, None)

        self._sync(lambda: clear())

    def abort(self, room: int) -> None:
        event = pc.LocalAbort(room) if self.role == "prefill" else dc.Abort(room)
        handler = self._prefill_event if self.role == "prefill" else self._decode_event
        self._sync(lambda: handler(event))

    # ---- wire messages for field scenarios ---------------------------------------
    def abort_frames(self, room: int) -> list[bytes]:
        """The reference decode's ABORT for ``room``'s current lifecycle (generation 0
        when this decode holds no receiver for it)."""
        return self._sync(lambda: abort_frame(room, self.side.endpoint, getattr(self.decode.rooms.get(room),
                                                                                  "generation", 0)))

    def abort_acks(self) -> list[dict]:
        return self._sync(lambda: list(self.acks))

    def aborts_sent(self) -> list[dict]:
        return self._sync(lambda: list(self.aborts))

    def status_frames(self, room: int, status: int) -> list[bytes]:
        """The STATUS this prefill sends its decode for ``room``'s current lifecycle
        (``[STATUS, room, generation, status, reason]``, backends/reference/wire.py), with
        the generation of the registration bound to the room (0 when none is)."""
        def build() -> list[bytes]:
            r = self.prefill.rooms.get(room)
            return status_frame(room, next(iter(r.dests.values())).generation if r is not None and r.dests else 0, status,
                                "", self.side.endpoint)

        return self._sync(build)

    #: where the reference keeps per-room state: its core and its own maps (the rest of the
    #: adapter is the harness's view: recorder, points, fault plans, ABORT_ACK log)
    STATE = ("prefill", "decode", "status", "reasons", "plans", "peer", "sources")

    def observe(self, rooms: list[int] = (), residue: bool = True) -> dict:
        """Threads, logs and per-room residue: a deep walk (harness.role.residue) of
        :attr:`STATE` for every room of the cell; the bounded memory of ended generations
        (pc.ENDED_GENERATION_MEMORY) is reported apart, as ``remembered``."""
        import types

        from harness.role.residue import find_rooms

        wanted = set(rooms) | set(self.rooms_seen)
        view = types.SimpleNamespace(**{name: getattr(self, name) for name in self.STATE})

        def walk_all():  # on the control thread: every room held too, opened by the harness or not
            cores = [c for c in (self.prefill, self.decode) if c is not None]
            return find_rooms(view, wanted | set(self.status) | {r for c in cores for r in c.rooms})

        walk = self._sync(walk_all) if self.side and residue else None
        held: dict[int, list[str]] = {}
        remembered: dict[int, list[str]] = {}
        for room, paths in (walk.rooms if walk else {}).items():
            for path in paths:
                core, _, rest = path.partition(".")
                ended = core in ("prefill", "decode") and rest.split("[")[0] in pc.ENDED_GENERATION_MEMORY
                (remembered if ended else held).setdefault(room, []).append(path)
        return self.recorder.observation(self.role, self.threads, held, remembered,
                                         residue_incomplete=walk.incomplete if walk else "", since=self.since)

    def teardown(self) -> None:
        self.stopping.set()
        if self.http is not None:
            self.http.shutdown()
        if self.side is not None:
            self.side.close()

    def begin_program(self) -> dict:
        """See :meth:`RoleAdapter.begin_program`; on the control thread (no write lands meanwhile)."""
        def forget() -> dict:
            self.fault_counter, self.past_counters = None, []
            del self.acks[:], self.aborts[:]
            self._forget_points()
            self.recorder.clear()
            self.rooms_seen = []
            return {"buffers": refill(self.buffers, self.pool_side, self.layout)}

        return self._sync(forget)
