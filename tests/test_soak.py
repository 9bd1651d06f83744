"""pdconform soak: a cell flips when its verdict, or its reason with numbers masked, differs
between two runs; the soak folder holds every run and the flips."""

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.soak import SoakRun, flips, normalised, soak_markdown
from test_untrusted_text import assert_inert_markdown

ROOT = Path(__file__).resolve().parents[1]


def _run(index: int, load: float, **cells) -> SoakRun:
    return SoakRun(index=index, folder=f"run-{index}", started_at="", duration_s=40.0, load_mean=load,
                   load_max=load + 1, cells={name.replace("__", " x "): list(v) for name, v in cells.items()})


def test_timings_in_a_reason_are_not_a_flip_but_a_verdict_or_wording_is():
    runs = [_run(1, 5.0, a__mori=("PASS", "ok"), b__nixl=("FAIL", "ACK came 1.3 s after the ABORT")),
            _run(2, 6.0, a__mori=("PASS", "ok"), b__nixl=("FAIL", "ACK came 1.4 s after the ABORT")),
            _run(3, 9.5, a__mori=("FAIL", "decode aux buffer 0 slot 0 wrong"),
                 b__nixl=("FAIL", "ACK came 12 s after the ABORT"))]
    assert normalised("came 1.3 s after room 17") == "came # s after room #"
    found = flips(runs)
    assert [f.cell for f in found] == ["a x mori"]
    flip = found[0]
    assert flip.verdicts == {"PASS": 2, "FAIL": 1} and flip.odd_runs == [3] and flip.odd_loads == [9.5]
    assert {r["verdict"]: r["runs"] for r in flip.reasons} == {"PASS": [1, 2], "FAIL": [3]}
    text = soak_markdown(runs, found, jobs=12, cores=2)
    assert "1 flipping cell(s)" in text and "run 3 (load 9.5)" in text and "decode aux buffer 0 slot 0" in text


def test_a_cell_missing_from_one_run_is_a_flip():
    runs = [_run(1, 1.0, a__mori=("PASS", "")), _run(2, 1.0)]
    assert [(f.cell, f.verdicts) for f in flips(runs)] == [("a x mori", {"PASS": 1, "MISSING": 1})]


def test_identical_runs_have_no_flip():
    runs = [_run(i, 2.0, a__mori=("WARN", "no reason recorded")) for i in (1, 2, 3)]
    assert flips(runs) == []
    assert "0 flipping cell(s)" in soak_markdown(runs, [], jobs=1, cores=1)


