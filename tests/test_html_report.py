"""index.html, the cell pages and the trend page: the pure renderers (escaping, marks,
links, the timeline's spans and pins, tracebacks, truncation) and, in headless Chromium
from file://, the pages a person sees (matrix and filter, baseline marks, a FAIL cell's
timeline with its failing check pinned, its traceback, links that resolve, no console
errors)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from harness.judge.divergence import first_divergence
from harness.judge.results import CellResult, RunResult, SglangInfo, dump_run, load_histories
from harness.report import timeline as tl
from harness.report.cell_page import render_cell_page, tracebacks
from harness.report.html import render_index_html, write_index_html
from harness.report.run_diff import baseline_marks
from harness.report.terminal import reproduce_command
from harness.report.trend import OURS, render_trend, write_trend

REPO = Path(__file__).resolve().parent.parent
# screenshots go where PDCONFORM_ARTIFACTS says (CI keeps them); else into the test's own tmp folder
ARTIFACTS_ENV = os.environ.get("PDCONFORM_ARTIFACTS")
TRACEBACK = ('Traceback (most recent call last):\n  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner\n'
             '    self.run()\n  File "/v/lib/python3.11/site-packages/sglang/srt/disaggregation/nixl/conn.py", line 3379,'
             ' in bootstrap_thread\n    assert waiting_req_bytes[0] == GUARD, (\n'
             "AssertionError: First message should be b'NixlMsgGuard'. Foreign traffic?\n")


def _events(status: str, fail: bool = False, dead: bool = False) -> list[dict]:
    """A small history: StartRoles, an injected frame, a poll of room 1 (timed out unless
    Success), and, with ``dead``, an observation that saw the prefill's control thread dead."""
    reached = status == "Success"
    events = [
        {"seq": 0, "t": 0.0, "step": 0, "op": "step", "role": None, "type": "info", "args": {"step": "StartRoles"}},
        {"seq": 1, "t": 0.05, "step": 0, "op": "start_prefill", "role": "prefill", "type": "invoke", "args": {}},
        {"seq": 2, "t": 0.4, "step": 0, "op": "start_prefill", "role": "prefill", "type": "ok", "args": {},
         "value": {"engine": "real"}},
        {"seq": 3, "t": 0.5, "step": 1, "op": "step", "role": None, "type": "info", "args": {"step": "InjectFrames"}},
        {"seq": 4, "t": 0.6, "step": 1, "op": "inject", "role": "prefill", "type": "nemesis",
         "args": {"messages": 1, "sample": [["41424f5254", "00ff"]]}},
        {"seq": 5, "t": 0.7, "step": 2, "op": "step", "role": None, "type": "info", "args": {"step": "AwaitStatus"}},
        {"seq": 6, "t": 0.8, "step": 2, "op": "await_status", "role": "decode", "type": "invoke",
         "args": {"room": 1, "statuses": ["Success"], "timeout_s": 5}},
        {"seq": 7, "t": 5.8 if not reached else 1.0, "step": 2, "op": "await_status", "role": "decode", "type": "ok",
         "args": {"room": 1, "statuses": ["Success"], "timeout_s": 5},
         "value": {"status_name": status, "status": 4 if reached else 2, "reached": reached, "waited_s": 5.0}},
    ]
    if dead:
        events.append({"seq": 8, "t": 5.9, "step": 2, "op": "observe-mid", "role": "prefill", "type": "ok",
                       "args": {"label": "after"}, "value": {"loops": {}, "dead_threads": [
                           {"thread": "Thread-7 (bootstrap_thread_guarded)", "exception": "AssertionError",
                            "message": "First message should be b'NixlMsgGuard'. Foreign traffic?",
                            "traceback": TRACEBACK}]}})
    if fail:
        events.append({"seq": 9, "t": 6.0, "step": 2, "op": "poll", "role": "prefill", "type": "fail",
                       "args": {}, "error": "TimeoutError: no answer in 5 s"})
    return events


FAILING = [{"name": "decode-success", "requirement": "R-XFER-1", "level": "MUST", "ok": False,
            "detail": "decode room 1 ended at WaitingForInput", "at": 7},
           {"name": "loops-alive", "requirement": "R-LIVE-2", "level": "MUST", "ok": True, "detail": "ok"}]


