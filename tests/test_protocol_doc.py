"""docs/protocol.md and the scenarios agree: every cited requirement exists, IDs are unique."""

import re
from pathlib import Path

from harness.scenario import all_scenarios

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
ROW = re.compile(r"^\| (R-[A-Z]+-\d+) \| (MUST|SHOULD) \|", re.M)


def requirements():
    return ROW.findall(DOC.read_text())


def test_ids_are_unique_and_levelled():
    ids = [rid for rid, _ in requirements()]
    assert len(ids) >= 12
    assert len(ids) == len(set(ids)), "duplicate requirement id"


def test_every_cited_requirement_is_specified():
    known = {rid for rid, _ in requirements()}
    for scenario in all_scenarios(include_test_only=False):
        for check in scenario.checks(0):
            assert check.requirement in known, (scenario.id, check.requirement)
        assert set(scenario.requirements) <= known, scenario.id


def test_every_must_is_checked_by_something_that_runs():
    """Each MUST names a scenario that exists, or a reference test/simulator invariant."""
    existing = {s.id for s in all_scenarios(include_test_only=False)}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if not match or match.group(2) != "MUST":
            continue
        checked_by = line.rstrip(" |").rsplit("|", 1)[1]
        runs = "reference:" in checked_by or any(s in checked_by.replace("*(planned)*", "") for s in existing)
        assert runs, f"{match.group(1)} is checked by nothing that runs yet: {checked_by.strip()}"
