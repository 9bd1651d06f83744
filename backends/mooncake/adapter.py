"""Mooncake: sglang's ``MooncakeKVManager`` on the real Mooncake TransferEngine.

Mirrors ``sglang/srt/disaggregation/mooncake/conn.py``.  The manager takes the
process-wide engine from ``sglang.srt.distributed.device_communicators.
mooncake_transfer_engine`` (a real server creates it while it sets up model
parallelism); this adapter creates it for loopback with the TCP protocol
(``MOONCAKE_PROTOCOL=tcp``, ``MC_FORCE_TCP=1``, see harness.role_context).
"""

from __future__ import annotations

from backends.sglang_common import SglangCommonRole


class MooncakeRole(SglangCommonRole):
    impl = "mooncake"
    backend = "mooncake"
    conn_module = "sglang.srt.disaggregation.mooncake.conn"
    manager_class = "MooncakeKVManager"
    sender_class = "MooncakeKVSender"
    receiver_class = "MooncakeKVReceiver"
    bootstrap_class = "MooncakeKVBootstrapServer"

    def engine(self) -> str:
        return "real"

    def init_engine(self) -> None:
        from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (
            init_mooncake_transfer_engine,
        )

        init_mooncake_transfer_engine(hostname=self.host, gpu_id=None, ib_device=None)
