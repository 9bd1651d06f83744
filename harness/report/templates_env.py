"""The one jinja2 environment of the HTML reports (index.html, cell pages, the trend page):
templates from ``templates/``, every value HTML-escaped whatever the template's name and
cleaned of lone surrogates and invisible characters (harness.spec.text.clean: a bidi control
from a role's log cannot reverse the page's own text after it)."""

from __future__ import annotations

from pathlib import Path

import jinja2
from markupsafe import Markup

from harness.spec.text import clean


def _finalize(value):
    """Every ``{{ value }}`` a template prints: a string cleaned (markup the templates made
    safe stays markup), anything else as it is."""
    if isinstance(value, Markup):
        return Markup(clean(str(value), shown="&lt;U+{:04X}&gt;"))
    return clean(value) if isinstance(value, str) else value


env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).resolve().parent / "templates"),
    autoescape=True,  # every template, whatever its name
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    finalize=_finalize,
)
