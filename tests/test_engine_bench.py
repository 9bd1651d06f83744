"""harness.bench.engines: raw vs instrumented KV throughput through the real engines.

The engine tests start two child processes per engine (the source imports torch,
and for Mooncake sglang: 5-10 s on a loaded 2-core machine), so they are marked
e2e; the unit tests of the verification, the sizes and the time limits are not.
"""

import math
import time

import psutil
import pytest

from harness.bench import engines as engine_bench
from harness.bench.engines import EngineBenchError, EngineUnavailable, _Child, _Session, compare

SMALL = 4 << 20  # 4 MiB in 64 blocks of 64 KiB


def _bench_children() -> list[int]:
    return [p.pid for p in psutil.Process().children(recursive=True)
            if "_child_main" in " ".join(p.cmdline() or [])]


@pytest.mark.e2e
@pytest.mark.parametrize("engine", engine_bench.engines())
def test_compare_moves_verified_bytes(engine):
    start = time.monotonic()
    try:
        result = compare(engine, total_bytes=SMALL, block_bytes=64 << 10, repeats=2)
    except EngineUnavailable as exc:
        pytest.skip(str(exc))
    # warm-up + 2 raw + 2 instrumented, each with the destination's CRC-32 equal to
    # the expected image (compare raises otherwise)
    assert result["verified_runs"] == 5
    assert result["checksum"].startswith("crc32:")
    assert result["blocks"] == 64
    for mode in ("raw", "instrumented"):
        assert len(result[mode]["bytes_per_s"]) == 2
        assert all(rate > 0 and math.isfinite(rate) for rate in result[mode]["bytes_per_s"])
        assert result[mode]["median_bytes_per_s"] > 0
    # the wrapper really was on the path of the instrumented runs, and injected nothing
    assert result["wrapper"] == {"transfers": 2, "groups": 2, "faults_logged": 0}
    assert math.isfinite(result["overhead_pct"]) and math.isfinite(result["paired_overhead_pct"])
    assert result["wrapper_cost"]["wrapped_s"] > 0
    assert not _bench_children()
    assert time.monotonic() - start < 60


class _FakeChild:
    def __init__(self, answers):
        self.answers = answers

    def call(self, command, wait_s, **kwargs):
        return self.answers[command]


def _session(dst_crc: int, expected: int) -> _Session:
    session = object.__new__(_Session)
    session.engine, session.timeout_s, session.verified_runs = "fake", 1.0, 0
    session.expected_crc = expected
    session.dst = _FakeChild({"clear": None, "checksum": dst_crc})
    session.src = _FakeChild({"transfer": 0.01})
    return session


def test_a_transfer_whose_bytes_did_not_arrive_is_refused():
    assert _session(0xABC, 0xABC).run(instrumented=True) == 0.01
    with pytest.raises(EngineBenchError, match="did not all arrive"):
        _session(0x0, 0xABC).run(instrumented=False)


@pytest.mark.parametrize("kwargs", [dict(engine="mori"), dict(total_bytes=1000, block_bytes=64),
                                    dict(block_bytes=0), dict(repeats=0), dict(total_bytes=True)])
def test_bad_arguments_are_refused_before_any_process_starts(kwargs):
    args = dict(engine="nixl", total_bytes=SMALL, block_bytes=64 << 10, repeats=1) | kwargs
    with pytest.raises(ValueError):
        engine_bench._check_sizes(**args)
    assert not _bench_children()


def test_a_child_that_does_not_answer_is_killed_within_the_limit():
    child = _Child("nixl", "destination")
    try:
        start = time.monotonic()
        with pytest.raises(EngineBenchError, match="no answer within"):
            child.reply("nothing asked", 0.5)
        assert time.monotonic() - start < 15
        assert child.proc.poll() is not None
    finally:
        child.close()
    assert not _bench_children()


def test_a_child_reports_an_unknown_request_and_leaves_on_stop():
    child = _Child("nixl", "destination")
    try:
        with pytest.raises(EngineBenchError, match="failed"):
            child.call("no_such_command", 15)
    finally:
        child.close()
    assert child.proc.returncode == 0


def test_table_shows_both_rates_and_the_overhead():
    result = {"engine": "mooncake", "total_bytes": 64 << 20, "block_bytes": 64 << 10, "repeats": 5,
              "raw": {"median_bytes_per_s": 1.0e9}, "instrumented": {"median_bytes_per_s": 0.98e9},
              "overhead_pct": 2.0, "paired_overhead_pct": 1.5, "wrapper_cost": {"added_s": 12e-6}}
    table = engine_bench.format_table([result])
    assert "mooncake" in table and "1000" in table and "980" in table and "+2.0" in table


def test_compare_interleaves_in_flipped_pairs_and_computes_the_overhead(monkeypatch):
    order = []

    class FakeSession:
        verified_runs = 0

        def __init__(self, engine, total_bytes, block_bytes, timeout_s):
            self.src = _FakeChild({"wrapper_cost": {"raw_s": 1e-6, "wrapped_s": 3e-6, "added_s": 2e-6}})

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def run(self, instrumented):
            order.append("i" if instrumented else "r")
            self.verified_runs += 1
            return 0.011 if instrumented else 0.010  # 1 MB in 10 ms raw, 11 ms instrumented

        def wrapper_stats(self):
            return {"transfers": 2, "groups": 2, "faults_logged": 0}

        def facts(self):
            return {"engine": "nixl"}

    monkeypatch.setattr(engine_bench, "_Session", FakeSession)
    result = compare("nixl", total_bytes=1_000_000, block_bytes=1000, repeats=4)
    assert "".join(order) == "riirriir"
    assert result["raw"]["median_bytes_per_s"] == pytest.approx(1e8)
    assert result["overhead_pct"] == pytest.approx(100 / 11)  # 1 - 10/11 of the raw rate
    assert result["paired_overhead_pct"] == pytest.approx(10.0)
    assert result["wrapper_cost"]["added_pct"] == pytest.approx(0.02)
    assert result["verified_runs"] == 8


@pytest.mark.e2e
def test_both_sides_of_a_bench_share_one_private_network():
    """Mooncake listens on 0.0.0.0 whatever it is told: as for cells, the bench's two sides run
    in one network namespace of their own (loopback only) when this machine allows it."""
    import os

    from harness.drive.contain import isolation_available

    if isolation_available() is not None:
        pytest.skip(isolation_available())
    try:
        session = _Session("mooncake", SMALL, 64 << 10, 30.0)
    except EngineUnavailable as exc:
        pytest.skip(str(exc))
    with session:
        spaces = {os.readlink(f"/proc/{child.proc.pid}/ns/net") for child in session.children}
        assert len(spaces) == 1 and os.readlink("/proc/self/ns/net") not in spaces
        devices = open(f"/proc/{session.dst.proc.pid}/net/dev").read().split("\n")[2:]
        assert [line.split(":")[0].strip() for line in devices if line.strip()] == ["lo"]
    assert not _bench_children()
