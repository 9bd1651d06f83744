"""The terminal view of a run (harness.report.terminal): known bugs marked, one closing line."""

from harness.judge.results import CellResult, RunResult
from harness.report.terminal import bug_id, closing_line, reasons
from harness.target.sglang import SglangInfo


def _run(*cells: CellResult) -> RunResult:
    return RunResult(sglang=SglangInfo(version="0.5.23", path=None), seed=0, cells=list(cells))


KNOWN = CellResult(impl="nixl", scenario="malformed-frame", verdict="FAIL", reason="R-LIVE-1 loops-survive: died",
                   expected="FAIL", expected_reason="B3", expected_link="docs/sglang-bugs.md#b3")
KNOWN_WARN = CellResult(impl="mori", scenario="room-reuse", verdict="WARN", reason="R-REASON-1 x", expected="WARN",
                        expected_link="docs/sglang-bugs.md#b11")
NEW = CellResult(impl="mooncake", scenario="happy-path", verdict="FAIL", reason="R-XFER-1 y")
FIXED = CellResult(impl="mori", scenario="slow-aux", verdict="PASS", expected="FAIL",
                   expected_link="docs/sglang-bugs.md#b12")
OK = CellResult(impl="reference", scenario="happy-path", verdict="PASS")


def test_a_known_failure_is_marked_with_its_bug_and_a_new_one_is_not():
    lines = reasons(_run(KNOWN, NEW, OK))
    assert lines[0].startswith("malformed-frame x nixl: known B3: FAIL: R-LIVE-1")
    assert any(line.startswith("happy-path x mooncake: FAIL: R-XFER-1") for line in lines)
    assert not any("reference" in line and "happy-path x" in line for line in lines)


def test_the_closing_line_counts_known_cells_and_leads_with_regressions_and_fixes():
    assert closing_line(_run(KNOWN, KNOWN_WARN, OK)) == "3 cells: all as expected, 2 known (1 FAIL, 1 WARN)"
    assert closing_line(_run(OK)) == "1 cell: all as expected"
    assert closing_line(_run(KNOWN, NEW, FIXED)) == "3 cells: 1 regression, 1 fixed, 1 known (1 FAIL)"


def test_bug_ids_come_from_the_bug_list_anchors_only():
    assert bug_id("docs/sglang-bugs.md#b13") == "B13" and bug_id("docs/sglang-bugs.md#u2") == "U2"
    assert bug_id("https://github.com/sgl-project/sglang/issues/1") == "https://github.com/sgl-project/sglang/issues/1"


def test_a_cell_of_a_run_across_hosts_reruns_through_run_on_the_same_hosts():
    from harness.report.terminal import reproduce_command

    cell = CellResult(impl="mooncake", scenario="network-partition", verdict="FAIL", engine="real", reason="x")
    across = RunResult(sglang=SglangInfo(version="0.5.23", path=None), seed=3, hosts_spec="netns:2", cells=[cell])
    line = reproduce_command(across, cell)
    assert line.startswith("pdconform run --hosts netns:2 --scenario network-partition --impl mooncake --seed 3")
    cluster = RunResult(sglang=SglangInfo(version="0.5.23", path=None), seed=3, hosts_spec="2",
                        hosts_listen="10.0.0.5:29400", cells=[cell])
    assert reproduce_command(cluster, cell).startswith("pdconform run --hosts 2 --listen 10.0.0.5:29400 --scenario")
    here = RunResult(sglang=SglangInfo(version="0.5.23", path=None), seed=3, cells=[cell])
    assert reproduce_command(here, cell).startswith("pdconform repro network-partition --impl mooncake --seed 3")
