"""The Mooncake sides of the engine transport contract (harness.bench.contract).

Built on the engine benchmark's sides (backends/mooncake/engine_bench.py): the source is
sglang's ``MooncakeTransferEngine`` (``sglang/srt/distributed/device_communicators/
mooncake_transfer_engine.py``) over a real ``mooncake.engine.TransferEngine`` (TCP,
P2PHANDSHAKE); the destination a bare ``TransferEngine`` initialised and registered with the
same calls.  Each command says which call it makes:

* ``batch_transfer_sync`` -- sglang's ``MooncakeTransferEngine.batch_transfer_sync``
  (-> ``TransferEngine.batch_transfer_sync_write``), the call every KV write of
  ``MooncakeKVManager`` (``disaggregation/mooncake/conn.py``) ends in.  It returns 0 when
  the batch completed, a negative number otherwise; the wrapper turns any exception into -1.
* ``batch_transfer_async_write`` + ``get_batch_transfer_status`` and ``transfer_submit_write``
  + ``transfer_check_status``: the installed engine's asynchronous API, which sglang does not
  call.  ``transfer_check_status`` returns 0 (in progress), 1 (completed), -1 (failed) or -2
  (timed out).

Mooncake bounds its own synchronous waits by ``MC_TRANSFER_TIMEOUT`` (seconds, default 30,
plus a nanosecond per byte): the parent leaves that variable as the bench sets it.
"""

from __future__ import annotations

import time

from backends.mooncake.engine_bench import MooncakeDestination, MooncakeSource
from harness.bench.contract_sides import (
    GUARD_BYTES, Background, ContractDestination, ContractSource, StateLog, attempt, bounded, stamp)
from harness.role.engine_bench import BenchSides

_UNKNOWN_PEER = "127.0.0.1:1"  # nothing listens there (the children run in a private loopback network)
_AFTER_FREE = ("UNSUPPORTED: the poll that returns 1 (or -1) frees the batch (TransferEnginePy::"
               "transferCheckStatus calls freeBatchID); a later poll would read freed memory, and there "
               "is no release call")


class MooncakeContractDestination(ContractDestination, MooncakeDestination):
    def __init__(self, total_bytes: int, block_bytes: int):
        super().__init__(total_bytes + GUARD_BYTES, block_bytes)
        # register only the first total_bytes: the guard after them stays unregistered
        if self.engine.unregister_memory(self.addr) != 0 or self.engine.register_memory(self.addr, total_bytes) != 0:
            raise RuntimeError("Mooncake: re-registering the destination without its guard failed")
        self._keep_guard(total_bytes)