def fixture_run() -> tuple[RunResult, dict]:
    """Two scenarios x three implementations, one cell of each verdict (and a second PASS)."""
    histories = {
        ("happy-path", "reference"): _events("Success"),
        ("happy-path", "mooncake"): _events("WaitingForInput", fail=True, dead=True),
        ("happy-path", "mori"): _events("Success"),
        ("dead-prefill", "reference"): _events("Success"),
        ("dead-prefill", "mooncake"): [],
    }
    cells = [
        CellResult(impl="reference", scenario="happy-path", verdict="PASS", engine="reference", bytes_verified=7744,
                   checks=[{**FAILING[1]}]),
        CellResult(impl="mooncake", scenario="happy-path", verdict="FAIL", engine="real", checks=FAILING,
                   reason="R-XFER-1 decode-success: decode room 1 ended at WaitingForInput",
                   divergence=first_divergence(histories[("happy-path", "reference")],
                                               histories[("happy-path", "mooncake")], FAILING)),
        CellResult(impl="mori", scenario="happy-path", verdict="WARN", engine="standin", expected="WARN",
                   expected_reason="ABORT reason is empty <script>alert(1)</script>",
                   expected_link="docs/sglang-bugs.md#b11", reason="R-REASON-1 SHOULD"),
        CellResult(impl="reference", scenario="dead-prefill", verdict="PASS", engine="reference"),
        CellResult(impl="mooncake", scenario="dead-prefill", verdict="UNSUPPORTED", engine="real",
                   expected="UNSUPPORTED", reason="no TP>1 role context"),
        CellResult(impl="mori", scenario="dead-prefill", verdict="ERROR", engine=None,
                   reason="cell exceeded its deadline of 60 s and was killed"),
    ]
    run = RunResult(sglang=SglangInfo(version="0.5.23", path="/x/sglang", source="src", commit="abc1234"),
                    seed=7, duration_s=12.5, started_at="2026-11-30T15:15:00+00:00", cells=cells)
    return run, histories


def _td(html: str, scenario: str, impl: str) -> str:
    match = re.search(rf'<td class="([^"]*)"[^>]*id="cell-{scenario}--{impl}"', html)
    assert match, (scenario, impl)
    return match.group(1)


def _page(run: RunResult, histories: dict, scenario: str, impl: str, logs: dict | None = None) -> str:
    cell = next(c for c in run.cells if (c.scenario, c.impl) == (scenario, impl))
    return render_cell_page(run, cell, histories.get((scenario, impl)), histories.get((scenario, "reference")),
                            ["cell.json", "history.jsonl", "prefill.log"], logs or {})


# --- index.html ----------------------------------------------------------------------------------

def test_header_matrix_engines_and_links_to_the_cell_pages():
    run, _ = fixture_run()
    html = render_index_html(run)
    assert "sglang 0.5.23" in html and "commit <code>abc1234</code>" in html and "seed <b>7</b>" in html
    assert "12.5 s" in html and "2026-11-30T15:15:00+00:00" in html
    columns = re.findall(r'<th data-impl="([^"]+)">\1<br><span class="engine">([^<]*)</span>', html)
    # mori's ERROR cell started no role: its column still says standin
    assert columns == [("reference", "reference"), ("mooncake", "real"), ("mori", "standin")]
    assert _td(html, "happy-path", "reference") == "cell v-PASS"
    assert _td(html, "dead-prefill", "mooncake") == "cell v-UNSUPPORTED"
    assert _td(html, "dead-prefill", "mori") == "cell v-ERROR unexpected"
    assert 'href="cells/happy-path--mooncake/cell.html"' in html
    assert 'id="trend-link"' not in html  # no trend page unless the run folder is an --out folder's


def test_unexpected_verdicts_are_marked_and_known_ones_name_their_bug():
    run, _ = fixture_run()
    html = render_index_html(run, trend_href="../../trend.html")
    assert _td(html, "happy-path", "mooncake") == "cell v-FAIL unexpected"
    assert "FAIL <span class=\"mark\">(expected PASS)</span>" in html
    assert _td(html, "happy-path", "mori") == "cell v-WARN"  # expected WARN: not marked unexpected
    assert '<span class="mark known">known B11</span>' in html
    assert "2</b> not as expected" in html
    assert '<a href="../../trend.html" id="trend-link">' in html