def test_soak_runs_the_matrix_into_one_folder_and_exits_0_when_nothing_flips(tmp_path):
    env = {**os.environ, "PDCONFORM_TEST_SCENARIOS": "1"}
    out = subprocess.run([sys.executable, "-m", "harness.cli", "soak", "--runs", "2", "--impl", "selftest",
                          "--scenario", "selftest-noop", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "latest"
    data = json.loads((folder / "soak.json").read_text())
    assert [r["index"] for r in data["runs"]] == [1, 2] and data["flips"] == []
    assert all(r["cells"]["selftest-noop x selftest"][0] == "PASS" for r in data["runs"])
    assert all(r["judged"]["selftest-noop x selftest"]["label"] == "as expected" for r in data["runs"])
    assert (folder / "run-1" / "results.json").is_file() and (folder / "run-2" / "results.json").is_file()
    assert "0 flipping cell(s)" in out.stdout


def test_soak_refuses_bad_options_before_writing(tmp_path):
    for args in (["--runs", "1"], ["--impl", "nope"], ["--jobs", "0"]):
        out = subprocess.run([sys.executable, "-m", "harness.cli", "soak", *args, "--out", str(tmp_path / "o")],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (args, out.stderr)
    assert not (tmp_path / "o").exists()


def test_a_flip_exits_1_and_is_listed_escaped(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import harness.soak
    from harness.cli import app

    hostile = "boom</details>\n## every cell as expected \x1b[31m @sgl-project"
    fake = [_run(1, 3.0, **{"clear-then-abort__mori": ("PASS", "")}),
            _run(2, 7.0, **{"clear-then-abort__mori": ("FAIL", hostile)})]
    monkeypatch.setattr(harness.soak, "soak", lambda config, runs, folder, on_run=None: fake)
    result = CliRunner().invoke(app, ["soak", "--runs", "2", "--impl", "reference", "--scenario", "happy-path",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    text = (tmp_path / "latest" / "soak.md").read_text()
    assert "clear-then-abort x mori: FAIL x1, PASS x1" in text and "run 2 (load 7.0)" in text
    assert_inert_markdown(text)  # the reason is shown in a code span, literally, on one line


def _cell(verdict, expected="PASS", alone=None, checks=(), expected_checks=None, starved=""):
    from harness.judge.results import CellResult
    from harness.judge.verdict import Verdict

    return CellResult(impl="mori", scenario="dead-prefill", verdict=Verdict(verdict), expected=Verdict(expected),
                      checks=[{"name": n, "ok": False} for n in checks], expected_checks=expected_checks,
                      starved=starved, alone=alone)


def test_each_cell_is_labelled_as_run_judges_it():
    from harness.soak import AS_EXPECTED, NOT_AS_EXPECTED, UNDER_LOAD, judged, label

    assert label(_cell("FAIL", "FAIL")) == AS_EXPECTED
    assert label(_cell("PASS")) == AS_EXPECTED
    assert label(_cell("FAIL")) == NOT_AS_EXPECTED  # a regression
    assert label(_cell("PASS", "FAIL")) == NOT_AS_EXPECTED  # a fix: also what run exits 1 on
    # a known cell with a check failing that its entry does not list: not as expected
    assert label(_cell("FAIL", "FAIL", checks=["a", "b"], expected_checks=["a"])) == NOT_AS_EXPECTED
    starved = _cell("FAIL", starved="load 31.0 on 2 cores", alone=_cell("PASS"))
    assert label(starved) == UNDER_LOAD
    record = judged(starved)
    assert record["label"] == UNDER_LOAD and record["expected"] == "PASS"
    assert record["alone"] == "FAIL under load (load 31.0 on 2 cores), PASS alone: timing under load"
    still = _cell("FAIL", starved="load 31.0 on 2 cores", alone=_cell("FAIL"))
    assert label(still) == NOT_AS_EXPECTED and "not as expected alone either" in judged(still)["alone"]


def _judged_run(index, load, **cells) -> SoakRun:
    from harness.soak import judged

    run = _run(index, load, **{k: (str(c.verdict), "r") for k, c in cells.items()})
    run.judged = {k.replace("__", " x "): judged(c) for k, c in cells.items()}
    return run


def test_a_flip_under_load_is_explained_and_a_regression_is_not(tmp_path):
    from harness.soak import unexplained

    under = _cell("FAIL", starved="load 20.0 on 2 cores", alone=_cell("PASS"))
    runs = [_judged_run(1, 2.0, a__mori=_cell("PASS"), b__nixl=_cell("FAIL", "FAIL")),
            _judged_run(2, 20.0, a__mori=under, b__nixl=_cell("FAIL", "FAIL"))]
    found = flips(runs)
    assert [(f.cell, f.explained) for f in found] == [("a x mori", True)] and unexplained(runs) == []
    text = soak_markdown(runs, found, jobs=32, cores=2)
    assert "| 2 | 20.0 / 21.0 | 40 | 2 | 1 | 1 | 0 |" in text  # red cells: b as expected, a under load
    assert "run 2: a x mori: FAIL under load (load 20.0 on 2 cores), PASS alone: timing under load" in text
    assert "### Not as expected: 0" in text

    worse = [_judged_run(1, 2.0, b__nixl=_cell("FAIL", "FAIL")),
             _judged_run(2, 2.0, b__nixl=_cell("FAIL", "FAIL", checks=["new-one"], expected_checks=[]))]
    assert unexplained(worse) == [(2, "b x nixl")] and flips(worse) == []  # same verdict and reason: no flip
    text = soak_markdown(worse, [], jobs=2, cores=2)
    assert "run 2: b x nixl: FAIL, expected FAIL, new failing checks: new-one" in text


def test_soak_exits_1_on_a_cell_not_as_expected_and_0_on_one_under_load(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import harness.soak
    from harness.cli import app

    under = _cell("FAIL", starved="load 20.0 on 2 cores", alone=_cell("PASS"))
    for cells, code in (((_cell("PASS"), under), 0), ((_cell("PASS"), _cell("FAIL")), 1)):
        fake = [_judged_run(i, 2.0, **{"happy-path__reference": c}) for i, c in enumerate(cells, 1)]
        monkeypatch.setattr(harness.soak, "soak", lambda config, runs, folder, on_run=None, fake=fake: fake)
        result = CliRunner().invoke(app, ["soak", "--runs", "2", "--impl", "reference", "--scenario", "happy-path",
                                          "--out", str(tmp_path / str(code))])
        assert result.exit_code == code, result.output
        data = json.loads((tmp_path / str(code) / "latest" / "soak.json").read_text())
        assert data["not_as_expected"] == ([] if code == 0 else [{"run": 2, "cell": "happy-path x reference"}])
