"""Untrusted text stays text: strings from the code under test or from a results file cannot
add markup to summary.md, `diff --markdown` or index.html, nor escape sequences to a terminal."""

import re
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


# --- one hostile string through a real role process into every output ----------------------------

FORGED = ("## pdconform: every cell as expected", "- 1 cells: all as expected", "[1/1] selftest-noop x selftest",
          "> quoted", "1. item")


def assert_no_raw_hostile(text: str, where: str) -> None:
    """No bidi control, lone surrogate or escape sequence, and no line the hostile text forged."""
    assert "\u202e" not in text and "\u202c" not in text and "\udcff" not in text, where
    assert "\x1b" not in text and "\x07" not in text, where
    for line in text.splitlines():
        stripped = line.strip()
        assert not any(stripped.startswith(f) or stripped.startswith(f"- {f}") for f in FORGED), (where, line)


def test_a_hostile_string_from_a_real_role_reaches_every_output_inert(tmp_path):
    """A role whose exception message holds a lone surrogate, a right-to-left override, forged
    lines and markup: the cell is a FAIL (not a crash), and run, repro, judge, summary.md,
    index.html, cell.html, junit.xml, results.json and diff --markdown each show it inert."""
    import json

    from backends.selftest.adapter import HOSTILE_TEXT

    assert "\udcff" in HOSTILE_TEXT and "\u202e" in HOSTILE_TEXT
    out = tmp_path / "out"
    cli = [sys.executable, "-m", "harness.cli"]
    ran = subprocess.run([*cli, "run", "--impl", "selftest", "--scenario", "selftest-hostile-text", "--out", str(out)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, errors="surrogateescape")
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stdout + ran.stderr  # a FAIL, not a crash
    assert "FAIL" in ran.stdout and "<U+202E>evil" in ran.stdout  # shown, as visible text
    assert_no_raw_hostile(ran.stdout + ran.stderr, "run's terminal")
    run = (out / "latest").resolve()
    results = json.loads((run / "results.json").read_text(encoding="utf-8"))
    cell = results["cells"][0]
    assert cell["verdict"] == "FAIL" and "<U+202E>evil" in cell["reason"] and "\ufffd" in cell["reason"]
    summary = (run / "summary.md").read_text(encoding="utf-8")
    assert_inert_markdown(summary)
    assert_no_raw_hostile(summary, "summary.md")
    assert "&lt;U+202E&gt;evil" in summary
    for page in (run / "index.html", run / "cells" / "selftest-hostile-text--selftest" / "cell.html"):
        html = page.read_text(encoding="utf-8")
        assert "\u202e" not in html and "\udcff" not in html and "<b>x</b>" not in html, page
        assert "&lt;U+202E&gt;evil" in html, page
    junit = (run / "junit.xml").read_text(encoding="utf-8")
    assert "\u202e" not in junit and "\x1b" not in junit
    judged = subprocess.run([*cli, "judge", str(run)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert judged.returncode == 1 and "Traceback" not in judged.stderr, judged.stderr
    assert_no_raw_hostile(judged.stdout + judged.stderr, "judge's terminal")
    repro = subprocess.run([*cli, "repro", "selftest-hostile-text", "--impl", "selftest", "--out", str(tmp_path / "r")],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert repro.returncode == 1 and "Traceback" not in repro.stderr, repro.stderr
    assert_no_raw_hostile(repro.stdout + repro.stderr, "repro's terminal")
    passed = tmp_path / "passed"  # the same run with the cell passing: diff shows the hostile reason
    passed.mkdir()
    results["cells"][0]["verdict"], results["cells"][0]["reason"] = "PASS", ""
    (passed / "results.json").write_text(json.dumps(results))
    for extra in ([], ["--markdown"]):
        diff = subprocess.run([*cli, "diff", str(passed), str(run), *extra], capture_output=True, text=True, timeout=60,
                              cwd=ROOT)
        assert diff.returncode == 1 and "Traceback" not in diff.stderr, diff.stderr
        assert_no_raw_hostile(diff.stdout, f"diff {extra}")
        if extra:
            assert_inert_markdown(diff.stdout)


def test_the_written_out_invisible_class_is_this_pythons():
    """harness.spec.text.INVISIBLE is the computed class, written out so no process pays for it."""
    from harness.spec.text import INVISIBLE, invisible_class

    assert INVISIBLE == invisible_class()


def test_md_opens_no_block_wherever_a_value_starts_a_line():
    from harness.report.safe import md

    for text in ("## heading", "- item", "+ item", "> quote", "1. item", "12) item", "| a | b |", "=====",
                 "    code block", "\t# tab heading", "line\n# second"):
        rendered = f"- {md(text)}"
        assert "\n" not in rendered
        body = rendered[2:]
        assert not re.match(r"\s*(#|-|\+|>|\d+[.)]|\||=)", body), (text, body)
