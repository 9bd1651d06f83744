"""Mooncake: sglang's ``MooncakeKVManager`` on the real Mooncake TransferEngine (TCP, loopback).

Registered as the ``mooncake`` implementation (pyproject.toml entry point); the adapter
is backends/mooncake/adapter.py.
"""

from backends.sglang_releases import COMMON_PRELOAD, SGLANG_COMMON_RANGE
from harness.implementations import Implementation

IMPLEMENTATION = Implementation(
    "mooncake",
    "backends.mooncake.adapter:MooncakeRole",
    "sglang MooncakeKVManager on the real Mooncake TransferEngine (TCP, loopback)",
    rank=10,
    sglang_range=SGLANG_COMMON_RANGE,
    # not mooncake.engine: its import starts native threads, which a fork would not carry over
    preload=(*COMMON_PRELOAD, "sglang.srt.disaggregation.mooncake.conn", "backends.mooncake.adapter"),
    probe="backends.mooncake:probe",
    tools={"engine_bench": "backends.mooncake.engine_bench:SIDES"},
    role_env={"MOONCAKE_PROTOCOL": "tcp", "MC_FORCE_TCP": "1"},  # no RDMA device here: Mooncake's TCP transport
)


def probe() -> tuple[str, str]:
    """Mooncake's engine loads and starts; RuntimeError naming libibverbs when it is missing."""
    import subprocess

    try:
        from mooncake.engine import TransferEngine

        TransferEngine()
    except Exception as exc:
        try:
            libs = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            libs = ""
        hint = "" if "libibverbs.so.1 " in libs else " (libibverbs.so.1 missing: install the Debian package libibverbs1)"
        raise RuntimeError(f"{type(exc).__name__}: {exc}{hint}") from exc
    return "real", "mooncake.engine.TransferEngine loads (TCP protocol)"