def test_baseline_marks_the_new_and_fixed_cells():
    run, _ = fixture_run()
    before = RunResult(sglang=SglangInfo(version="0.5.17", path="/y", source="installed"), seed=7, cells=[
        CellResult(impl="mooncake", scenario="happy-path", verdict="PASS"),
        CellResult(impl="mori", scenario="dead-prefill", verdict="ERROR"),
        CellResult(impl="mori", scenario="happy-path", verdict="FAIL")])
    run.baseline = {"path": "/b", "sglang": "0.5.17", "marks": baseline_marks(before, run)}
    html = render_index_html(run)
    cell = html[html.index('id="cell-happy-path--mooncake"'):]
    assert '<span class="baseline b-new" title="new: PASS before' in cell[:cell.index("</td>")]
    cell = html[html.index('id="cell-happy-path--mori"'):]
    assert '<span class="baseline b-fixed"' in cell[:cell.index("</td>")]
    cell = html[html.index('id="cell-dead-prefill--mori"'):]
    assert "baseline" not in cell[:cell.index("</td>")]  # same verdict: no mark
    assert re.search(r'id="baseline-counts">.*1 new.*1 fixed', html, re.S)


def test_requirement_view_and_non_pass_list():
    run, _ = fixture_run()
    html = render_index_html(run)
    table = html[html.index('<table id="requirements">'):]
    row = table[table.index('data-requirement="R-XFER-1"'):]
    row = row[:row.index("</tr>")]
    assert 'data-all-pass="no"' in row and "1 / 1" in row and 'href="cells/happy-path--mooncake/cell.html"' in row
    assert 'href="file://' in row and "docs/protocol.md#r-xfer-1" in row  # the requirement, in the checkout's docs
    live = table[table.index('data-requirement="R-LIVE-2"'):]
    assert 'data-all-pass="yes"' in live[:live.index(">")]
    listed = html[html.index('<ul id="non-pass">'):html.index("</ul>")]
    assert listed.count("<li>") == 4  # FAIL, WARN, UNSUPPORTED, ERROR
    assert re.search(r'data-scenario="happy-path" data-all-pass="no"', html)


def test_strings_from_the_result_tree_are_escaped():
    run, histories = fixture_run()
    run.cells[1].reason = '</pre><script>alert("reason")</script>'
    run.cells[2].expected_link = "javascript:alert(1)"
    histories[("happy-path", "mooncake")][0]["args"]["step"] = "<img src=x onerror=alert(1)>"
    html = render_index_html(run)
    assert "<script>alert" not in html
    assert "&lt;/pre&gt;&lt;script&gt;alert(&#34;reason&#34;)&lt;/script&gt;" in html
    assert html.count("<script>") == 1  # only the page's own
    page = _page(run, histories, "happy-path", "mooncake", {"prefill.log": "<script>alert(2)</script>\n" + TRACEBACK})
    assert "<img src=x" not in page and "&lt;img src=x" in page and "<script>alert" not in page
    page = _page(run, histories, "happy-path", "mori")
    assert 'href="javascript:' not in page  # a non-http, non-docs link is never an href
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


# --- the cell page --------------------------------------------------------------------------------

def test_cell_page_failing_check_divergence_diff_and_reproduce():
    run, histories = fixture_run()
    page = _page(run, histories, "happy-path", "mooncake")
    checks = page[page.index('<table class="checks" id="failing-checks">'):page.index("</table>")]
    assert "decode-success" in checks and "loops-alive" not in checks  # failing checks only
    assert '<a href="#row-7">step 2, t=5.800 s</a>' in checks  # where it was decided
    assert re.search(r'<a class="req" href="file://[^"]*/docs/protocol.md#r-xfer-1">R-XFER-1</a>', checks)
    assert "first divergence at step 2 AwaitStatus (await_status on decode) [R-XFER-1]" in page
    # the conventional colours: the reference is what was expected, the backend what actually happened
    assert '<span class="expected">-step 2 AwaitStatus: await_status on decode: Success</span>' in page
    assert '<span class="actual">+step 2 AwaitStatus: await_status on decode: WaitingForInput</span>' in page
    assert f'<pre class="repro">{reproduce_command(run, run.cells[1])}</pre>' in page
    assert "--expectations none --sglang-src /x" in page  # judged with no file; the folder holding sglang/
    assert '<a href="../../index.html" id="back">' in page
    assert [f'<a href="./{n}">{n}</a>' in page for n in ("cell.json", "history.jsonl", "prefill.log")] == [True] * 3
    # the identical histories of mori's cell say so; a cell without history says that
    assert "The normalized histories are identical" in _page(run, histories, "happy-path", "mori")
    assert "No history recorded." in _page(run, histories, "dead-prefill", "mori")


