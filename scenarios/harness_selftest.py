"""Test-only scenarios for the harness itself (hidden unless PDCONFORM_TEST_SCENARIOS=1).

``selftest-hang`` never finishes, so the runner must kill it at its deadline and
report ERROR; ``selftest-noop`` runs no step and must PASS right after it.
Neither starts a role, so they cost no sglang import.
"""

from __future__ import annotations

from harness import checks as c
from harness.scenario import Scenario, register
from harness.steps import Sleep

register(
    Scenario(
        id="selftest-hang",
        title="A cell that hangs (harness self-test)",
        requirements=(),
        steps=lambda seed: [Sleep(3600.0)],
        checks=lambda seed: [],
        timeout_s=3.0,
        test_only=True,
    )
)

register(
    Scenario(
        id="selftest-noop",
        title="A cell that does nothing (harness self-test)",
        requirements=(),
        steps=lambda seed: [],
        checks=lambda seed: [c.Check("steps-complete", "-", "MUST", c.steps_completed())],
        timeout_s=30.0,
        test_only=True,
    )
)
