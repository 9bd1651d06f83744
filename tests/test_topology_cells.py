"""Cells on other deployment topologies, run for real: a prefill of two attention-TP ranks into
a decode of one, and one into two, each rank its own role process with its share of the KV
heads, the bytes checked on every decode rank at head-slice granularity; a TP pair the engine
cannot serve here is UNSUPPORTED before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.spec.scenario import get_scenario
from tests.cellruns import run_cells

ROOT = Path(__file__).resolve().parents[1]
HAPPY = [get_scenario("happy-path@p2-d1"), get_scenario("happy-path@p1-d2")]


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    """happy-path on p2-d1 and p1-d2 for the reference, Mooncake (real engine) and NIXL."""
    out = tmp_path_factory.mktemp("tp")
    return run_cells(["reference", "mooncake", "nixl"], HAPPY, out, jobs=6), out


def _events(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]


def _cell(run, scenario: str, impl: str):
    return next(c for c in run.cells if (c.scenario, c.impl) == (scenario, impl))


def test_tp_pairs_transfer_real_bytes_checked_per_head_slice(tp_run):
    run, out = tp_run
    for scenario in ("happy-path@p2-d1", "happy-path@p1-d2"):
        for impl in ("reference", "mooncake"):
            cell = _cell(run, scenario, impl)
            assert cell.verdict == "PASS", (scenario, impl, cell.reason)
            assert cell.bytes_verified > 0
    # every rank is its own role process: the prefill's two ranks, or the decode's two
    folder = out / "cells" / "happy-path@p2-d1--mooncake"
    assert (folder / "prefill.log").is_file() and (folder / "prefill.tp1.log").is_file()
    events = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["op"] == "start_prefill" and e["type"] == "ok"]
    assert [(e["role"], e["value"]["attn_tp"], e["args"]["layout"]["head_start"]) for e in starts] == [
        ("prefill", [2, 0], 0), ("prefill.tp1", [2, 1], 2)]
    assert len({e["args"]["bootstrap_port"] for e in starts}) == 1  # rank 0 serves it, rank 1 registers
    verify = next(e for e in events if e["op"] == "verify" and e["type"] == "ok")
    assert verify["value"]["ok"] and verify["value"]["bytes_verified"] == _cell(run, "happy-path@p2-d1", "mooncake").bytes_verified
    decode = out / "cells" / "happy-path@p1-d2--mooncake" / "history.jsonl"
    verify = next(e for e in map(json.loads, decode.read_text().splitlines())
                  if e["op"] == "verify" and e["type"] == "ok")
    assert verify["value"]["ranks"] == 2 and verify["value"]["ok"]  # each decode rank checked its own heads


def test_a_tp_pair_the_engine_cannot_serve_here_is_unsupported_with_what_would_make_it_run(tp_run):
    run, _ = tp_run
    for scenario in ("happy-path@p2-d1", "happy-path@p1-d2"):
        cell = _cell(run, scenario, "nixl")
        assert cell.verdict == "UNSUPPORTED", cell.reason
        assert cell.reason.startswith("needs VRAM") and "run on a GPU host" in cell.reason
        assert cell.divergence is None  # nothing ran to diverge


def test_a_prefill_of_two_pp_stages_runs_as_two_role_processes(tmp_path):
    """p1pp2-d1: the prefill's two stages (sglang's default split of 3 layers: [0, 1), [1, 3))
    are two role processes on one bootstrap port; the reference lands every byte, and Mooncake's
    verdict is the one its expectations say (B4: V of one stage's layer in another's)."""
    from harness.session import read_expectations

    run = run_cells(["reference", "mooncake"], [get_scenario("happy-path@p1pp2-d1")], tmp_path, jobs=2,
                    expectations=read_expectations(ROOT / "expectations" / "sglang-0.5.23.toml"))
    reference, mooncake = _cell(run, "happy-path@p1pp2-d1", "reference"), _cell(run, "happy-path@p1pp2-d1", "mooncake")
    assert reference.verdict == "PASS" and reference.bytes_verified > 0, reference.reason
    assert mooncake.as_expected, (mooncake.verdict, mooncake.reason)
    events = _events(tmp_path / "cells" / "happy-path@p1pp2-d1--mooncake")
    starts = [e for e in events if e["op"] == "start_prefill" and e["type"] == "ok"]
    assert [(e["role"], e["args"]["pp"][:2], e["args"]["layout"]["stage_start"], e["args"]["layout"]["stage_end"])
            for e in starts] == [("prefill", [2, 0], 0, 1), ("prefill.pp1", [2, 1], 1, 3)]


def test_dp_engines_serve_each_room_on_engine_room_mod_dp_with_bytes_checked_there(tmp_path):
    """p1-d1dp2 and p1dp2-d1: each DP engine is its own role process; multi-chunk-long-prompt's
    two rooms go to different engines (room mod 2) of each side that has two, and each room's
    bytes are verified on its engine while every other page there stays untouched.  Planted:
    the reference mutant that takes every room from prefill engine 0 fails R-DP-1."""
    import os

    from harness import implementations

    cells = [get_scenario("multi-chunk-long-prompt@p1-d1dp2"), get_scenario("multi-chunk-long-prompt@p1dp2-d1")]
    os.environ[implementations.MUTANTS_ENV] = "1"
    implementations.registered.cache_clear()
    try:
        run = run_cells(["reference", "mooncake", "mutant.dp-engine-zero"], cells, tmp_path, jobs=6)
    finally:
        del os.environ[implementations.MUTANTS_ENV]
        implementations.registered.cache_clear()
    for scenario in ("multi-chunk-long-prompt@p1-d1dp2", "multi-chunk-long-prompt@p1dp2-d1"):
        for impl in ("reference", "mooncake"):
            cell = _cell(run, scenario, impl)
            assert cell.verdict == "PASS", (scenario, impl, cell.reason)
            dp = [c for c in cell.checks if c["requirement"] == "R-DP-1"]
            assert len(dp) == 4 and all(c["ok"] is True for c in dp), dp
            assert any("engine 1 of 2" in c["detail"] for c in dp) and any("engine 0 of 2" in c["detail"] for c in dp)
    events = _events(tmp_path / "cells" / "multi-chunk-long-prompt@p1-d1dp2--mooncake")
    verify = [e for e in events if e["op"] == "verify" and e["type"] == "ok"][-1]["value"]
    assert verify["ok"] and verify["ranks"] == 2 and verify["bytes_verified"] > 0 and verify["bytes_untouched_checked"] > 0
    assert {e.get("engine", "decode") for e in events if e["op"] == "request_kv"} == {"decode", "decode.dp1"}
    assert (tmp_path / "cells" / "multi-chunk-long-prompt@p1-d1dp2--mooncake" / "decode.dp1.log").is_file()
    planted = _cell(run, "multi-chunk-long-prompt@p1dp2-d1", "mutant.dp-engine-zero")
    failed = {c["name"] for c in planted.checks if c["ok"] is False and c["requirement"] == "R-DP-1"}
    assert planted.verdict == "FAIL" and any(name.endswith("decode-served-on-room-engine") for name in failed), \
        planted.reason
