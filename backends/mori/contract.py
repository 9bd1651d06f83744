"""The Mori sides of the engine transport contract (harness.bench.contract).

The real Mori (amd-mori) needs AMD GPUs and ROCm and does not import on a CPU machine, so
these sides run pdconform's stand-in (backends/mori/standin: the ``mori.io`` IOEngine API of
amd-mori 1.2.4, moving bytes over its own TCP data plane); ``contract_facts`` says which one
ran.  Answers measured here are the stand-in's, not AMD's engine's.

Both sides make the calls ``MoriKVManager`` (``sglang/srt/disaggregation/mori/conn.py``)
makes: ``_init_engine``'s ``IOEngine(key, IOEngineConfig(host, port=0))`` and
``create_backend(BackendType.RDMA, RdmaBackendConfig(4, -1, 4, PollCqMode.POLLING, False))``
(sglang's defaults), ``register_memory(ptr, size, device, location)`` (host buffers here:
``-1``, ``MemoryLocationType.CPU``), ``register_remote_engine``; a transfer is
``_submit_batch_transfer_plan``'s ``allocate_transfer_uid`` + ``batch_write([src], [offsets],
[dst], [offsets], [sizes], [uid])`` (one status for the whole block list), awaited as
``_wait_transfer_completion`` awaits it: ``wait_all(statuses, timeout_ms=1000)`` (sglang's
``SGLANG_MORI_WAIT_POLL_MS``) until it returns something other than ``IN_PROGRESS``.
"""

from __future__ import annotations

import os
import time
import uuid

from harness.bench.contract_sides import (
    GUARD_BYTES, Background, ContractDestination, ContractSource, StateLog, bounded, stamp)
from harness.role.engine_bench import BenchSides, Side, SourceSide
from harness.target.role_context import LOOPBACK

WAIT_POLL_MS = 1000  # sglang's SGLANG_MORI_WAIT_POLL_MS default


def _engine(mode: str):
    """An IOEngine made as MoriKVManager._init_engine makes it; (engine, "real" | "standin")."""
    from backends.mori.adapter import use_standin_if_needed

    use_standin_if_needed()
    import mori
    from mori.io import BackendType, IOEngine, IOEngineConfig, PollCqMode, RdmaBackendConfig

    key = f"io-{mode}-dp0-tp0-pid{os.getpid()}-{LOOPBACK}-{uuid.uuid4().hex[:8]}"
    engine = IOEngine(key, IOEngineConfig(host=LOOPBACK, port=0))
    engine.create_backend(BackendType.RDMA, RdmaBackendConfig(4, -1, 4, PollCqMode.POLLING, False))
    if engine.get_engine_desc().port <= 0:
        raise RuntimeError(f"Mori IOEngine {key} bound no port")
    return engine, "standin" if getattr(mori, "__pdconform_standin__", False) else "real"


def _register(engine, addr: int, size: int, stale: bool = False):
    """Register host memory as MoriKVManager registers its aux buffers; ``stale``: deregister it
    again and return the descriptor (one the engine no longer knows)."""
    from mori.io import MemoryLocationType

    desc = engine.register_memory(addr, size, -1, MemoryLocationType.CPU)
    if stale:
        engine.deregister_memory(desc)
    return desc


def _codes(statuses) -> list[dict]:
    return [{"code": s.Code().name, "message": s.Message()} for s in statuses]


class MoriContractDestination(ContractDestination, Side):
    def __init__(self, total_bytes: int, block_bytes: int):
        super().__init__(total_bytes + GUARD_BYTES, block_bytes)
        self._keep_guard(total_bytes)
        self.engine, self.kind = _engine("decode")
        self.mem = _register(self.engine, self.addr, total_bytes)
        self.stale = _register(self.engine, self.addr + total_bytes, int(self.guard.size), stale=True)

    def info(self) -> dict:
        return {"engine_desc": self.engine.get_engine_desc().pack(), "mem_desc": self.mem.pack(),
                "stale_desc": self.stale.pack(), **self.guard_info()}

    def close(self) -> None:
        self.close_signal()
        self.engine.deregister_memory(self.mem)
        if hasattr(self.engine, "standin_close"):
            self.engine.standin_close()


