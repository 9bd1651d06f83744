"""Test-only scenarios for the harness itself (hidden unless PDCONFORM_TEST_SCENARIOS=1).

``selftest-hang`` never finishes, so the runner must kill it at its deadline and
report ERROR; ``selftest-noop`` runs no step and must PASS right after it.
Neither starts a role, so they cost no sglang import.
"""

from __future__ import annotations

from harness import checks as c
from harness.scenario import Scenario, register
from harness.steps import Sleep, VerifyPools

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


def _misplaced_steps(seed: int):
    """happy-path, but the verification expects the first two destination pages
    swapped: the real transfer is right, so the check must fail and name them."""
    from scenarios import happy_path

    steps = happy_path.steps(seed)
    at = next(i for i, step in enumerate(steps) if isinstance(step, VerifyPools))
    moves = list(steps[at].kv_moves)
    (s0, d0), (s1, d1) = moves[0], moves[1]
    moves[0], moves[1] = (s0, d1), (s1, d0)
    return steps[:at] + [VerifyPools(tuple(moves), steps[at].aux_moves)] + steps[at + 1:]


register(
    Scenario(
        id="selftest-misplaced",
        title="happy-path checked against a wrong plan: the byte check must fail (harness self-test)",
        requirements=("R-LAYOUT-1",),
        steps=_misplaced_steps,
        checks=lambda seed: [c.Check("bytes-exact", "R-LAYOUT-1", "MUST", c.pools_exact())],
        timeout_s=150.0,
        test_only=True,
    )
)


def _open_room_steps(room: int):
    from harness.adapter import SUCCESS, FAILED
    from harness.steps import AwaitStatus, OpenRoom, StartRoles

    return lambda seed: [StartRoles(ready_timeout_s=30), OpenRoom(room), AwaitStatus(room, "prefill", (SUCCESS, FAILED), 2)]


register(
    Scenario(
        id="selftest-role-dies",
        title="The prefill role process exits in the middle of a call (harness self-test, impl selftest)",
        requirements=(),
        steps=_open_room_steps(1002),  # backends.selftest.adapter.DIE_ROOM
        checks=lambda seed: [c.Check("steps-complete", "-", "MUST", c.steps_completed())],
        timeout_s=60.0,
        test_only=True,
    )
)

register(
    Scenario(
        id="selftest-role-hangs",
        title="The prefill role blocks forever inside a call (harness self-test, impl selftest)",
        requirements=(),
        steps=_open_room_steps(1001),  # backends.selftest.adapter.HANG_ROOM
        checks=lambda seed: [c.Check("steps-complete", "-", "MUST", c.steps_completed())],
        timeout_s=6.0,
        test_only=True,
    )
)
