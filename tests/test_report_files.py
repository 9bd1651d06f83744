"""junit.xml and summary.md: pure functions of the result tree, readable back."""

from pathlib import Path

from hypothesis import given, strategies as st
from junitparser import Error, Failure, JUnitXml, Skipped

from harness.report.files import SUMMARY_LIMIT, junit_xml, summary_markdown, write_reports
from harness.judge.results import VERDICTS, CellResult, RunResult, SglangInfo, dump_run, load_run
from harness.spec.text import encodable

ROOT = Path(__file__).resolve().parents[1]
DIVERGENCE = {"step": 7, "step_name": "AwaitStatus", "op": "await_status", "role": "decode",
              "requirement": "R-HB-1", "reference": "Failed", "observed": "WaitingForInput"}


def sample_run() -> RunResult:
    return RunResult(sglang=SglangInfo(version="0.5.23", path="/src/python/sglang", source="src",
                                       commit="0123456789abcdef0123"), seed=4, duration_s=12.5,
                     expectations="expectations/sglang-0.5.23.toml", cells=[
        CellResult(impl="reference", scenario="dead-prefill", verdict="PASS", engine="reference", duration_s=1.0),
        CellResult(impl="mooncake", scenario="dead-prefill", verdict="FAIL", engine="real", duration_s=2.0,
                   reason="R-HB-1 waiting-room-failed: room 5 still WaitingForInput 6 s after the kill",
                   divergence=DIVERGENCE),
        CellResult(impl="nixl", scenario="dead-prefill", verdict="FAIL", expected="FAIL", engine="real",
                   reason="R-HB-1 same", expected_reason="known bug", expected_link="docs/sglang-bugs.md#b1"),
        CellResult(impl="mori", scenario="dead-prefill", verdict="ERROR", engine="standin",
                   reason="cell exceeded its deadline of 120 s"),
        CellResult(impl="mooncake", scenario="room-reuse", verdict="PASS", expected="FAIL", engine="real",
                   expected_reason="B6", expected_link="docs/sglang-bugs.md#b6"),
        CellResult(impl="nixl", scenario="room-reuse", verdict="UNSUPPORTED", expected="UNSUPPORTED",
                   reason="no deferred release", expected_reason="r", expected_link="l"),
        CellResult(impl="mori", scenario="room-reuse", verdict="WARN", engine="standin", reason="R-REASON-1 no reason"),
    ])


def test_junit_one_case_per_cell_classname_impl_name_scenario(tmp_path):
    path = tmp_path / "junit.xml"
    junit_xml(sample_run()).write(str(path), pretty=True)
    (suite,) = list(JUnitXml.fromfile(str(path)))
    cases = {(c.classname, c.name): c for c in suite}
    assert len(cases) == 7
    (failure,) = cases[("mooncake", "dead-prefill")].result
    assert isinstance(failure, Failure) and failure.message.startswith("R-HB-1")
    assert "step 7" in failure.text and "AwaitStatus" in failure.text  # the first divergence
    (known,) = cases[("nixl", "dead-prefill")].result
    assert isinstance(known, Skipped) and "known FAIL: known bug" in known.message and known.type == "known-fail"
    assert isinstance(cases[("mori", "dead-prefill")].result[0], Error)
    (fixed,) = cases[("mooncake", "room-reuse")].result
    assert isinstance(fixed, Failure) and "fixed" in fixed.message  # better than expected also fails the gate
    assert cases[("reference", "dead-prefill")].result == []
    (warn,) = cases[("mori", "room-reuse")].result  # a WARN where PASS is expected is a regression too
    assert isinstance(warn, Failure) and warn.message.startswith("WARN, expected PASS: R-REASON-1")
    assert "pdconform repro dead-prefill --impl mooncake --seed 4 --sglang-src SGLANG_CHECKOUT" in \
        cases[("mooncake", "dead-prefill")].system_out
    assert suite.failures == 3 and suite.errors == 1 and suite.skipped == 2
    (unsupported,) = cases[("nixl", "room-reuse")].result
    assert unsupported.type == "known-unsupported"  # a known UNSUPPORTED is told from a known FAIL by its type


def test_reports_for_a_pull_request_carry_no_local_path_and_the_wall_time():
    """junit.xml's suite: no local path in its name, the run's wall time (12.5 s), not the sum
    of its cells (3 s); summary.md: no local path, links absolute with the run's docs_url."""
    run = sample_run()
    (suite,) = list(junit_xml(run))
    assert "/src/python" not in suite.name and "sglang 0.5.23 (src, commit 0123456789ab)" in suite.name
    assert float(suite.time) == 12.5
    text = summary_markdown(run)
    assert "/src/python" not in text and "--sglang-src SGLANG_CHECKOUT" in text
    assert "(docs/sglang-bugs.md#b1)" in text  # relative without a docs URL
    run.docs_url = "https://github.com/example/pdconform/blob/main/"
    linked = summary_markdown(run)
    assert "[B1](https://github.com/example/pdconform/blob/main/docs/sglang-bugs.md#b1)" in linked
    (suite,) = list(junit_xml(run))
    known = {(c.classname, c.name): c for c in suite}[("nixl", "dead-prefill")].result[0]
    assert "https://github.com/example/pdconform/blob/main/docs/sglang-bugs.md#b1" in known.message


