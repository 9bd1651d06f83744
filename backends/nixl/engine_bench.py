"""The NIXL sides of the engine benchmark (harness.bench.engines): two ``nixl_agent``
instances configured as ``NixlKVManager`` configures a prefill's and a decode's, the
source wrapped in :class:`backends.nixl.adapter.FaultyNixlAgent` for the instrumented runs."""

from __future__ import annotations

import time
from typing import Any

from harness.role.engine_bench import BenchSides, Side, SourceSide


def _nixl_agent(prefill: bool):
    """A nixl_agent configured as NixlKVManager configures its own: no backends in the
    config, STRICT thread sync, 8 worker threads on a prefill (0 on a decode), then
    ``create_backend("UCX", {"num_threads": "8"})`` (``{}`` on a decode)."""
    import uuid

    from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t

    threads = 8 if prefill else 0
    agent = nixl_agent(str(uuid.uuid4()), nixl_agent_config(
        backends=[], num_threads=threads, sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT))
    agent.create_backend("UCX", {"num_threads": str(threads)} if threads else {})
    return agent


class NixlDestination(Side):
    def __init__(self, total_bytes: int, block_bytes: int):
        super().__init__(total_bytes, block_bytes)
        self.agent = _nixl_agent(prefill=False)
        self.descs = self.agent.register_memory([(self.addr, total_bytes, 0, "")], "DRAM")
        if not self.descs:
            raise RuntimeError("NIXL register_memory failed on the destination")

    def info(self) -> dict:
        return {"metadata": self.agent.get_agent_metadata(), "addr": self.addr}

    def close(self) -> None:
        self.agent.deregister_memory(self.descs)


class NixlSource(Side, SourceSide):
    def __init__(self, total_bytes: int, block_bytes: int):
        super().__init__(total_bytes, block_bytes)
        from backends.nixl.adapter import FaultyNixlAgent

        self.fill = self._fill_source()
        self.raw = _nixl_agent(prefill=True)
        self.descs = self.raw.register_memory([(self.addr, total_bytes, 0, "")], "DRAM")
        if not self.descs:
            raise RuntimeError("NIXL register_memory failed on the source")
        self._make_wrapper_counter()
        self.wrapped = FaultyNixlAgent(self.raw, self.counter)

    def connect(self, peer: dict) -> None:
        import numpy as np

        self.peer_name = self.raw.add_remote_agent(peer["metadata"])
        bb = self.block_bytes

        def reqs(base: int, index) -> Any:  # rows of (addr, len, device id), as sglang builds them
            index = np.asarray(index, dtype=np.uint64)
            return np.column_stack((base + index * bb, np.full_like(index, bb), np.zeros_like(index)))

        self.src_reqs = reqs(self.addr, np.arange(self.blocks))
        self.dst_reqs = reqs(peer["addr"], self.perm)

    def _drive(self, agent, deadline: float):
        src = agent.get_xfer_descs(self.src_reqs, "DRAM")
        dst = agent.get_xfer_descs(self.dst_reqs, "DRAM")
        handle = agent.initialize_xfer("WRITE", src, dst, self.peer_name)
        if not handle:
            raise RuntimeError("initialize_xfer returned no handle")
        state = agent.transfer(handle)
        while state != "DONE":
            if state == "ERR":
                raise RuntimeError("NIXL transfer reported ERR")
            if time.perf_counter() > deadline:
                raise RuntimeError(f"NIXL transfer not DONE within its time limit (state {state})")
            time.sleep(0)
            state = agent.check_xfer_state(handle)
        return handle

    def _after(self, handle) -> None:
        self.raw.release_xfer_handle(handle)

    @staticmethod
    def _stub():
        class StubNixlAgent:  # every transfer completes as it is posted
            def get_xfer_descs(self, descs, mem_type="DRAM"):
                return descs

            def initialize_xfer(self, operation, local_descs, remote_descs, remote_agent):
                return True

            def transfer(self, handle):
                return "DONE"

            def check_xfer_state(self, handle):
                return "DONE"

        return StubNixlAgent()

    def close(self) -> None:
        self.raw.deregister_memory(self.descs)


SIDES = BenchSides(
    NixlSource, NixlDestination,
    setup="two processes: source = nixl_agent configured as NixlKVManager's prefill (UCX, 8 threads, "
          "STRICT sync); destination = nixl_agent as its decode (UCX, 0 threads); UCX_TLS=tcp on lo; "
          "buffers are numpy uint8 arrays registered as DRAM",
)
