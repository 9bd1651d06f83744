"""Mori: sglang's ``MoriKVManager`` on amd-mori, or on pdconform's stand-in engine.

Mirrors ``sglang/srt/disaggregation/mori/conn.py``.  amd-mori 1.2.4 needs ROCm
and ships only cp310/cp312 wheels; when ``import mori.io`` fails, the stand-in
package in ``backends/mori/standin`` (same API, real byte movement over TCP) is
put on ``sys.path`` and results say ``engine: standin``.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import threading
from pathlib import Path

from backends.sglang_common import SglangCommonRole
from harness.role.adapter import Unsupported
from harness.role.faults import EngineFaultCounter, HeldConnection

STANDIN_PATH = Path(__file__).resolve().parent / "standin"


def real_mori_error() -> str | None:
    """None when the real ``mori.io`` imports; otherwise why it does not."""
    if importlib.util.find_spec("mori") is None:
        return "amd-mori is not installed (ROCm-only wheels for cp310/cp312)"
    try:
        importlib.import_module("mori.io")
    except Exception as exc:  # ImportError or a missing ROCm library
        for name in [m for m in sys.modules if m == "mori" or m.startswith("mori.")]:
            del sys.modules[name]
        return f"import mori.io failed: {exc}"
    return None


def use_standin_if_needed() -> str | None:
    """Put the stand-in first on ``sys.path`` unless the real ``mori.io`` imports (once per
    process; the fork server calls it before it preloads Mori's conn module).  Returns why
    the real one does not import (None: it does)."""
    why = real_mori_error()
    if why is not None and str(STANDIN_PATH) not in sys.path:
        sys.path.insert(0, str(STANDIN_PATH))
    return why


class MoriRole(SglangCommonRole):
    impl = "mori"
    backend = "mori"
    conn_module = "sglang.srt.disaggregation.mori.conn"
    manager_class = "MoriKVManager"
    sender_class = "MoriKVSender"
    receiver_class = "MoriKVReceiver"
    bootstrap_class = "MoriKVBootstrapServer"
    prefill_control_method = "_start_bootstrap_thread"
    decode_control_method = "_start_decode_thread"

    def message_kinds(self) -> tuple[str, ...]:
        """Common's kinds, and ``aux_data`` unless the aux goes over RDMA (mori/conn.py
        ``send_aux_tcp``, the default; ``SGLANG_MORI_SEND_AUX_RDMA`` makes it an engine write)."""
        rdma = getattr(self.manager, "_send_aux_rdma", False) if self.manager is not None else False
        return self.MESSAGE_KINDS + (() if rdma else ("aux_data",))

    def prepare_imports(self) -> None:
        self._standin_past_faults: list[dict] = []
        use_standin_if_needed()

    def engine(self) -> str:
        import mori

        return "standin" if getattr(mori, "__pdconform_standin__", False) else "real"

    def plan_one(self, shell, mla: bool, n_src: int, n_dst: int) -> list[tuple[int, int]]:
        """Mori's pairing: ``MoriKVManager._get_mha_mem_desc_slices`` /
        ``_get_mla_mem_desc_slices`` (mori/conn.py), fed descriptor stand-ins that are
        buffer indices (the functions only slice the lists) and, where the release
        takes them, the peer's layer ids (none: plain pools publish none)."""
        shell.kv_mem_descs = list(range(n_src))
        dst = list(range(n_dst))
        # sglang 0.5.17 - 0.5.18 take the destination descriptors only (mori/conn.py);
        # the peer's layer ids were added as a second argument in 0.5.22.
        takes_layer_ids = "dst_kv_layer_ids" in inspect.signature(shell._get_mha_mem_desc_slices).parameters
        peer_layer_ids = ([],) if takes_layer_ids else ()
        if mla:
            src_d, dst_d, layers = shell._get_mla_mem_desc_slices(dst, *peer_layer_ids)
            return [(src_d[i], dst_d[i]) for i in range(layers)]
        s_k, s_v, d_k, d_v, layers = shell._get_mha_mem_desc_slices(dst, *peer_layer_ids)
        return [(s_k[i], d_k[i]) for i in range(layers)] + [(s_v[i], d_v[i]) for i in range(layers)]

    def set_engine_faults(self, **plan) -> dict:
        """Engine faults through the stand-in engine's own knobs (``mori.io.set_standin_faults``;
        the real amd-mori has none, so on ROCm they are Unsupported); ``aux_delay_s`` on
        sglang's own aux path (:meth:`delay_aux`), on either engine."""
        import mori.io

        checked = self._engine_plan(plan)
        if hasattr(mori.io, "set_standin_faults"):
            self._standin_past_faults += list(mori.io.standin_fault_log())  # its log restarts with each plan
            mori.io.set_standin_faults(fail_nth_transfer=checked.fail_nth, delay_s=float(checked.delay_s),
                                       never_complete=checked.never_complete, fail_group=checked.fail_group,
                                       slow_nth_transfer=checked.slow_nth, slow_s=float(checked.slow_s))
        elif checked.engine_faults:
            raise Unsupported("real amd-mori runs here and has no fault injection")
        if self._fault_counter is not None:
            self._past_counters.append(self._fault_counter)
        self._fault_counter = EngineFaultCounter(checked)
        if checked.aux_delay_s and not getattr(self, "_aux_delay_installed", False):
            self.delay_aux()
            self._aux_delay_installed = True
        return checked.to_dict()

    def delay_aux(self) -> None:
        """Mori's default aux path (``SGLANG_MORI_SEND_AUX_RDMA`` off, mori/conn.py
        ``send_aux_tcp``) sends each aux buffer as an ``AUX_DATA`` control message on the
        sending thread's own PUSH socket (``_connect_threadsafe``): every socket that call
        hands out becomes a :class:`HeldConnection` that holds ``AUX_DATA`` messages
        ``aux_delay_s`` seconds, and whatever that socket sends after them.  With aux over
        RDMA the aux is an engine write the worker waits for: Common's way (it starts late)."""
        manager = self.manager
        if getattr(manager, "_send_aux_rdma", False):
            super().delay_aux()
            return
        connect = manager._connect_threadsafe
        header = getattr(type(manager), "AUX_DATA_HEADER", b"AUX_DATA")
        held: dict[int, HeldConnection] = {}
        lock = threading.Lock()

        def hold_for(parts) -> float:
            counter = self._fault_counter
            if counter is None or not counter.plan.aux_delay_s or not parts or bytes(parts[0]) != header:
                return 0.0
            room = bytes(parts[1]).decode("ascii", "replace") if len(parts) > 1 else "?"
            counter.note_aux_delay(f"AUX_DATA of room {room} held on its connection")
            return counter.plan.aux_delay_s

        def connect_held(endpoint: str, is_ipv6: bool = False):
            sock = connect(endpoint, is_ipv6=is_ipv6)
            with lock:
                conn = held.get(id(sock))
                if conn is None or conn.socket is not sock:
                    conn = held[id(sock)] = HeldConnection(sock, hold_for)
            return conn

        manager._connect_threadsafe = connect_held

    def fault_log(self) -> list[dict]:
        import mori.io

        now = list(mori.io.standin_fault_log()) if hasattr(mori.io, "standin_fault_log") else []
        return self._standin_past_faults + now + super().fault_log()

    def begin_program(self) -> dict:
        """As :meth:`SglangCommonRole.begin_program`; the stand-in engine's own log of faults is
        forgotten too (a plan of no faults restarts it)."""
        facts = super().begin_program()
        self._standin_past_faults = []
        return facts
