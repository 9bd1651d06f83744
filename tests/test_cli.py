"""The command line: usage errors exit 2 with a clear message, never a traceback."""

import json
import os
import subprocess
import sys

import pytest


def pdconform(*args, cwd=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("args, message", [
    (["run", "--impl", "bogus"], "unknown --impl bogus"),
    (["run", "--scenario", "no-such-scenario"], "unknown --scenario no-such-scenario"),
    (["run", "--seed", "-1"], "--seed"),
    (["run", "--seed", "abc"], "--seed"),
    (["frobnicate"], "No such command"),
    (["run", "--out", "/proc/pdconform-cannot-write"], "cannot use --out"),
    (["run", "--out", ""], "--out needs a directory path"),
    (["run", "--out", "/etc/hostname"], "is a file, not a directory"),
    (["run", "--impl", "reference", "--scenario", "[/x]"], "unknown --scenario [/x]"),  # no rich markup
    (["repro", "[/x]", "--impl", "reference"], "unknown scenario [/x]"),
    (["run", "--impl", "reference", "--out", "~no-such-user-pdconform/x"], "cannot use --out"),
    (["run", "--impl", "reference", "--topology", "p9-d9"], "unknown --topology p9-d9"),
    (["run", "--impl", "reference", "--scenario", "happy-path@p9-d9"], "unknown topology p9-d9 in --scenario happy-path@p9-d9"),
    (["run", "--impl", "reference", "--scenario", "failure-fan-out", "--topology", "p2-d1"],
     "failure-fan-out does not run on topology p2-d1: it starts its own decode"),
    (["repro", "failure-fan-out@p2-d1", "--impl", "reference"], "does not run on topology p2-d1"),
    # numbers bounded where they are parsed (issue 34: a huge one made every NIXL cell ERROR)
    (["run", "--engine-setting", "nixl_progress_delay_us=99999999999999999999"], "a whole number from 0 to 1000000"),
    (["run", "--engine-setting", "nixl_progress_delay_us=-5"], "a whole number from 0 to"),
    (["run", "--seed", "99999999999999999999"], "--seed"),
    (["run", "--jobs", "100000"], "--jobs"),
    (["explore", "--impl", "reference", "--budget", "99999999999999999999"], "up to a day"),
    (["explore", "--impl", "reference", "--topology", "p9-d9"], "unknown --topology p9-d9 (known: default, nightly"),
    (["repro", "happy-path", "--impl", "reference", "--impl", "nixl"], "repro runs one cell: give one --impl"),
])
def test_usage_errors_exit_2(args, message):
    out = pdconform(*args)
    assert out.returncode == 2, out
    assert message in out.stderr + out.stdout
    assert "Traceback" not in out.stderr


def test_list_json_names_scenarios_and_requirements():
    out = pdconform("list", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["id"]: row for row in json.loads(out.stdout)}
    assert rows["happy-path"]["requirements"] == ["R-XFER-1", "R-DP-1", "R-LAYOUT-1", "R-TERM-1", "R-LIVE-2"]
    assert rows["happy-path"]["title"]
    assert rows["no-residue"]["opt_out"].keys() == {"no-residue-after-clear"} and rows["happy-path"]["opt_out"] == {}


def test_list_names_the_post_conditions_every_scenario_is_judged_on():
    out = pdconform("list")
    assert out.returncode == 0, out.stderr
    generic = [line for line in out.stdout.splitlines() if line.startswith("Judged in every scenario")]
    assert generic and "no-residue-after-clear (R-RESIDUE-1)" in generic[0] and "every-trail-terminal" in generic[0]
    assert "no-residue opts out of no-residue-after-clear" in out.stdout


def test_doctor_reports_python_sglang_and_every_engine():
    out = pdconform("doctor", "--json")
    report = json.loads(out.stdout)
    assert report["python"]["version"].count(".") == 2
    assert report["sglang"]["version"] == "0.5.23"
    assert report["sglang"]["path"].endswith("sglang")
    engines = {e["impl"]: e for e in report["engines"]}
    assert set(engines) == {"reference", "mooncake", "nixl", "mori"}
    for e in engines.values():
        assert e["engine"] in ("real", "standin", "reference", "unusable") and e["reason"] and e["sglang_range"]
    assert report["network"]["isolated"] is (os.geteuid() == 0) and report["network"]["detail"]
    assert engines["reference"]["engine"] == "reference" and "imports no sglang" in engines["reference"]["sglang_range"]
    assert engines["nixl"]["settings"] == {"nixl_progress_delay_us": 100} and ">= 0.5.22" in engines["nixl"]["sglang_range"]
    # This machine (CPU, no ROCm): real Mooncake and NIXL, Mori on the stand-in.
    assert engines["mooncake"]["engine"] == "real"
    assert engines["nixl"]["engine"] == "real"
    assert engines["mori"]["engine"] == "standin" and "amd-mori" in engines["mori"]["reason"]
    assert out.returncode == 0


def test_doctor_table():
    out = pdconform("doctor")
    for word in ("python", "sglang", "mooncake", "nixl", "mori", "standin"):
        assert word in out.stdout


def test_out_symlink_loop_is_a_usage_error(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    out = pdconform("run", "--impl", "reference", "--scenario", "happy-path", "--out", str(loop))
    assert out.returncode == 2 and "cannot use --out" in out.stderr and "Traceback" not in out.stderr


# two matrix runs, the simulator and two explore rates: 35 s of CPU; make bench is not make test's either
@pytest.mark.nightly
def test_bench_reports_every_figure_with_its_samples(tmp_path):
    (tmp_path / "run-3" / "cells").mkdir(parents=True)  # not pdconform's: never touched
    (tmp_path / "bench.json").write_text("{}")
    out = pdconform("bench", "--repeat", "2", "--impl", "reference", "--scenario", "happy-path", "--jobs", "2",
                    "--skip", "engines", "--skip", "shrink", "--skip", "isolation", "--seeds", "50",
                    "--explore-seconds", "3", "--out", str(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    bench = tmp_path / "latest"
    figures = {f["name"]: f for f in json.loads((bench / "bench.json").read_text())["figures"]}
    assert len(figures["matrix_wall_s"]["samples"]) == 2 and figures["matrix_wall_s"]["goal"] == ["<=", 60.0]
    assert figures["matrix_wall_s"]["note"].startswith("cells as expected per run: [1, 1] of 1")  # the shipped expectations
    assert len(figures["cell_overhead_s"]["samples"]) == 2  # one cell per run
    assert len(figures["matrix_cpu_s"]["samples"]) == 2 and all(s > 0 for s in figures["matrix_cpu_s"]["samples"])
    assert figures["simulator_runs_per_min"]["median"] > 0
    rate = figures["explore_programs_per_min[reference]"]
    assert len(rate["samples"]) == 2 and all(s > 0 for s in rate["samples"]) and rate["goal"] == [">=", 300.0]
    assert "matrix_cpu_s" in out.stdout
    per_impl = figures["cell_overhead_s[reference]"]
    assert per_impl["samples"] == figures["cell_overhead_s"]["samples"] and per_impl["goal"] is None
    assert "PASS cells" in per_impl["note"] and "per matrix" in per_impl["note"]
    assert "cell_overhead_s[reference]" in out.stdout  # the name, not eaten as rich markup
    assert (tmp_path / "run-3" / "cells").is_dir() and (tmp_path / "bench.json").read_text() == "{}"
    for i in (1, 2):  # each run's results.json, to read a figure's cells afterwards
        assert json.loads((bench / f"run-{i}" / "results.json").read_text())["cells"][0]["verdict"] == "PASS"


def test_bench_bad_skip_is_a_usage_error():
    out = pdconform("bench", "--skip", "everything")
    assert out.returncode == 2 and "unknown --skip everything" in out.stderr + out.stdout
    out = pdconform("bench", "--skip", "matrix", "--skip", "simulator", "--skip", "engines", "--skip", "explore",
                    "--skip", "shrink")
    assert out.returncode == 2 and "nothing to measure" in out.stderr + out.stdout


def test_bench_engine_buffers_beyond_memory_are_a_usage_error():
    out = pdconform("bench", "--engine-mib", "5000", "--skip", "matrix")
    assert out.returncode == 2 and "--engine-mib" in out.stderr + out.stdout and "Traceback" not in out.stderr


def test_a_known_bug_is_judged_against_the_shipped_expectations_by_default(tmp_path):
    """No --expectations: the file shipped for sglang 0.5.23 applies, so a documented bug is
    'known B13' and exits 0; --expectations none makes it a regression (judged again from the
    stored run: the cell's history is the same, and a second Mori cell costs 20 s of CPU)."""
    ran = pdconform("run", "--scenario", "late-old-status", "--impl", "mori", "--out", str(tmp_path / "out"))
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "late-old-status x mori: known B13 (bug): FAIL" in ran.stdout
    lines = ran.stdout.rstrip().splitlines()
    assert lines[-3].startswith("expectations: expectations/sglang-0.5.23.toml (shipped")
    progress = [line for line in ran.stderr.splitlines() if not line.startswith("warning: the machine was overloaded")]
    assert progress[-1].startswith("[1/1] late-old-status x mori: known B13 (bug): FAIL, ")  # off a terminal; the load
    # warning (harness/report/load.py) may follow it on a loaded machine
    from harness import program

    line = f"{program()} repro late-old-status --impl mori"  # pasteable at the checkout root, and the same everywhere
    assert line in ran.stdout
    latest = tmp_path / "out" / "latest"
    assert line in (latest / "summary.md").read_text()
    assert line in (latest / "cells" / "late-old-status--mori" / "cell.html").read_text()
    assert lines[-2] == "1 cell: all as expected, 1 known (1 FAIL)"
    strict = pdconform("judge", str(tmp_path / "out"), "--expectations", "none")
    assert strict.returncode == 1 and "FAIL (expected PASS)" in strict.stdout, strict.stdout[-2000:]
    assert "1 regression (worse than expected)" in strict.stdout, strict.stdout[-2000:]
    assert strict.stdout.rstrip().splitlines()[-3] == "expectations: none, every cell expected to PASS"


def test_reproduce_commands_name_the_pdconform_that_ran(tmp_path, monkeypatch):
    """A pasted reproduce command runs in a fresh shell at the checkout root: the console
    script of the interpreter's environment, relative to the checkout when inside it, else by
    its absolute path; `pdconform` only when there is none (an installation on PATH)."""
    from harness import ROOT, program
    from harness.cli import this_program

    assert program() == this_program()
    outside = tmp_path / "venv" / "bin"
    outside.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(outside / "python"))
    assert program() == "pdconform"  # no console script beside the interpreter
    (outside / "pdconform").write_text("#!/bin/sh\n")
    assert program() == str(outside / "pdconform")
    monkeypatch.setattr(sys, "executable", str(ROOT / ".venv" / "bin" / "python"))
    if (ROOT / ".venv" / "bin" / "pdconform").is_file():
        assert program() == ".venv/bin/pdconform"




def test_a_reader_that_stops_reading_does_not_turn_the_exit_code_into_a_regression(tmp_path):
    """`run ... | head -1`: the pipe closes before the matrix is printed; the command ends with its
    own exit code (0: every cell as expected), no BrokenPipeError, no 1."""
    import os

    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        ran = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--impl", "selftest", "--scenario",
                              "selftest-noop", "--out", str(tmp_path / "out")], stdout=write, stderr=subprocess.PIPE,
                             text=True, timeout=120)
    finally:
        os.close(write)
    assert ran.returncode == 0 and "BrokenPipe" not in ran.stderr and "Traceback" not in ran.stderr, ran.stderr


def test_repro_refuses_a_held_out_folder_before_it_prints_its_plan(tmp_path):
    import os

    from harness.report.outdir import take_lock

    (tmp_path / "out").mkdir()
    fd = take_lock(tmp_path / "out", "writing into")
    try:
        ran = pdconform("repro", "selftest-noop", "--impl", "selftest", "--out", str(tmp_path / "out"))
    finally:
        os.close(fd)
    assert ran.returncode == 2 and "another pdconform run" in ran.stderr, ran.stderr
    assert "steps" not in ran.stdout and ran.stdout.strip() == ""  # nothing printed before the refusal


def test_the_terminal_matrix_marks_known_cells_and_cuts_long_reasons():
    from harness.judge.results import CellResult, RunResult, SglangInfo
    from harness.report.safe import REASON_CHARS
    from harness.report.terminal import cell_text, reasons

    known = CellResult(impl="mori", scenario="late-old-status", verdict="FAIL", expected="FAIL",
                       expected_link="docs/sglang-bugs.md#b13", reason="R-TERM-1 x: " + "word " * 300)
    assert "FAIL known B13" in cell_text(known).plain
    new = CellResult(impl="mori", scenario="happy-path", verdict="FAIL", reason="short")
    assert "known" not in cell_text(new).plain and "(expected PASS)" in cell_text(new).plain
    run = RunResult(sglang=SglangInfo(version="0.5.23", path=None), seed=0, cells=[known, new])
    first = reasons(run)[0]
    assert len(first) < REASON_CHARS + 150 and "more characters in cell.html" in first


def test_explore_takes_a_topology_set_and_gives_each_shape_a_share():
    """``explore --topology default`` runs programs on every shape of the default set, one
    after another (issue 36: explore on the multi-rank topologies); one name is one shape."""
    from harness.cli.explore import shapes
    from harness.spec.topology import default_set

    assert shapes("default") == [t.name for t in default_set()] and len(shapes("default")) > 1
    assert shapes("p1-d2") == ["p1-d2"]
    with pytest.raises(KeyError):
        shapes("p9-d9")