def test_cell_page_timeline_pins_the_failing_check_and_the_dead_thread():
    run, histories = fixture_run()
    page = _page(run, histories, "happy-path", "mooncake")
    svg = page[page.index("<svg"):page.index("</svg>")]
    layout = tl.layout(histories[("happy-path", "mooncake")], run.cells[1].checks, run.cells[1].divergence)
    assert layout.lanes == ["harness", "prefill", "decode", "faults"]
    check_pin = next(p for p in layout.pins if p.kind == "check")
    wait = next(i for i in layout.items if i.seq == 7)
    assert (check_pin.seq, check_pin.x) == (7, wait.x2)  # at the end of the wait it was decided on
    assert wait.kind == "timed-out" and "timed out after 5 s waiting for Success, saw WaitingForInput" in wait.title
    assert '<g class="pin pin-check" id="pin-check-0">' in svg and "\u2716 decode-success" in svg
    assert '<g class="pin pin-dead-thread" id="pin-dead-thread">' in svg
    assert '<g class="pin pin-divergence" id="pin-divergence">' in svg
    injected = next(i for i in layout.items if i.kind == "nemesis")
    assert "1 message(s): ['ABORT', 0x00ff]" in injected.title  # injected frames decoded
    raised = next(i for i in layout.items if i.seq == 9)
    assert raised.kind == "fail"
    # the rows the pins point at carry ids the SVG links to; the timed-out wait is not "ok"
    assert '<tr id="row-7" class="ok timed-out pinned">' in page and "<td>timed out</td>" in page
    assert 'href="#row-7"' in svg


def test_cell_page_traceback_names_file_line_and_the_role_log_line():
    run, histories = fixture_run()
    log = "starting\nwarming up\n" + TRACEBACK
    page = _page(run, histories, "happy-path", "mooncake", {"prefill.log": log})
    assert '<code class="where">sglang/srt/disaggregation/nixl/conn.py:3379 in bootstrap_thread</code>' in page
    assert '<a href="./prefill.log">prefill.log</a> line 8' in page
    assert "thread Thread-7 (bootstrap_thread_guarded) died: AssertionError" in page
    # with no dead thread in the history, the tracebacks the role log holds are shown
    found = tracebacks(_events("Success"), {"decode.log": "x\n" + TRACEBACK.replace("AssertionError", "KeyError")})
    assert [(t["role"], t["log_line"], t["where"].split(" in ")[0]) for t in found] == [
        ("decode", 7, "sglang/srt/disaggregation/nixl/conn.py:3379")]


def test_long_histories_are_cut_but_pinned_rows_are_kept():
    run, histories = fixture_run()
    long = _events("WaitingForInput") * 150
    long = [dict(e, seq=i, t=i * 0.01) for i, e in enumerate(long)]
    long[3] = dict(long[3], value={"blob": "x" * 10_000}, op="poll", type="ok")
    checks = [dict(FAILING[0], at=len(long) - 1)]
    run.cells[1].checks, run.cells[1].divergence = checks, None
    histories[("happy-path", "mooncake")] = long
    page = _page(run, histories, "happy-path", "mooncake")
    assert "x" * 500 not in page
    assert f'<tr id="row-{len(long) - 1}"' in page  # the pinned row, past the cut
    assert f"{len(long) - 401} of {len(long)} events not shown" in page
    assert '<a href="./history.jsonl">history.jsonl</a>' in page


def test_pin_labels_do_not_overlap():
    events = _events("WaitingForInput", dead=True)
    checks = [{"name": f"check-{n}-with-a-long-name", "requirement": "R-XFER-1", "ok": False, "at": seq}
              for n, seq in enumerate((7, 8, 9))]
    layout = tl.layout(events + [{"seq": 9, "t": 5.95, "step": 2, "op": "verify", "role": "decode", "type": "ok"}],
                       checks, None)
    boxes = {}
    for pin in layout.pins:
        size = tl.TEXT_PX * len(pin.label) + 8
        left = pin.x - size if pin.anchor == "end" else pin.x
        for other_left, other_right in boxes.get(pin.row, []):
            assert left + size < other_left or left > other_right, "labels overlap"
        boxes.setdefault(pin.row, []).append((left, left + size))
    assert all(p.x - tl.TEXT_PX * len(p.label) >= 0 or p.anchor == "start" for p in layout.pins)


