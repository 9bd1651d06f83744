"""Untrusted text stays text: everything a report shows that comes from the code under test
or from a results file (exception messages, log lines, names, versions, paths) goes through
one of these before it reaches Markdown (summary.md, ``diff --markdown``) or a terminal.
index.html is escaped by its templates (jinja2 autoescape).
"""

from __future__ import annotations

import re

# C0 and C1 control characters (ESC starts terminal sequences; NUL, BEL, BS rewrite lines)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# ANSI/VT sequences: CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), and two-byte ESC sequences
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# what Markdown (GitHub's) would read as markup inside a line (md() never lets text start a
# line, so list markers and headings cannot arise)
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]!|~])")


def terminal(text: object) -> str:
    """``text`` without terminal escape sequences or other control characters (newlines and
    tabs are kept)."""
    return _CONTROL.sub("?", _ANSI.sub("", str(text)))


def md(text: object) -> str:
    """``text`` as inline Markdown that renders as itself: on one line, control characters
    gone, HTML (``<``, ``>``, ``&``) as entities, Markdown punctuation backslash-escaped and
    ``@`` mentions broken, so no string from the code under test can close a ``<details>``,
    add a heading, an image, a link or a mention."""
    text = terminal(text).replace("\r", " ").replace("\n", " ").replace("\t", " ")
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MD_SPECIAL.sub(r"\\\1", text)
    text = text.replace("://", ":/\u200b/")  # no autolinked URL
    return text.replace("@", "@\u200b")  # a zero-width space: no @mention, no e-mail autolink


def md_code(text: object) -> str:
    """``text`` as an inline code span (one line, control characters gone), fenced with more
    backticks than any run of backticks inside it, so it cannot end the span early."""
    text = terminal(text).replace("\r", " ").replace("\n", " ").replace("\t", " ")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"
