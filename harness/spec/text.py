"""Text from the code under test, made safe to store and to encode.

An exception message, a log line or a failure reason comes from sglang, an engine or a
hostile peer: it may hold a lone surrogate (text decoded with ``surrogateescape``), which
no UTF-8 encoder accepts, or format characters that change how the text around them is
shown: the bidi controls (U+202A-202E, U+2066-2069) reverse the report's own text after
them, zero-width characters hide text, U+2028/2029 break lines where a reader sees none.
:func:`clean` replaces a lone surrogate or a noncharacter with U+FFFD and every such
character with a visible ``<U+XXXX>``; the judge stores only cleaned text (results.json,
cell.json), and every output cleans again (harness.report.safe, the HTML environment), so
an older results file cannot bring them back.  Newlines, tabs and control characters are
each output's own business: Markdown and the terminal show them differently.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from typing import Any, Callable

import msgspec


def invisible_class() -> str:
    """A regex character class of every format character (category Cf) and the line and
    paragraph separators (Zl, Zp) in this Python's Unicode database: what :data:`INVISIBLE`
    holds, computed (a tenth of a second: tests/test_untrusted_text.py checks the two agree)."""
    points = [cp for cp in range(sys.maxunicode + 1)
              if unicodedata.category(chr(cp)) in ("Cf", "Zl", "Zp")]
    ranges, start = [], None
    for i, cp in enumerate(points):  # runs of consecutive code points as ranges: a short class
        if start is None:
            start = cp
        if i + 1 == len(points) or points[i + 1] != cp + 1:
            ranges.append(re.escape(chr(start)) + ("" if cp == start else "-" + re.escape(chr(cp))))
            start = None
    return "[" + "".join(ranges) + "]"


#: :func:`invisible_class` of Python 3.11's Unicode 14 database, written out: every process imports this
INVISIBLE = ("[\xad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e"
             "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438"
             "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]")
_INVISIBLE = re.compile(INVISIBLE)
# a lone surrogate (a Python str never holds a valid pair as two code points) or a noncharacter
_UNENCODABLE = re.compile("[\ud800-\udfff\ufdd0-\ufdef\ufffe\uffff]")


def clean(text: str, shown: str = "<U+{:04X}>") -> str:
    """``text`` with every lone surrogate and noncharacter as U+FFFD and every format
    character (bidi controls, zero-width characters, U+2028/2029 ...) as a visible
    ``<U+XXXX>`` (``shown``, formatted with the code point: HTML markup wants it escaped);
    any other text as it is (see the module docstring).  Linear in its length."""
    if text.isascii():  # the common case: nothing to replace
        return text
    text = _UNENCODABLE.sub("\ufffd", text)
    return _INVISIBLE.sub(lambda m: shown.format(ord(m.group(0))), text)


def encodable(text: str) -> str:
    """``text`` with every lone surrogate and noncharacter as U+FFFD, nothing else changed:
    what any UTF-8 encoder takes (results.json keeps every other character as it was)."""
    return text if text.isascii() else _UNENCODABLE.sub("\ufffd", text)


def clean_tree(node: Any, fix: Callable[[str], str] = clean) -> Any:
    """``node`` (JSON-like: dicts, lists, tuples, strings, numbers; a msgspec Struct as a dict
    of its fields) with every string, keys included, passed through ``fix`` (:func:`clean`,
    or :func:`encodable`)."""
    if isinstance(node, msgspec.Struct):
        node = {name: getattr(node, name) for name in node.__struct_fields__}
    if isinstance(node, str):
        return fix(node)
    if isinstance(node, dict):
        return {fix(k) if isinstance(k, str) else k: clean_tree(v, fix) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [clean_tree(v, fix) for v in node]
    return node


__all__ = ["clean", "clean_tree", "encodable"]
