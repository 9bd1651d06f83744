"""harness.bench.contract: the transport contract of the real engines, measured.

Two real-engine tests (a source and a destination child each, small transfers: a few seconds
each), the wording of answers on made-up evidence, and the command line's usage errors.
"""

import subprocess
import sys
import time

import psutil
import pytest

from harness.bench import contract
from harness.bench.engines import EngineUnavailable

SMALL = {"total_bytes": 4 << 20, "block_bytes": 64 << 10}  # 64 blocks of 64 KiB


def _contract_children() -> list[int]:
    return [p.pid for p in psutil.Process().children(recursive=True)
            if "child_main" in " ".join(p.cmdline() or []) or "while True: pass" in " ".join(p.cmdline() or [])]


def _run(engine: str, **kwargs) -> dict:
    try:
        return contract.run_contract(engine, **SMALL, **kwargs)
    except EngineUnavailable as exc:
        pytest.skip(str(exc))


def _shape(result: dict, ids: list[str]) -> None:
    assert [a["id"] for a in result["answers"]] == ids
    for a in result["answers"]:
        assert a["question"] == contract.QUESTIONS[a["id"]]
        assert isinstance(a["answer"], str) and a["answer"] and isinstance(a["evidence"], dict)
    assert result["blocks"] == 64 and result["machine"]["cores"] >= 1 and result["date"]
    assert not _contract_children()  # every child (and the starving busy loop) ended


def test_mooncake_done_means_the_bytes_are_on_the_destination():
    start = time.monotonic()
    result = _run("mooncake", questions=["Q2"], done_repeats=3, starved_repeats=1)
    _shape(result, ["Q2"])
    assert result["kind"] == "real" and result["version"].startswith("mooncake-transfer-engine")
    q2 = result["answers"][0]
    as_is = q2["evidence"]["as_is"]
    # the destination read its buffer right after batch_transfer_sync returned 0: every block there
    assert as_is["engine_ok"] == as_is["complete_at_done"] == 3
    assert as_is["median_lag_s"] < 0.5 and not as_is["incomplete_runs"]
    assert q2["answer"].startswith("yes: at batch_transfer_sync returned 0")
    starved = q2["evidence"]["starved"]
    if not isinstance(starved, str):  # two cores: also with the receiving engine's threads starved
        assert starved["complete_at_done"] == starved["engine_ok"] == 1
    assert time.monotonic() - start < 30


def test_nixl_failures_surface_as_exceptions_and_never_write_unregistered_memory():
    result = _run("nixl", questions=["Q1", "Q4"], submit_repeats=1)
    _shape(result, ["Q1", "Q4"])
    (call,) = result["answers"][0]["evidence"]["calls"]
    assert call["api"] == "transfer" and call["sglang_calls_it"] and call["verified_runs"] == 1
    assert 0 < call["median_submit_s"] <= call["median_done_s"]
    cases = {c["case"]: c for c in result["answers"][1]["evidence"]["cases"]}
    assert set(cases) == {"remote_unregistered", "remote_out_of_range", "zero_length", "negative_length",
                          "local_unregistered", "unknown_peer"}
    for name in ("remote_unregistered", "remote_out_of_range", "unknown_peer"):
        step = cases[name]["sglang"]["value"]["prepare"]
        assert step["raised"]["type"].endswith("nixlNotFoundError"), step
    assert all(c["destination_alive"] and c["guard_bytes_written"] == 0 for c in cases.values())


# --------------------------------------------------------------------------- wording, no engine


def test_a_run_not_complete_at_done_is_reported_with_its_missing_blocks():
    runs = [{"engine_ok": True, "transfer_s": 0.01, "complete_at_done": True, "lag_s": 1e-4, "read_s": 2e-3,
             "blocks_incomplete": 0, "crc_ok": True, "complete_after_s": None},
            {"engine_ok": True, "transfer_s": 0.01, "complete_at_done": False, "lag_s": 1e-4, "read_s": 2e-3,
             "blocks_incomplete": 3, "crc_ok": False, "complete_after_s": 0.004}]
    said, evidence = contract._done_summary(runs, 64)
    assert said.startswith("1/2 complete") and "1 with up to 3 of 64 blocks missing" in said
    assert evidence["complete_at_done"] == 1 and evidence["incomplete_runs"] == [runs[1]]


@pytest.mark.parametrize("answer, words", [
    ({"answered": False, "waited_s": 30.0}, "no answer within 30 s"),
    ({"answered": True, "value": [-1, -1]}, "returns [-1, -1]"),
    ({"answered": True, "raised": {"type": "x.nixlRemoteDisconnectError", "message": "NIXL_ERR_REMOTE_DISCONNECT"},
      "raised_by": "check_xfer_state"}, "check_xfer_state raises x.nixlRemoteDisconnectError: NIXL_ERR_REMOTE_"),
    ({"answered": True, "value": {"final": [{"code": "ERR_RDMA_OP", "message": "peer gone"}],
                                  "at_submit": [{"code": "IN_PROGRESS", "message": ""}]}},
     "status IN_PROGRESS at submit, ERR_RDMA_OP (peer gone)"),
])
def test_engine_answers_in_words(answer, words):
    assert words in contract._outcome(answer)


# --------------------------------------------------------------------------- command line


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", "engine-contract", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["--engine", "bogus"], "unknown --engine bogus (known: mooncake, nixl, mori)"),
    (["--total-mib", "abc"], "--total-mib abc: give a whole number from 1 to 4096"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    out = _cli(*args)
    assert out.returncode == 2, out
    assert out.stderr.strip().splitlines() == [f"error: {message}"]
    assert out.stdout == ""
