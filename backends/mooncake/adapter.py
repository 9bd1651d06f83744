"""Mooncake: sglang's ``MooncakeKVManager`` on the real Mooncake TransferEngine.

Mirrors ``sglang/srt/disaggregation/mooncake/conn.py``.  The manager takes the
process-wide engine from ``sglang.srt.distributed.device_communicators.
mooncake_transfer_engine`` (a real server creates it while it sets up model
parallelism); this adapter creates it for loopback with the TCP protocol
(``MOONCAKE_PROTOCOL=tcp``, ``MC_FORCE_TCP=1``, set by the mooncake Implementation's role_env, backends/mooncake/__init__.py).
"""

from __future__ import annotations

import os
import threading
import time

from backends.sglang_common import SglangCommonRole
from harness.role.faults import FAIL, NEVER, NEVER_BLOCK_S, POST_ERROR, SLOW, EngineFaultCounter


def engine_transfer_timeout_s() -> float:
    """Mooncake's wall-clock limit for one synchronous batch (``MC_TRANSFER_TIMEOUT``,
    seconds; 30 when unset or not a positive number)."""
    try:
        value = float(os.environ.get("MC_TRANSFER_TIMEOUT", "30"))
    except ValueError:
        return 30.0
    return value if value > 0 else 30.0


class FaultyMooncakeEngine:
    """Pass-through wrapper around sglang's ``MooncakeTransferEngine``
    (``distributed/device_communicators/mooncake_transfer_engine.py``) that injects
    engine faults into ``batch_transfer_sync``, the call every KV, aux and state
    write of ``MooncakeKVManager`` goes through.

    One call is one transfer and one group (Mooncake reports one result per batch):
    a failed call returns -1 like a real failed batch and moves no bytes.  A call
    that never completes behaves as the real engine does with a batch that does not
    finish: it blocks for the engine's own wall-clock transfer timeout
    (``MC_TRANSFER_TIMEOUT`` seconds, 30 by default, read from the role's
    environment like the engine reads it) and returns -1 (sglang's
    ``_poison_unsettled_send`` describes that return); no bytes move.  The plan's slow
    transfer runs ``slow_s`` late, unless that is at or past the engine's timeout: then
    it is a batch that does not finish in time, as above, logged as a failed write (the
    real engine may still finish such a batch later; this one moves no bytes).  With the plan's
    ``error`` ``post-error`` a failed call is the binding raising (as Mooncake's
    ``batch_transfer_sync_write`` does for a session it cannot open): sglang's own wrapper runs
    on a binding that raises, and answers what its ``except`` makes of it.
    """

    def __init__(self, real, counter: EngineFaultCounter):
        self._real = real
        self._counter = counter
        self._never = threading.Event()

    def batch_transfer_sync(self, session_id, buffers, peer_buffer_addresses, lengths) -> int:
        group_fails = self._counter.next_group()
        what = f"batch_transfer_sync of {len(buffers)} block(s), {sum(lengths)} bytes, to {session_id}"
        verdict = self._counter.next_transfer(what, group_fails, defer_slow=True)
        if verdict == FAIL and self._counter.plan.error == POST_ERROR:
            return type(self._real).batch_transfer_sync(_RaisingView(self._real), session_id, buffers,
                                                        peer_buffer_addresses, lengths)
        if verdict == FAIL:
            return -1
        if verdict == NEVER:
            self._never.wait(min(NEVER_BLOCK_S, engine_transfer_timeout_s()))
            return -1
        if verdict == SLOW:  # the real engine gives up on a batch at its own timeout, slow or not
            limit = engine_transfer_timeout_s()
            if self._counter.plan.slow_s >= limit:
                self._never.wait(min(NEVER_BLOCK_S, limit))
                self._counter.note_gave_up(what, limit)
                return -1
            time.sleep(self._counter.plan.slow_s)
        return self._real.batch_transfer_sync(session_id, buffers, peer_buffer_addresses, lengths)

    def __getattr__(self, name):
        return getattr(self._real, name)


class _RaisingView:
    """sglang's MooncakeTransferEngine with a binding whose batch write raises (POST_ERROR)."""

    def __init__(self, real):
        self._real = real
        self.engine = _RaisingBinding(real.engine)

    def __getattr__(self, name):
        return getattr(self._real, name)


class _RaisingBinding:
    def __init__(self, real):
        self._real = real

    def batch_transfer_sync_write(self, *args, **kwargs):
        raise RuntimeError("pdconform: injected Mooncake transfer error (the binding raised)")

    def __getattr__(self, name):
        return getattr(self._real, name)


class MooncakeRole(SglangCommonRole):
    impl = "mooncake"
    ENGINE_ERRORS = (POST_ERROR,)  # the binding raising (FaultyMooncakeEngine)
    backend = "mooncake"
    conn_module = "sglang.srt.disaggregation.mooncake.conn"
    manager_class = "MooncakeKVManager"
    sender_class = "MooncakeKVSender"
    receiver_class = "MooncakeKVReceiver"
    bootstrap_class = "MooncakeKVBootstrapServer"
    prefill_control_method = "start_prefill_thread"
    decode_control_method = "start_decode_thread"

    def engine(self) -> str:
        return "real"

    def message_kinds(self) -> tuple[str, ...]:
        """Common's kinds, and ``aux_data`` when the aux goes as a message (mooncake/conn.py
        ``send_aux``: only with ``SGLANG_MOONCAKE_SEND_AUX_TCP``; else the engine writes it)."""
        from sglang.srt.environ import envs

        return self.MESSAGE_KINDS + (("aux_data",) if envs.SGLANG_MOONCAKE_SEND_AUX_TCP.get() else ())

    def init_engine(self) -> None:
        from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (
            init_mooncake_transfer_engine,
        )

        init_mooncake_transfer_engine(hostname=self.host, gpu_id=None, ib_device=None)

    def wrap_engine(self, counter: EngineFaultCounter) -> None:
        """Wrap the manager's engine once; a later plan replaces the counter (calls
        already blocked by ``never_complete`` stay blocked)."""
        if isinstance(self.manager.engine, FaultyMooncakeEngine):
            self.manager.engine._counter = counter
        else:
            self.manager.engine = FaultyMooncakeEngine(self.manager.engine, counter)
