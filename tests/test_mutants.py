"""The planted-bug catalogue (backends/reference/mutants) and its judge (harness.mutants)."""

import json
import os
import subprocess
import sys

from backends.reference import mutants
from harness import ROOT
from harness.judge.results import CellResult, RunResult
from harness.mutants import outcomes, score_line
from harness.spec.requirements import requirement
from harness.target.sglang import SglangInfo


def _must_requirements() -> set[str]:
    text = (ROOT / "docs" / "protocol.md").read_text()
    import re

    return set(re.findall(r"^\| (R-[A-Z0-9-]+) \| MUST \|", text, re.M))


def test_the_catalogue_has_25_mutants_and_one_for_every_must_requirement():
    assert len(mutants.MUTANTS) >= 25
    assert len(mutants.BY_ID) == len(mutants.MUTANTS)  # ids are unique
    cited = {m.requirement for m in mutants.MUTANTS}
    assert _must_requirements() <= cited, sorted(_must_requirements() - cited)
    for m in mutants.MUTANTS:
        requirement(m.requirement)  # every ID exists in docs/protocol.md


def test_the_catalogue_table_in_the_docs_lists_every_mutant_with_its_requirement():
    """docs/mutants.md's table is read by people choosing what to run: one row per mutant of
    MUTANTS, with the mutant's own requirement, and no row for a mutant that is gone."""
    import re

    rows = dict(re.findall(r"^\| `([a-z0-9-]+)` \| (R-[A-Z0-9-]+) \|", (ROOT / "docs" / "mutants.md").read_text(), re.M))
    assert rows == {m.id: m.requirement for m in mutants.MUTANTS}


