"""pdconform's harness: spec, role, judge, target, drive, report and bench (docs/architecture.md)."""

from pathlib import Path

#: The checkout pdconform runs from: cells and roles start with it as working directory.
ROOT = Path(__file__).resolve().parent.parent


def program() -> str:
    """How to call this pdconform pasted into a fresh shell at the checkout root, the one
    form every reproduce line uses (terminal, summary.md, the HTML pages, JUnit): the console
    script of the virtual environment this interpreter belongs to, relative to the checkout
    when it lives inside it (``.venv/bin/pdconform``), else by its absolute path when it has
    one, else ``pdconform`` (an installation that put it on PATH)."""
    import shlex
    import sys

    script = Path(sys.executable).parent / "pdconform"  # not resolved: a venv's python is a link out of it
    if not script.is_file():
        return "pdconform"
    try:
        return shlex.quote(str(script.relative_to(ROOT)))
    except ValueError:
        return shlex.quote(str(script))
