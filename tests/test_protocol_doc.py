"""docs/protocol.md and the scenarios agree: every cited requirement exists, IDs are unique."""

import re
from pathlib import Path

from harness.spec.scenario import all_scenarios

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
ROW = re.compile(r"^\| (R-[A-Z]+-\d+) \| (MUST|SHOULD) \|", re.M)
TESTS = Path(__file__).resolve().parent
# What a "reference: ..." entry in the checked-by column may name, and the tests that are it.
REFERENCE_CHECKS = {
    "prefill core test": ["test_reference_prefill_core.py"],
    "decode core test": ["test_reference_decode_core.py"],
    "core tests": ["test_reference_prefill_core.py", "test_reference_decode_core.py"],
    "stateful test": ["test_reference_stateful.py", "test_reference_prefill_core.py"],
    "simulator": ["test_reference_simulator.py"],
    "driver test": ["test_reference_driver.py"],
    "planner property test": ["test_reference_planner.py"],
}


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
        reference = checked_by.split("reference:", 1)[1] if "reference:" in checked_by else ""
        named = [TESTS / f for word, files in REFERENCE_CHECKS.items() if word in reference for f in files]
        assert not reference or named, f"{match.group(1)}: unknown reference check {reference.strip()!r}"
        assert all(path.exists() for path in named), named
        scenario = any(s in checked_by.replace("*(planned)*", "") for s in existing)
        assert named or scenario, f"{match.group(1)} is checked by nothing that runs yet: {checked_by.strip()}"
