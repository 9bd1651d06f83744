"""index.html: the pure renderer (escaping, marks, engines, truncation) and, in headless
Chromium from file://, the page a person sees (matrix, colours, a cell's details, no
console errors)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from harness.judge.divergence import first_divergence
from harness.judge.results import load_histories
from harness.report.html import render_index_html, write_index_html
from harness.report.terminal import reproduce_command
from harness.judge.results import CellResult, RunResult, SglangInfo, dump_run

REPO = Path(__file__).resolve().parent.parent
# screenshots go where PDCONFORM_ARTIFACTS says (CI keeps them); else into the test's own tmp folder
ARTIFACTS_ENV = os.environ.get("PDCONFORM_ARTIFACTS")


def _events(status: str, fail: bool = False) -> list[dict]:
    events = [
        {"seq": 0, "t": 0.0, "step": 0, "op": "step", "role": None, "type": "info", "args": {"step": "StartRoles"}},
        {"seq": 1, "t": 0.1, "step": 1, "op": "step", "role": None, "type": "info", "args": {"step": "AwaitStatus"}},
        {"seq": 2, "t": 0.2, "step": 1, "op": "await_status", "role": "decode", "type": "invoke", "args": {"room": 1}},
        {"seq": 3, "t": 0.3, "step": 1, "op": "await_status", "role": "decode", "type": "ok", "args": {"room": 1},
         "value": {"status_name": status}},
    ]
    if fail:
        events.append({"seq": 4, "t": 0.4, "step": 1, "op": "poll", "role": "prefill", "type": "fail",
                       "args": {}, "error": "TimeoutError: no answer in 5 s"})
    return events


def fixture_run() -> tuple[RunResult, dict]:
    """Two scenarios x three implementations, one cell of each verdict (and a second PASS)."""
    failing = [{"name": "decode-success", "requirement": "R-XFER-1", "level": "MUST", "ok": False,
                "detail": "decode room 1 reached Failed"},
               {"name": "loops-alive", "requirement": "R-LIVE-2", "level": "MUST", "ok": True, "detail": "ok"}]
    histories = {
        ("happy-path", "reference"): _events("Success"),
        ("happy-path", "mooncake"): _events("Failed", fail=True),
        ("happy-path", "mori"): _events("Success"),
        ("dead-prefill", "reference"): _events("Failed"),
        ("dead-prefill", "mooncake"): [],
    }
    cells = [
        CellResult(impl="reference", scenario="happy-path", verdict="PASS", engine="reference", bytes_verified=7744),
        CellResult(impl="mooncake", scenario="happy-path", verdict="FAIL", engine="real", checks=failing,
                   reason="R-XFER-1 decode-success: decode room 1 reached Failed",
                   divergence=first_divergence(histories[("happy-path", "reference")],
                                               histories[("happy-path", "mooncake")], failing)),
        CellResult(impl="mori", scenario="happy-path", verdict="WARN", engine="standin", expected="WARN",
                   expected_reason="ABORT reason is empty <script>alert(1)</script>",
                   expected_link="https://github.com/sgl-project/sglang/issues/1", reason="R-REASON-1 SHOULD"),
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
    match = re.search(rf'<td class="([^"]*)"[^>]*>\s*<a href="#cell-{scenario}--{impl}"', html)
    assert match, (scenario, impl)
    return match.group(1)


def test_header_matrix_and_engine_per_column():
    run, histories = fixture_run()
    html = render_index_html(run, histories)
    assert "sglang 0.5.23" in html and "commit <code>abc1234</code>" in html and "seed <b>7</b>" in html
    assert "12.5 s" in html and "2026-11-30T15:15:00+00:00" in html
    columns = re.findall(r'<th data-impl="([^"]+)">\1<br><span class="engine">([^<]*)</span>', html)
    # mori's ERROR cell started no role: its column still says standin
    assert columns == [("reference", "reference"), ("mooncake", "real"), ("mori", "standin")]
    assert _td(html, "happy-path", "reference") == "cell v-PASS"
    assert _td(html, "dead-prefill", "mooncake") == "cell v-UNSUPPORTED"
    assert _td(html, "dead-prefill", "mori") == "cell v-ERROR unexpected"


def test_unexpected_verdicts_are_marked_and_expected_ones_are_not():
    run, histories = fixture_run()
    html = render_index_html(run, histories)
    assert _td(html, "happy-path", "mooncake") == "cell v-FAIL unexpected"
    assert "FAIL <span class=\"mark\">(expected PASS)</span>" in html
    assert _td(html, "happy-path", "mori") == "cell v-WARN"  # expected WARN: not marked unexpected
    assert "2</b> not as expected" in html
    assert '<a href="https://github.com/sgl-project/sglang/issues/1">' in html


def test_strings_from_the_result_tree_are_escaped():
    run, histories = fixture_run()
    run.cells[0].reason = '</pre><script>alert("reason")</script>'
    run.cells[2].expected_link = "javascript:alert(1)"
    histories[("happy-path", "reference")][0]["args"]["step"] = "<img src=x onerror=alert(1)>"
    html = render_index_html(run, histories)
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;/pre&gt;&lt;script&gt;alert(&#34;reason&#34;)&lt;/script&gt;" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the expectation reason
    assert 'href="javascript:' not in html  # a non-http link is shown as text, never as an href
    assert html.count("<script>") == 1  # only the page's own


def test_cell_details_reason_checks_divergence_diff_history_reproduce():
    run, histories = fixture_run()
    html = render_index_html(run, histories)
    start = html.index('id="cell-happy-path--mooncake"')
    details = html[start:html.index("</details>\n", html.index('<details class="history"', start))]
    assert "R-XFER-1 decode-success: decode room 1 reached Failed" in details
    assert "<td>decode-success</td>" in details and "loops-alive" not in details  # failing checks only
    assert "first divergence at step 1 AwaitStatus (await_status on decode) [R-XFER-1]" in details
    assert '<span class="del">-step 1 AwaitStatus: await_status on decode: Success</span>' in details
    assert '<span class="add">+step 1 AwaitStatus: await_status on decode: Failed</span>' in details
    assert "TimeoutError: no answer in 5 s" in details  # the history table shows errors
    assert f'<pre class="repro">{reproduce_command(run, run.cells[1])}</pre>' in details
    assert "--expectations none --sglang-src /x" in details  # judged with no file; the folder holding sglang/
    # identical normalized histories say so; the ERROR cell has no history at all
    assert "identical (1 events)" in html[html.index('id="cell-happy-path--mori"'):]
    assert "No history recorded." in html[html.index('id="cell-dead-prefill--mori"'):]


def test_long_histories_and_values_are_truncated_with_a_note():
    run, histories = fixture_run()
    long = _events("Success") * 200
    long[3] = dict(long[3], op="poll", value={"blob": "x" * 10_000})
    histories[("happy-path", "reference")] = long
    html = render_index_html(run, histories, max_events=50, max_value_chars=80)
    assert "x" * 100 not in html
    assert "Showing the first 50 of 800 events" in html
    assert 'href="cells/happy-path--reference/history.jsonl"' in html
    section = html[html.index('id="cell-happy-path--reference"'):html.index('id="cell-happy-path--mooncake"')]
    assert section.count("<tr class=") == 50


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
    dump_run(run, out / "results.json")
    return run, out


def test_load_histories_reads_the_out_directory_layout(tmp_path):
    for reference_column in (True, False):
        run, out = _write_out_dir(tmp_path / str(reference_column), reference_column)
        cells = [(c.scenario, c.impl) for c in run.cells]
        histories = load_histories(out, cells)
        assert histories == fixture_run()[1]  # the torn last lines skipped
        assert write_index_html(run, out, histories) == out / "index.html"
        html = (out / "index.html").read_text()
        assert '<span class="add">+step 1 AwaitStatus: await_status on decode: Failed</span>' in html
        assert html.count('<th data-impl="reference">') == 1  # dead-prefill keeps its reference column


# --- headless Chromium --------------------------------------------------------------------

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.mark.browser
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                    reason="no Debian chromium/chromedriver: apt-get install chromium chromium-driver")
def test_index_html_in_headless_chromium(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium missing: pip install -r requirements/harness.txt")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    run, out = _write_out_dir(tmp_path)
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
            assert f"v-{verdict}" in cell.get_attribute("class").split()
            rgb = tuple(int(x) for x in re.findall(r"\d+", cell.value_of_css_property("background-color"))[:3])
            colours.setdefault(verdict, set()).add(rgb)
        assert all(len(c) == 1 for c in colours.values())  # one colour per verdict ...
        colour = {verdict: next(iter(c)) for verdict, c in colours.items()}
        assert len(set(colour.values())) == 5  # ... five different ones
        (r, g, b), (r2, g2, b2) = colour["PASS"], colour["FAIL"]
        assert g > r and g > b and r2 > g2 and r2 > b2  # PASS green, FAIL red
        ARTIFACTS = Path(ARTIFACTS_ENV) if ARTIFACTS_ENV else tmp_path / "artifacts"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "index.png"))

        details = driver.find_element(By.ID, "cell-happy-path--mooncake")
        repro = details.find_element(By.CSS_SELECTOR, "pre.repro")
        assert not repro.is_displayed()
        driver.find_element(By.CSS_SELECTOR, 'a[data-cell="cell-happy-path--mooncake"]').click()
        WebDriverWait(driver, 5).until(EC.visibility_of(repro))
        assert details.get_attribute("open") is not None
        assert repro.text == reproduce_command(run, run.cells[1])
        assert details.find_element(By.CSS_SELECTOR, "p.divergence").text.startswith("first divergence at step 1")
        driver.save_screenshot(str(ARTIFACTS / "index-cell.png"))

        logs = driver.get_log("browser")
        assert [e for e in logs if e["level"] == "SEVERE"] == []
        # the capture itself works: a console error does show up as SEVERE
        driver.execute_script("console.error('pdconform-probe')")
        assert any("pdconform-probe" in e["message"] and e["level"] == "SEVERE" for e in driver.get_log("browser"))
        print(f"\nscreenshots: {ARTIFACTS / 'index.png'} {ARTIFACTS / 'index-cell.png'} "
              f"({time.monotonic() - started:.1f} s in the browser)")
    finally:
        driver.quit()
        shutil.rmtree(browser_tmp, ignore_errors=True)
