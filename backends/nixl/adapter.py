"""NIXL: sglang's ``NixlKVManager`` on a real NIXL agent, UCX over TCP on ``lo``.

Mirrors ``sglang/srt/disaggregation/nixl/conn.py``.  The manager creates its own
NIXL agent; KV buffers are registered as host memory (``DRAM``) through the
per-buffer ``kv_data_mem_kinds`` (sglang's schedulers register GPU KV as ``VRAM``
and use ``DRAM`` only for host-backed HiSparse pools; on a CPU machine DRAM is
all there is).
``UCX_TLS=tcp`` and ``UCX_NET_DEVICES=lo`` come from harness.target.role_context.

One engine setting differs from sglang's: the agent's progress thread.  nixl's Python
API creates every agent with ``pthrDelay = 0`` (``nixl_cu12/_api.py``), so the thread
polls UCX in a busy loop and keeps a whole core busy for the life of the role, even
when nothing moves.  A cell has two to four NIXL roles and a 2-core CI machine runs
several cells at once, so by default the harness has the thread sleep
:data:`backends.nixl.DEFAULT_PROGRESS_DELAY_US` between polls (the engine, its threads and every
transfer are still the real ones).  ``pdconform run --engine-setting nixl_progress_delay_us=0``
restores sglang's busy loop; results.json records which one a run used.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from backends.nixl import DEFAULT_PROGRESS_DELAY_US, PROGRESS_DELAY_ENV
from backends.sglang_common import SglangCommonRole
from harness.role.adapter import Refusal, Unsupported, predicted, refused
from harness.role.faults import FAIL, NEVER, POST_ERROR, REMOTE_DISCONNECT, SLOW, EngineFaultCounter

log = logging.getLogger(__name__)



def progress_delay_us() -> int:
    """The NIXL progress thread's sleep between polls for this role (microseconds; 0 =
    busy loop as in sglang), from ``PDCONFORM_NIXL_PROGRESS_DELAY_US``.

    Raises ValueError when the variable is set but not a non-negative integer."""
    raw = os.environ.get(PROGRESS_DELAY_ENV, str(DEFAULT_PROGRESS_DELAY_US))
    value = int(raw)
    if value < 0:
        raise ValueError(f"{PROGRESS_DELAY_ENV}={raw}: must be >= 0 microseconds")
    return value


class _ProgressDelayBindings:
    """Stands in for the ``nixlBind`` module that nixl's ``_api`` builds agents with:
    every attribute is the real one, except that ``nixlAgent(name, config)`` first sets
    ``config.pthrDelay`` (microseconds) to ``delay_us``."""

    def __init__(self, real, delay_us: int):
        self._real = real
        self.delay_us = delay_us

    def nixlAgent(self, name, config, *args, **kwargs):  # noqa: N802 - nixl's name
        config.pthrDelay = self.delay_us
        return self._real.nixlAgent(name, config, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._real, name)


def load_ucx_plugin() -> str | None:
    """Load nixl's UCX backend plugin (and with it UCX) into this process, as the first
    agent a role creates would: the ``own_fork_server`` hook of the ``nixl`` implementation
    (harness.implementations), run once in NIXL's own fork server so that each role's agent
    finds it loaded (0.05 s of CPU per role instead of 0.5 s; docs/performance.md).  Its
    load patches libc's ``mmap`` family (UCX's memory hooks), which is why no other
    implementation's fork server does it.  The plugin comes from ``NIXL_PLUGIN_DIR`` when
    set, else the ``plugins`` folder beside the ``libnixl.so`` nixl's bindings loaded.

    Returns the loaded path, or None (nothing loaded; each role then loads it itself) when
    no such plugin is found.  OSError when it is there but does not load."""
    import ctypes

    import nixl._api  # noqa: F401 - loads libnixl.so, whose folder holds the plugins

    folder = os.environ.get("NIXL_PLUGIN_DIR")
    if not folder:
        with open("/proc/self/maps") as maps:
            libnixl = next((line.split()[-1] for line in maps if line.rstrip().endswith("/libnixl.so")), None)
        folder = os.path.join(os.path.dirname(libnixl), "plugins") if libnixl else ""
    path = os.path.join(folder, "libplugin_UCX.so")
    if not folder or not os.path.isfile(path):
        log.warning("no nixl UCX plugin at %r: each NIXL role loads UCX itself", path)
        return None
    ctypes.CDLL(path)
    return path


def install_progress_delay(delay_us: int) -> bool:
    """Make the agents this process creates from now on use ``delay_us`` (see the module
    docstring).  Returns False, changing nothing, when this nixl's API does not build
    its agents through ``nixlBind.nixlAgent`` with a ``pthrDelay`` field."""
    import nixl._api  # noqa: F401 - nixl/__init__ puts its build's _api module here

    api = sys.modules["nixl._api"]
    bind = getattr(api, "nixlBind", None)
    if bind is None or not hasattr(getattr(bind, "nixlAgentConfig", None), "pthrDelay"):
        return False
    if isinstance(bind, _ProgressDelayBindings):
        bind.delay_us = delay_us
    else:
        api.nixlBind = _ProgressDelayBindings(bind, delay_us)
    return True


class FaultyNixlAgent:
    """Pass-through wrapper around the manager's ``nixl_agent`` that injects engine
    faults into ``transfer(handle)`` (``NixlKVManager`` posts every write with it and
    then polls ``check_xfer_state``).

    A failed transfer fails in flight, as a real one does when the network or the
    peer drops it: it is not posted, ``transfer`` reports ``"PROC"`` and
    ``check_xfer_state`` then ``"ERR"`` (a failure to post is a different event:
    sglang cannot tell whether such writes still land).  One that never completes
    is not posted and reports ``"PROC"`` on every ``check_xfer_state``.  A slow one
    (EngineFaultPlan ``slow_nth``) is posted ``slow_s`` seconds later on a timer, reporting
    ``"PROC"`` until then, while later handles are posted at once: completion out of issue
    order on the real engine.  One ``transfer`` call is one transfer and one group.

    The plan's ``error`` gives a failed transfer NIXL's own error kinds, as the Python API
    raises them (the bindings turn a negative NIXL status into a typed exception):
    ``post-error`` makes ``transfer`` raise ``nixlBackendError``; ``remote-disconnect`` makes
    ``check_xfer_state`` of that handle raise ``nixlRemoteDisconnectError`` and then behaves
    as NIXL does after NIXL_ERR_REMOTE_DISCONNECT (nixl issue #1983, sglang #40108;
    docs/engine-contract.md Q5 measured it on the real agent): the peer's metadata is gone, so
    ``check_remote_metadata`` answers False and the next ``transfer`` raises the same error at
    once, until ``add_remote_agent`` loads it again (sglang's ``_reload_invalidated_peers``).
    """

    def __init__(self, real, counter: EngineFaultCounter):
        self._real = real
        self._counter = counter
        self._lock = threading.Lock()
        # the handles themselves: an id() could be reused after garbage collection
        self._never: list = []
        self._failed: list = []
        self._late: list = []  # slow handles not posted yet
        self._disconnected: list = []  # handles whose state raises a remote disconnect
        self._invalidated = False  # the peer's metadata is gone (after a remote disconnect)

    def transfer(self, handle, *args, **kwargs):
        if self._invalidated:  # the peer is gone until it is loaded again
            raise _nixl_error("nixlRemoteDisconnectError", "pdconform: remote agent invalidated by a remote disconnect")
        group_fails = self._counter.next_group()
        verdict = self._counter.next_transfer(f"transfer of handle {handle}", group_fails, defer_slow=True)
        if verdict == FAIL and self._counter.plan.error == POST_ERROR:
            raise _nixl_error("nixlBackendError", "pdconform: injected NIXL_ERR_BACKEND on post")
        if verdict in (FAIL, NEVER):
            with self._lock:
                (self._failed if verdict == FAIL else self._never).append(handle)
                if verdict == FAIL and self._counter.plan.error == REMOTE_DISCONNECT:
                    self._disconnected.append(handle)
            return "PROC"
        if verdict == SLOW:
            with self._lock:
                self._late.append(handle)
            timer = threading.Timer(self._counter.plan.slow_s, self._post_late, (handle, args, kwargs))
            timer.daemon = True
            timer.start()
            return "PROC"
        return self._real.transfer(handle, *args, **kwargs)

    def _post_late(self, handle, args, kwargs) -> None:
        """Post a slow handle now; a post that fails reads ``"ERR"`` (as a write lost in flight)."""
        try:
            state = self._real.transfer(handle, *args, **kwargs)
        except Exception:  # noqa: BLE001 - the agent may be gone with its role
            state = "ERR"
        with self._lock:
            self._late = [h for h in self._late if h is not handle]
            if state == "ERR":
                self._failed.append(handle)

    def check_xfer_state(self, handle, *args, **kwargs):
        with self._lock:
            if any(h is handle for h in self._disconnected):
                self._invalidated = True  # NIXL drops the peer's metadata with the error
                raise _nixl_error("nixlRemoteDisconnectError", "pdconform: injected NIXL_ERR_REMOTE_DISCONNECT")
            if any(h is handle for h in self._failed):
                return "ERR"
            if any(h is handle for h in self._never) or any(h is handle for h in self._late):
                return "PROC"
        return self._real.check_xfer_state(handle, *args, **kwargs)

    def check_remote_metadata(self, *args, **kwargs):
        return False if self._invalidated else self._real.check_remote_metadata(*args, **kwargs)

    def add_remote_agent(self, metadata, *args, **kwargs):
        """Load a peer again: the real agent never lost it (the disconnect was injected), so
        loading it twice may be refused; the peer is valid again either way."""
        if not self._invalidated:
            return self._real.add_remote_agent(metadata, *args, **kwargs)
        self._invalidated = False
        try:
            return self._real.add_remote_agent(metadata, *args, **kwargs)
        except Exception:  # noqa: BLE001 - already loaded in the real agent
            return None

    def __getattr__(self, name):
        return getattr(self._real, name)


def _nixl_error(kind: str, message: str) -> Exception:
    """An instance of NIXL's own exception class ``kind`` (nixl._bindings), as its API raises it."""
    from nixl import _bindings

    return getattr(_bindings, kind)(message)


#: NIXL's refusals of host-memory (DRAM) KV that a GPU host gets past, as sglang raises them at run
#: time: nixl/conn.py ``_prepare_payload_xfer``, on the prefill's bootstrap thread when a decode
#: registers (the thread dies of it; docs/sglang-bugs.md U3)
DRAM_REFUSALS = (
    Refusal("NotImplementedError", "heterogeneous-TP direct-to-host KV transfer is not implemented safely yet",
            "needs VRAM: NIXL writes the head slices of a heterogeneous-TP transfer (prefill and decode attention "
            "TP differ) into GPU KV only, and pdconform's roles on this CPU machine register their KV as DRAM: "
            "run on a GPU host (run --pool-device cuda)"),
    Refusal("NotImplementedError", "HiSparse combined with decode-only speculative decoding",
            "needs VRAM: NIXL serves a decode with more KV entries than the prefill (decode-only draft KV; a "
            "whole-model decode fed by prefill PP stages) into GPU KV only, and pdconform's roles on this CPU "
            "machine register their KV as DRAM: run on a GPU host (run --pool-device cuda); for prefill PP stages "
            "a GPU host is not enough: sglang's pairing then asks for layer ids (docs/sglang-bugs.md U3)"),
)


class NixlRole(SglangCommonRole):
    impl = "nixl"
    ENGINE_ERRORS = (POST_ERROR, REMOTE_DISCONNECT)  # NIXL's own error kinds (FaultyNixlAgent)
    backend = "nixl"
    conn_module = "sglang.srt.disaggregation.nixl.conn"
    manager_class = "NixlKVManager"
    sender_class = "NixlKVSender"
    receiver_class = "NixlKVReceiver"
    bootstrap_class = "NixlKVBootstrapServer"
    prefill_control_method = "_start_bootstrap_thread"
    decode_control_method = "_start_decode_listener_thread"

    def engine(self) -> str:
        return "real"

    def init_engine(self) -> None:
        delay = progress_delay_us()
        if not install_progress_delay(delay):
            log.warning("this nixl's API has no nixlBind.nixlAgentConfig.pthrDelay: the progress "
                        "thread keeps its own setting (%s ignored)", PROGRESS_DELAY_ENV)

    def fill_backend_kv_args(self, kv_args: Any) -> None:
        from harness.role.pool_device import pool_device

        # KV in device memory (run --pool-device cuda) is registered as sglang's schedulers do
        kind = "VRAM" if pool_device() == "cuda" else "DRAM"
        kv_args.kv_data_mem_kinds = [kind] * len(kv_args.kv_data_ptrs)

    def missing_method_note(self, method: str) -> str:
        if method == self.decode_control_method:
            return ("; before 0.5.19 a NIXL decode starts no control thread (transfer results "
                    "arrive as NIXL notifications), so there is no such point to reach")
        return ""

    def plan_one(self, shell, mla: bool, n_src: int, n_dst: int) -> list[tuple[int, int]]:
        """NIXL's pairing: ``NixlKVManager._build_transfer_dst_indices`` (called from
        ``_prepare_payload_xfer`` when a decode registers), one destination index per
        source entry.  sglang 0.5.17 - 0.5.18 have no such method: their
        ``_prepare_payload_xfer`` pairs inline with ``build_transfer_entry_pairs``
        (``disaggregation/utils.py``), positional fallback allowed when PP is 1."""
        from types import SimpleNamespace

        if not hasattr(shell, "_build_transfer_dst_indices"):
            from sglang.srt.disaggregation.utils import build_transfer_entry_pairs

            return [tuple(p) for p in build_transfer_entry_pairs(
                shell.kv_args.kv_layer_ids, [], n_src, n_dst, allow_positional_fallback=shell.pp_size == 1)]
        peer = SimpleNamespace(dst_kv_layer_ids=[], dst_kv_item_lens=[256] * n_dst)
        indices = shell._build_transfer_dst_indices(peer_info=peer, n_src=n_src, n_dst=n_dst)
        return list(enumerate(indices))

    def unsupported_topology(self, prefill_tp: int, decode_tp: int, mla: bool, prefill_pp: int = 1,
                             prefill_dp: int = 1, decode_dp: int = 1) -> str | None:
        """Only what the shared driver cannot build (SglangCommonRole).  NIXL's own refusal of a
        heterogeneous-TP or PP-stage transfer into DRAM KV is left to NIXL: the cell runs, and
        when sglang raises it (:data:`DRAM_REFUSALS`) the prefill's next step is Unsupported
        with the advice (:meth:`_refused_here`), so a change in sglang shows."""
        return super().unsupported_topology(prefill_tp, decode_tp, mla, prefill_pp, prefill_dp, decode_dp)

    def _refused_here(self) -> None:
        """Unsupported, with the advice and NIXL's own words, once a thread of this role died of
        one of :data:`DRAM_REFUSALS` while the KV is DRAM (with VRAM KV such a raise is no
        limit of this machine, and is left for the checks to judge)."""
        from harness.role.pool_device import pool_device

        if pool_device() == "cuda":
            return
        why = refused(DRAM_REFUSALS, self.recorder.snapshot()[1])
        if why:
            raise Unsupported(why)

    # Every scheduler step of a room first asks whether NIXL has refused here: the refusal comes on a
    # background thread, and the prefill's next step (a poll of await_status, every 5 ms) carries it.
    def open_sender(self, room: int, bootstrap_addr: str, destinations: int = 1) -> None:
        self._refused_here()
        super().open_sender(room, bootstrap_addr, destinations)

    def init_sender(self, room: int, num_pages: int, aux_slot: int) -> None:
        self._refused_here()
        super().init_sender(room, num_pages, aux_slot)

    def send_chunk(self, room: int, pages: list[int]) -> None:
        self._refused_here()
        super().send_chunk(room, pages)

    def poll(self, room: int) -> int:
        self._refused_here()
        return super().poll(room)

    def failure_reason(self, room: int) -> str | None:
        self._refused_here()
        return super().failure_reason(room)

    def clear(self, room: int) -> None:
        self._refused_here()
        super().clear(room)

    def abort(self, room: int) -> None:
        self._refused_here()
        super().abort(room)

    def unsupported_layout(self, spec: dict) -> str | None:
        """nixl/conn.py ``_prepare_payload_xfer`` takes a decode with more KV entries than the
        prefill (``n_dst > n_src``) for decode-only speculative decoding and refuses it unless
        the decode's KV is VRAM; on a CPU machine it is registered as DRAM.  That is decode-only
        draft KV, and every stage of a multi-stage prefill sending to a whole-model decode."""
        from harness.role.pool_device import pool_device
        from harness.spec.layouts import whole_model_decode

        if pool_device() == "cuda":  # VRAM KV: NIXL serves both
            return None
        # Still a prediction: the layouts executor (harness/drive/executors/layouts.py) skips such a
        # layout before its roles start and has no way yet to take a run-time Unsupported as one
        # layout's skip rather than the cell's end; marked so (harness.role.adapter.predicted).
        if spec["decode"][2] > spec["prefill"][2]:
            return predicted("NIXL refuses decode-only draft KV unless the decode's KV is VRAM (nixl/conn.py "
                             "_prepare_payload_xfer: 'HiSparse combined with decode-only speculative decoding'); "
                             "on a CPU machine the KV is registered as DRAM")
        if spec["stages"] > 1 and whole_model_decode(spec):
            return predicted("NIXL takes a whole-model decode fed by one of several prefill stages (more KV entries "
                             "on the decode than on the stage) for decode-only speculative decoding and refuses it "
                             "unless the decode's KV is VRAM (nixl/conn.py _prepare_payload_xfer); on a CPU machine "
                             "it is DRAM")
        return None

    def wrap_engine(self, counter: EngineFaultCounter) -> None:
        """Wrap the manager's agent once; a later plan replaces the counter (handles
        already held by ``never_complete`` stay in progress)."""
        if isinstance(self.manager.agent, FaultyNixlAgent):
            self.manager.agent._counter = counter
        else:
            self.manager.agent = FaultyNixlAgent(self.manager.agent, counter)