def test_summary_lists_the_unexpected_cells_with_divergence_and_repro():
    text = summary_markdown(sample_run())
    assert text.startswith("## pdconform: **3 regression(s), 1 fix(es)**")
    assert "sglang 0.5.23 (src, commit 0123456789ab" in text
    assert "| `dead-prefill` | ✅ PASS | **❌ FAIL** (expected PASS) | ❌ FAIL known B1 |" in text  # known: marked
    unexpected = text.split("### Not as expected")[1].split("<details>")[0]
    assert "dead-prefill x mooncake" in unexpected and "dead-prefill x mori" in unexpected
    assert "room-reuse x mooncake" in unexpected and "dead-prefill x nixl" not in unexpected
    assert "step 7" in unexpected and "`pdconform repro dead-prefill --impl mooncake --seed 4" in unexpected
    assert "Known non-PASS cells (as expected): 2" in text and "docs/sglang-bugs.md#b1" in text


def test_summary_stays_short_enough_for_a_pr_comment():
    run = sample_run()
    run.cells = [CellResult(impl=f"impl{i % 4}", scenario=f"s{i}", verdict="FAIL", reason="x" * 2000)
                 for i in range(200)]
    text = summary_markdown(run)
    assert len(text) <= SUMMARY_LIMIT + 200 and "truncated" in text


def test_write_reports_writes_every_file(tmp_path):
    paths = write_reports(sample_run(), tmp_path, {})
    assert {"junit.xml", "summary.md"} <= set(paths)
    for path in paths.values():
        assert path.exists() and path.stat().st_size > 0


# text results.json keeps as it is: a noncharacter (U+FDD0...) is written as U+FFFD by design
# (harness.spec.text.encodable, issue 34; test_results_json_writes_a_noncharacter_as_replacement)
def _text():
    return st.text(st.characters().filter(lambda ch: encodable(ch) == ch))


cells = st.builds(
    CellResult, impl=st.sampled_from(["reference", "mooncake", "nixl", "mori"]), scenario=st.text(min_size=1),
    verdict=st.sampled_from(VERDICTS), expected=st.sampled_from(VERDICTS), expected_reason=_text(),
    expected_link=_text(), engine=st.none() | st.sampled_from(["real", "standin", "reference"]),
    duration_s=st.floats(min_value=0, max_value=1e6), bytes_verified=st.integers(min_value=0, max_value=2**40),
    reason=_text(), divergence=st.none() | st.dictionaries(_text(), _text() | st.integers() | st.none()),
    checks=st.lists(st.dictionaries(_text(), _text() | st.booleans())), workdir=st.none() | _text())
runs = st.builds(RunResult, sglang=st.builds(SglangInfo, version=st.none() | _text(), path=st.none() | _text(),
                                             source=st.sampled_from(["installed", "src", "venv"]),
                                             commit=st.none() | _text()),
                 seed=st.integers(min_value=0, max_value=2**63), duration_s=st.floats(min_value=0, max_value=1e6),
                 started_at=_text(), expectations=st.none() | _text(), cells=st.lists(cells, max_size=5))


@given(runs)
def test_results_json_round_trips(tmp_path_factory, run):
    path = tmp_path_factory.mktemp("rt") / "results.json"
    dump_run(run, path)
    assert load_run(path) == run


def test_results_json_writes_a_noncharacter_as_replacement(tmp_path):
    run = sample_run()
    run.cells[1].reason = "peer \ufdd0 said \uffff"
    dump_run(run, tmp_path / "results.json")
    assert load_run(tmp_path / "results.json").cells[1].reason == "peer \ufffd said \ufffd"


def test_junit_survives_control_characters_in_reasons(tmp_path):
    run = sample_run()
    run.cells[1].reason = "role log tail: \x1b[31mbroken\x1b[0m \x00 sglang"
    path = tmp_path / "junit.xml"
    junit_xml(run).write(str(path), pretty=True)
    (suite,) = list(JUnitXml.fromfile(str(path)))
    case = next(c for c in suite if c.classname == "mooncake" and c.name == "dead-prefill")
    assert "broken" in case.result[0].text and "\x1b" not in case.result[0].text
