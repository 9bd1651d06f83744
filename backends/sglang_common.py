"""Shared role adapter for sglang backends built on the Common protocol classes.

Mooncake, NIXL and Mori each subclass sglang's ``CommonKVManager``,
``CommonKVSender``, ``CommonKVReceiver`` and ``CommonKVBootstrapServer``
(``sglang/srt/disaggregation/common/conn.py``), so one adapter drives all three;
a backend's subclass names its ``conn`` module and classes, starts its engine and
fills backend-specific ``KVArgs`` fields.

The adapter drives the managers the way sglang's schedulers do
(``disaggregation/prefill.py`` and ``decode.py``):

* prefill: ``Sender(mgr, bootstrap_addr, room)`` -> ``init(num_pages, aux_index)``
  once the sender is WaitingForInput -> ``send(page_indices)`` per chunk;
* decode: ``Receiver(mgr, bootstrap_addr, room)`` ->
  ``mgr.try_ensure_parallel_info(addr)`` until true -> ``init(prefill_dp_rank=0)``
  -> ``send_metadata(page_indices, aux_index, state_indices=None)``.

Two shapes of the Common classes are supported (``harness.implementations``
declares the releases): the current one (sglang >= 0.5.22: ``AbortNotification``,
``handle_abort_ack_message``, deferred decode release) and the one before it
(0.5.17 - 0.5.18).  Where they differ the adapter checks for the capability in the
imported sglang, not the version string, and says which file and release the
other branch mirrors; a step the older release cannot take raises
:class:`Unsupported` naming the release and what it lacks.
"""

from __future__ import annotations

import importlib
import inspect
import threading
import time
from typing import Any, ClassVar

from backends.sglang_hooks import CommonHooks, wait_for_tcp_port
from harness.role import pattern
from harness.role.adapter import RoleAdapter, Unsupported
from harness.role.faults import EngineFaultCounter
from harness.role.pools import pattern_pools, refill
from harness.role.recorder import RoleRecorder
from harness.spec.protocol import DRAFT_BASE, Layout
from harness.target import gpu_import_shims, role_context
from harness.target.version import sglang_version


