"""The child side of the engine transport contract (harness.bench.contract): what every engine's
source and destination add to the engine benchmark's sides (harness.role.engine_bench) to
answer the contract's questions.

An engine's contract sides (``backends/<engine>/contract.py``: ``SIDES``, a
:class:`harness.role.engine_bench.BenchSides`) subclass its benchmark sides, or for an engine
without them the bench's :class:`~harness.role.engine_bench.Side`, and mix in
:class:`ContractSource` / :class:`ContractDestination`.  The engine-specific source commands
(each answers one question; the parent calls them by name) are listed on
:class:`ContractSource`.

Clocks
    Every cross-process time stamp is ``CLOCK_MONOTONIC`` (:func:`stamp`, seconds): one clock
    for every process of the machine, so a source's "done" and a destination's wake-up can be
    subtracted.

The "done" check (question 2)
    The destination binds a UDP socket on loopback (:meth:`ContractDestination.arm`) and
    blocks on it (:meth:`ContractDestination.check_on_signal`); the source sends it one
    datagram, carrying its stamp, the moment its engine first says "done"
    (:meth:`ContractSource.signal`).  The destination then reads at once, no sleep: first
    the first and last 8 bytes of every destination block (the *sentinels*, against the
    expected image's, which the source computes: :meth:`ContractSource.expected_sentinels`),
    then the CRC-32 of the whole buffer.  When something is missing it re-reads every
    millisecond until complete or ``settle_s`` passes, and says when it became complete.

The guard (question 4)
    A contract destination allocates :data:`GUARD_BYTES` more than it registers, right after
    its registered buffer, zeroed: a write to an address the engine should refuse (past the
    end of the registered region, or inside the guard) lands there, harmlessly, if the engine
    does not check; :meth:`ContractDestination.guard_report` counts the bytes it finds there.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import zlib
from typing import Any, Callable

from harness.target.role_context import LOOPBACK

#: unregistered bytes right after a contract destination's registered buffer
GUARD_BYTES = 1 << 20
#: bytes checked at each end of every destination block at "done"
SENTINEL_BYTES = 8
_SIGNAL = struct.Struct("!d")


def stamp() -> float:
    """Seconds on ``CLOCK_MONOTONIC``: comparable between the processes of one machine."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def describe_exception(exc: BaseException) -> dict:
    """``{"type": module.Name, "message": str}`` of an exception an engine call raised."""
    kind = type(exc)
    module = kind.__module__
    return {"type": kind.__name__ if module == "builtins" else f"{module}.{kind.__name__}",
            "message": str(exc)[:400]}


def attempt(call: Callable[[], Any]) -> dict:
    """Run one engine call; ``{"returned": repr, "seconds"}`` or ``{"raised": {...}, "seconds"}``."""
    start = stamp()
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - the exception is the measurement
        return {"raised": describe_exception(exc), "seconds": stamp() - start}
    return {"returned": value if isinstance(value, (int, float, str, bool, type(None))) else repr(value),
            "seconds": stamp() - start}


