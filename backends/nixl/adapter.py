"""NIXL: sglang's ``NixlKVManager`` on a real NIXL agent, UCX over TCP on ``lo``.

Mirrors ``sglang/srt/disaggregation/nixl/conn.py``.  The manager creates its own
NIXL agent; KV buffers are registered as host memory (``DRAM``) through the
per-buffer ``kv_data_mem_kinds`` that sglang's decode scheduler sets.
``UCX_TLS=tcp`` and ``UCX_NET_DEVICES=lo`` come from harness.role_context.
"""

from __future__ import annotations

from typing import Any

from backends.sglang_common import SglangCommonRole


class NixlRole(SglangCommonRole):
    impl = "nixl"
    backend = "nixl"
    conn_module = "sglang.srt.disaggregation.nixl.conn"
    manager_class = "NixlKVManager"
    sender_class = "NixlKVSender"
    receiver_class = "NixlKVReceiver"
    bootstrap_class = "NixlKVBootstrapServer"

    def engine(self) -> str:
        return "real"

    def fill_backend_kv_args(self, kv_args: Any) -> None:
        kv_args.kv_data_mem_kinds = ["DRAM"] * len(kv_args.kv_data_ptrs)
