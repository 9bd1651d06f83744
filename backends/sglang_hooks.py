"""What the harness hooks into sglang's Common classes (backends/sglang_common.py): the
interleaving points, the ABORT_ACK tap, engine fault wrappers, the layout-planning shell,
and the per-room residue a manager keeps.

:class:`CommonHooks` is a mixin of :class:`backends.sglang_common.SglangCommonRole`; it
expects the attributes that class sets (``conn``, ``manager``, ``points``, ``receivers``,
the ABORT_ACK list and the fault counters).
"""

from __future__ import annotations

import importlib
import socket
import time

from harness.role.adapter import Unsupported
from harness.role.faults import EngineFaultCounter


def wait_for_tcp_port(host: str, port: int, timeout_s: float) -> None:
    """Block until ``host:port`` accepts a TCP connection; TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s:.0f} s") from None
            time.sleep(0.05)


class ReceiveTap:
    """Pass-through around a manager's ZMQ receive socket (``server_socket``) that
    shows every message the control thread takes to ``on_message`` (the message
    frames, a list of bytes) before returning it; everything else goes to the
    real socket.  sglang 0.5.17 - 0.5.18 managers only call ``recv_multipart`` on it."""

    def __init__(self, sock, on_message):
        self._sock = sock
        self._on_message = on_message

    def recv_multipart(self, *args, **kwargs):
        msg = self._sock.recv_multipart(*args, **kwargs)
        self._on_message(msg)
        return msg

    def __getattr__(self, name):
        return getattr(self._sock, name)


class CommonHooks:
    """The hook half of a Common-based role adapter (see the module docstring)."""

    def _install_point_hooks(self) -> None:
        """Wrap the sglang methods behind :attr:`POINTS` (in this role process only).
        An unarmed point costs one lock round trip per call."""
        from sglang.srt.disaggregation.common.utils import FastQueue

        host = self.host  # self.points is looked up at each hit: begin_program gives a long-lived role new points
        manager_cls = getattr(self.conn, self.manager_class)
        # sglang >= 0.5.22 hands every ABORT_ACK to handle_abort_ack_message
        # (common/conn.py); 0.5.17 - 0.5.18 have no such method: Mooncake's decode
        # control thread takes the ACK inline (mooncake/conn.py start_decode_thread),
        # so the adapter reads it from the socket that thread receives on.
        tap_acks = not hasattr(manager_cls, "handle_abort_ack_message")
        for point, name in (("prefill-control-started", self.prefill_control_method),
                            ("decode-control-started", self.decode_control_method)):
            original = getattr(manager_cls, name, None)
            if original is None or getattr(original, "__pdconform_point__", False):
                continue

            def started(mgr, *args, _original=original, _point=point, _name=name, **kwargs):
                if tap_acks and _point == "decode-control-started":
                    mgr.server_socket = ReceiveTap(mgr.server_socket, self._note_if_ack)
                result = _original(mgr, *args, **kwargs)
                self.points.hit(_point, endpoint=f"tcp://{host}:{mgr.rank_port}", method=_name)
                return result

            started.__pdconform_point__ = True
            setattr(manager_cls, name, started)
        original_ack = getattr(manager_cls, "handle_abort_ack_message", None)
        if original_ack is not None and not getattr(original_ack, "__pdconform_point__", False):
            def handle_abort_ack_message(mgr, msg, _original=original_ack):
                self._note_if_ack(msg)
                return _original(mgr, msg)

            handle_abort_ack_message.__pdconform_point__ = True
            manager_cls.handle_abort_ack_message = handle_abort_ack_message
        if not getattr(FastQueue.get, "__pdconform_point__", False):
            original_get = FastQueue.get

            def get(queue):
                item = original_get(queue)
                room = getattr(item, "room", None)
                if room is None:  # sglang 0.5.17 - 0.5.18 Mori queues _TransferChunk(sender, ...) (mori/conn.py)
                    room = getattr(getattr(item, "sender", None), "bootstrap_room", None)
                if room is not None:
                    self.points.hit(self.WORKER_POINT, room=room)
                return item

            get.__pdconform_point__ = True
            FastQueue.get = get

    def _note_if_ack(self, msg: list) -> None:
        if msg and msg[0] == b"ABORT_ACK":
            self._note_ack(msg)

    def _note_ack(self, msg: list) -> None:
        """Record an ABORT_ACK as the decode's control thread takes it (Common wire:
        ``[ABORT_ACK, room(, prefill_rank, generation)]``); unparsable fields are None."""
        def field(i: int):
            try:
                return int(msg[i].decode("ascii"))
            except (IndexError, ValueError, UnicodeDecodeError, AttributeError):
                return None

        with self._acks_lock:
            self._acks.append({"room": field(1), "generation": field(3), "sender": field(2), "t": time.time()})

    def abort_acks(self) -> list[dict]:
        with self._acks_lock:
            return list(self._acks)

    def _tap_abort_generations(self) -> None:
        """Note every generation the decode's manager arms for an ABORT
        (``register_deferred_abort_room``, common/conn.py; the AbortNotification carries it)
        for :meth:`aborts_sent`.  Releases without deferred release have no such method."""
        arm = getattr(self.manager, "register_deferred_abort_room", None)
        if arm is None:
            return

        def armed(room, *args, **kwargs):
            generation = arm(room, *args, **kwargs)
            with self._acks_lock:
                self._aborts.append({"room": int(room), "generation": generation, "t": time.time()})
            return generation

        self.manager.register_deferred_abort_room = armed

    def aborts_sent(self) -> list[dict]:
        with self._acks_lock:
            return list(self._aborts)

    def abort_frames(self, room: int) -> list[bytes]:
        """Common's ``AbortNotification(room, local_ip, rank_port, generation).to_zmq()``
        (common/conn.py) with this decode's address; the generation is the one the
        room's receiver armed for deferred release, if any.  sglang 0.5.17 - 0.5.18
        have no AbortNotification: ``CommonKVReceiver._send_abort_notification``
        sends ``[ABORT, room, local_ip, rank_port]`` (no generation)."""
        common = importlib.import_module("sglang.srt.disaggregation.common.conn")
        AbortNotification = getattr(common, "AbortNotification", None)
        if AbortNotification is None:
            return [b"ABORT", str(room).encode("ascii"), self.manager.local_ip.encode("ascii"),
                    str(self.manager.rank_port).encode("ascii")]
        receiver = self.receivers.get(room)
        generation = getattr(receiver, "_abort_generation", None) if receiver is not None else None
        return AbortNotification(room=room, decode_ip=self.manager.local_ip, decode_port=self.manager.rank_port,
                                 generation=generation).to_zmq()

    def status_frames(self, room: int, status: int) -> list[bytes]:
        """Common's own status encoder, ``_encode_kv_status_message`` (common/conn.py, sglang
        >= 0.5.22): ``[tag?, room, status, prefill rank, reason?]``, the message
        ``send_kv_status_message`` pushes to the decode when a room concludes (with this
        backend's tag: NIXL ``KV_STATUS``, Mori its guard).  It names no lifecycle.  Older
        releases sent their status in per-backend shapes (NIXL 0.5.17 in transfer
        notifications, not a control message), so there it is Unsupported."""
        encode = getattr(self.manager, "_encode_kv_status_message", None)
        if encode is None:
            raise Unsupported(f"sglang {self.sglang_version} has no Common status encoder "
                              "(_encode_kv_status_message); its status message is not rebuilt here")
        return [bytes(part) for part in encode(bootstrap_room=room, status=int(status), failure_reason=None)]

    def set_engine_faults(self, **plan) -> dict:
        """Wrap this manager's engine so it injects ``plan`` (an :class:`EngineFaultPlan`'s
        fields); the wrapper passes everything else through to the real engine."""
        if self.manager is None:
            raise RuntimeError("start the manager before setting engine faults")
        counter = EngineFaultCounter(self._engine_plan(plan))
        if self._fault_counter is not None:  # a new plan counts afresh; the old one may still log
            self._past_counters.append(self._fault_counter)  # (a delayed call finishing under it)
        self._fault_counter = counter
        self.wrap_engine(counter)  # also for a plan without engine faults: it replaces the last one's
        if counter.plan.aux_delay_s and not getattr(self, "_aux_delay_installed", False):
            self.delay_aux()
            self._aux_delay_installed = True  # once: it reads the plan in force at each send
        return counter.plan.to_dict()

    def wrap_engine(self, counter: EngineFaultCounter) -> None:
        """Put a fault-injecting wrapper around the manager's engine (per backend)."""
        raise Unsupported(f"{self.impl} has no engine fault wrapper")

    def delay_aux(self) -> None:
        """Make each room's aux data arrive ``aux_delay_s`` late (the plan in force when it is
        sent): the manager's ``send_aux`` (mooncake/conn.py, nixl/conn.py: an engine write of
        the aux slot, or a control message on the connection that then carries the room's
        status) starts that much later on the thread that calls it, so what that thread
        sends after it waits too, as behind a slow write or a held TCP segment.  A backend
        that sends aux on a connection of its own overrides this (Mori)."""
        manager = self.manager
        send_aux = manager.send_aux

        def delayed_send_aux(*args, **kwargs):
            counter = self._fault_counter
            if counter is not None and counter.plan.aux_delay_s:
                counter.note_aux_delay(f"{type(manager).__name__}.send_aux")
                time.sleep(counter.plan.aux_delay_s)
            return send_aux(*args, **kwargs)

        manager.send_aux = delayed_send_aux

    def fault_log(self) -> list[dict]:
        counters = self._past_counters + ([self._fault_counter] if self._fault_counter else [])
        return [entry for counter in counters for entry in counter.snapshot()]

    SRC_BASE, DST_BASE = 1 << 40, 2 << 40  # fake pointers: base + buffer index

    def plan_layouts(self, specs: list[dict]) -> list[dict]:
        """The backend's own KV pairing for each spec, on a manager shell (an
        uninitialised instance of the backend's manager class whose ``kv_args`` holds
        the prefill stage, the draft entry count and no layer ids, as sglang's plain
        MHA/MLA pools publish none).  :meth:`plan_one` says which sglang function
        pairs buffers for this backend; an exception is a visible refusal
        (``rejected``)."""
        from types import SimpleNamespace

        from harness.spec.layouts import buffer_counts

        manager_cls = getattr(self.conn, self.manager_class)
        out = []
        for spec in specs:
            n_src, n_dst = buffer_counts(spec)
            start, end, draft = spec["prefill"]
            mla = spec["attention"] == "MLA"
            shell = object.__new__(manager_cls)
            shell.kv_args = SimpleNamespace(prefill_start_layer=start, prefill_end_layer=end, kv_layer_ids=[],
                                            num_draft_entries=draft * (1 if mla else 2), mla_compression_ratios=None,
                                            kv_item_lens=[256] * n_src)
            shell.pp_size = spec["stages"]
            shell.is_mla_backend, shell.is_hybrid_mla_backend = mla, False
            try:
                pairs = self.plan_one(shell, mla, n_src, n_dst)
            except Exception as exc:  # the transfer (or the peer's registration) fails here, visibly
                out.append({"rejected": f"{type(exc).__name__}: {exc}"})
                continue
            out.append({"pairs": [list(p) for p in pairs]})
        return out

    def plan_one(self, shell, mla: bool, n_src: int, n_dst: int) -> list[tuple[int, int]]:
        """Mooncake's pairing for plain pools: ``get_mha_kv_ptrs_with_pp`` /
        ``get_mla_kv_ptrs_with_pp`` (``common/conn.py``, called from
        ``MooncakeKVManager._send_kvcache_generic``), fed pointers that encode buffer
        indices; pointer pairs ``src_k[i]``/``dst_k[i]`` (and V) read back as indices."""
        src = [self.SRC_BASE + i for i in range(n_src)]
        dst = [self.DST_BASE + j for j in range(n_dst)]
        if mla:
            s_ptrs, d_ptrs, layers = shell.get_mla_kv_ptrs_with_pp(src, dst)
            pointer_pairs = [(s_ptrs[i], d_ptrs[i]) for i in range(layers)]
        else:
            s_k, s_v, d_k, d_v, layers = shell.get_mha_kv_ptrs_with_pp(src, dst)
            pointer_pairs = [(s_k[i], d_k[i]) for i in range(layers)] + [(s_v[i], d_v[i]) for i in range(layers)]
        return [(s - self.SRC_BASE, d - self.DST_BASE) for s, d in pointer_pairs]