class MoriContractSource(ContractSource, SourceSide, Side):
    def __init__(self, total_bytes: int, block_bytes: int):
        import numpy as np

        super().__init__(total_bytes, block_bytes)
        self.fill = self._fill_source()
        self.engine, self.kind = _engine("prefill")
        self.mem = _register(self.engine, self.addr, total_bytes)
        self.spare = np.full(block_bytes, 7, dtype=np.uint8)
        self.stale_local = _register(self.engine, int(self.spare.ctypes.data), block_bytes, stale=True)
        self._pending = None

    def connect(self, peer: dict) -> None:
        from mori.io import EngineDesc, MemoryDesc

        self.peer = peer
        self.peer_desc = EngineDesc.unpack(peer["engine_desc"])
        self.engine.register_remote_engine(self.peer_desc)
        self.remote, self.stale_remote = MemoryDesc.unpack(peer["mem_desc"]), MemoryDesc.unpack(peer["stale_desc"])
        bb = self.block_bytes
        self.plan = ([i * bb for i in range(self.blocks)], [int(j) * bb for j in self.perm], [bb] * self.blocks)

    def contract_facts(self) -> dict:
        import mori

        return {"engine": "mori", "kind": self.kind, "version": f"mori {mori.__version__}",
                "transport": "pdconform stand-in: Python TCP data plane on loopback (the real Mori: RDMA/XGMI, "
                             "AMD GPUs only)" if self.kind == "standin" else "amd-mori",
                "completion": "wait_all returns SUCCESS (sglang MoriKVManager._wait_transfer_completion)"}

    # ------------------------------------------------------------------ the calls

    def _write(self, local=None, loffs=None, remote=None, roffs=None, sizes=None) -> list:
        loffs, roffs, sizes = (self.plan[i] if v is None else v for i, v in enumerate((loffs, roffs, sizes)))
        local, remote = self.mem if local is None else local, self.remote if remote is None else remote
        uid = self.engine.allocate_transfer_uid()
        return self.engine.batch_write([local], [loffs], [remote], [roffs], [sizes], [uid])

    def _wait(self, statuses, deadline: float) -> str:
        from mori.io import StatusCode

        code = self.engine.wait_all(statuses, timeout_ms=WAIT_POLL_MS)
        while code == StatusCode.IN_PROGRESS and stamp() < deadline:
            code = self.engine.wait_all(statuses, timeout_ms=WAIT_POLL_MS)
        return code.name

    def _poll(self, status, log: StateLog, deadline: float) -> str:
        state = log.poll(lambda: status.Code().name)
        while state == "IN_PROGRESS" and stamp() < deadline:
            time.sleep(0)
            state = log.poll(lambda: status.Code().name)
        return state

    def submit_apis(self) -> list[str]:
        return ["batch_write"]

    def time_submit(self, api: str, timeout_s: float) -> dict:
        start = stamp()
        statuses = self._write()
        submitted = stamp()
        code = self._wait(statuses, start + timeout_s)
        end = stamp()
        return {"submit_s": submitted - start, "done_s": end - start, "returned": code, "layout": "permuted",
                "ok": code == "SUCCESS", "sglang_calls_it": True}

    def done_and_signal(self, port: int, timeout_s: float, blocks: int | None = None) -> dict:
        start = stamp()
        loffs, roffs, sizes = (part[:blocks] for part in self.plan)
        code = self._wait(self._write(loffs=loffs, roffs=roffs, sizes=sizes), start + timeout_s)
        done = stamp()
        self.signal(port, done)
        return {"ok": code == "SUCCESS", "returned": code, "transfer_s": done - start,
                "done_means": "wait_all returned SUCCESS"}

    def poll_states(self, timeout_s: float) -> dict:
        from mori.cpp import TransferStatus

        start = stamp()
        statuses = self._write()
        submit_s, at_submit = stamp() - start, statuses[0].Code().name
        log = StateLog(start)
        self._poll(statuses[0], log, start + timeout_s)
        after = [statuses[0].Code().name for _ in range(3)]
        return {"api": "batch_write + TransferStatus.Code()", "layout": "permuted",
                "before": "UNSUPPORTED: no status exists before submit (batch_write creates them); a "
                          f"TransferStatus the caller constructs reads {TransferStatus().Code().name}",
                "at_submit": {"returned": f"{len(statuses)} status(es), {at_submit}",
                              "seconds": submit_s}, "during": log.as_list(),
                "after_done": {"three more polls": after},
                "after_release": "UNSUPPORTED: no release call: the status is the caller's object and keeps "
                                 "its final code (see after_done)"}

    # ------------------------------------------------------------------ failures

    def failure_cases(self) -> list[str]:
        return ["remote_unregistered", "remote_out_of_range", "zero_length", "negative_length",
                "local_unregistered", "unknown_peer"]

    def failure_case(self, name: str, timeout_s: float) -> dict:
        bb, total = self.block_bytes, self.total_bytes
        args = {"remote_unregistered": dict(remote=self.stale_remote, roffs=[0]),
                "remote_out_of_range": dict(roffs=[total - bb // 2]),
                "zero_length": dict(sizes=[0]), "negative_length": dict(sizes=[-1]),
                "local_unregistered": dict(local=self.stale_local)}.get(name, {})
        args = {"loffs": [0], "roffs": [0], "sizes": [bb], **args}

        def run() -> dict:
            if name == "unknown_peer":
                self.engine.deregister_remote_engine(self.peer_desc)
            try:
                statuses = self._write(**args)
                at_submit = _codes(statuses)
                final = self._wait(statuses, stamp() + timeout_s / 2)
                return {"at_submit": at_submit, "wait_all": final, "final": _codes(statuses)}
            finally:
                if name == "unknown_peer":
                    self.engine.register_remote_engine(self.peer_desc)

        return {"call": f"batch_write(..., sizes=[{args['sizes'][0]}]) + wait_all", "sglang": bounded(run, timeout_s)}

    # ------------------------------------------------------------------ disconnect

    def disconnect_variants(self) -> list[str]:
        return ["batch_write"]

    def disconnect_start(self, variant: str, timeout_s: float, limit_s: float) -> dict:
        """Submit the whole transfer and start polling its status (on a thread of its own,
        ``limit_s`` s at most)."""
        self._log = StateLog(stamp())
        self._statuses = statuses = self._write()
        self._pending = Background(lambda: self._poll(statuses[0], self._log, stamp() + limit_s))
        return {"t_submit": self._log.t0, "state_after_submit": statuses[0].Code().name,
                "call": "batch_write + TransferStatus.Code() (polled from submit on)"}

    def disconnect_wait(self, limit_s: float) -> dict:
        statuses = self._statuses
        answer = self._pending.wait(limit_s + 1)
        answer.update(states=self._log.as_list(), final=_codes(statuses),
                      peer_failure=repr(self.engine.pop_peer_failure()))
        if answer.get("value") == "IN_PROGRESS":
            answer["answered"] = False
        return answer

    def disconnect_resubmit(self, variant: str, limit_s: float) -> dict:
        def run() -> dict:
            statuses = self._write(loffs=[0], roffs=[0], sizes=[self.block_bytes])
            return {"wait_all": self._wait(statuses, stamp() + limit_s), "final": _codes(statuses)}

        return bounded(run, limit_s + 1)

    def close(self) -> None:
        self.close_signal()
        self.engine.deregister_memory(self.mem)
        if hasattr(self.engine, "standin_close"):
            self.engine.standin_close()


SIDES = BenchSides(
    MoriContractSource, MoriContractDestination,
    setup="two processes, each a Mori IOEngine made as MoriKVManager._init_engine makes it (RDMA backend config "
          "of sglang's defaults) -- on this CPU machine pdconform's stand-in engine, not AMD's; the destination's "
          "registered buffer is followed by an unregistered 1 MiB guard; buffers are numpy uint8 arrays",
)
