"""The Mooncake sides of the engine benchmark (harness.bench.engines): sglang's
``MooncakeTransferEngine`` as the source, a bare ``TransferEngine`` as the destination,
and the source wrapped in :class:`backends.mooncake.adapter.FaultyMooncakeEngine` for
the instrumented runs."""

from __future__ import annotations

import os

from harness.role.engine_bench import BenchSides, Side, SourceSide
from harness.target.role_context import LOOPBACK

#: blocks per Mooncake batch_transfer_sync call (a batch of ~4096 fails over TCP)
MOONCAKE_MAX_BATCH_ENTRIES = 1024


class MooncakeDestination(Side):
    def __init__(self, total_bytes: int, block_bytes: int):
        super().__init__(total_bytes, block_bytes)
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        protocol = os.environ.get("MOONCAKE_PROTOCOL", "tcp")
        if self.engine.initialize(LOOPBACK, "P2PHANDSHAKE", protocol, "") != 0:
            raise RuntimeError("Mooncake TransferEngine.initialize failed")
        if self.engine.register_memory(self.addr, total_bytes) != 0:
            raise RuntimeError("Mooncake register_memory failed on the destination")

    def info(self) -> dict:
        return {"session_id": f"{LOOPBACK}:{self.engine.get_rpc_port()}", "addr": self.addr}

    def close(self) -> None:
        self.engine.unregister_memory(self.addr)


class MooncakeSource(Side, SourceSide):
    def __init__(self, total_bytes: int, block_bytes: int):
        super().__init__(total_bytes, block_bytes)
        from harness.target import gpu_import_shims

        gpu_import_shims.install()  # before the first sglang import
        from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import MooncakeTransferEngine

        from backends.mooncake.adapter import FaultyMooncakeEngine

        self.fill = self._fill_source()
        self.raw = MooncakeTransferEngine(hostname=LOOPBACK, gpu_id=None, ib_device=None)
        # MooncakeKVManager.register_buffer_to_engine registers its pools this way
        if self.raw.batch_register([self.addr], [total_bytes]) != 0:
            raise RuntimeError("Mooncake batch_register failed on the source")
        self._make_wrapper_counter()
        self.wrapped = FaultyMooncakeEngine(self.raw, self.counter)

    def connect(self, peer: dict) -> None:
        self.session_id = peer["session_id"]
        bb = self.block_bytes
        src = [self.addr + i * bb for i in range(self.blocks)]
        dst = [peer["addr"] + int(j) * bb for j in self.perm]
        step = MOONCAKE_MAX_BATCH_ENTRIES
        # (src_addrs, dst_addrs, lengths) per call, built once: not timed
        self.batches = [(src[k:k + step], dst[k:k + step], [bb] * len(src[k:k + step]))
                        for k in range(0, self.blocks, step)]

    def _drive(self, engine, deadline: float) -> None:
        # synchronous: bounded by Mooncake's own MC_TRANSFER_TIMEOUT (set by the parent)
        session = self.session_id
        for src, dst, lengths in self.batches:
            ret = engine.batch_transfer_sync(session, src, dst, lengths)
            if ret != 0:
                raise RuntimeError(f"batch_transfer_sync of {len(src)} blocks returned {ret}")

    @staticmethod
    def _stub():
        class StubMooncake:
            def batch_transfer_sync(self, session_id, buffers, peer_buffer_addresses, lengths) -> int:
                return 0

        return StubMooncake()

    def close(self) -> None:
        self.raw.batch_deregister([self.addr])


SIDES = BenchSides(
    MooncakeSource, MooncakeDestination,
    setup="two processes: source = sglang MooncakeTransferEngine (TCP, P2PHANDSHAKE) in a child that "
          "imported sglang; destination = a second Mooncake TransferEngine (same initialize/register "
          "calls, no sglang) in another child; buffers are registered numpy uint8 arrays",
)
