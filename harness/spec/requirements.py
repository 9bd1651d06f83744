"""The requirements of docs/protocol.md, read from its tables: ID -> level and text.

docs/protocol.md is the one place a requirement's level is written; checks cite an
ID (harness.judge.checks.Check) and take the level from here, and a scenario's
requirements are those its checks cite (harness.spec.scenario.Scenario.requirements).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from harness import ROOT

PROTOCOL_MD = ROOT / "docs" / "protocol.md"
_ROW = re.compile(r"^\| (R-[A-Z]+-\d+) \| (MUST|SHOULD) \| ([^|]*)\|", re.M)
# each row's text starts with the anchor reports link to (harness.report.cell_page.requirement_link)
_ANCHOR = re.compile(r'^<a id="[^"]*"></a>')


class UnknownRequirement(KeyError):
    """A requirement ID that docs/protocol.md does not define."""


@dataclass(frozen=True)
class Requirement:
    """One row of docs/protocol.md: ``id`` (``R-XFER-1``), ``level`` (``MUST``/``SHOULD``), ``text``."""

    id: str
    level: str
    text: str


def parse(text: str) -> dict[str, Requirement]:
    """The requirement rows of a protocol.md text, by ID; ValueError on a duplicate ID."""
    found: dict[str, Requirement] = {}
    for rid, level, body in _ROW.findall(text):
        if rid in found:
            raise ValueError(f"docs/protocol.md defines {rid} twice")
        found[rid] = Requirement(rid, level, _ANCHOR.sub("", body.strip()))
    return found


@lru_cache(maxsize=None)
def requirements(path: Path = PROTOCOL_MD) -> dict[str, Requirement]:
    """Every requirement of ``path`` (default docs/protocol.md), by ID (read once per process)."""
    return parse(Path(path).read_text(encoding="utf-8"))


def requirement(rid: str) -> Requirement:
    """The requirement ``rid``; UnknownRequirement when docs/protocol.md lacks it."""
    try:
        return requirements()[rid]
    except KeyError:
        raise UnknownRequirement(f"{rid} is not a requirement of docs/protocol.md") from None