# --- what a hostile or unlucky result tree cannot do ------------------------------------------------

def test_no_file_name_or_docs_url_becomes_a_script_link():
    run, histories = fixture_run()
    cell = run.cells[1]
    page = render_cell_page(run, cell, histories[("happy-path", "mooncake")], None,
                            ["javascript:alert(1);({}).log", "a#b.log"], {"javascript:alert(1);({}).log": TRACEBACK})
    assert 'href="javascript:' not in page
    assert 'href="./javascript%3Aalert%281%29%3B%28%7B%7D%29.log"' in page and 'href="./a%23b.log"' in page
    run.docs_url = "javascript:alert(2)//"
    run.cells[2].expected_link = "docs/../../../etc/passwd"
    for page in (render_index_html(run), _page(run, histories, "happy-path", "mooncake"),
                 _page(run, histories, "happy-path", "mori")):
        assert "javascript:" not in page and not re.search(r'href="[^"]*passwd', page)
    run.docs_url = "https://example.org/pdconform/blob/main/"
    assert 'href="https://example.org/pdconform/blob/main/docs/protocol.md#r-xfer-1"' in render_index_html(run)


def test_odd_histories_draw_or_say_so():
    """Events of odd shapes never cost the run its reports: a huge or endless time is left off
    the timeline (a bounded axis), odd values are shown as text, and a history that still cannot
    be drawn gives a page that says so."""
    run, histories = fixture_run()
    events = histories[("happy-path", "mooncake")]
    odd = [dict(events[2], t=float("inf")), dict(events[3], t=1.7e9), dict(events[5], seq=[1]),
           dict(events[7], value=["x"], args={"statuses": [1]}),
           dict(events[-3], value={"dead_threads": ["x", {"traceback": 5}]}),
           {"seq": 40, "t": "1.5", "op": "poll", "type": "ok", "role": "prefill", "step": 1}]
    started = time.monotonic()
    page = render_cell_page(run, run.cells[1], events + odd, None, [], {})
    assert time.monotonic() - started < 5 and "could not be drawn" not in page
    layout = tl.layout(events + [dict(events[0], seq=99, t=1e9)], [], None)
    assert len(layout.ticks) <= tl.MAX_TICKS
    broken = render_cell_page(run, run.cells[1], events, None, ["cell.json"], {}, skipped={"x": object()})
    assert "could not be drawn" not in broken  # an unused odd argument changes nothing
    import harness.report.cell_page as cp

    original = cp.tl.layout
    cp.tl.layout = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("<boom>"))
    try:
        page = render_cell_page(run, run.cells[1], events, None, ["cell.json"], {})
    finally:
        cp.tl.layout = original
    assert 'id="unreadable"' in page and "RuntimeError: &lt;boom&gt;" in page and 'href="./cell.json"' in page


def test_a_check_on_a_missing_event_says_so():
    run, histories = fixture_run()
    run.cells[1].checks = [dict(FAILING[0], at=999999)]
    page = _page(run, histories, "happy-path", "mooncake")
    assert "event 999999, which the history does not hold" in page
    assert "decode-success was decided on event 999999, which is not on the timeline" in page


def test_links_go_only_to_rows_on_the_page(tmp_path):
    run, histories = fixture_run()
    long = [dict(e, seq=i, t=i * 0.001) for i, e in enumerate(_events("WaitingForInput") * 200)]
    page = render_cell_page(run, run.cells[1], long, None, [], {})
    ids = set(re.findall(r'id="(row-\d+)"', page))
    assert ids and all(h in ids for h in re.findall(r'href="#(row-\d+)"', page))


