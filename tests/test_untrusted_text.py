"""Untrusted text stays text: strings from the code under test or from a results file cannot
add markup to summary.md, `diff --markdown` or index.html, nor escape sequences to a terminal."""

import subprocess
import sys
from pathlib import Path

from harness.judge.results import CellResult, RunResult, SglangInfo, dump_run
from harness.report.files import summary_markdown
from harness.report.html import render_index_html
from harness.report.run_diff import changed_cells, changes_markdown

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ("boom</details>\n\n## pdconform: every cell as expected\n![pwn](https://evil.example/x.png) "
           "[click](https://evil.example) @sgl-project/maintainers `code` | cell \x1b[31mRED\x1b]0;title\x07 <b>x</b>")


def hostile_run(verdict: str = "FAIL") -> RunResult:
    cells = [CellResult(impl="nixl", scenario="happy-path", verdict=verdict, reason=HOSTILE,
                        expected="FAIL", expected_reason=HOSTILE, expected_link=HOSTILE),
             CellResult(impl="mooncake", scenario="room-reuse", verdict="ERROR", reason=HOSTILE)]
    return RunResult(sglang=SglangInfo(version="0.5.23 " + HOSTILE, path="/x/" + HOSTILE), seed=0, cells=cells,
                     expectations="/e/" + HOSTILE)


def assert_inert_markdown(text: str) -> None:
    import re

    assert "\x1b" not in text and "\x07" not in text
    # a code span shows its text literally (a backslash-escaped backtick opens none)
    text = re.sub(r"(?<![\\`])(`+)(?!`).*?(?<!`)\1(?!`)", "CODE", text)
    assert text.count("<details>") == text.count("</details>")  # nothing closed a fold early
    assert "<b>" not in text
    headings = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert not [h for h in headings if "every cell as expected" in h and "regression" not in text[:80]]
    assert all(h.startswith(("## pdconform: ", "### ")) for h in headings), headings  # only our own headings
    # no image, link or autolink: every "![" and "](" that is left has its bracket escaped
    assert not re.search(r"!\[|(?<!\\)\]\(", text) and "https://" not in text
    assert "@sgl-project" not in text  # no mention
    assert "\x1b" not in text and "\x07" not in text


def test_summary_md_escapes_every_string_from_the_run():
    text = summary_markdown(hostile_run())
    assert_inert_markdown(text)
    assert "boom&lt;/details&gt;" in text  # shown, as text


def test_diff_markdown_and_the_terminal_escape_them_too(tmp_path):
    a, b = hostile_run("PASS"), hostile_run("FAIL")
    assert_inert_markdown(changes_markdown(a, b, changed_cells(a, b)))
    dump_run(a, tmp_path / "a" / "results.json")
    dump_run(b, tmp_path / "b" / "results.json")
    for extra in ([], ["--markdown"]):
        out = subprocess.run([sys.executable, "-m", "harness.cli", "diff", str(tmp_path / "a"), str(tmp_path / "b"),
                              *extra], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 1, out.stderr
        assert "\x1b]0;" not in out.stdout and "\x1b[31m" not in out.stdout and "\x07" not in out.stdout


def test_index_html_escapes_them():
    html = render_index_html(hostile_run())
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
