"""`pdconform diff RUN_A RUN_B`: the cells whose verdict changed."""

import subprocess
import sys
from pathlib import Path

from harness.judge.results import CellResult, RunResult, SglangInfo, dump_run
from harness.report.run_diff import changed_cells, changes_markdown

ROOT = Path(__file__).resolve().parents[1]


def make_run(version, **verdicts):
    return RunResult(sglang=SglangInfo(version=version, path=None), seed=0, cells=[
        CellResult(impl=key.split("__")[1], scenario=key.split("__")[0].replace("_", "-"), verdict=v,
                   reason=f"why {v}") for key, v in verdicts.items()])


A = make_run("0.5.17", room_reuse__nixl="FAIL", room_reuse__mori="PASS", happy_path__nixl="PASS",
             no_residue__nixl="WARN")
B = make_run("0.5.23", room_reuse__nixl="PASS", room_reuse__mori="FAIL", happy_path__nixl="PASS",
             dead_prefill__nixl="PASS")


def test_changed_cells_and_direction():
    changes = {(c.scenario, c.impl): c for c in changed_cells(A, B, all_cells=True)}
    assert set(changes) == {("room-reuse", "nixl"), ("room-reuse", "mori"), ("no-residue", "nixl"),
                            ("dead-prefill", "nixl")}
    assert changes[("room-reuse", "nixl")].direction == "better"
    assert changes[("room-reuse", "mori")].worse and changes[("room-reuse", "mori")].reason == "why FAIL"
    assert changes[("no-residue", "nixl")].direction == "only in A: worse" and changes[("no-residue", "nixl")].worse
    assert changes[("dead-prefill", "nixl")].direction == "only in B" and not changes[("dead-prefill", "nixl")].worse
    assert changed_cells(A, A) == []


def test_markdown():
    text = changes_markdown(A, B, changed_cells(A, B))
    assert "2 cell(s) changed" in text and "A = sglang 0.5.17" in text
    assert "| `room-reuse` | mori | PASS | FAIL | worse |  | why FAIL |" in text
    assert "No cell changed" in changes_markdown(A, A, [])


def test_cli_diff_exit_codes(tmp_path):
    dump_run(A, tmp_path / "a" / "results.json")
    dump_run(B, tmp_path / "b" / "results.json")

    def diff(*args):
        return subprocess.run([sys.executable, "-m", "harness.cli", "diff", *args], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)

    out = diff(str(tmp_path / "a"), str(tmp_path / "b" / "results.json"))
    assert out.returncode == 1 and "room-reuse" in out.stdout and "worse" in out.stdout  # a cell got worse
    out = diff(str(tmp_path / "b"), str(tmp_path / "a"), "--markdown")
    assert out.returncode == 1 and out.stdout.startswith("### pdconform diff: 2 cell(s) changed")
    assert "1 cell(s) only in A, 1 only in B (--all lists them)" in out.stdout
    out = diff(str(tmp_path / "a"), str(tmp_path / "a"))
    assert out.returncode == 0 and "0 cell(s) changed" in out.stdout
    (tmp_path / "junk.json").write_text("{\"schema\": 2}")
    for args in ([str(tmp_path / "a"), str(tmp_path / "missing")], [str(tmp_path / "a"), str(tmp_path / "junk.json")]):
        out = diff(*args)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr


def test_cli_diff_rejects_an_unknown_verdict(tmp_path):
    # A hand-edited or foreign results.json with a verdict pdconform does not know cannot
    # be ranked worse or better: bad input, exit 2, naming the value.
    dump_run(A, tmp_path / "a" / "results.json")
    text = (tmp_path / "a" / "results.json").read_text()
    (tmp_path / "odd.json").write_text(text.replace('"verdict": "WARN"', '"verdict": "MAYBE"', 1))
    out = subprocess.run([sys.executable, "-m", "harness.cli", "diff", str(tmp_path / "a"), str(tmp_path / "odd.json")],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "MAYBE" not in out.stdout and "Traceback" not in out.stderr, out.stderr
    assert "verdict" in out.stderr + out.stdout


def test_a_vanished_cell_fails_the_gate_and_another_schema_is_refused(tmp_path):
    import json

    only_happy = make_run("0.5.23", happy_path__nixl="PASS")
    with_failure = make_run("0.5.23", happy_path__nixl="PASS", room_reuse__nixl="FAIL")
    dump_run(with_failure, tmp_path / "a" / "results.json")
    dump_run(only_happy, tmp_path / "b" / "results.json")
    out = subprocess.run([sys.executable, "-m", "harness.cli", "diff", str(tmp_path / "a"), str(tmp_path / "b")],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0 and "1 cell(s) only in A" in out.stdout  # a partial run B: compared where both ran
    out = subprocess.run([sys.executable, "-m", "harness.cli", "diff", str(tmp_path / "a"), str(tmp_path / "b"),
                          "--all"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 1 and "only in A: worse" in out.stdout  # as a gate: the FAIL did not turn green by vanishing
    data = json.loads((tmp_path / "b" / "results.json").read_text())
    (tmp_path / "b" / "results.json").write_text(json.dumps({**data, "schema": 7}))
    out = subprocess.run([sys.executable, "-m", "harness.cli", "diff", str(tmp_path / "a"), str(tmp_path / "b")],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "schema 7; this pdconform reads schema 2" in out.stderr, out.stderr


def test_a_baseline_marks_each_cell_new_fixed_or_same_check_by_check():
    """run --baseline: the 0.5.17-like baseline FAILs a cell the new run PASSes (fixed), the
    new run FAILs one the baseline PASSed (new, naming the check), the rest stay."""
    from harness.judge.results import CellResult, RunResult, SglangInfo
    from harness.report.files import summary_markdown
    from harness.report.run_diff import baseline_lines, baseline_marks

    def cell(scenario, impl, verdict, failing=()):
        return CellResult(impl=impl, scenario=scenario, verdict=verdict,
                          checks=[{"name": n, "requirement": "R-X", "ok": n not in failing}
                                  for n in ("a-check", "b-check")])

    old = RunResult(sglang=SglangInfo(version="0.5.17", path=None), seed=0, cells=[
        cell("room-reuse", "mori", "FAIL", ["a-check"]), cell("slow-aux", "mori", "PASS"),
        cell("happy-path", "nixl", "PASS"), cell("no-residue", "nixl", "FAIL", ["a-check"]),
        cell("clear-then-abort", "nixl", "UNSUPPORTED")])
    new = RunResult(sglang=SglangInfo(version="0.5.23", path=None), seed=0, cells=[
        cell("room-reuse", "mori", "PASS"), cell("slow-aux", "mori", "FAIL", ["b-check"]),
        cell("happy-path", "nixl", "PASS"), cell("no-residue", "nixl", "FAIL", ["b-check"]),
        cell("late-old-abort", "nixl", "FAIL", ["a-check"]), cell("clear-then-abort", "nixl", "FAIL", ["a-check"])])
    marks = baseline_marks(old, new)
    assert {k: m["mark"] for k, m in marks.items()} == {
        "room-reuse x mori": "fixed", "slow-aux x mori": "new", "happy-path x nixl": "same",
        "no-residue x nixl": "same", "late-old-abort x nixl": "not in baseline",
        "clear-then-abort x nixl": "now judged"}  # UNSUPPORTED then: neither new nor fixed
    assert marks["slow-aux x mori"]["checks"] == ["fails now: b-check"]
    assert marks["no-residue x nixl"]["checks"] == ["fails now: b-check", "passes now: a-check"]
    new.baseline = {"path": "old", "sglang": "0.5.17", "marks": marks}
    lines = baseline_lines(new)
    assert lines[0] == "against baseline old (sglang 0.5.17): 1 new, 1 fixed, 1 now judged, 2 same, 1 not in baseline"
    assert "  fixed: room-reuse x mori: FAIL -> PASS (passes now: a-check)" in lines
    assert "**new** slow-aux x mori: PASS -> FAIL: fails now: b-check" in summary_markdown(new)


def test_diff_compares_the_cells_both_runs_have_unless_asked():
    from harness.judge.results import CellResult, RunResult, SglangInfo
    from harness.report.run_diff import changed_cells

    a = RunResult(sglang=SglangInfo(version="1", path=None), seed=0,
                  cells=[CellResult(impl="x", scenario=s, verdict="PASS") for s in ("s1", "s2", "s3")])
    b = RunResult(sglang=SglangInfo(version="2", path=None), seed=0,
                  cells=[CellResult(impl="x", scenario="s1", verdict="FAIL")])
    assert [(c.scenario, c.direction) for c in changed_cells(a, b)] == [("s1", "worse")]
    assert len(changed_cells(a, b, all_cells=True)) == 3