def test_role_logs_links_and_line_numbers_past_the_part_read(tmp_path):
    """A symlinked log is neither read nor listed; a symlinked cell folder is not written
    through; a log longer than what is read still gives the traceback's real line."""
    from harness.report import cell_page as cp

    run, out = _write_out_dir(tmp_path)
    cell = out / "cells" / "happy-path--mooncake"
    secret = tmp_path / "secret.txt"
    secret.write_text("secret\n")
    (cell / "decode.log").symlink_to(secret)
    (cell / "prefill.log").write_text("x\n" * 5000 + TRACEBACK)
    victim = tmp_path / "victim"
    victim.mkdir()
    (out / "cells" / "dead-prefill--mooncake").rename(tmp_path / "moved")
    (out / "cells" / "dead-prefill--mooncake").symlink_to(victim)
    original = cp.MAX_LOG_BYTES
    cp.MAX_LOG_BYTES = 1000
    try:
        write_index_html(run, out, load_histories(out, [(c.scenario, c.impl) for c in run.cells]))
    finally:
        cp.MAX_LOG_BYTES = original
    page = (cell / "cell.html").read_text()
    assert "decode.log" not in page and "secret" not in page
    assert '<a href="./prefill.log">prefill.log</a> line 5006' in page
    assert list(victim.iterdir()) == []


def test_trend_is_left_alone_when_it_is_not_ours_and_links_only_pages_that_exist(tmp_path):
    run, _ = fixture_run()
    folder = tmp_path / "runs" / "20261201-100000"
    folder.mkdir(parents=True)
    (folder / ".pdconform-run").write_text("{}")
    dump_run(run, folder / "results.json")
    assert write_trend(tmp_path) is not None
    html = (tmp_path / "trend.html").read_text()
    assert 'href="runs/20261201-100000/index.html"' in html and "cell.html" not in html  # no cell pages yet
    for make in (lambda p: p.mkdir(), lambda p: os.mkfifo(p), lambda p: p.symlink_to(tmp_path / "nowhere")):
        (tmp_path / "trend.html").unlink()
        make(tmp_path / "trend.html")
        assert write_trend(tmp_path) is None  # a folder, a FIFO (never opened), a link: not ours
        if (tmp_path / "trend.html").is_dir() and not (tmp_path / "trend.html").is_symlink():
            (tmp_path / "trend.html").rmdir()
            (tmp_path / "trend.html").touch()


# --- the trend page -------------------------------------------------------------------------------

def test_trend_shows_each_cell_across_runs_and_marks_changes(tmp_path):
    run_a, _ = fixture_run()
    run_b, _ = fixture_run()
    run_b.cells[1].verdict = "PASS"
    html = render_trend([("20261201-100000", run_a), ("20261202-100000", run_b)])
    row = html[html.rindex("<tr", 0, html.index('<th scope="row">happy-path</th><th>mooncake</th>')):]
    row = row[:row.index("</tr>")]
    assert 'class="changed"' in row and row.index("v-FAIL") < row.index("v-PASS")
    assert 'href="runs/20261202-100000/cells/happy-path--mooncake/cell.html"' in row
    assert "1 cell(s) changed verdict" in html
    # written into an --out folder from its stored runs, but never over a trend.html that is not ours
    for name, run in (("20261201-100000", run_a), ("20261202-100000", run_b)):
        folder = tmp_path / "runs" / name
        folder.mkdir(parents=True)
        (folder / ".pdconform-run").write_text("{}")
        dump_run(run, folder / "results.json")
    (tmp_path / "runs" / "foreign").mkdir()  # no marker: not a run
    assert write_trend(tmp_path) == tmp_path / "trend.html"
    assert OURS in (tmp_path / "trend.html").read_text() and "2 stored run(s)" in (tmp_path / "trend.html").read_text()
    (tmp_path / "trend.html").write_text("mine")
    assert write_trend(tmp_path) is None and (tmp_path / "trend.html").read_text() == "mine"


# --- the out folder, and headless Chromium -------------------------------------------------------