class Background:
    """One engine call on a daemon thread of its own (started at once), waited for with a bound:
    a call that never returns cannot stall the child, which the parent ends (kills) anyway."""

    def __init__(self, call: Callable[[], Any]):
        self.box: dict = {}
        self.started = stamp()
        self.thread = threading.Thread(target=self._run, args=(call,), name="contract-call", daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self.box["value"] = call()
        except Exception as exc:  # noqa: BLE001 - reported
            self.box["raised"] = describe_exception(exc)
        self.box["at"] = stamp()

    def wait(self, limit_s: float) -> dict:
        """``{"answered": True, "value" | "raised", "at", "seconds"}`` (``at``: the :func:`stamp`
        when the call ended; ``seconds``: since it started), or ``{"answered": False}`` when it
        is still running after ``limit_s`` seconds more."""
        self.thread.join(limit_s)
        if "at" not in self.box:
            return {"answered": False, "waited_s": limit_s}
        return {"answered": True, **self.box, "seconds": self.box["at"] - self.started}


def bounded(call: Callable[[], Any], limit_s: float) -> dict:
    """Run ``call`` on a thread of its own and wait for it at most ``limit_s`` seconds
    (:meth:`Background.wait`'s answer)."""
    return Background(call).wait(limit_s)


class StateLog:
    """The states a poll returned, run-length encoded: one entry per change, with the seconds
    since ``t0`` when it was first seen and how many polls in a row returned it; and the
    longest single poll (seconds), which tells a poll that waits from one that does not."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.runs: list[list] = []
        self.longest_poll_s = 0.0

    def add(self, state: Any) -> Any:
        state = state if isinstance(state, (int, str)) else str(state)
        if self.runs and self.runs[-1][0] == state:
            self.runs[-1][2] += 1
        else:
            self.runs.append([state, stamp() - self.t0, 1])
        return state

    def poll(self, call: Callable[[], Any]) -> Any:
        """Make one poll, timed; record and return its state."""
        start = stamp()
        state = call()
        self.longest_poll_s = max(self.longest_poll_s, stamp() - start)
        return self.add(state)

    def as_list(self) -> list[dict]:
        return [{"state": s, "at_s": round(at, 6), "polls": n, **({"longest_poll_s": round(self.longest_poll_s, 6)}
                                                                  if i == len(self.runs) - 1 else {})}
                for i, (s, at, n) in enumerate(self.runs)]


class ContractSource:
    """Mixed into an engine's source side, after :meth:`SourceSide._fill_source` ran.

    Engine-specific commands a contract source provides (all times in seconds):

    * ``contract_facts() -> dict``: engine, versions, which sglang calls the commands mirror;
    * ``submit_apis() -> list[str]`` and ``time_submit(api, timeout_s) -> dict``
      (``submit_s``, ``done_s``, ``layout``: ``"permuted"`` or ``"contiguous"``);
    * ``done_and_signal(port, timeout_s, blocks=None) -> dict`` (sglang's own completion
      signal; ``blocks``: transfer only the first that many source blocks);
    * ``poll_states(timeout_s) -> dict`` (``before``, ``at_submit``, ``during``, ``after_done``,
      ``after_release``);
    * ``failure_cases() -> list[str]`` and ``failure_case(name, timeout_s) -> dict``;
    * ``disconnect_variants() -> list[str]``, ``disconnect_start(variant, timeout_s, limit_s)``
      (submits and keeps the call, or a poll loop, running on a thread of its own, so that the
      answer's time stamp is when the engine gave it, not when the parent asked),
      ``disconnect_wait(limit_s)``, ``disconnect_resubmit(variant, limit_s)``.
    """

    _udp: socket.socket | None = None

    def expected_sentinels(self) -> bytes:
        """The first and last :data:`SENTINEL_BYTES` bytes of every destination block of the
        expected (permuted) image, block by block: ``blocks * 16`` bytes."""
        import numpy as np

        rows = self.buf.reshape(self.blocks, self.block_bytes)
        out = np.empty((self.blocks, 2 * SENTINEL_BYTES), dtype=np.uint8)
        out[self.perm] = np.concatenate([rows[:, :SENTINEL_BYTES], rows[:, -SENTINEL_BYTES:]], axis=1)
        return out.tobytes()

    def expected_prefix(self, blocks: int) -> dict:
        """The expected destination after a transfer of only the first ``blocks`` source blocks
        (the rest of the destination zero): its ``sentinels`` (as :meth:`expected_sentinels`)
        and ``crc`` (CRC-32)."""
        import numpy as np

        rows = self.buf.reshape(self.blocks, self.block_bytes)
        image = np.zeros_like(rows)
        image[self.perm[:blocks]] = rows[:blocks]
        sentinels = np.concatenate([image[:, :SENTINEL_BYTES], image[:, -SENTINEL_BYTES:]], axis=1)
        return {"sentinels": sentinels.tobytes(), "crc": zlib.crc32(image)}

    def contiguous_crc(self) -> int:
        """CRC-32 the destination holds after a contiguous (unpermuted) copy of the source."""
        return zlib.crc32(self.buf)

    def signal(self, port: int, at: float) -> None:
        """Tell the destination listening on loopback ``port`` that the engine said "done" at ``at``."""
        if self._udp is None:
            self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._udp.sendto(_SIGNAL.pack(at), (LOOPBACK, port))

    def close_signal(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None


class ContractDestination:
    """Mixed into an engine's destination side: the guard, the "done" check.

    Call :meth:`_keep_guard` right after the engine side's ``__init__`` ran with
    ``total_bytes + GUARD_BYTES`` bytes and before registering only ``total_bytes``."""

    _sock: socket.socket | None = None

    def _keep_guard(self, total_bytes: int) -> None:
        """Split the buffer into the ``total_bytes`` the engine will register and the guard after it."""
        self.whole = self.buf
        self.total_bytes, self.blocks = total_bytes, total_bytes // self.block_bytes
        self.buf, self.guard = self.whole[:total_bytes], self.whole[total_bytes:]

    def guard_info(self) -> dict:
        return {"addr": self.addr, "total_bytes": self.total_bytes,
                "guard_addr": self.addr + self.total_bytes, "guard_bytes": int(self.guard.size)}

    def info(self) -> dict:
        """The engine side's info (the next class in the MRO: an engine_bench destination) and the guard's."""
        return {**super().info(), **self.guard_info()}

    def close(self) -> None:
        """Close the "done" signal socket, then the engine side."""
        self.close_signal()
        super().close()

    def guard_report(self) -> dict:
        """How many guard bytes are not zero (written by a transfer the engine should have
        refused); zeroes the guard and the registered buffer for the next case."""
        import numpy as np

        written = int(np.count_nonzero(self.guard))
        self.whole.fill(0)
        return {"guard_bytes_written": written}

    def arm(self) -> int:
        """Bind the loopback UDP socket the source will signal "done" on; returns its port."""
        if self._sock is None:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._sock.bind((LOOPBACK, 0))
        return self._sock.getsockname()[1]

    def _sentinels(self):
        import numpy as np

        rows = self.buf.reshape(self.blocks, self.block_bytes)
        return np.concatenate([rows[:, :SENTINEL_BYTES], rows[:, -SENTINEL_BYTES:]], axis=1)

    def check_on_signal(self, sentinels: bytes, expected_crc: int, timeout_s: float, settle_s: float) -> dict:
        """Wait (at most ``timeout_s`` s) for the source's "done" datagram, then read the
        destination at once: ``lag_s`` (its wake-up after the source's "done"),
        ``blocks_incomplete`` (blocks whose sentinels differ from the expected image's),
        ``crc_ok`` (the whole buffer's CRC-32 against ``expected_crc``), ``read_s`` (the
        seconds from "done" to the end of that CRC) and, when it was not complete,
        ``complete_after_s`` (seconds after "done"; None: not within ``settle_s``)."""
        import numpy as np

        self._sock.settimeout(timeout_s)
        try:
            data, _ = self._sock.recvfrom(64)
        except socket.timeout:
            return {"signalled": False}
        woke = stamp()
        done_at = _SIGNAL.unpack(data)[0]
        expected = np.frombuffer(sentinels, dtype=np.uint8).reshape(self.blocks, 2 * SENTINEL_BYTES)
        incomplete = int(np.count_nonzero((self._sentinels() != expected).any(axis=1)))
        crc_ok = zlib.crc32(self.buf) == expected_crc
        out = {"signalled": True, "lag_s": woke - done_at, "blocks_incomplete": incomplete, "crc_ok": crc_ok,
               "read_s": stamp() - done_at}
        if not crc_ok or incomplete:
            out["complete_after_s"] = None
            deadline = stamp() + settle_s
            while stamp() < deadline:
                if zlib.crc32(self.buf) == expected_crc:
                    out["complete_after_s"] = stamp() - done_at
                    break
                time.sleep(0.001)
        return out

    def close_signal(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
