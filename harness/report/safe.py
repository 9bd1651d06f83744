"""Untrusted text stays text: everything a report shows that comes from the code under test
or from a results file (exception messages, log lines, names, versions, paths) goes through
one of these before it reaches Markdown (summary.md, ``diff --markdown``) or a terminal.
The HTML pages are escaped by their templates (jinja2 autoescape) and cleaned of invisible
characters by the environment (harness.report.templates_env).

Each first cleans the text (harness.spec.text.clean: no lone surrogate, every bidi control
and other format character shown as ``<U+XXXX>``), then keeps it on its line: a newline is
shown as :data:`NEWLINE` and nothing else, so no value can forge a line of its own; and in
Markdown no value can open a block (a heading, list item, quote, table, code block) where a
line starts.
"""

from __future__ import annotations

import re

from harness.spec.text import clean

NEWLINE = "⏎"  # what a newline inside a value looks like in a terminal or Markdown: it starts no line
# C0 and C1 control characters (ESC starts terminal sequences; NUL, BEL, BS rewrite lines)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# ANSI/VT sequences: CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), and two-byte ESC sequences
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# what Markdown (GitHub's) would read as markup inside a line (md() never lets text start a
# line, so list markers and headings cannot arise)
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]!|~])")


def terminal(text: object, lines: bool = False) -> str:
    """``text`` as plain terminal text: cleaned (harness.spec.text.clean), without escape
    sequences or control characters, newlines (and carriage returns) shown as
    :data:`NEWLINE`; tabs kept.  ``lines``: keep the newlines (text pdconform wrote itself,
    line by line, from values that were made safe one by one)."""
    text = _CONTROL.sub("?", _ANSI.sub("", clean(str(text)).replace("\r\n", "\n")))
    return text if lines else text.replace("\r", NEWLINE).replace("\n", NEWLINE)


def _one_line(text: object) -> str:
    return terminal(text).replace("\t", " ")


# what would open a block where a line starts (after the list marker pdconform puts before a
# value): a heading, a quote, a list item, a table row, a thematic break, an HTML block
_BLOCK_START = re.compile(r"^(\s*)([#>+\-=|]|\d{1,9}[.)])")


def md(text: object) -> str:
    """``text`` as inline Markdown that renders as itself: on one line (newlines shown as
    :data:`NEWLINE`), control characters gone, HTML (``<``, ``>``, ``&``) as entities, Markdown
    punctuation backslash-escaped, a line start that would open a block escaped and leading
    spaces dropped, and ``@`` mentions broken, so no string from the code under test can
    close a ``<details>``, add a heading, a list item, an image, a link or a mention,
    wherever on a line it is put."""
    text = _one_line(text).lstrip(" ")
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MD_SPECIAL.sub(r"\\\1", text)
    text = _BLOCK_START.sub(lambda m: m.group(1) + m.group(2)[:-1] + "\\" + m.group(2)[-1], text)
    text = text.replace("://", ":/\u200b/")  # no autolinked URL
    return text.replace("@", "@\u200b")  # a zero-width space: no @mention, no e-mail autolink


#: the most characters of a reason the terminal and summary.md show; the cell page and results.json hold it all
REASON_CHARS = 300


def cut(text: str, limit: int = REASON_CHARS, where: str = "cell.html") -> str:
    """``text`` cut to about ``limit`` characters, at a word where one is near, saying how
    much was left out and ``where`` the whole of it is; as it is when it fits."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    space = head.rfind(" ", limit - 40)
    head = head[:space] if space > 0 else head
    return f"{head} … ({len(text) - len(head)} more characters in {where})"


def md_code(text: object) -> str:
    """``text`` as an inline code span (one line, control characters gone), fenced with more
    backticks than any run of backticks inside it, so it cannot end the span early."""
    text = _one_line(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"
