"""Scenario declarations and the scenario registry.

A scenario is data: a kebab-case ``id``, a ``title``, a cell deadline in seconds,
the steps (from the closed vocabulary in :mod:`harness.spec.steps`) and the checks
(from :mod:`harness.judge.checks`).  The requirements it checks are the ones its
checks cite (docs/protocol.md), never listed twice.  It imports no backend.  Scenarios live in
``scenarios/`` and register themselves with :func:`register`.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Callable

from harness.spec.steps import Step

if TYPE_CHECKING:  # a scenario holds checks; the spec layer does not need the judge to exist
    from harness.judge.checks import Check


@dataclass(frozen=True)
class Scenario:
    """One scenario; see the module docstring.

    ``timeout_s``: the cell's deadline (seconds; the runner kills it then).
    ``timeout_wait_s``: seconds the scenario must wait, beyond its ``Sleep`` steps,
    for a timeout, heartbeat window or engine delay it sets up itself (for example a
    3 s bootstrap timeout); with the sleeps it makes :meth:`inherent_wait_s`, which the
    runner subtracts from a cell's wall time to report the harness's overhead.
    ``opt_out``: ``(name, reason)`` for each generic post-condition
    (harness.judge.postconditions) the judge must not add to this scenario's checks.
    ``topologies``: the named topologies (harness.spec.topology) it runs on, with the reason,
    only when it must say (it starts its own ranks or stages); empty: every topology.
    ``nightly``: why it runs only when asked for (by id, or in a ``--topology nightly`` run),
    not in the default matrix (it costs more than a CI gate spends); empty: in every run.
    ``alone``: why its cells run with no other cell at the same time (a network fault
    between two hosts reaches every cell whose roles share them); empty: with the others.
    ``faults_optional``: see the field.
    """

    id: str
    title: str
    steps: Callable[[int], list[Step]]  # seed -> steps
    checks: Callable[[int], list["Check"]]  # seed -> checks
    timeout_s: float = 120.0
    timeout_wait_s: float = 0.0
    test_only: bool = False
    description: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    opt_out: tuple[tuple[str, str], ...] = ()
    topologies: tuple[tuple[str, ...], str] | tuple[()] = ()
    nightly: str = ""
    alone: str = ""
    #: why a fault of this scenario that never fired does not make a cell ERROR (harness.judge.fired);
    #: empty: it does.  Only generated programs say so: their plans are drawn before the writes they may hit
    faults_optional: str = ""

    def runs_on(self, topology: str) -> bool:
        """Whether this scenario runs on the named topology (see ``topologies``)."""
        return not self.topologies or topology in self.topologies[0]

    @property
    def requirements(self) -> tuple[str, ...]:
        """The requirement IDs this scenario's checks cite (docs/protocol.md), in the order
        they are first cited (the checks of seed 0: a seed changes rooms, not requirements)."""
        return tuple(dict.fromkeys(check.requirement for check in self.checks(0)))

    @functools.lru_cache(maxsize=None)  # noqa: B019 - scenarios live as long as the process
    def inherent_wait_s(self, seed: int) -> float:
        """Seconds any conforming implementation spends waiting in this scenario for ``seed``:
        its ``Sleep`` steps plus ``timeout_wait_s`` (computed once per seed: steps may sample)."""
        from harness.spec.steps import Sleep

        return round(sum(step.seconds for step in self.steps(seed) if isinstance(step, Sleep)) + self.timeout_wait_s, 3)

    @functools.lru_cache(maxsize=None)  # noqa: B019 - scenarios live as long as the process
    def expected_s(self, seed: int) -> float:
        """Seconds a conforming cell of this scenario is expected to take for ``seed``: its
        :meth:`inherent_wait_s` plus :data:`STEP_COST_S` per step, so a scenario of many steps
        and no sleeps (a load of 256 rooms) is not taken for an instant one when cells are
        ordered (harness.drive.scheduler, harness.mutants.EarlyStop)."""
        return round(self.inherent_wait_s(seed) + STEP_COST_S * len(self.steps(seed)), 3)


#: seconds a step costs a cell beyond its waits, measured on the reference on 2 cores at make
#: matrix's load (load-64: 471 steps in 5.4 s, load-256: 1,871 in 20 s; docs/performance.md)
STEP_COST_S = 0.01

_REGISTRY: dict[str, Scenario] = {}
TEST_SCENARIOS_ENV = "PDCONFORM_TEST_SCENARIOS"


def register(scenario: Scenario) -> Scenario:
    """Add ``scenario`` to the registry, once its checks have been built (so a check citing an
    ID docs/protocol.md lacks fails here, at import, naming the scenario's module); ValueError
    on a duplicate id, harness.spec.requirements.UnknownRequirement on such a check."""
    if scenario.id in _REGISTRY and _REGISTRY[scenario.id] is not scenario:
        raise ValueError(f"duplicate scenario id {scenario.id!r}")
    scenario.checks(0)
    _REGISTRY[scenario.id] = scenario
    return scenario


SCENARIO_ENTRY_POINTS = "pdconform.scenarios"  # each names a package whose every module registers scenarios


class ScenarioLoadError(RuntimeError):
    """A scenario package of the :data:`SCENARIO_ENTRY_POINTS` group does not load, or a
    module of it raises, or registers an id another scenario has; the message names it."""


@functools.lru_cache(maxsize=None)
def _load_all() -> None:
    """Import every module of every scenario package (entry point group :data:`SCENARIO_ENTRY_POINTS`,
    pyproject.toml), once per process; each registers its scenarios.  ScenarioLoadError
    names the entry point and module that failed."""
    for entry in metadata.entry_points(group=SCENARIO_ENTRY_POINTS):
        module = entry.value
        try:
            package = importlib.import_module(module)
            for info in pkgutil.iter_modules(getattr(package, "__path__", [])):
                module = f"{entry.value}.{info.name}"
                importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - a broken scenario package is named, not a traceback
            _load_all.cache_clear()
            raise ScenarioLoadError(f"scenario entry point {entry.name} = {entry.value}: {module} does not load: "
                                    f"{type(exc).__name__}: {exc}") from exc


def all_scenarios(include_test_only: bool | None = None) -> list[Scenario]:
    """Registered scenarios in id order.  Test-only ones (harness self-tests)
    appear only when ``PDCONFORM_TEST_SCENARIOS=1`` or asked for."""
    _load_all()
    if include_test_only is None:
        include_test_only = os.environ.get(TEST_SCENARIOS_ENV) == "1"
    return sorted((s for s in _REGISTRY.values() if include_test_only or not s.test_only), key=lambda s: s.id)


def scenario_ids(include_test_only: bool | None = None) -> list[str]:
    """Every cell scenario id: each registered scenario, and it on every named topology it runs
    on (``SCENARIO@TOPOLOGY``, harness.spec.topology) other than p1-d1."""
    from harness.spec.topology import TOPOLOGIES, TOPOLOGY_SEP

    out = []
    for s in all_scenarios(include_test_only):
        out.append(s.id)
        out += [f"{s.id}{TOPOLOGY_SEP}{t}" for t in TOPOLOGIES if t != "p1-d1" and s.runs_on(t)]
    return out


def scenarios_by_id(ids, include_test_only: bool | None = None) -> dict[str, Scenario]:
    """The scenarios of the cell ids ``ids`` that exist (a ``SCENARIO@TOPOLOGY`` id as the
    scenario on that topology), by id; unknown ids are left out."""
    out = {}
    for sid in dict.fromkeys(ids):
        try:
            scenario = get_scenario(sid, include_test_only)
        except KeyError:
            continue
        out[sid] = scenario
    return out


_FILE_LOADERS: dict[str, Callable[[str], Scenario]] = {}


def register_file_loader(suffix: str, load: Callable[[str], Scenario]) -> None:
    """Let :func:`get_scenario` take a path ending in ``suffix`` as a scenario: ``load(path)``
    builds it (a scenario package registers one, e.g. generated programs stored as JSON,
    scenarios/found_programs.py); ``load`` raises ValueError for a file it cannot read."""
    _FILE_LOADERS[suffix] = load


def get_scenario(scenario_id: str, include_test_only: bool | None = None) -> Scenario:
    """Look up a scenario, or ``SCENARIO@TOPOLOGY``: the scenario run on a named topology
    (harness.spec.topology.on_topology), or the path of a scenario file a registered loader
    reads (:func:`register_file_loader`); KeyError names the known ids (or topologies), or
    why the file is no scenario."""
    from harness.spec.topology import TOPOLOGY_SEP, on_topology, topology

    _load_all()
    suffix = next((s for s in _FILE_LOADERS if scenario_id.endswith(s)), None)
    if suffix is not None and os.sep in scenario_id:
        try:
            return _FILE_LOADERS[suffix](scenario_id)
        except (OSError, ValueError) as exc:
            raise KeyError(f"scenario file {scenario_id}: {exc}") from exc
    base, sep, name = scenario_id.partition(TOPOLOGY_SEP)
    known = {s.id: s for s in all_scenarios(include_test_only)}
    if base not in known:
        raise KeyError(f"unknown scenario {base!r} (known: {', '.join(known)})")
    if sep and not known[base].runs_on(name):
        raise KeyError(f"{base} does not run on topology {name}: {known[base].topologies[1]}")
    return on_topology(known[base], topology(name)) if sep else known[base]