class MooncakeContractSource(ContractSource, MooncakeSource):
    def __init__(self, total_bytes: int, block_bytes: int):
        import numpy as np

        super().__init__(total_bytes, block_bytes)
        self.te = self.raw.engine  # the TransferEngine under sglang's wrapper
        self.spare = np.full(block_bytes, 7, dtype=np.uint8)  # never registered
        self._pending: Background | None = None
        self._bid = 0
        self._state: int | None = None

    def connect(self, peer: dict) -> None:
        super().connect(peer)
        self.peer = peer

    def contract_facts(self) -> dict:
        from importlib import metadata

        version = None
        for dist in ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine"):
            try:
                version = f"{dist} {metadata.version(dist)}"
                break
            except metadata.PackageNotFoundError:
                continue
        return {"engine": "mooncake", "kind": "real", "version": version, "transport": "TCP on loopback",
                "completion": "batch_transfer_sync returns 0 (sglang MooncakeTransferEngine.batch_transfer_sync)"}

    # ------------------------------------------------------------------ the calls

    def _sync(self, blocks: int | None = None) -> list[int]:
        """sglang's path: one wrapper batch_transfer_sync per batch (<= 1024 entries) of the first
        ``blocks`` blocks (None: all); the return codes."""
        batches, left = [], self.blocks if blocks is None else blocks
        for src, dst, lengths in self.batches:
            if left > 0:
                batches.append((src[:left], dst[:left], lengths[:left]))
            left -= len(src)
        return [self.raw.batch_transfer_sync(self.session_id, src, dst, lengths) for src, dst, lengths in batches]

    def _submit_whole(self) -> int:
        """One contiguous transfer_submit_write of the whole buffer; its batch id (< 0: refused)."""
        return self.te.transfer_submit_write(self.session_id, self.addr, self.peer["addr"], self.total_bytes)

    def _poll(self, bid: int, log: StateLog, deadline: float) -> int:
        state = log.poll(lambda: self.te.transfer_check_status(bid))
        while state == 0 and stamp() < deadline:
            time.sleep(0)
            state = log.poll(lambda: self.te.transfer_check_status(bid))
        return state

    def submit_apis(self) -> list[str]:
        return ["batch_transfer_sync", "batch_transfer_async_write", "transfer_submit_write"]

    def time_submit(self, api: str, timeout_s: float) -> dict:
        start = stamp()
        if api == "batch_transfer_sync":
            codes = self._sync()
            end = stamp()
            return {"submit_s": end - start, "done_s": end - start, "returned": codes, "layout": "permuted",
                    "ok": all(c == 0 for c in codes), "sglang_calls_it": True}
        if api == "batch_transfer_async_write":
            ids = [self.te.batch_transfer_async_write(self.session_id, s, d, n) for s, d, n in self.batches]
            submitted = stamp()
            code = self.te.get_batch_transfer_status(ids) if all(ids) else None
            end = stamp()
            return {"submit_s": submitted - start, "done_s": end - start, "status_call_s": end - submitted,
                    "returned": code, "layout": "permuted", "ok": code == 0, "sglang_calls_it": False}
        bid = self._submit_whole()
        submitted = stamp()
        state = self._poll(bid, StateLog(start), start + timeout_s) if bid > 0 else None
        end = stamp()
        return {"submit_s": submitted - start, "done_s": end - start, "returned": state, "layout": "contiguous",
                "ok": state == 1, "sglang_calls_it": False}

    def done_and_signal(self, port: int, timeout_s: float, blocks: int | None = None) -> dict:
        start = stamp()
        codes = self._sync(blocks)
        done = stamp()
        self.signal(port, done)
        return {"ok": all(c == 0 for c in codes), "returned": codes, "transfer_s": done - start,
                "done_means": "batch_transfer_sync returned 0"}

    def poll_states(self, timeout_s: float) -> dict:
        ids = [self.te.batch_transfer_async_write(self.session_id, s, d, n) for s, d, n in self.batches]
        status_call = attempt(lambda: self.te.get_batch_transfer_status(ids))
        start = stamp()
        bid = self._submit_whole()
        submit_s = stamp() - start
        log = StateLog(start)
        if bid > 0:
            self._poll(bid, log, start + timeout_s)
        return {"api": "transfer_submit_write + transfer_check_status", "layout": "contiguous",
                "before": "UNSUPPORTED: no handle exists before submit (transfer_submit_write creates the batch id)",
                "at_submit": {"returned": bid if bid <= 0 else "a batch id (> 0)", "seconds": submit_s},
                "during": log.as_list(), "after_done": _AFTER_FREE,
                "after_release": "UNSUPPORTED: there is no release call (the completing poll frees the batch)",
                "batch_api": {"get_batch_transfer_status": status_call,
                              "note": "blocks until every batch ends; returns 0 (all completed) or -1"},
                "sglang_call": "batch_transfer_sync: no handle to poll; the call returns at completion"}

    # ------------------------------------------------------------------ failures

    def failure_cases(self) -> list[str]:
        return ["remote_unregistered", "remote_out_of_range", "zero_length", "negative_length",
                "local_unregistered", "unknown_peer"]

    def failure_case(self, name: str, timeout_s: float) -> dict:
        bb, peer = self.block_bytes, self.peer
        src, dst, length, session = self.addr, peer["addr"], bb, self.session_id
        if name == "remote_unregistered":
            dst = peer["guard_addr"] + peer["guard_bytes"] // 4
            length = min(bb, peer["guard_bytes"] // 2)
        elif name == "remote_out_of_range":
            dst = peer["addr"] + peer["total_bytes"] - bb // 2
        elif name == "zero_length":
            length = 0
        elif name == "negative_length":
            length = -1
        elif name == "local_unregistered":
            src = int(self.spare.ctypes.data)
        elif name == "unknown_peer":
            session = _UNKNOWN_PEER
        out = {"call": f"MooncakeTransferEngine.batch_transfer_sync({session!r}, [src], [dst], [{length}])",
               "sglang": bounded(lambda: self.raw.batch_transfer_sync(session, [src], [dst], [length]), timeout_s)}
        if name == "negative_length":  # what the wrapper's blanket except hides
            out["engine"] = bounded(lambda: self.te.batch_transfer_sync_write(session, [src], [dst], [length]),
                                    timeout_s)
        return out

    # ------------------------------------------------------------------ disconnect

    def disconnect_variants(self) -> list[str]:
        return ["batch_transfer_sync", "transfer_submit_write"]

    def disconnect_start(self, variant: str, timeout_s: float, limit_s: float) -> dict:
        """Start the whole transfer: sglang's call on a thread of its own, or the asynchronous
        submit followed by polls (on a thread of their own, ``limit_s`` s at most)."""
        self._log = StateLog(stamp())
        if variant == "batch_transfer_sync":
            self._pending = Background(self._sync)
            return {"t_submit": self._pending.started, "call": "batch_transfer_sync (sglang)"}
        bid = self._submit_whole()
        self._pending = Background(lambda: self._poll(bid, self._log, stamp() + limit_s)) if bid > 0 else None
        self._state = bid
        return {"t_submit": self._log.t0, "returned": bid if bid <= 0 else "a batch id (> 0)",
                "call": "transfer_submit_write + transfer_check_status (polled from submit on)"}

    def disconnect_wait(self, limit_s: float) -> dict:
        if self._pending is None:  # the submit was refused
            return {"answered": True, "value": self._state, "at": self._log.t0, "ended_before_wait": True}
        pending, self._pending = self._pending, None
        answer = pending.wait(limit_s + 1)
        if self._log.runs:
            answer["states"] = self._log.as_list()
        if answer.get("value") == 0:
            answer["answered"] = False  # still in progress when the limit passed
        return answer

    def disconnect_resubmit(self, variant: str, limit_s: float) -> dict:
        peer_addr, bb = self.peer["addr"], self.block_bytes
        if variant == "batch_transfer_sync":
            return bounded(lambda: self.raw.batch_transfer_sync(self.session_id, [self.addr], [peer_addr], [bb]),
                           limit_s)

        def submit_and_poll() -> dict:
            bid = self.te.transfer_submit_write(self.session_id, self.addr, peer_addr, bb)
            state = self._poll(bid, StateLog(stamp()), stamp() + limit_s) if bid > 0 else None
            return {"submitted": bid if bid <= 0 else "a batch id (> 0)", "final_state": state}

        return bounded(submit_and_poll, limit_s + 1)

    def close(self) -> None:
        self.close_signal()
        super().close()


SIDES = BenchSides(
    MooncakeContractSource, MooncakeContractDestination,
    setup="two processes: source = sglang MooncakeTransferEngine over a real Mooncake TransferEngine (TCP, "
          "P2PHANDSHAKE); destination = a bare TransferEngine (same initialize/register calls) whose registered "
          "buffer is followed by an unregistered 1 MiB guard; buffers are numpy uint8 arrays",
)
