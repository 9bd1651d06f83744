"""Scenario declarations and the scenario registry.

A scenario is data: a kebab-case ``id``, a ``title``, the requirement IDs it
checks (docs/protocol.md), a cell deadline in seconds, the steps (from the
closed vocabulary in :mod:`harness.spec.steps`) and the checks (from
:mod:`harness.judge.checks`).  It imports no backend.  Scenarios live in
``scenarios/`` and register themselves with :func:`register`.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from dataclasses import dataclass, field
from typing import Callable

from harness.judge.checks import Check
from harness.spec.steps import Step


@dataclass(frozen=True)
class Scenario:
    """One scenario; see the module docstring.

    ``timeout_s``: the cell's deadline (seconds; the runner kills it then).
    ``timeout_wait_s``: seconds the scenario must wait, beyond its ``Sleep`` steps,
    for a timeout, heartbeat window or engine delay it sets up itself (for example a
    3 s bootstrap timeout); with the sleeps it makes :meth:`inherent_wait_s`, which the
    runner subtracts from a cell's wall time to report the harness's overhead.
    """

    id: str
    title: str
    requirements: tuple[str, ...]
    steps: Callable[[int], list[Step]]  # seed -> steps
    checks: Callable[[int], list[Check]]  # seed -> checks
    timeout_s: float = 120.0
    timeout_wait_s: float = 0.0
    test_only: bool = False
    description: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)


    def inherent_wait_s(self, seed: int) -> float:
        """Seconds any conforming implementation spends waiting in this scenario for ``seed``:
        its ``Sleep`` steps plus ``timeout_wait_s``."""
        from harness.spec.steps import Sleep

        return round(sum(step.seconds for step in self.steps(seed) if isinstance(step, Sleep)) + self.timeout_wait_s, 3)


_REGISTRY: dict[str, Scenario] = {}
TEST_SCENARIOS_ENV = "PDCONFORM_TEST_SCENARIOS"


def register(scenario: Scenario) -> Scenario:
    """Add ``scenario`` to the registry; ValueError on a duplicate id."""
    if scenario.id in _REGISTRY and _REGISTRY[scenario.id] is not scenario:
        raise ValueError(f"duplicate scenario id {scenario.id!r}")
    _REGISTRY[scenario.id] = scenario
    return scenario


def _load_all() -> None:
    import scenarios

    for info in pkgutil.iter_modules(scenarios.__path__):
        importlib.import_module(f"scenarios.{info.name}")


def all_scenarios(include_test_only: bool | None = None) -> list[Scenario]:
    """Registered scenarios in id order.  Test-only ones (harness self-tests)
    appear only when ``PDCONFORM_TEST_SCENARIOS=1`` or asked for."""
    _load_all()
    if include_test_only is None:
        include_test_only = os.environ.get(TEST_SCENARIOS_ENV) == "1"
    return sorted((s for s in _REGISTRY.values() if include_test_only or not s.test_only), key=lambda s: s.id)


def get_scenario(scenario_id: str) -> Scenario:
    """Look up a scenario; KeyError names the known ids."""
    known = {s.id: s for s in all_scenarios()}
    if scenario_id not in known:
        raise KeyError(f"unknown scenario {scenario_id!r} (known: {', '.join(known)})")
    return known[scenario_id]
