"""The NIXL sides of the engine transport contract (harness.bench.contract).

Built on the engine benchmark's sides (backends/nixl/engine_bench.py): two real
``nixl_agent`` instances (UCX over TCP on ``lo``, buffers registered as DRAM) configured as
``NixlKVManager`` (``sglang/srt/disaggregation/nixl/conn.py``) configures a prefill's and a
decode's.  The source drives a transfer as ``NixlKVManager`` does: ``get_xfer_descs`` for
both sides, ``initialize_xfer("WRITE", ...)``, ``transfer(handle)`` (its ``_post_xfer``:
"DONE", "PROC" or "ERR", or an exception), then ``check_xfer_state(handle)`` with
``time.sleep(0)`` between polls until "DONE" or "ERR" (its ``_await_handles``), and
``release_xfer_handle``.
"""

from __future__ import annotations

import time
from typing import Any

from backends.nixl.engine_bench import NixlDestination, NixlSource
from harness.bench.contract_sides import (
    GUARD_BYTES, Background, ContractDestination, ContractSource, StateLog, attempt, bounded, describe_exception,
    stamp)
from harness.role.engine_bench import BenchSides

_AFTER_RELEASE = ("UNSUPPORTED: release_xfer_handle frees the request (nixl_xfer_handle.release -> "
                  "releaseXferReq) while the Python handle keeps its address; check_xfer_state would read "
                  "freed memory")