def test_every_mutant_applies_in_a_fresh_process():
    """Each patch must find the methods it replaces (a renamed method would make it a no-op
    or an error); a mutant run names the unknown ones."""
    code = ("import os, sys; from backends.reference import mutants\n"
            "os.environ['PDCONFORM_MUTANTS'] = '1'\n"
            "for m in mutants.MUTANTS:\n"
            "    os.environ[mutants.MUTANT_ENV] = m.id; mutants._applied.clear(); mutants.apply_from_env()\n"
            "os.environ[mutants.MUTANT_ENV] = 'nope'; mutants._applied.clear()\n"
            "try: mutants.apply_from_env()\n"
            "except KeyError as e: print('unknown:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={k: v for k, v in os.environ.items() if k != mutants.MUTANT_ENV})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "unknown mutant 'nope'" in out.stdout


def _cell(impl: str, scenario: str, verdict: str, checks: list[tuple[str, str, bool]]) -> CellResult:
    return CellResult(impl=impl, scenario=scenario, verdict=verdict, reason="r",
                      checks=[{"name": n, "requirement": r, "level": "MUST", "ok": ok, "detail": "d"}
                              for n, r, ok in checks])


def test_outcomes_count_only_a_check_citing_the_mutants_requirement():
    planted = {"mutant.a": {"id": "a", "requirement": "R-XFER-1", "bug": "b", "like": "l"},
               "mutant.b": {"id": "b", "requirement": "R-ABORT-2", "bug": "b", "like": "l"},
               "mutant.c": {"id": "c", "requirement": "R-HB-1", "bug": "b", "like": "l"}}
    run = RunResult(sglang=SglangInfo(version=None, path=None), seed=0, cells=[
        _cell("reference", "happy-path", "PASS", [("decode-success", "R-XFER-1", True)]),
        _cell("mutant.a", "happy-path", "FAIL", [("decode-success", "R-XFER-1", False)]),
        _cell("mutant.b", "happy-path", "FAIL", [("bytes-exact", "R-LAYOUT-1", False)]),  # another requirement
        _cell("mutant.c", "happy-path", "PASS", [("decode-success", "R-XFER-1", True)]),
    ])
    found, control = outcomes(run, planted)
    assert [(m.id, m.caught) for m in found] == [("a", True), ("b", False), ("c", False)]
    assert found[0].catching == [{"scenario": "happy-path", "check": "decode-success", "detail": "d"}]
    assert found[1].other == [{"scenario": "happy-path", "verdict": "FAIL", "reason": "r"}]
    assert control == [] and score_line(found) == "1 of 3 mutants caught"
    run.cells[0].verdict = "FAIL"
    assert outcomes(run, planted)[1][0]["impl"] == "reference"  # a failing control is reported


def test_pdconform_mutants_catches_a_planted_bug_end_to_end(tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness.cli", "mutants", "--mutant", "ack-twice", "--scenario",
                          "abort-ack-after-drain", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.rstrip().splitlines()[-1] == "1 of 1 mutants caught"
    data = json.loads((tmp_path / "latest" / "mutants.json").read_text())
    (entry,) = data["mutants"]
    assert entry["id"] == "ack-twice" and entry["requirement"] == "R-ABORT-2" and entry["caught"]
    assert {h["check"] for h in entry["catching"]} >= {"inflight-ack-after-drain-at-most-once"}
    assert data["score"] == {"caught": 1, "total": 1} and data["control"] == []


def test_an_unknown_mutant_is_a_usage_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness.cli", "mutants", "--mutant", "nope", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "unknown --mutant nope" in out.stderr and not any(tmp_path.iterdir())


def test_a_check_the_control_fails_too_catches_nothing():
    planted = {"mutant.a": {"id": "a", "of": "reference", "requirement": "R-XFER-1", "bug": "b", "like": "l"}}
    run = RunResult(sglang=SglangInfo(version=None, path=None), seed=0, cells=[
        _cell("reference", "happy-path", "FAIL", [("decode-success", "R-XFER-1", False)]),
        _cell("mutant.a", "happy-path", "FAIL", [("decode-success", "R-XFER-1", False)]),
    ])
    found, control = outcomes(run, planted)
    assert not found[0].caught and control[0]["impl"] == "reference"


def test_an_inherited_mutant_id_never_reaches_a_role(monkeypatch):
    """Only a mutant.<id> role runs a mutant, and only its own: the id is set by the
    registry, never taken from the caller's environment."""
    from harness import implementations

    seen = {}

    class Probe:
        def __init__(self, role, recorder):
            seen[role] = os.environ.get(implementations.MUTANT_ENV)

    monkeypatch.setenv(implementations.MUTANTS_ENV, "1")
    monkeypatch.setenv(implementations.MUTANT_ENV, "no-success-status")  # left over in the caller's shell
    implementations.registered.cache_clear()
    try:
        for name in ("reference", "mutant.ack-twice"):
            impl = implementations.implementation(name)
            monkeypatch.setattr(type(impl), "hook", lambda self, what: Probe)
            implementations.load_role_adapter(name, role=name, recorder=None)
    finally:
        implementations.registered.cache_clear()
    assert seen == {"reference": None, "mutant.ack-twice": "ack-twice"}
    monkeypatch.delenv(implementations.MUTANTS_ENV)
    assert mutants.apply_from_env() is None  # and without a mutant run, nothing is applied


def test_a_mutants_cells_stop_at_its_first_catch(tmp_path):
    """EarlyStop: the cell of the scenario citing the mutant's requirement runs first (one job)
    and catches it; its other cell is skipped and said so."""
    args = [sys.executable, "-m", "harness.cli", "mutants", "--mutant", "ack-twice", "--scenario", "happy-path",
            "--scenario", "abort-ack-after-drain", "--jobs", "1"]
    out = subprocess.run([*args, "--out", str(tmp_path / "stop")], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads((tmp_path / "stop" / "latest" / "mutants.json").read_text())
    assert data["skipped_cells"] == 1 and data["score"] == {"caught": 1, "total": 1}
    cells = json.loads((tmp_path / "stop" / "latest" / "results.json").read_text())["cells"]
    assert sorted((c["scenario"], c["impl"]) for c in cells if c["impl"] != "reference") == [
        ("abort-ack-after-drain", "mutant.ack-twice")]
    assert "1 cell(s) of caught mutants were not run" in out.stdout


def test_early_stop_ranks_each_mutants_cells_cheapest_citing_first_and_interleaves_mutants():
    """Each mutant's cells are ranked 1..n on their own (the control's, unranked, start first):
    the scenarios citing its requirement first, the cheapest first within them, steps counted
    (a load of 256 rooms has no sleeps but is not instant)."""
    from harness.mutants import EarlyStop
    from harness.spec.scenario import get_scenario

    scenarios = {sid: get_scenario(sid) for sid in ("happy-path", "load-64", "load-256", "abort-ack-after-drain")}
    planted = {"mutant.l": {"requirement": "R-LOAD-1"}, "mutant.a": {"requirement": "R-ABORT-2"}}
    rank = EarlyStop(planted, scenarios, 0).priority()
    assert [sid for sid in sorted(scenarios, key=lambda sid: rank[(sid, "mutant.l")])] == [
        "load-64", "load-256", "happy-path", "abort-ack-after-drain"]
    assert [sid for sid in sorted(scenarios, key=lambda sid: rank[(sid, "mutant.a")])] == [
        "abort-ack-after-drain", "happy-path", "load-64", "load-256"]
    assert sorted(rank[(sid, "mutant.a")] for sid in scenarios) == [1, 2, 3, 4]  # interleaved: ranks per mutant
    assert ("happy-path", "reference") not in rank


def test_a_cell_run_again_alone_is_judged_by_its_rerun():
    """outcomes reads a cell's rerun alone where there is one: a starved timing failure that
    passes alone catches nothing, and a catch the rerun alone shows counts."""
    planted = {"mutant.a": {"id": "a", "of": "reference", "requirement": "R-XFER-1", "bug": "b", "like": "l"},
               "mutant.b": {"id": "b", "of": "reference", "requirement": "R-XFER-1", "bug": "b", "like": "l"}}
    first_a = _cell("mutant.a", "happy-path", "FAIL", [("decode-success", "R-XFER-1", False)])
    first_a.alone = _cell("mutant.a", "happy-path", "PASS", [("decode-success", "R-XFER-1", True)])
    first_b = _cell("mutant.b", "happy-path", "PASS", [("decode-success", "R-XFER-1", True)])
    first_b.alone = _cell("mutant.b", "happy-path", "FAIL", [("decode-success", "R-XFER-1", False)])
    run = RunResult(sglang=SglangInfo(version=None, path=None), seed=0, cells=[
        _cell("reference", "happy-path", "PASS", [("decode-success", "R-XFER-1", True)]), first_a, first_b])
    found, control = outcomes(run, planted)
    assert [(m.id, m.caught) for m in found] == [("a", False), ("b", True)] and control == []


def test_a_starved_catch_is_provisional_until_its_rerun_alone(tmp_path, monkeypatch):
    """EarlyStop: a catch made only on timing bounds while starved defers the mutant's other
    cells and reruns (``skip``) but catches nothing; its rerun alone either catches the mutant or,
    passing, lets what was deferred run.  outcomes counts no starved timing failure that was not
    run again alone."""
    from types import SimpleNamespace

    from harness.judge import judge as judge_module
    from harness.mutants import EarlyStop
    from harness.spec import history as hist

    verdicts = {}  # a cell's history path -> its judged cell
    monkeypatch.setattr(hist, "load", lambda path: [str(path)])
    monkeypatch.setattr(judge_module, "judge_cell", lambda sc, seed, history, impl, exp: verdicts[history[0]])

    def ended(stop, impl, scenario, judged, alone=False):
        workdir = tmp_path / f"{impl}-{scenario}-{alone}"
        workdir.mkdir()
        (workdir / "history.jsonl").write_text("")
        verdicts[str(workdir / "history.jsonl")] = judged
        cell = SimpleNamespace(impl=impl, scenario=scenario, workdir=str(workdir))
        (stop.on_alone if alone else lambda c: stop.on_cell(0, 0, c))(cell)

    timer = [("bootstrap-deadline", "R-TIMEOUT-1", False)]
    starved_fail = _cell("mutant.t", "s1", "FAIL", timer)
    starved_fail.starved, starved_fail.timing_only = "load 16.0 on 2 cores", True
    starved_rerun = _cell("mutant.t", "s1", "FAIL", timer)  # caught, but its own threads waited for a core
    starved_rerun.timing_only, starved_rerun.load = True, {"duration_s": 10.0, "wait_s": 4.0}
    for confirmed, rerun in ((False, _cell("mutant.t", "s1", "PASS", [])), (True, _cell("mutant.t", "s1", "FAIL", timer)),
                             (False, starved_rerun)):
        stop = EarlyStop({"mutant.t": {"id": "t", "requirement": "R-TIMEOUT-1"}}, {"s1": None, "s2": None}, 0)
        ended(stop, "reference", "s1", _cell("reference", "s1", "PASS", []))
        ended(stop, "mutant.t", "s1", starved_fail)
        assert not stop.caught and stop.skip("mutant.t", "s2") and not stop.skip("mutant.t", "s1")
        ended(stop, "mutant.t", "s1", rerun, alone=True)
        assert (stop.caught == {"mutant.t"}) is confirmed and stop.skip("mutant.t", "s2") is confirmed
        assert not stop.provisional  # settled either way: nothing left waiting for ever
        tmp_path = tmp_path / "next"
        tmp_path.mkdir()
    unconfirmed = RunResult(sglang=SglangInfo(version=None, path=None), seed=0, cells=[
        _cell("reference", "s1", "PASS", []), starved_fail])
    planted = {"mutant.t": {"id": "t", "of": "reference", "requirement": "R-TIMEOUT-1", "bug": "b", "like": "l"}}
    assert not outcomes(unconfirmed, planted)[0][0].caught
    # its rerun alone catches, however loaded the machine still looked (a load average lags the main phase)
    starved_fail.alone = _cell("mutant.t", "s1", "FAIL", timer)
    starved_fail.alone.starved, starved_fail.alone.timing_only = "load 9.0 on 2 cores", True
    assert outcomes(unconfirmed, planted)[0][0].caught
