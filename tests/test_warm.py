"""Matrix cells on warm role pairs (harness.drive.warm): rooms moved per cell
(harness.drive.room_shift), which cells may share a pair, when a pair is retired, and what the
shared run gives up, checked against the same cells run isolated (same verdicts, same failing
checks); a cell whose result is not the expected one is confirmed in a fresh cell."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
from cellruns import run_cells

from harness.drive.pair import held_writes, kept, retires_pair
from harness.drive.room_shift import MIN_DIGITS, RoomShift, shiftable
from harness.drive.warm import WarmPairs
from harness.report.files import summary_markdown
from harness.report.html import render_index_html
from harness.report.load import pair_line, pairs_sentence
from harness.report.terminal import reasons
from harness.spec import steps as s
from harness.spec.history import Event, Op
from harness.spec.rooms import ROOM_STRIDE
from harness.spec.scenario import get_scenario
from harness.target.sglang import installed_target

ROOM = 3922118255432057885
OK_OBS = {"prefill": {"type": Event.OK, "value": {"loops": {"control": True}, "dead_threads": []}}}


def test_a_room_moves_in_every_value_that_names_it_and_back():
    shift = RoomShift([ROOM, 12345678901], 3)
    moved = ROOM + 3 * ROOM_STRIDE
    call = {"room": ROOM, "rooms": [ROOM, 7], "pages": [1, 2, 3], "frames": [(b"ABORT", str(ROOM).encode(), b"9")],
            "flag": True, "note": f"room {ROOM} failed; port 12345"}
    out = shift.out(call)
    assert out["room"] == moved and out["rooms"] == [moved, 7] and out["pages"] == [1, 2, 3] and out["flag"] is True
    assert out["frames"] == [(b"ABORT", str(moved).encode(), b"9")] and out["note"] == f"room {moved} failed; port 12345"
    assert shift.back(out) == call
    reply = {"rooms": {moved: {"held": [f"manager.transfer_infos[{moved}]"]}}, "other": moved + 1}
    assert shift.back(reply) == {"rooms": {ROOM: {"held": [f"manager.transfer_infos[{ROOM}]"]}}, "other": moved + 1}
    long_run = b"9" * 2_000_000  # a malformed frame's digits name no room, and cost no big-int parse
    assert shift.out(long_run) == long_run
    assert moved % 840 == ROOM % 840  # every room keeps its DP engine (R-DP-1)


def test_only_long_rooms_move():
    assert shiftable([ROOM]) and not shiftable([7]) and not shiftable([10 ** (MIN_DIGITS - 1) - 1])
    assert not shiftable([2**62])
    with pytest.raises(ValueError):
        RoomShift([42], 1)
    with pytest.raises(ValueError):
        RoomShift([ROOM], 0)


def test_a_matrix_pair_is_retired_after_a_kill_restart_point_freeze_injected_frame_or_failed_write():
    done = {"outcome": "completed"}
    plain = [s.StartRoles(), s.OpenRoom(ROOM), s.EngineFaults("prefill", delay_s=0.5), s.Sleep(0.1)]
    assert kept(plain, done, OK_OBS, alive=True, matrix=True) == "" and retires_pair(plain) is None
    for odd in (s.KillRole("prefill"), s.RestartRole("prefill"), s.ArmPoint("prefill", "worker-take-chunk"),
                s.InjectFrames("prefill", ((b"x",),)), s.FreezeRole("prefill"),
                s.EngineFaults("prefill", never_complete=True), s.EngineFaults("prefill", fail_nth=1),
                s.EngineFaults("prefill", fail_group=2)):
        assert type(odd).__name__ in kept(plain + [odd], done, OK_OBS, alive=True, matrix=True), odd
        assert retires_pair(plain + [odd]) == odd
    # explore's rule is unchanged: a step outside its trusted list ends its pair
    assert "OpenSender" in kept([s.StartRoles(), s.OpenSender(ROOM)], done, OK_OBS, alive=True)


def test_a_write_an_engine_fault_still_holds_retires_the_pair():
    fault = {"op": Op.ENGINE_FAULT, "value": {"fault": "slow", "t": 100.0, "delay_s": 60.0}}
    assert "in flight" in held_writes([fault], now=130.0)
    assert held_writes([fault], now=161.0) == ""
    gave_up = {"op": Op.ENGINE_FAULT, "value": {"fault": "fail", "t": 100.0, "after_s": 6.0}}
    assert held_writes([gave_up], now=101.0) == ""


def test_which_cells_run_isolated():
    warm = WarmPairs(installed_target(), Path("/nonexistent"), threading.Event(), 1)
    assert warm.why_isolated(get_scenario("happy-path"), 0) == ""
    assert "constructors" in warm.why_isolated(get_scenario("early-watermark"), 0)
    assert "TransferLayouts" in warm.why_isolated(get_scenario("draft-kv-layout"), 0)
    happy = get_scenario("happy-path")
    short = replace(happy, id="happy-short", steps=lambda seed: [happy.steps(seed)[0], s.OpenRoom(5)])
    assert "too short" in warm.why_isolated(short, 0)
    assert "no other cell" in warm.why_isolated(replace(happy, alone="a network fault"), 0)
    assert warm.key("mooncake", happy, 0) == warm.key("mooncake", get_scenario("decode-first"), 0)
    assert warm.key("mooncake", happy, 0) != warm.key("mooncake", get_scenario("bootstrap-timeout"), 0)


# cells that share one StartRoles (and so pairs), with late messages, ABORTs and an engine fault
SHARED = ["happy-path", "decode-first", "late-old-status", "abort-unguarded", "slow-aux", "stale-chunk-after-clear"]


def _failing(cell) -> list[str]:
    return sorted(c["name"] for c in cell.checks if not c.get("ok"))


@pytest.mark.e2e
def test_cells_on_warm_pairs_judge_as_they_do_isolated(tmp_path):
    """The isolation pairs give up, checked: the same cells on pairs and isolated give the same
    verdicts and failing checks, and pairs were reused (nightly: the whole default set)."""
    from importlib.metadata import version

    from harness.implementations import available
    from harness.judge.expectations import load_expectations
    from harness.spec.scenario import scenario_ids

    scenarios = [get_scenario(x) for x in SHARED]
    impls = ["reference", "mooncake"]
    # the shipped expectations: a known non-PASS cell (three of Mooncake's here) is as expected on
    # its pair, so it is not confirmed fresh and the comparison is of pair runs, not fresh ones
    shipped = Path(__file__).parent.parent / "expectations" / f"sglang-{version('sglang')}.toml"
    expectations = load_expectations(shipped, available(), scenario_ids()) if shipped.is_file() else None
    paired = run_cells(impls, scenarios, tmp_path / "pairs", jobs=2,  # cells of one key at once start pairs of their own
                       expectations=expectations)
    isolated = run_cells(impls, scenarios, tmp_path / "isolated", jobs=4, isolated=True, expectations=expectations)
    assert [(c.scenario, c.impl, c.verdict, _failing(c)) for c in paired.cells] == \
        [(c.scenario, c.impl, c.verdict, _failing(c)) for c in isolated.cells]

    def reused(cell) -> bool:  # a cell confirmed fresh (starved: a timing bound) still ran on its pair first
        return bool((cell.pair or {}).get("reused") or (cell.on_pair and (cell.on_pair.pair or {}).get("reused")))
    assert any(reused(c) for c in paired.cells if c.impl == "mooncake")
    assert all(c.pair is None and c.on_pair is None for c in isolated.cells)


@pytest.mark.e2e
def test_an_unexpected_result_on_a_pair_is_confirmed_in_a_fresh_cell(tmp_path):
    from harness.judge.expectations import load_expectations

    planted = tmp_path / "expect.toml"  # a planted wrong expectation: happy-path x reference FAILs
    planted.write_text('sglang = "0"\n[[expect]]\nscenario = "happy-path"\nimpl = "reference"\nverdict = "FAIL"\n'
                       'reason = "planted"\nlink = "tests/test_warm.py"\n')
    expectations = load_expectations(planted, ["reference"], ["happy-path", "decode-first"])
    run = run_cells(["reference"], [get_scenario("decode-first"), get_scenario("happy-path")], tmp_path / "out",
                    expectations=expectations)
    confirmed = {c.scenario: c for c in run.cells}["happy-path"]
    assert confirmed.verdict == "PASS" and confirmed.pair is None  # the reported run is the fresh cell's
    assert confirmed.on_pair is not None and confirmed.on_pair.verdict == "PASS" and confirmed.on_pair.pair
    assert (tmp_path / "out" / "on-pair" / "happy-path--reference" / "history.jsonl").is_file()
    assert {c.scenario: c for c in run.cells}["decode-first"].on_pair is None  # as expected: not run twice
    said = pair_line(confirmed)  # every report says the reported run is the fresh one
    assert said.startswith("confirmed in a fresh cell: PASS on a warm pair") and said.endswith("PASS fresh")
    assert said in summary_markdown(run).replace("\\", "") and "confirmed fresh" in render_index_html(run)
    assert "1 not as expected there ran again in a fresh cell" in pairs_sentence(run)


def test_reports_say_a_cell_ran_on_a_reused_pair_and_escape_what_the_history_holds():
    from harness.judge.results import CellResult, RunResult
    from harness.target.sglang import SglangInfo

    reused = CellResult(impl="mooncake", scenario="happy-path", verdict="FAIL", reason="r",
                        pair={"program": "<b>7</b>", "reused": True, "room_shift": 7})
    first = CellResult(impl="nixl", scenario="happy-path", verdict="PASS", pair={"program": 0, "reused": False})
    run = RunResult(sglang=SglangInfo(version="0.5.23", path="", source="installed"), seed=0, cells=[reused, first])
    assert pair_line(reused) == "ran on a warm role pair (its program <b>7</b>, rooms moved 7 strides)"
    assert pair_line(first) == ""  # a pair's first program starts its roles as an isolated cell does
    assert pairs_sentence(run).startswith("1 of 2 cells ran on a warm role pair after an earlier cell")
    assert any("rooms moved 7 strides" in line for line in reasons(run))
    assert "<b>7</b>" not in summary_markdown(run) and "&lt;b&gt;" not in pairs_sentence(run)


@pytest.mark.nightly
def test_the_whole_default_set_judges_the_same_on_pairs_and_isolated(tmp_path):
    """Issue 37's comparison: ``make matrix``'s cells (p1-d1 and the default topology set, every
    implementation, the shipped expectations) once on warm pairs and once ``--isolated`` give
    the same verdict and failing checks in every cell, and pairs served some of them.
    A cell's result is the one its report gives (its rerun alone when it had one:
    harness.judge.load); a check its expectation lists as ``sometimes`` (a documented race) may
    differ, and then the verdict with it."""
    import json
    import os
    import subprocess
    import sys
    from importlib.metadata import version

    def outcome(cell: dict) -> tuple[str, set[str], set[str]]:
        shown = cell.get("alone") or cell
        return shown["verdict"], {ch["name"] for ch in shown["checks"] if ch.get("ok") is False}, \
            set(cell.get("expected_sometimes") or [])

    def same(a, b) -> bool:  # a sometimes check failing on one side only may change the verdict with it
        raced = (a[1] ^ b[1]) & (a[2] | b[2])
        return a[1] - raced == b[1] - raced and (bool(raced) or a[0] == b[0])

    expectations = Path(__file__).parent.parent / "expectations" / f"sglang-{version('sglang')}.toml"
    env = {k: v for k, v in os.environ.items() if k != "PDCONFORM_TEST_SCENARIOS"}  # make matrix's set, as shipped
    runs, reused = {}, 0
    for how in ("pairs", "isolated"):
        args = [str(Path(sys.executable).parent / "pdconform"), "run", "--topology", "p1-d1", "--topology", "default", "--jobs", "16",
                "--out", str(tmp_path / how)] + (["--isolated"] if how == "isolated" else [])
        args += ["--expectations", str(expectations)] if expectations.is_file() else []
        subprocess.run(args, timeout=900, check=False, capture_output=True, env=env)
        cells = json.loads((tmp_path / how / "latest" / "results.json").read_text())["cells"]
        reused += sum(bool((c.get("pair") or {}).get("reused")) for c in cells)
        runs[how] = {(c["scenario"], c["impl"]): outcome(c) for c in cells}
    assert len(runs["pairs"]) > 300 and runs["pairs"].keys() == runs["isolated"].keys()
    assert not any(scenario.startswith("selftest") for scenario, _ in runs["pairs"])
    differ = {k: (runs["pairs"][k], runs["isolated"][k]) for k in runs["pairs"] if not same(runs["pairs"][k], runs["isolated"][k])}
    assert not differ
    assert reused > len(runs["pairs"]) / 10  # the pairs run's (81 of 528 measured, docs/performance.md)


def test_a_pair_starts_only_where_a_later_cell_of_its_key_can_reuse_it(tmp_path):
    """WarmPairs.expect / claim: a cell runs on a pair when another cell of its key is still to
    start (or an idle pair waits); the last cell of a key with no idle pair runs isolated, as
    does a key's only cell (a pair no later cell reuses costs more than an isolated cell)."""
    import threading

    from harness.target.sglang import installed_target

    warm = WarmPairs(installed_target(), tmp_path, threading.Event(), 4)
    happy = get_scenario("happy-path")
    warm.expect([("reference", happy), ("reference", happy), ("mooncake", happy)], 0)
    assert warm.claim("reference", happy, 0) is True  # the second reference cell may reuse its pair
    assert warm.claim("mooncake", happy, 0) is False  # its key's only cell
    assert warm.claim("reference", happy, 0) is False  # the last of its key, and no idle pair waits
    late = get_scenario("late-old-status")  # it injects a frame: its pair is retired after it
    assert retires_pair(warm.steps(late, 0)) is not None
    warm.expect([("reference", late), ("reference", late)], 0)
    assert warm.claim("reference", late, 0) is False  # no later cell could reuse a pair it started
