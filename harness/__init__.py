"""pdconform's harness: spec, role, judge, target, drive, report and bench (docs/architecture.md)."""

from pathlib import Path

#: The checkout pdconform runs from: cells and roles start with it as working directory.
ROOT = Path(__file__).resolve().parent.parent
