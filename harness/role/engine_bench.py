"""The child side of the engine benchmark (harness.bench.engines): one engine instance and its
registered buffer per child process, serving the parent's commands over a socket.

An implementation's ``engine_bench`` tool (harness.implementations) is a :class:`BenchSides`:
its source and destination classes, subclasses of :class:`Side` (the source also of
:class:`SourceSide`).
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

from harness.target.role_context import LOOPBACK  # noqa: F401 - the sides bind loopback

SEED = 20240517


@dataclass(frozen=True)
class BenchSides:
    """What an implementation's ``engine_bench`` tool gives (harness.implementations):
    the classes of its two sides (subclasses of :class:`Side`; the source also of
    :class:`SourceSide`) and one line on how they are set up."""

    source: type
    destination: type
    setup: str


def _permutation(blocks: int):
    """The destination block of each source block: a fixed seeded permutation."""
    import numpy as np

    return np.random.default_rng(SEED).permutation(blocks)


# --------------------------------------------------------------------------- child side


class Side:
    """One engine instance and its registered buffer, inside a child process."""

    def __init__(self, total_bytes: int, block_bytes: int):
        import numpy as np

        self.total_bytes, self.block_bytes = total_bytes, block_bytes
        self.blocks = total_bytes // block_bytes
        self.buf = np.zeros(total_bytes, dtype=np.uint8)
        self.addr = int(self.buf.ctypes.data)

    # destination commands
    def clear(self) -> None:
        self.buf.fill(0)

    def checksum(self) -> int:
        return zlib.crc32(self.buf)


class SourceSide:
    """Source-side state shared by every engine: random bytes, the expected image."""

    def _fill_source(self) -> dict:
        import numpy as np

        rng = np.random.default_rng(SEED + 1)
        self.buf[:] = np.frombuffer(rng.bytes(self.total_bytes), dtype=np.uint8)
        self.perm = _permutation(self.blocks)
        expected = np.empty_like(self.buf)
        expected.reshape(self.blocks, self.block_bytes)[self.perm] = self.buf.reshape(self.blocks, self.block_bytes)
        return {"expected_crc": zlib.crc32(expected)}

    def _make_wrapper_counter(self):
        from harness.role.faults import EngineFaultCounter, EngineFaultPlan

        self.counter = EngineFaultCounter(EngineFaultPlan())

    def wrapper_stats(self) -> dict:
        return {"transfers": self.counter.transfers, "groups": self.counter.groups,
                "faults_logged": len(self.counter.snapshot())}

    # the engine calls of one transfer, on ``engine`` (raw, wrapped or a stub)
    def _drive(self, engine, deadline: float):
        raise NotImplementedError

    def _after(self, handle) -> None:
        """Untimed clean-up of one transfer (NIXL: release the handle)."""

    def transfer(self, instrumented: bool, timeout_s: float) -> float:
        """One transfer through the raw engine or its wrapper; returns its seconds."""
        engine = self.wrapped if instrumented else self.raw
        start = time.perf_counter()
        handle = self._drive(engine, start + timeout_s)
        seconds = time.perf_counter() - start
        self._after(handle)
        return seconds

    def wrapper_cost(self, calls: int) -> dict:
        """Seconds the wrapper adds to one transfer's engine calls, measured on a stub
        engine that answers at once (no I/O): the same calls as :meth:`transfer`, raw
        stub against the wrapper around it, best of 5 rounds of ``calls`` transfers.
        NIXL: the stub's transfer is done when posted, and one ``check_xfer_state``
        (the poll that sees ``"DONE"``) is added to both; ``added_s_per_poll`` is what
        the wrapper adds to each poll (polls before the last overlap the transfer)."""
        from harness.role.faults import EngineFaultCounter, EngineFaultPlan

        stub = self._stub()
        wrapped = type(self.wrapped)(stub, EngineFaultCounter(EngineFaultPlan()))

        def best(engine, step) -> float:
            rounds = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(calls):
                    step(engine)
                rounds.append((time.perf_counter() - start) / calls)
            return min(rounds)

        far = time.perf_counter() + 3600
        raw_s = best(stub, lambda e: self._drive(e, far))
        wrapped_s = best(wrapped, lambda e: self._drive(e, far))
        cost = {"raw_s": raw_s, "wrapped_s": wrapped_s}
        if hasattr(stub, "check_xfer_state"):
            # the stub's transfer is DONE at once (no poll loop, whose sleep(0) would
            # drown the difference); a real one ends with the poll that sees DONE
            handle = object()
            raw_poll = best(stub, lambda e: e.check_xfer_state(handle))
            wrapped_poll = best(wrapped, lambda e: e.check_xfer_state(handle))
            cost["added_s_per_poll"] = wrapped_poll - raw_poll
            cost["raw_s"] += raw_poll
            cost["wrapped_s"] += wrapped_poll
        cost["added_s"] = cost["wrapped_s"] - cost["raw_s"]
        return cost
