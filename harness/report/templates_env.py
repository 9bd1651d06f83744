"""The one jinja2 environment of the HTML reports (index.html, cell pages, the trend page):
templates from ``templates/``, every value HTML-escaped whatever the template's name."""

from __future__ import annotations

from pathlib import Path

import jinja2

env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).resolve().parent / "templates"),
    autoescape=True,  # every template, whatever its name
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
