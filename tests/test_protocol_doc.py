"""docs/protocol.md and the scenarios agree: every cited requirement exists, IDs are unique."""

import re
from pathlib import Path

from harness.spec.requirements import PROTOCOL_MD, parse, requirements as spec_requirements
from harness.spec.scenario import all_scenarios

DOC = PROTOCOL_MD
ROW = re.compile(r"^\| (R-[A-Z]+-\d+) \| (MUST|SHOULD) \|", re.M)  # a row's start, to read its checked-by column
TESTS = Path(__file__).resolve().parent
# What a "reference: ..." entry in the checked-by column may name, and the tests that are it.
REFERENCE_CHECKS = {
    "prefill core test": ["test_reference_prefill_core.py"],
    "decode core test": ["test_reference_decode_core.py"],
    "core tests": ["test_reference_prefill_core.py", "test_reference_decode_core.py"],
    "stateful test": ["test_reference_stateful.py", "test_reference_prefill_core.py"],
    "simulator": ["test_reference_simulator.py"],
    "driver test": ["test_reference_driver.py"],
    "planner property test": ["test_layout_plan.py"],
}


def requirements():
    """(ID, level) of every row, as harness.spec.requirements reads them (the harness's own parser)."""
    return [(r.id, r.level) for r in parse(DOC.read_text()).values()]


def test_ids_are_unique_and_levelled():
    ids = [rid for rid, _ in requirements()]
    assert len(ids) >= 12
    assert len(ids) == len(set(ids)), "duplicate requirement id"


def test_every_cited_requirement_is_specified_with_its_level():
    """A check's requirement exists in docs/protocol.md and its level is the document's (a check
    never restates it); a scenario's requirements are exactly those its checks cite."""
    known = dict(requirements())
    for scenario in all_scenarios(include_test_only=True):
        for seed in (0, 1):
            for check in scenario.checks(seed):
                assert check.requirement in known, (scenario.id, check.requirement)
                assert check.level == known[check.requirement], (scenario.id, check.name)
        assert scenario.requirements == tuple(dict.fromkeys(c.requirement for c in scenario.checks(0)))
    assert spec_requirements() == parse(DOC.read_text())


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


def test_the_scenarios_a_requirement_names_do_check_it():
    """A scenario the "checked by" column names has a check citing that requirement (the
    scenario's requirements are derived from its checks, so the document must not promise more)."""
    scenarios = {s.id: s for s in all_scenarios(include_test_only=False)}
    wrong = []
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if not match:
            continue
        checked_by = line.rstrip(" |").rsplit("|", 1)[1].split("reference:", 1)[0]
        named = [sid for sid in scenarios if re.search(rf"(?<![\w-]){re.escape(sid)}(?![\w-])", checked_by)]
        wrong += [f"{match.group(1)}: {sid}" for sid in named if match.group(1) not in scenarios[sid].requirements]
    assert not wrong, wrong