class SglangCommonRole(CommonHooks, RoleAdapter):
    """Drives one side of a Common-protocol sglang backend inside a role process.

    Subclasses set ``backend`` (sglang's ``--disaggregation-transfer-backend``),
    ``conn_module`` and the four class names, and override :meth:`init_engine`,
    :meth:`engine` and :meth:`fill_backend_kv_args` as needed.
    """

    backend: ClassVar[str]
    conn_module: ClassVar[str]
    manager_class: ClassVar[str]
    sender_class: ClassVar[str]
    receiver_class: ClassVar[str]
    bootstrap_class: ClassVar[str]
    #: the manager methods that start the prefill's and the decode's control thread
    prefill_control_method: ClassVar[str]
    decode_control_method: ClassVar[str]
    #: the Common control messages (common/conn.py, common/staging_handler.py), by kind
    #: (harness.role.message_loss); a backend that sends its aux as a message adds ``aux_data``
    MESSAGE_KINDS = ("registration", "kv_args", "status", "abort", "abort_ack", "watermark", "staging_rsp",
                     "chunk_ready")

    @property
    def host(self) -> str:
        """The address the bootstrap server listens on (harness.target.role_context.bind_address)."""
        return role_context.bind_address()
    WORKER_POINT = "worker-take-chunk"

    @classmethod
    def points_for(cls) -> dict[str, str]:
        """The interleaving points every Common-based backend offers, named after the
        sglang code they wrap."""
        return {
            "prefill-control-started": f"{cls.manager_class}.{cls.prefill_control_method}() has returned: "
                                       "the prefill constructor, right after its control thread started",
            "decode-control-started": f"{cls.manager_class}.{cls.decode_control_method}() has returned: "
                                      "the decode constructor, right after its control thread started",
            cls.WORKER_POINT: "transfer worker: FastQueue.get() (common/utils.py) has handed it a chunk "
                              "it has not looked at yet",
        }

    def __init__(self, role: str, recorder: RoleRecorder):
        self.role = role
        self.recorder = recorder
        role_context.apply_role_env()
        self.prepare_imports()
        gpu_import_shims.install()
        self.conn = importlib.import_module(self.conn_module)
        self.sglang_version = sglang_version()
        self.manager = None
        self.bootstrap_server = None
        self.buffers: list[tuple[pattern.BufferSpec, Any]] = []
        self.pool_of: tuple | None = None  # (side, layout) the pools were filled for
        self.senders: dict[int, Any] = {}
        self.receivers: dict[int, Any] = {}
        self.rooms_seen: list[int] = []
        self.tp_rank = 0
        self.pp_rank = 0
        self._threads: list[threading.Thread] = []
        self._fault_counter: EngineFaultCounter | None = None
        self._past_counters: list[EngineFaultCounter] = []
        self._acks: list[dict] = []
        self._aborts: list[dict] = []  # decode: the ABORT generations it armed (aborts_sent)
        self._acks_lock = threading.Lock()
        self.POINTS = self.points_for()
        # Control-thread points whose wrapped method this release's manager lacks:
        # point -> why (arm_point answers Unsupported with it).
        self.missing_points: dict[str, str] = {}
        manager_cls = getattr(self.conn, self.manager_class)
        for point, method in (("prefill-control-started", self.prefill_control_method),
                              ("decode-control-started", self.decode_control_method)):
            if not hasattr(manager_cls, method):
                self.missing_points[point] = (
                    f"sglang {self.sglang_version}: {self.manager_class} has no {method}() "
                    f"({self.conn_module.replace('.', '/')}.py){self.missing_method_note(method)}")
                self.POINTS.pop(point, None)

    # ---- hooks -----------------------------------------------------------
    def prepare_imports(self) -> None:
        """Runs before sglang's conn module is imported (e.g. put a stand-in on sys.path)."""

    def init_engine(self) -> None:
        """Start process-wide engine state the manager expects to find."""

    def fill_backend_kv_args(self, kv_args: Any) -> None:
        """Set KVArgs fields only this backend reads."""

    def missing_method_note(self, method: str) -> str:
        """What it means for this backend that its manager lacks ``method`` (a control
        thread starter); appended to the Unsupported reason.  Empty by default."""
        return ""

    def arm_point(self, point: str, action: str, frames: list | None = None, hold_s: float = 20.0) -> None:
        """As :meth:`RoleAdapter.arm_point`; a control-thread point whose method this
        sglang release does not have is Unsupported with the release and the method."""
        if point in self.missing_points:
            raise Unsupported(self.missing_points[point])
        super().arm_point(point, action, frames, hold_s)

    # ---- lifecycle -------------------------------------------------------
    def _kv_args(self, layout: Layout, kv: list, aux: tuple, tp_rank: int = 0, pp_rank: int = 0):
        from sglang.srt.disaggregation.base.conn import KVArgs

        args = KVArgs()
        # the scheduler's tp_rank: the decode picks its prefill rank from it and
        # registers it as its dst_tp_rank (common/conn.py _resolve_rank_mapping)
        args.engine_rank = tp_rank
        args.pp_rank = pp_rank
        args.system_dp_rank = 0
        args.rust_http_port = None
        args.kv_cache_dtype_str = "bfloat16"
        args.kv_layout = None
        args.prefill_start_layer = layout.main_layers.start
        args.prefill_end_layer = layout.main_layers.stop
        args.kv_data_ptrs = [t.data_ptr() for _, t in kv]
        args.kv_data_lens = [t.nbytes for _, t in kv]
        args.kv_item_lens = [layout.page_bytes for _ in kv]
        # Plain MHA/MLA pools publish no layer ids (disaggregation/utils.py
        # build_kv_layer_ids returns []), so transfers take the positional planners.
        args.kv_layer_ids = []
        args.num_draft_entries = sum(1 for s, _ in kv if s.layer >= DRAFT_BASE)
        args.kv_head_num = layout.kv_heads
        args.total_kv_head_num = layout.model_kv_heads  # the model's, all TP ranks together
        args.page_size = layout.page_size
        aux_tensor = aux[1]
        args.aux_data_ptrs = [aux_tensor.data_ptr()]
        args.aux_data_lens = [aux_tensor.nbytes]
        args.aux_item_lens = [layout.aux_bytes]
        for name in ("state_types", "state_data_ptrs", "state_data_lens", "state_item_lens",
                     "state_layer_ids", "state_dim_per_tensor", "state_slice_outer_counts",
                     "state_conv_shard_groups"):
            setattr(args, name, [])
        args.is_hybrid_mla_backend = False
        args.swa_kv_cache_layout = None
        args.ib_device = None
        args.gpu_id = 0
        args.mla_compression_ratios = None
        args.kv_buf_groups = 1
        args.hidden_kv_layers = len(layout.main_layers)
        args.draft_kv_layers = layout.draft_layers
        self.fill_backend_kv_args(args)
        return args

    def _start(self, mode: str, layout_dict: dict, bootstrap_port: int, attn_tp: tuple[int, int] = (1, 0),
               pp: tuple[int, int, str] = (1, 0, ""), dp: tuple[int, int] = (1, 0)) -> dict:
        from sglang.srt.disaggregation.utils import DisaggregationMode

        layout = Layout(**layout_dict)
        tp_size, tp_rank = (int(x) for x in attn_tp)
        pp_size, pp_rank, rendezvous = int(pp[0]), int(pp[1]), str(pp[2])
        dp_size, dp_rank = (int(x) for x in dp)
        self.tp_rank, self.pp_rank = tp_rank, pp_rank
        server_args = role_context.prepare_role(
            role_context.RoleSettings(
                mode=mode, backend=self.backend, bootstrap_port=bootstrap_port, page_size=layout.page_size,
                attn_tp_size=tp_size, attn_tp_rank=tp_rank, pp_size=pp_size, pp_rank=pp_rank, pp_rendezvous=rendezvous,
                dp_size=dp_size, dp_rank=dp_rank,
            )
        )
        before = set(threading.enumerate())
        self._since = self.recorder.mark()  # R-LIVE-2: every thread the manager starts, whenever
        self._install_point_hooks()
        self.init_engine()
        facts: dict[str, Any] = {"mode": mode, "sglang": self.sglang_version}
        if tp_size > 1:
            facts["attn_tp"] = [tp_size, tp_rank]
        if pp_size > 1:
            facts["pp"] = [pp_size, pp_rank]
        if dp_size > 1:
            facts["dp"] = [dp_size, dp_rank]
        if mode == "prefill":
            if pp_rank == 0 and tp_rank == 0 and dp_rank == 0:  # one bootstrap server per prefill server; every rank registers
                self.bootstrap_server = getattr(self.conn, self.bootstrap_class)(self.host, bootstrap_port)
            wait_for_tcp_port(self.host, bootstrap_port, timeout_s=15)
            facts["bootstrap_addr"] = f"{self.host}:{bootstrap_port}"
        side = pattern.PREFILL if mode == "prefill" else pattern.DECODE
        kv, aux = pattern_pools(side, layout)
        self.buffers, self.pool_of = kv + [aux], (side, layout)
        dmode = DisaggregationMode.PREFILL if mode == "prefill" else DisaggregationMode.DECODE
        manager_cls = getattr(self.conn, self.manager_class)
        try:
            # the scheduler's tp_rank: a DP engine's is its DP rank (attention TP 1 each)
            kv_args = self._kv_args(layout, kv, aux, tp_rank + dp_rank * tp_size, pp_rank)
            self.manager = manager_cls(kv_args, dmode, server_args, layout.mla)
        except Exception as exc:  # staging buffers: sglang makes them on cuda and xpu devices only
            text = f"{type(exc).__name__}: {exc}"
            if "not supported on device type" in text or (role_context.staging_on() and "cuda" in text.lower()):
                raise Unsupported(f"staging buffers need a cuda or xpu device ({text}); pdconform's roles keep "
                                  "their KV pools on the CPU") from exc
            raise
        self._threads = [t for t in threading.enumerate() if t not in before]
        self._tap_abort_generations()
        facts["rank_port"] = getattr(self.manager, "rank_port", None)
        facts["engine"] = self.engine()
        facts["deferred_release"] = bool(getattr(self.manager, "enable_deferred_decode_kv_release", False))
        facts["staging"] = bool(getattr(self.manager, "enable_staging", False))
        if mode == "decode":
            facts["heartbeat_window_s"] = float(self.manager.heartbeat_interval) * int(self.manager.max_failures)
            facts["waiting_timeout_s"] = float(self.manager.waiting_timeout)
        else:
            facts["bootstrap_timeout_s"] = float(self.manager.bootstrap_timeout)
        return facts

    def start_prefill(self, layout: dict, bootstrap_port: int, pp: tuple[int, int, str] = (1, 0, ""),
                      attn_tp: tuple[int, int] = (1, 0), dp: tuple[int, int] = (1, 0)) -> dict:
        return self._start("prefill", layout, bootstrap_port, attn_tp, pp=pp, dp=dp)

    def start_decode(self, layout: dict, bootstrap_port: int, attn_tp: tuple[int, int] = (1, 0),
                     dp: tuple[int, int] = (1, 0)) -> dict:
        return self._start("decode", layout, bootstrap_port, attn_tp, dp=dp)

    def teardown(self) -> None:
        # Only managers that declare role-switch support implement teardown()
        # (base/conn.py); NixlKVManager's raises NotImplementedError.
        if self.manager is None or not getattr(self.manager, "supports_role_switch", False):
            return
        teardown = self.manager.teardown
        worker = threading.Thread(target=teardown, name="pdconform-teardown", daemon=True)
        worker.start()
        worker.join(timeout=3)

    # ---- prefill side ----------------------------------------------------
    def _room_object(self, room: int):
        obj = self.senders.get(room) or self.receivers.get(room)
        if obj is None:
            raise KeyError(f"room {room} is not open on this {self.role}")
        return obj

    def open_sender(self, room: int, bootstrap_addr: str, destinations: int = 1) -> None:
        # ``destinations`` needs nothing here: sglang's prefill learns the count from
        # each decode rank's metadata (``required_dst_info_num``, which the decode
        # derives from its attention TP over the prefill's) and waits for all of them.
        self.rooms_seen.append(room)
        sender_cls = getattr(self.conn, self.sender_class)
        if "dest_tp_ranks" in inspect.signature(sender_cls.__init__).parameters:
            # sglang 0.5.17 - 0.5.18 senders also take the destination TP ranks and the
            # PP rank; prefill.py create_sender passes dest_tp_ranks=[tp_rank], pp_rank.
            self.senders[room] = sender_cls(self.manager, bootstrap_addr, room, dest_tp_ranks=[self.tp_rank],
                                            pp_rank=self.pp_rank)
        else:
            self.senders[room] = sender_cls(self.manager, bootstrap_addr, room)

    def init_sender(self, room: int, num_pages: int, aux_slot: int) -> None:
        self.senders[room].init(num_pages, aux_slot)

    def send_chunk(self, room: int, pages: list[int]) -> None:
        import numpy as np

        self.senders[room].send(np.asarray(pages, dtype=np.int32), None)

    # ---- decode side -----------------------------------------------------
    def open_receiver(self, room: int, bootstrap_addr: str, timeout_s: float) -> None:
        self.rooms_seen.append(room)
        deadline = time.monotonic() + timeout_s
        while not self.manager.try_ensure_parallel_info(bootstrap_addr):
            if time.monotonic() > deadline:
                raise TimeoutError(f"prefill at {bootstrap_addr} gave no parallel info within {timeout_s:.0f} s")
            time.sleep(0.05)
        self.receivers[room] = getattr(self.conn, self.receiver_class)(self.manager, bootstrap_addr, room)

    def request_kv(self, room: int, pages: list[int], aux_slot: int) -> None:
        import numpy as np

        receiver = self.receivers[room]
        receiver.init(self._prefill_dp_rank(receiver, room))
        receiver.send_metadata(np.asarray(pages, dtype=np.int32), aux_slot, None)

    def unsupported_topology(self, prefill_tp: int, decode_tp: int, mla: bool, prefill_pp: int = 1,
                             prefill_dp: int = 1, decode_dp: int = 1) -> str | None:
        """DP engines need the runtime context sglang publishes from 0.5.19 on (a rank's DP
        placement, harness/target/role_context.py); pdconform does not build it for older
        releases."""
        from harness.target.version import release_of

        if max(prefill_dp, decode_dp) > 1 and self.sglang_version and release_of(self.sglang_version) < (0, 5, 19):
            return (f"pdconform drives DP engines on sglang >= 0.5.19 only (its published runtime context); sglang "
                    f"{self.sglang_version} has none: run this topology against a newer sglang")
        return None

    #: the manager's maps keyed by bootstrap room (common/conn.py CommonKVManager, and the
    #: backends' transfer_infos): every room the manager holds, opened by the harness or not
    ROOM_MAPS = ("request_status", "failure_records", "transfer_infos")

    def _held_rooms(self) -> set[int]:
        """Every room a key of the manager's room maps names (harness or not: a late
        message's room, another engine's room), so the residue walk looks for each."""
        held: set[int] = set()
        for name in self.ROOM_MAPS:
            table = getattr(self.manager, name, None)
            try:
                held |= {int(k) for k in list(table.keys()) if isinstance(k, int) and not isinstance(k, bool)}
            except (AttributeError, TypeError, RuntimeError):  # not a dict (a PP consensus store), or changed meanwhile
                continue
        return held

    def _prefill_dp_rank(self, receiver, room: int) -> int:
        """The prefill DP engine serving ``room``, as decode.py ``_resolve_prefill_dp_rank``
        resolves it without a router's hint: 0 for one engine, ``room mod DP`` when the prefill
        follows the bootstrap room (R-DP-1).  Unsupported when the prefill wants to be asked."""
        info = getattr(self.manager, "prefill_info_table", {}).get(getattr(receiver, "bootstrap_addr", None))
        dp_size = int(getattr(info, "dp_size", 1) or 1)
        if dp_size == 1:
            return 0
        if getattr(info, "follow_bootstrap_room", True):
            return room % dp_size
        raise Unsupported("the prefill's DP engines register each room's DP rank to be queried; pdconform's "
                          "decode follows the bootstrap room only")

    def verify(self, kv_moves: list, aux_moves: list, unchecked_kv: list = (), unchecked_aux: list = (),
               sent_layers: list | None = None) -> dict:
        kv_moves = [tuple(m) for m in kv_moves]
        aux_moves = [tuple(m) for m in aux_moves]
        return pattern.verify_pools(self.buffers, kv_moves, aux_moves, unchecked_kv, unchecked_aux, sent_layers).to_dict()

    # ---- either side -----------------------------------------------------
    def poll(self, room: int) -> int:
        return int(self._room_object(room).poll())

    def status_map(self, room: int) -> int | None:
        """The manager's ``request_status`` entry for the room (common/conn.py
        ``CommonKVManager.check_status`` reads the same table), without poll()'s cache."""
        table = getattr(self.manager, "request_status", None)
        value = table.get(room) if isinstance(table, dict) else None
        return None if value is None else int(value)

    def failure_reason(self, room: int) -> str | None:
        """The reason the manager recorded for the room, read without side effects.

        sglang's own ``failure_exception()`` clears the room and pops the record,
        so the adapter reads ``failure_records`` (common/conn.py) under its lock.
        """
        self._room_object(room)
        records = getattr(self.manager, "failure_records", None)
        if records is None:
            return None
        with self.manager.failure_lock:
            return records.get(room)

    def clear(self, room: int) -> None:
        """Release the room as sglang's schedulers do (``disaggregation/prefill.py``,
        ``decode.py``): a Failed room through ``failure_exception()`` (which clears it
        and pops its failure record; the KVTransferError it raises is how it hands
        over the reason), any other through ``clear()``; the decode also drops the
        room's deferred-ABORT state (``kv_mgr.clear_deferred_abort_state``, as
        ``DecodePreallocQueue._do_release`` does before ``kv_receiver.clear()``), after
        arming the ABORT for a Failed room it did not abort itself
        (``ensure_abort_notified(force_arm=True)``, as the decode's transfer queue does
        with deferred release on)."""
        obj = self._room_object(room)
        if int(obj.poll()) == 0:  # KVPoll.Failed
            try:
                obj.failure_exception()
            except Exception:  # noqa: BLE001 - KVTransferError carries the reason, already recorded
                pass
            if room in self.receivers and not hasattr(self.manager, "clear_deferred_abort_state"):
                # sglang 0.5.17 - 0.5.18 decode.py: failure_exception() and then
                # kv_receiver.clear(); NIXL's receiver failure_exception does not clear.
                obj.clear()
            # decode.py: a failure the decode did not initiate still arms the deferred
            # ABORT/ACK flow before release (writes of other ranks may be in flight)
            if (room in self.receivers and getattr(self.manager, "enable_deferred_decode_kv_release", False)
                    and not getattr(obj, "abort_notified", True)):
                obj.ensure_abort_notified(force_arm=True)
        else:
            obj.clear()
        if room in self.receivers and hasattr(self.manager, "clear_deferred_abort_state"):
            self.manager.clear_deferred_abort_state(room)
        self.senders.pop(room, None)
        self.receivers.pop(room, None)

    def abort(self, room: int) -> None:
        self._room_object(room).abort()

    def observe(self, rooms: list[int] = (), residue: bool = True) -> dict:
        from harness.role.residue import find_rooms

        wanted = set(rooms) | set(self.rooms_seen) | self._held_rooms()
        found = find_rooms(self.manager, wanted) if self.manager is not None and residue else None
        return self.recorder.observation(self.role, self._threads, found.rooms if found else {},
                                         residue_incomplete=found.incomplete if found else "",
                                         since=getattr(self, "_since", None))

    def begin_program(self) -> dict:
        """See :meth:`RoleAdapter.begin_program`: a plan of no faults replaces the last one (its
        wrapper stays, passing everything through), the logs, ABORT_ACKs and rooms seen are
        forgotten, and the pools are written again in place (their registrations stay)."""
        if self.manager is None or self.pool_of is None:
            raise RuntimeError("start the manager before its next program")
        if self._fault_counter is not None:
            self.set_engine_faults()
        self._fault_counter, self._past_counters = None, []
        with self._acks_lock:
            self._acks.clear()
            self._aborts.clear()
        self._forget_points()
        self.recorder.clear()
        self.rooms_seen = [room for room in self.rooms_seen if room in self.senders or room in self.receivers]
        return {"buffers": refill(self.buffers, *self.pool_of)}