def _write_out_dir(tmp_path: Path, reference_column: bool = True) -> tuple[RunResult, Path]:
    """The run's out directory as harness.drive.runner lays it out; without ``reference_column``
    the happy-path reference cell is no column and its history is under reference-for-diff/."""
    run, histories = fixture_run()
    if not reference_column:
        run.cells = [c for c in run.cells if not (c.scenario == "happy-path" and c.impl == "reference")]
    out = tmp_path / "out"
    for (scenario, impl), events in histories.items():
        if impl == "reference" and scenario == "happy-path" and not reference_column:
            folder = out / "reference-for-diff" / scenario
        else:
            folder = out / "cells" / f"{scenario}--{impl}"
        folder.mkdir(parents=True)
        (folder / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"torn')
    (out / "cells" / "happy-path--mooncake" / "prefill.log").write_text("log\n" + TRACEBACK)
    dump_run(run, out / "results.json")
    return run, out


def test_load_histories_reads_the_out_directory_layout(tmp_path):
    for reference_column in (True, False):
        run, out = _write_out_dir(tmp_path / str(reference_column), reference_column)
        cells = [(c.scenario, c.impl) for c in run.cells]
        histories = load_histories(out, cells)
        assert histories == fixture_run()[1]  # the torn last lines skipped
        assert write_index_html(run, out, histories) == out / "index.html"
        page = (out / "cells" / "happy-path--mooncake" / "cell.html").read_text()
        assert '<span class="actual">+step 2 AwaitStatus: await_status on decode: WaitingForInput</span>' in page
        assert '<a href="./prefill.log">prefill.log</a> line' in page
        # a cell that never got a folder still gets its page, so the matrix's link leads somewhere
        assert "No history recorded." in (out / "cells" / "dead-prefill--mori" / "cell.html").read_text()
        assert (out / "index.html").read_text().count('<th data-impl="reference">') == 1


CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


def _resolves(page: Path, href: str) -> bool:
    """Whether a link on ``page`` leads to a file that exists (in-page anchors: an element with that id)."""
    if href.startswith("#"):
        return f'id="{href[1:]}"' in page.read_text()
    url = urlparse(href)
    target = Path(unquote(url.path)) if url.scheme == "file" else (page.parent / unquote(url.path)).resolve()
    if url.fragment and target.suffix == ".html":
        return f'id="{url.fragment}"' in target.read_text()
    if url.fragment and target.suffix == ".md":  # a requirement's anchor in docs/protocol.md
        return f'<a id="{url.fragment}"></a>' in target.read_text()
    return target.is_file()


@pytest.mark.browser
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                    reason="no Debian chromium/chromedriver: apt-get install chromium chromium-driver")
def test_reports_in_headless_chromium(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium missing: pip install -r requirements/harness.txt")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    run, out = _write_out_dir(tmp_path)
    before = RunResult(sglang=SglangInfo(version="0.5.17", path="/y", source="installed"), seed=7, cells=[
        CellResult(impl="mooncake", scenario="happy-path", verdict="PASS")])
    run.baseline = {"path": "/b", "sglang": "0.5.17", "marks": baseline_marks(before, run)}
    page = write_index_html(run, out, load_histories(out, [(c.scenario, c.impl) for c in run.cells]))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--window-size=1280,1400"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Chromium's temporary profile and singleton-socket folders (org.chromium.Chromium.*) go into
    # a folder of ours, removed after the test (they were left in /tmp after every run); a short
    # path, since a Unix socket's path must fit in 108 bytes
    browser_tmp = Path(tempfile.mkdtemp(prefix="pdconform-chromium-"))
    # an explicit driver path: Selenium Manager (which would go to the network) never runs
    service = Service(executable_path=CHROMEDRIVER, env={**os.environ, "TMPDIR": str(browser_tmp)})
    try:
        driver = webdriver.Chrome(service=service, options=options)
    except BaseException:
        shutil.rmtree(browser_tmp, ignore_errors=True)
        raise
    artifacts = Path(ARTIFACTS_ENV) if ARTIFACTS_ENV else tmp_path / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    try:
        started = time.monotonic()
        driver.get(page.as_uri())
        rows = driver.find_elements(By.CSS_SELECTOR, "#matrix tbody tr")
        assert [r.get_attribute("data-scenario") for r in rows] == ["happy-path", "dead-prefill"]
        cells = driver.find_elements(By.CSS_SELECTOR, "#matrix td.cell")
        assert [c.text.split()[0] for c in cells] == ["PASS", "FAIL", "WARN", "PASS", "UNSUPPORTED", "ERROR"]
        colours: dict[str, set] = {}
        for cell in cells:
            verdict = cell.get_attribute("data-verdict")
            rgb = tuple(int(x) for x in re.findall(r"\d+", cell.value_of_css_property("background-color"))[:3])
            colours.setdefault(verdict, set()).add(rgb)
        assert all(len(c) == 1 for c in colours.values()) and len({next(iter(c)) for c in colours.values()}) == 5
        (r, g, b), (r2, g2, b2) = next(iter(colours["PASS"])), next(iter(colours["FAIL"]))
        assert g > r and g > b and r2 > g2 and r2 > b2  # PASS green, FAIL red
        mark = driver.find_element(By.CSS_SELECTOR, "#cell-happy-path--mooncake .baseline")
        assert mark.is_displayed() and mark.text == "new"  # the baseline mark shows
        # every link of the index resolves (cell pages, the requirement in docs/protocol.md)
        hrefs = {a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "a[href]")}
        assert hrefs and all(_resolves(page, h) for h in hrefs), sorted(h for h in hrefs if not _resolves(page, h))
        # the non-PASS filter hides the rows where everything passed (none here in the matrix; R-LIVE-2's row)
        live = driver.find_element(By.CSS_SELECTOR, 'tr[data-requirement="R-LIVE-2"]')
        assert live.is_displayed()
        driver.find_element(By.ID, "non-pass-only").click()
        assert not live.is_displayed() and driver.find_element(By.CSS_SELECTOR, 'tr[data-requirement="R-XFER-1"]') \
            .is_displayed()
        driver.save_screenshot(str(artifacts / "index.png"))

        driver.find_element(By.CSS_SELECTOR, "#cell-happy-path--mooncake a").click()
        assert driver.current_url.endswith("cells/happy-path--mooncake/cell.html")
        svg = driver.find_element(By.CSS_SELECTOR, "svg.timeline")
        assert svg.size["width"] > 800 and svg.size["height"] > 100  # the timeline renders
        pin = driver.find_element(By.CSS_SELECTOR, "#pin-check-0 text")
        assert pin.is_displayed() and pin.text == "\u2716 decode-success"  # the failing check, pinned
        pin_x = driver.find_element(By.CSS_SELECTOR, "#pin-check-0 line").get_attribute("x1")
        wait = driver.find_element(By.CSS_SELECTOR, 'a[href="#row-7"] rect')
        assert float(pin_x) == pytest.approx(float(wait.get_attribute("x")) + float(wait.get_attribute("width")), abs=1)
        tb = driver.find_element(By.CSS_SELECTOR, ".traceback code.where")
        assert tb.is_displayed() and tb.text == "sglang/srt/disaggregation/nixl/conn.py:3379 in bootstrap_thread"
        cell_page = out / "cells" / "happy-path--mooncake" / "cell.html"
        # every link of the cell page resolves: the role log, history.jsonl, the matrix, the requirement,
        # and the timeline's and the checks' links to raw rows (the SVG's too: its raw attributes)
        hrefs = {a.get_dom_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "a[href]")}
        assert {"./prefill.log", "./history.jsonl", "../../index.html", "#row-7"} <= hrefs
        assert all(_resolves(cell_page, h) for h in hrefs), sorted(h for h in hrefs if not _resolves(cell_page, h))
        driver.save_screenshot(str(artifacts / "cell.png"))
        # a click on the pinned check opens the folded history at its row
        driver.find_element(By.CSS_SELECTOR, "#failing-checks a[href='#row-7']").click()
        assert driver.find_element(By.ID, "row-7").is_displayed()

        logs = driver.get_log("browser")
        assert [e for e in logs if e["level"] == "SEVERE"] == []
        # the capture itself works: a console error does show up as SEVERE
        driver.execute_script("console.error('pdconform-probe')")
        assert any("pdconform-probe" in e["message"] and e["level"] == "SEVERE" for e in driver.get_log("browser"))
        print(f"\nscreenshots: {artifacts / 'index.png'} {artifacts / 'cell.png'} "
              f"({time.monotonic() - started:.1f} s in the browser)")
    finally:
        driver.quit()
        shutil.rmtree(browser_tmp, ignore_errors=True)


def test_trend_paints_a_known_bug_as_known_not_as_a_red_failure():
    run, _ = fixture_run()
    cell = run.cells[1]
    cell.verdict, cell.expected, cell.expected_link = "FAIL", "FAIL", "docs/sglang-bugs.md#b13"
    html = render_trend([("20261201-100000", run)])
    row = html[html.rindex("<tr", 0, html.index(f'<th scope="row">{cell.scenario}</th><th>{cell.impl}</th>')):]
    row = row[:row.index("</tr>")]
    assert 'class="cell v-FAIL known"' in row and "known B13" in row
    cell.expected = "PASS"  # the same FAIL, not expected: a verdict's colour, marked
    html = render_trend([("20261201-100000", run)])
    assert "v-FAIL unexpected" in html and "known B13" not in html
