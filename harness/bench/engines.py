"""KV bytes per second through the real transfer engines, raw and under the harness's wrappers.

The question this answers: what does the harness's steady-state instrumentation
(the engine fault wrappers with a plan that injects nothing) cost on the engine's
data path?  Each engine that runs on a CPU machine is measured on one transfer:

* **Mooncake** (TCP on loopback): sglang's ``MooncakeTransferEngine``
  (``distributed/device_communicators/mooncake_transfer_engine.py``) and its
  ``batch_transfer_sync(session_id, src_addrs, dst_addrs, lengths)``, the call every
  KV write of ``MooncakeKVManager`` ends in;
* **NIXL** (UCX over TCP on ``lo``): a ``nixl_agent`` configured as
  ``NixlKVManager`` configures it, driven as its transfer worker drives it:
  ``get_xfer_descs`` for both sides, ``initialize_xfer("WRITE", ...)``, ``transfer``
  and then ``check_xfer_state`` until ``"DONE"`` (``time.sleep(0)`` between polls).

**raw** calls the engine object directly; **instrumented** makes the same calls
through :class:`backends.mooncake.adapter.FaultyMooncakeEngine` /
:class:`backends.nixl.adapter.FaultyNixlAgent` wrapped around the *same* engine
object, with an :class:`harness.role.faults.EngineFaultCounter` whose plan is
``EngineFaultPlan()`` (injects nothing).

Setup (two processes, like a prefill and a decode)
    The caller's process only coordinates.  A *source* child (the prefill side)
    owns the sending engine and a source buffer of ``total_bytes`` random bytes; a
    *destination* child (the decode side) owns a second engine instance and a
    destination buffer of ``total_bytes``, both numpy ``uint8`` arrays registered
    with their engine as host memory.  The transfer writes block ``i`` of the
    source (``block_bytes`` each) to block ``perm[i]`` of the destination, a fixed
    seeded permutation: the blocks land scattered like decode pages, and each is
    an entry of its own (sglang merges only pages contiguous on both sides).  The destination side uses the bare engine
    (Mooncake's ``TransferEngine`` initialised and registered with the same calls
    sglang's wrapper makes; NIXL's agent as ``NixlKVManager`` makes it for a
    decode): it only receives, and sglang's Python code is not on its data path,
    which spares it sglang's import (seconds of CPU).

Every run is verified
    Before each timed transfer the destination is zeroed; after it, the
    destination's CRC-32 must equal the CRC-32 of the expected destination image
    (computed once by the source), or :class:`EngineBenchError` is raised.  So no
    figure comes from a transfer that did not move its bytes.  One untimed, verified
    warm-up transfer comes first (it opens the engines' connections).

What is timed (seconds, ``time.perf_counter``)
    Mooncake: the ``batch_transfer_sync`` calls that carry the transfer (at most
    :data:`MOONCAKE_MAX_BATCH_ENTRIES` blocks per call: shared/notes/sglang-on-cpu.md
    records a batch of 4096 entries failing over TCP with a queue-full error).  NIXL: from
    ``get_xfer_descs`` to the ``check_xfer_state`` that returns ``"DONE"`` (the
    per-transfer work ``NixlKVManager`` does; the handle is released after the
    clock stops).  Rates are ``total_bytes / seconds`` in bytes per second.

Children leave with ``os._exit`` (NIXL 1.5.1's agent segfaults at interpreter
exit); every wait on a child is bounded and a child that does not answer in time
is killed.  Errors: :class:`EngineUnavailable` (the engine cannot be imported or
started here), :class:`EngineBenchError` (anything else: a failed or unverified
transfer, a child that timed out or died), ``ValueError`` for bad sizes.

``python -m harness.bench.engines [--engine mooncake|nixl] [--total-mib N]
[--block-kib N] [--repeats N]`` prints a table of :func:`compare` results.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import traceback
from multiprocessing.connection import Connection
from typing import Any

from harness import ROOT
from harness.drive.contain import isolation_available
from harness.implementations import implementation, registered
from harness.role.engine_bench import BenchSides

DEFAULT_TOTAL_BYTES = 64 << 20  # 64 MiB
DEFAULT_BLOCK_BYTES = 64 << 10  # 64 KiB: a KV page of a few tokens across heads
DEFAULT_REPEATS = 5
#: seconds a child may take to import its engine and register its buffer
#: (sglang's import alone takes 5-10 s on a loaded 2-core machine)
STARTUP_TIMEOUT_S = 120.0
#: seconds one transfer (plus the destination's zeroing and checksum) may take
TRANSFER_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
#: stub transfers per round when timing the wrapper's own cost (compare's ``wrapper_cost``)
WRAPPER_COST_CALLS = 1000

def engines() -> list[str]:
    """The implementations whose engines this benchmark can measure (an ``engine_bench`` tool)."""
    return [name for name, impl in registered().items() if "engine_bench" in impl.tools]


class EngineBenchError(RuntimeError):
    """A benchmark run failed: a transfer failed or did not deliver the expected bytes,
    or a child process timed out or died (the message carries its log's tail)."""


class EngineUnavailable(EngineBenchError):
    """The engine cannot be imported or started on this machine."""


# --------------------------------------------------------------------------- plan


def _check_sizes(engine: str, total_bytes: int, block_bytes: int, repeats: int) -> int:
    """Validate the arguments; return the number of blocks.  ValueError when wrong."""
    if engine not in engines():
        raise ValueError(f"engine must be one of {', '.join(engines())}, got {engine!r}")
    for name, value in (("total_bytes", total_bytes), ("block_bytes", block_bytes), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if total_bytes % block_bytes:
        raise ValueError(f"total_bytes ({total_bytes}) must be a multiple of block_bytes ({block_bytes})")
    return total_bytes // block_bytes


def sides(engine: str) -> BenchSides:
    """The bench sides of ``engine`` (imports its module: call it in the child that runs them)."""
    return implementation(engine).hook("engine_bench")



def _enter_network(join: int | None) -> str:
    """Move this child into a private loopback-only network namespace (``join`` None) or into
    the one of process ``join`` (the other side's), as cells do (harness.drive.contain):
    Mooncake's engine listens on 0.0.0.0 whatever it is told."""
    from harness.drive.contain import enter_network_of, isolate_network

    if join is None:
        return isolate_network()
    enter_network_of(join)
    return f"the network namespace of pid {join}"


def _child_main(engine: str, role: str, fd: int) -> None:
    """Serve one side over the connection on ``fd`` until ``stop`` or EOF; never returns
    (``os._exit``).  Requests are ``(command, kwargs)``; replies ``("ok", value)`` or
    ``("error" | "unavailable", text)``."""
    conn = Connection(fd)
    side = None
    code = 0
    try:
        from harness.target import role_context

        role_context.apply_role_env()
        implementation(engine).apply_role_env()
        while True:
            try:
                command, kwargs = conn.recv()
            except (EOFError, OSError):
                code = 1  # the parent went away
                break
            try:
                if command == "network":  # before the engine exists: its threads start in the namespace
                    conn.send(("ok", _enter_network(kwargs.get("join"))))
                elif command == "init":
                    try:
                        side = getattr(sides(engine), role)(**kwargs)
                    except ImportError as exc:
                        conn.send(("unavailable", f"{type(exc).__name__}: {exc}"))
                        continue
                    reply = dict(getattr(side, "fill", {}))
                    if role == "destination":
                        reply.update(side.info())
                    conn.send(("ok", reply))
                elif command == "stop":
                    if side is not None:
                        side.close()
                    conn.send(("ok", None))
                    break
                else:
                    conn.send(("ok", getattr(side, command)(**kwargs)))
            except Exception:  # noqa: BLE001 - reported to the parent, which raises
                conn.send(("error", traceback.format_exc(limit=6)))
    finally:
        try:
            conn.close()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


# --------------------------------------------------------------------------- parent side


class _Child:
    """A child process serving one side; its stdout and stderr go to a temporary log.  ``ENTRY``:
    the module and function the child runs (``fn(engine, role, fd)``); a subclass serving more
    commands names its own."""

    ENTRY = ("harness.bench.engines", "_child_main")

    def __init__(self, engine: str, role: str):
        self.engine, self.role = engine, role
        self.log = tempfile.TemporaryFile(mode="w+b")
        parent_sock, child_sock = socket.socketpair()
        module, fn = self.ENTRY
        code = f"import sys; from {module} import {fn}; {fn}(sys.argv[1], sys.argv[2], int(sys.argv[3]))"
        env = dict(os.environ)
        env.setdefault("MC_TRANSFER_TIMEOUT", str(int(TRANSFER_TIMEOUT_S)))
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, engine, role, str(child_sock.fileno())],
                cwd=str(ROOT), env=env, pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL,
                stdout=self.log, stderr=subprocess.STDOUT)
        except BaseException:
            parent_sock.close()
            self.log.close()
            raise
        finally:
            child_sock.close()
        self.conn = Connection(parent_sock.detach())

    def send(self, command: str, **kwargs) -> None:
        try:
            self.conn.send((command, kwargs))
        except OSError as exc:
            raise EngineBenchError(f"{self.engine} {self.role} child is gone ({exc}){self.tail()}") from None

    def reply(self, what: str, timeout_s: float) -> Any:
        """The answer to the last request; EngineBenchError after ``timeout_s`` seconds
        or when the child died, EngineUnavailable when its engine cannot load."""
        try:
            ready = self.conn.poll(timeout_s)
            status, value = self.conn.recv() if ready else (None, None)
        except (EOFError, OSError):
            status, value = "died", None
        if status == "ok":
            return value
        if status is None:
            self.kill()
            raise EngineBenchError(f"{self.engine} {self.role}: {what} gave no answer within {timeout_s:.0f} s"
                                   f"{self.tail()}")
        if status == "unavailable":
            raise EngineUnavailable(f"{self.engine} cannot load here: {value}")
        if status == "died":
            self.proc.wait(timeout=STOP_TIMEOUT_S)
            raise EngineBenchError(f"{self.engine} {self.role} child died during {what} "
                                   f"(exit {self.proc.returncode}){self.tail()}")
        raise EngineBenchError(f"{self.engine} {self.role}: {what} failed:\n{value}")

    def call(self, command: str, wait_s: float, **kwargs) -> Any:
        """Send ``command`` and return its answer, waiting at most ``wait_s`` seconds."""
        self.send(command, **kwargs)
        return self.reply(command, wait_s)

    def tail(self, lines: int = 15) -> str:
        try:
            self.log.seek(0)
            text = self.log.read().decode(errors="replace").splitlines()[-lines:]
        except (OSError, ValueError):
            return ""
        return ("\n--- child log (tail) ---\n" + "\n".join(text)) if text else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """Ask the child to deregister and leave; kill it when it does not within
        :data:`STOP_TIMEOUT_S` seconds."""
        if self.proc.poll() is None:
            try:
                self.conn.send(("stop", {}))
                if self.conn.poll(STOP_TIMEOUT_S):
                    self.conn.recv()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except (OSError, EOFError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self.conn.close()
        self.log.close()


class _Session:
    """Both sides of one engine, connected and warmed up (one verified transfer)."""

    def __init__(self, engine: str, total_bytes: int, block_bytes: int, timeout_s: float):
        self.engine, self.total_bytes, self.block_bytes = engine, total_bytes, block_bytes
        self.timeout_s = timeout_s
        self.children: list[_Child] = []
        try:
            self.dst = _Child(engine, "destination")
            self.children.append(self.dst)
            self.src = _Child(engine, "source")
            self.children.append(self.src)
            if isolation_available() is None:  # both sides in one private loopback-only network
                self.dst.call("network", STARTUP_TIMEOUT_S, join=None)
                self.src.call("network", STARTUP_TIMEOUT_S, join=self.dst.proc.pid)
            for child in self.children:  # both import and register at the same time
                child.send("init", total_bytes=total_bytes, block_bytes=block_bytes)
            peer = self.dst.reply("init", STARTUP_TIMEOUT_S)
            self.expected_crc = self.src.reply("init", STARTUP_TIMEOUT_S)["expected_crc"]
            self.src.call("connect", timeout_s, peer=peer)
            self.verified_runs = 0
            self.warmup_s = self.run(instrumented=False)
        except BaseException:
            self.close()
            raise

    def run(self, instrumented: bool) -> float:
        """One verified transfer; returns its seconds."""
        self.dst.call("clear", self.timeout_s)
        seconds = self.src.call("transfer", self.timeout_s + 5, instrumented=instrumented, timeout_s=self.timeout_s)
        crc = self.dst.call("checksum", self.timeout_s)
        if crc != self.expected_crc:
            raise EngineBenchError(f"{self.engine}: destination CRC-32 {crc:08x} after a "
                                   f"{'instrumented' if instrumented else 'raw'} transfer, expected "
                                   f"{self.expected_crc:08x}: the bytes did not all arrive")
        self.verified_runs += 1
        return seconds

    def wrapper_stats(self) -> dict:
        return self.src.call("wrapper_stats", self.timeout_s)

    def facts(self) -> dict:
        return {"engine": self.engine, "total_bytes": self.total_bytes, "block_bytes": self.block_bytes,
                "blocks": self.total_bytes // self.block_bytes, "setup": sides(self.engine).setup,
                "checksum": f"crc32:{self.expected_crc:08x}", "warmup_s": self.warmup_s}

    def close(self) -> None:
        for child in reversed(self.children):
            child.close()
        self.children = []

    def __enter__(self) -> "_Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _samples(total_bytes: int, seconds: list[float]) -> dict:
    rates = [total_bytes / s for s in seconds]
    return {"seconds": seconds, "bytes_per_s": rates, "median_bytes_per_s": statistics.median(rates)}


def measure(engine: str, *, total_bytes: int = DEFAULT_TOTAL_BYTES, block_bytes: int = DEFAULT_BLOCK_BYTES,
            repeats: int = DEFAULT_REPEATS, instrumented: bool, timeout_s: float = TRANSFER_TIMEOUT_S) -> dict:
    """Time ``repeats`` verified transfers of ``total_bytes`` bytes in blocks of
    ``block_bytes`` bytes through ``engine`` (``"mooncake"`` or ``"nixl"``), raw or
    through the harness's wrapper (``instrumented``), after one untimed warm-up.

    Returns a dict: ``engine``, ``mode`` (``"raw"``/``"instrumented"``),
    ``total_bytes``, ``block_bytes``, ``blocks``, ``repeats``, ``seconds`` (one per
    repeat), ``bytes_per_s`` (one per repeat), ``median_bytes_per_s``,
    ``verified_runs`` (transfers whose destination CRC-32 matched, warm-up
    included), ``checksum``, ``setup``, ``warmup_s`` and, when instrumented,
    ``wrapper`` (the counter's ``transfers``, ``groups``, ``faults_logged``).

    ``timeout_s`` bounds each transfer (seconds).  Raises ValueError for bad sizes,
    EngineUnavailable when the engine cannot load here, EngineBenchError when a
    transfer fails, is not verified, or a child does not answer in time.
    """
    _check_sizes(engine, total_bytes, block_bytes, repeats)
    with _Session(engine, total_bytes, block_bytes, timeout_s) as session:
        seconds = [session.run(instrumented) for _ in range(repeats)]
        result = {**session.facts(), "mode": "instrumented" if instrumented else "raw", "repeats": repeats,
                  **_samples(total_bytes, seconds), "verified_runs": session.verified_runs}
        if instrumented:
            result["wrapper"] = session.wrapper_stats()
    return result


def compare(engine: str, *, total_bytes: int = DEFAULT_TOTAL_BYTES, block_bytes: int = DEFAULT_BLOCK_BYTES,
            repeats: int = DEFAULT_REPEATS, timeout_s: float = TRANSFER_TIMEOUT_S) -> dict:
    """Raw against instrumented on the same engines, buffers and transfer:
    ``repeats`` of each, interleaved in pairs whose order flips each time (raw,
    instrumented, instrumented, raw, raw, ...) so that drift (other load, caches)
    falls on both alike, a steady one included.

    Returns a dict: the facts of :func:`measure` (``engine``, ``total_bytes``,
    ``block_bytes``, ``blocks``, ``setup``, ``checksum``, ``warmup_s``), ``repeats``,
    ``raw`` and ``instrumented`` (each ``seconds``, ``bytes_per_s``,
    ``median_bytes_per_s``), ``overhead_pct`` (how much lower the instrumented median
    rate is than the raw one, in percent of the raw median; negative when it is
    higher), ``paired_overhead_pct`` (the median over the pairs of
    ``instrumented_s / raw_s - 1``, in percent), ``verified_runs``, ``wrapper`` (the
    counter's ``transfers``, ``groups``, ``faults_logged``) and ``wrapper_cost``: the
    seconds the wrapper adds to one transfer's engine calls, timed on a stub engine
    in the source process (``raw_s``, ``wrapped_s``, ``added_s``; ``added_pct``:
    ``added_s`` in percent of the raw median transfer time; NIXL also
    ``added_s_per_poll`` for one ``check_xfer_state``).  On a shared machine the
    measured overheads carry the run-to-run noise of the transfers (several percent);
    ``wrapper_cost`` is the noise-free estimate of what the wrapper itself costs.
    Errors as :func:`measure`.
    """
    _check_sizes(engine, total_bytes, block_bytes, repeats)
    raw_s: list[float] = []
    instr_s: list[float] = []
    with _Session(engine, total_bytes, block_bytes, timeout_s) as session:
        for k in range(repeats):
            # raw, instr | instr, raw | raw, instr ...: a steady drift would always
            # favour the second of a pair; flipping each pair cancels it
            for instrumented in ((False, True) if k % 2 == 0 else (True, False)):
                (instr_s if instrumented else raw_s).append(session.run(instrumented))
        wrapper = session.wrapper_stats()
        cost = session.src.call("wrapper_cost", STARTUP_TIMEOUT_S, calls=WRAPPER_COST_CALLS)
        facts, verified = session.facts(), session.verified_runs
    raw, instr = _samples(total_bytes, raw_s), _samples(total_bytes, instr_s)
    overhead = (raw["median_bytes_per_s"] - instr["median_bytes_per_s"]) / raw["median_bytes_per_s"] * 100
    paired = statistics.median((i / r - 1) * 100 for r, i in zip(raw_s, instr_s))
    cost["added_pct"] = cost["added_s"] / statistics.median(raw_s) * 100
    return {**facts, "repeats": repeats, "raw": raw, "instrumented": instr, "overhead_pct": overhead,
            "paired_overhead_pct": paired, "verified_runs": verified, "wrapper": wrapper, "wrapper_cost": cost}


# --------------------------------------------------------------------------- entry point


def format_table(results: list[dict]) -> str:
    """A small text table of :func:`compare` results: median rates (MB = 10**6 bytes),
    the overhead from the medians, the paired overhead, and the wrapper's own cost per
    transfer (microseconds, timed on a stub engine)."""
    header = (f"{'engine':<9} {'total':>8} {'block':>8} {'reps':>4} {'raw MB/s':>9} {'instr MB/s':>10} "
              f"{'overhead %':>10} {'paired %':>8} {'wrapper us':>10}")
    rows = [header, "-" * len(header)]
    for r in results:
        raw, instr = r["raw"]["median_bytes_per_s"] / 1e6, r["instrumented"]["median_bytes_per_s"] / 1e6
        rows.append(f"{r['engine']:<9} {_size(r['total_bytes']):>8} {_size(r['block_bytes']):>8} {r['repeats']:>4} "
                    f"{raw:>9.0f} {instr:>10.0f} {r['overhead_pct']:>+10.1f} {r['paired_overhead_pct']:>+8.1f} "
                    f"{r['wrapper_cost']['added_s'] * 1e6:>10.1f}")
    return "\n".join(rows)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.engines",
                                     description="KV bytes/s through the real engines, raw vs the harness's wrappers")
    parser.add_argument("--engine", choices=engines(), action="append",
                        help="engine to measure (repeatable; default: all)")
    parser.add_argument("--total-mib", type=int, default=DEFAULT_TOTAL_BYTES >> 20, help="bytes per transfer, MiB")
    parser.add_argument("--block-kib", type=int, default=DEFAULT_BLOCK_BYTES >> 10, help="block (page) size, KiB")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="timed transfers per mode")
    args = parser.parse_args(argv)
    results, code = [], 0
    for engine in args.engine or engines():
        try:
            results.append(compare(engine, total_bytes=args.total_mib << 20, block_bytes=args.block_kib << 10,
                                   repeats=args.repeats))
        except EngineUnavailable as exc:
            print(f"{engine}: skipped: {exc}", file=sys.stderr)
        except (EngineBenchError, ValueError) as exc:
            print(f"{engine}: failed: {exc}", file=sys.stderr)
            code = 1
    if results:
        print(format_table(results))
    return code


if __name__ == "__main__":
    sys.exit(main())
