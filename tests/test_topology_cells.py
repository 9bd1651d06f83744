"""Cells on other deployment topologies, run for real: a prefill of two attention-TP ranks into
a decode of one, and one into two, each rank its own role process with its share of the KV
heads, the bytes checked on every decode rank at head-slice granularity; a TP pair the engine
cannot serve here is UNSUPPORTED from the engine's own refusal at run time, with the advice."""

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
    """NIXL is let try: its managers start, the decode registers, and sglang's own refusal
    (nixl/conn.py _prepare_payload_xfer, on the prefill's bootstrap thread) makes the prefill's
    next step Unsupported, with the advice and NIXL's words; no prediction decided it."""
    run, out = tp_run
    for scenario in ("happy-path@p2-d1", "happy-path@p1-d2"):
        cell = _cell(run, scenario, "nixl")
        assert cell.verdict == "UNSUPPORTED", cell.reason
        # the prefill's first wait carries it (an Unsupported from await_status ends the cell there)
        assert cell.reason.startswith("prefill.await_status: needs VRAM") and "run on a GPU host" in cell.reason
        assert "refused at run time" in cell.reason and "not implemented safely yet" in cell.reason, cell.reason
        assert "predicted" not in cell.reason
        assert cell.divergence is None  # an UNSUPPORTED cell is not compared with the reference
        events = _events(out / "cells" / f"{scenario}--nixl")
        assert any(e["op"] == "start_prefill" and e["type"] == "ok" for e in events)  # it ran
        assert any(e["op"] == "request_kv" and e["type"] == "ok" for e in events)  # the decode registered
        refused = [e for e in events if e["type"] == "fail" and e.get("unsupported")]
        assert refused and refused[0]["role"].startswith("prefill"), refused
        assert next(e for e in events if e["op"] == "cell-end")["value"]["outcome"] == "unsupported"


def test_a_prefill_of_two_pp_stages_runs_as_two_role_processes(tmp_path):
    """p1pp2-d1: the prefill's two stages (sglang's default split of 3 layers: [0, 1), [1, 3))
    are two role processes on one bootstrap port; the reference lands every byte, and Mooncake's
    verdict is the one its expectations say (B4: V of one stage's layer in another's).  NIXL
    refuses the whole-model decode into DRAM KV at run time (decode-only speculative decoding):
    UNSUPPORTED with NIXL's words and the advice, which says a GPU host is not enough there."""
    from harness.session import read_expectations

    run = run_cells(["reference", "mooncake", "nixl"], [get_scenario("happy-path@p1pp2-d1")], tmp_path, jobs=3,
                    expectations=read_expectations(ROOT / "expectations" / "sglang-0.5.23.toml"))
    reference, mooncake = _cell(run, "happy-path@p1pp2-d1", "reference"), _cell(run, "happy-path@p1pp2-d1", "mooncake")
    assert reference.verdict == "PASS" and reference.bytes_verified > 0, reference.reason
    assert mooncake.as_expected, (mooncake.verdict, mooncake.reason)
    nixl = _cell(run, "happy-path@p1pp2-d1", "nixl")
    assert nixl.verdict == "UNSUPPORTED", nixl.reason
    assert "HiSparse combined with decode-only speculative decoding" in nixl.reason, nixl.reason
    assert "needs VRAM" in nixl.reason and "a GPU host is not enough" in nixl.reason, nixl.reason
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


class _Recorder:
    """A RoleRecorder's snapshot, planted: no log records, the given dead threads."""

    def __init__(self, dead: list[dict]):
        self.dead = dead

    def snapshot(self):
        return [], list(self.dead)


def _nixl_role(dead: list[dict]):
    """A NixlRole with a planted recorder and no manager (nothing of sglang runs)."""
    from backends.nixl.adapter import NixlRole

    role = object.__new__(NixlRole)
    role.recorder, role.sglang_version, role.senders, role.receivers = _Recorder(dead), "0.5.23", {}, {}
    role.role = "prefill"
    return role


HETERO_TP = {"thread": "Thread-7 (bootstrap_thread_guarded)", "exception": "NotImplementedError",
             "message": "NIXL heterogeneous-TP direct-to-host KV transfer is not implemented safely yet"}


def test_nixl_turns_its_own_run_time_refusal_into_unsupported_with_the_advice(monkeypatch):
    """Planted: the prefill's bootstrap thread died of NIXL's DRAM refusal.  Every scheduler step
    on that role is then Unsupported (the advice first, then NIXL's own words); another death
    (B3's refused registration) is no refusal of this machine and is left for the checks; with
    VRAM pools nothing is converted; and no TP shape is refused before anything runs."""
    from harness.role.adapter import PREDICTED, Unsupported
    from harness.role.pool_device import POOL_DEVICE_ENV

    monkeypatch.delenv(POOL_DEVICE_ENV, raising=False)
    role = _nixl_role([HETERO_TP])
    for op, kwargs in (("poll", {"room": 7}), ("await_status", {"room": 7, "statuses": [2], "timeout_s": 0.1}),
                       ("init_sender", {"room": 7, "num_pages": 1, "aux_slot": 0}),
                       ("send_chunk", {"room": 7, "pages": [0]}), ("failure_reason", {"room": 7}),
                       ("clear", {"room": 7}), ("abort", {"room": 7}),
                       ("open_sender", {"room": 7, "bootstrap_addr": "127.0.0.1:1"})):
        with pytest.raises(Unsupported) as refused:
            getattr(role, op)(**kwargs)
        why = str(refused.value)
        assert why.startswith("needs VRAM:") and "run on a GPU host" in why, why
        assert "refused at run time: thread Thread-7 (bootstrap_thread_guarded) raised NotImplementedError: NIXL " \
               "heterogeneous-TP direct-to-host KV transfer is not implemented safely yet" in why, why
        assert PREDICTED not in why
    b3 = {"thread": "Thread-7", "exception": "ValueError", "message": "PP-heterogeneous transfer requires layer ids"}
    with pytest.raises(KeyError):  # no refusal recognised: the step goes on to sglang (here: no such room)
        _nixl_role([b3]).poll(7)
    monkeypatch.setenv(POOL_DEVICE_ENV, "cuda")
    with pytest.raises(KeyError):  # VRAM KV: the same words are no limit of this machine
        role.poll(7)
    monkeypatch.delenv(POOL_DEVICE_ENV)
    for prefill_tp, decode_tp, pp in ((2, 1, 1), (1, 2, 1), (1, 1, 2), (4, 2, 1)):
        assert role.unsupported_topology(prefill_tp, decode_tp, mla=False, prefill_pp=pp) is None


def test_a_prediction_kept_says_it_was_predicted(monkeypatch):
    """NIXL's layout skip (draft-kv-layout's executor skips before roles start) is still a
    prediction, and says so."""
    from harness.role.adapter import PREDICTED
    from harness.role.pool_device import POOL_DEVICE_ENV

    monkeypatch.delenv(POOL_DEVICE_ENV, raising=False)
    spec = {"attention": "MHA", "num_layers": 3, "stages": 1, "prefill": [0, 3, 0], "decode": [0, 3, 1]}
    assert _nixl_role([]).unsupported_layout(spec).startswith(PREDICTED)
    assert _nixl_role([]).unsupported_layout({**spec, "decode": [0, 3, 0]}) is None