def _ucx_version() -> str:
    """The version of the UCX library this process loaded (NIXL's UCX backend bundles its own), or "?"."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            path = next(line.split()[-1] for line in maps if "/libucp" in line)
        lib = ctypes.CDLL(path)
        lib.ucp_get_version_string.restype = ctypes.c_char_p
        return lib.ucp_get_version_string().decode()
    except (OSError, StopIteration, AttributeError):
        return "?"


class NixlContractDestination(ContractDestination, NixlDestination):
    def __init__(self, total_bytes: int, block_bytes: int):
        super().__init__(total_bytes + GUARD_BYTES, block_bytes)
        # register only the first total_bytes: the guard after them stays unregistered
        self.agent.deregister_memory(self.descs)
        self.descs = self.agent.register_memory([(self.addr, total_bytes, 0, "")], "DRAM")
        if not self.descs:
            raise RuntimeError("NIXL: re-registering the destination without its guard failed")
        self._keep_guard(total_bytes)


class NixlContractSource(ContractSource, NixlSource):
    def __init__(self, total_bytes: int, block_bytes: int):
        import numpy as np

        super().__init__(total_bytes, block_bytes)
        self.spare = np.full(block_bytes, 7, dtype=np.uint8)  # never registered
        self._pending: Background | None = None
        self._handle: Any = None
        self._state: str | None = None

    def connect(self, peer: dict) -> None:
        super().connect(peer)
        self.peer = peer

    def contract_facts(self) -> dict:
        from importlib import metadata

        return {"engine": "nixl", "kind": "real", "version": f"nixl {metadata.version('nixl')}, UCX {_ucx_version()}",
                "transport": "UCX over TCP on lo (UCX_TLS=tcp), DRAM",
                "completion": 'check_xfer_state returns "DONE" (sglang NixlKVManager._await_handles)'}

    # ------------------------------------------------------------------ the calls

    def _prep(self, src_reqs=None, dst_reqs=None, peer: str | None = None):
        agent = self.raw
        src = agent.get_xfer_descs(self.src_reqs if src_reqs is None else src_reqs, "DRAM")
        dst = agent.get_xfer_descs(self.dst_reqs if dst_reqs is None else dst_reqs, "DRAM")
        handle = agent.initialize_xfer("WRITE", src, dst, peer or self.peer_name)
        if not handle:
            raise RuntimeError("initialize_xfer returned no handle")
        return handle

    def _poll(self, handle, log: StateLog, deadline: float) -> str:
        state = log.poll(lambda: self.raw.check_xfer_state(handle))
        while state == "PROC" and stamp() < deadline:
            time.sleep(0)
            state = log.poll(lambda: self.raw.check_xfer_state(handle))
        return state

    def submit_apis(self) -> list[str]:
        return ["transfer"]

    def time_submit(self, api: str, timeout_s: float) -> dict:
        start = stamp()
        handle = self._prep()
        prepared = stamp()
        posted = self.raw.transfer(handle)
        submitted = stamp()
        state = posted if posted != "PROC" else self._poll(handle, StateLog(prepared), prepared + timeout_s)
        end = stamp()
        self.raw.release_xfer_handle(handle)
        return {"prep_s": prepared - start, "submit_s": submitted - prepared, "done_s": end - prepared,
                "returned": posted, "final": state, "layout": "permuted", "ok": state == "DONE",
                "sglang_calls_it": True}

    def done_and_signal(self, port: int, timeout_s: float, blocks: int | None = None) -> dict:
        handle = self._prep(self.src_reqs[:blocks], self.dst_reqs[:blocks])
        start = stamp()
        posted = self.raw.transfer(handle)
        state = posted if posted != "PROC" else self._poll(handle, StateLog(start), start + timeout_s)
        done = stamp()
        self.signal(port, done)
        self.raw.release_xfer_handle(handle)
        return {"ok": state == "DONE", "returned": state, "transfer_s": done - start,
                "done_means": 'check_xfer_state returned "DONE"'}

    def poll_states(self, timeout_s: float) -> dict:
        handle = self._prep()
        before = attempt(lambda: self.raw.check_xfer_state(handle))
        start = stamp()
        posted = self.raw.transfer(handle)
        posted_s = stamp() - start
        log = StateLog(start)
        if posted == "PROC":
            self._poll(handle, log, start + timeout_s)
        after = [attempt(lambda: self.raw.check_xfer_state(handle)) for _ in range(3)]
        released = attempt(lambda: self.raw.release_xfer_handle(handle))
        return {"api": "initialize_xfer + transfer + check_xfer_state", "layout": "permuted",
                "before": {"check_xfer_state after initialize_xfer, before transfer": before},
                "at_submit": {"returned": posted, "seconds": posted_s}, "during": log.as_list(),
                "after_done": {"three more polls": after}, "release": released, "after_release": _AFTER_RELEASE}

    # ------------------------------------------------------------------ failures

    def failure_cases(self) -> list[str]:
        return ["remote_unregistered", "remote_out_of_range", "zero_length", "negative_length",
                "local_unregistered", "unknown_peer"]

    def _case_reqs(self, name: str) -> tuple[list, list, str | None]:
        bb, peer = self.block_bytes, self.peer
        src, dst, length, agent = self.addr, peer["addr"], bb, None
        if name == "remote_unregistered":
            dst, length = peer["guard_addr"] + peer["guard_bytes"] // 4, min(bb, peer["guard_bytes"] // 2)
        elif name == "remote_out_of_range":
            dst = peer["addr"] + peer["total_bytes"] - bb // 2
        elif name == "zero_length":
            length = 0
        elif name == "negative_length":
            length = -1
        elif name == "local_unregistered":
            src = int(self.spare.ctypes.data)
        elif name == "unknown_peer":
            agent = "no-such-agent"
        return [(src, length, 0)], [(dst, length, 0)], agent

    def failure_case(self, name: str, timeout_s: float) -> dict:
        src, dst, agent = self._case_reqs(name)

        def run() -> dict:
            made: dict = {}

            def prepare() -> str:
                made["handle"] = self._prep(src, dst, agent)
                return "a transfer handle"

            steps: dict = {"prepare": attempt(prepare)}
            if "raised" in steps["prepare"]:
                return steps
            handle = made["handle"]
            steps["transfer"] = attempt(lambda: self.raw.transfer(handle))
            if steps["transfer"].get("returned") == "PROC":
                log = StateLog(stamp())
                self._poll(handle, log, stamp() + timeout_s / 2)
                steps["polls"] = log.as_list()
            steps["release"] = attempt(lambda: self.raw.release_xfer_handle(handle))
            return steps

        return {"call": f"get_xfer_descs + initialize_xfer('WRITE', [{src[0][1]} B], ...) + transfer + "
                        "check_xfer_state", "sglang": bounded(run, timeout_s)}

    # ------------------------------------------------------------------ disconnect

    def disconnect_variants(self) -> list[str]:
        return ["transfer"]

    def disconnect_start(self, variant: str, timeout_s: float, limit_s: float) -> dict:
        """Post the whole transfer and start polling it (on a thread of its own, ``limit_s`` s at most)."""
        handle = self._handle = self._prep()
        self._log = StateLog(stamp())
        posted = self.raw.transfer(handle)
        self._state = posted
        self._pending = None
        if posted == "PROC":
            self._pending = Background(lambda: self._poll(handle, self._log, stamp() + limit_s))
        return {"t_submit": self._log.t0, "returned": posted, "state_after_submit": posted,
                "call": "transfer + check_xfer_state (polled from submit on)"}

    def disconnect_wait(self, limit_s: float) -> dict:
        handle = self._handle
        if self._pending is None:  # transfer() itself said DONE or ERR
            return {"answered": True, "value": self._state, "at": self._log.t0, "ended_before_wait": True}
        answer = self._pending.wait(limit_s + 1)
        answer["states"] = self._log.as_list()
        if "raised" in answer:
            answer["raised_by"] = "check_xfer_state"
        if answer.get("value") == "PROC":
            answer["answered"] = False
        elif answer["answered"]:
            answer["release"] = bounded(lambda: self.raw.release_xfer_handle(handle), 5.0)
        return answer

    def disconnect_resubmit(self, variant: str, limit_s: float) -> dict:
        src, dst = self.src_reqs[:1], self.dst_reqs[:1]

        def run() -> dict:
            step = "initialize_xfer"
            try:
                handle = self._prep(src, dst)
                step = "transfer"
                posted = self.raw.transfer(handle)
                step = "check_xfer_state"
                state = posted if posted != "PROC" else self._poll(handle, StateLog(stamp()), stamp() + limit_s)
            except Exception as exc:  # noqa: BLE001 - which call raised is the measurement
                return {"raised_by": step, **describe_exception(exc)}
            return {"submitted": posted, "final_state": state}

        return bounded(run, limit_s + 1)

    def close(self) -> None:
        self.close_signal()
        super().close()


SIDES = BenchSides(
    NixlContractSource, NixlContractDestination,
    setup="two processes: source = nixl_agent configured as NixlKVManager's prefill (UCX, 8 threads, STRICT "
          "sync); destination = nixl_agent as its decode (UCX, 0 threads) whose registered buffer is followed by "
          "an unregistered 1 MiB guard; UCX_TLS=tcp on lo; buffers are numpy uint8 arrays registered as DRAM",
)
