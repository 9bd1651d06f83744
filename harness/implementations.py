"""The registry of implementations: everything the harness knows about a backend, as data.

Each implementation is an :class:`Implementation` that its own package declares
(``backends/<name>/__init__.py``: ``IMPLEMENTATION = Implementation(...)``) and
registers as a Python entry point of the group :data:`ENTRY_POINT_GROUP` (pyproject.toml
lists pdconform's; another package may add its own backend the same way).  The harness
never imports a backend: it finds them here and reaches their code only through the
``"module:attribute"`` names an entry gives (:meth:`Implementation.hook`), inside the
processes that need it (a role, the fork server, a doctor probe, an engine bench child).

What an entry says: the role-adapter class (imported only inside a role process, since
importing it imports sglang and an engine); the sglang releases it supports
(:class:`harness.target.version.SglangRange`; None: any, it imports no sglang); what the
fork server preloads for its roles and what it must do first; how doctor probes its
engine; the engine settings a run may change (:class:`EngineSetting`); and optional
tools (the reference's simulator, an engine benchmark).  A role of an implementation
whose range excludes the sglang being driven gets an :class:`OutOfRangeRole`, so its
cells are UNSUPPORTED naming the release and the range instead of crashing on a changed
internal signature.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import metadata
from typing import Any

from harness.role.adapter import OutOfRangeRole
from harness.spec.scenario import TEST_SCENARIOS_ENV
from harness.target.version import SglangRange, sglang_version

ENTRY_POINT_GROUP = "pdconform.implementations"
#: set to 1 (by ``pdconform mutants``, inherited by its cells and roles), the registry also
#: holds each implementation's planted-bug mutants (its ``mutants`` tool) as ``mutant.<id>``
MUTANTS_ENV = "PDCONFORM_MUTANTS"
MUTANT_PREFIX = "mutant."
MUTANT_ENV = "PDCONFORM_MUTANT"  # in a mutant's role: the id of the planted bug it runs


class RegistryError(RuntimeError):
    """An entry point of :data:`ENTRY_POINT_GROUP` is unusable (does not load, or is not an Implementation)."""


@dataclass(frozen=True)
class EngineSetting:
    """An engine setting a run may change from how sglang runs the engine.

    ``name``: its key in results.json ``engine_settings`` and in ``pdconform run
    --engine-setting NAME=VALUE`` (reproduce commands carry it when not the default);
    ``env``: the variable a role reads it from; ``default``: what pdconform runs with;
    ``sglang_value``: sglang's own setting; ``as_sglang``/``changed``: the setting in
    words for the reports, ``changed`` with ``{value}``; ``maximum``: the largest value
    ``--engine-setting`` accepts (a bound the engine can take, checked where it is parsed)."""

    name: str
    env: str
    default: int
    sglang_value: int
    as_sglang: str
    changed: str
    maximum: int = 1_000_000

    def describe(self, value: int) -> str:
        """The setting ``value`` in words."""
        return self.as_sglang if value == self.sglang_value else self.changed.format(value=value)


@dataclass(frozen=True)
class Implementation:
    """One implementation (see the module docstring).

    ``name``; ``adapter``: ``"module:Class"`` of its harness.role.adapter.RoleAdapter;
    ``description``: one line; ``rank``: its column's place in reports (lower first);
    ``test_only``: hidden unless the self-test switch is on; ``sglang_range``: the sglang
    releases its adapter supports (None: any, it imports no sglang); ``preload``: modules
    the fork server imports once for its roles; ``prepare``: ``"module:function"`` the
    fork server calls before preloading (e.g. put an engine stand-in on ``sys.path``);
    ``own_fork_server``: ``"module:function"`` that loads what its roles would each load
    and what must not reach any other implementation's roles (NIXL's UCX plugin patches
    libc's ``mmap`` family when it loads): its cells then come from a fork server of their
    own, forked from the shared one, which calls it once (harness.drive.forkserver);
    ``probe``: ``"module:function"`` returning ``(engine, reason)`` with ``engine``
    ``real`` or ``standin`` (raising with the reason when unusable), run by doctor in a
    child process; ``engine_settings``; ``tools``: named ``"module:attribute"`` hooks
    (``simulator``, ``engine_bench``); ``role_env``: environment its roles (and its engine
    benchmark's children) need before the engine is imported, set unless already set
    (:meth:`apply_role_env`)."""

    name: str
    adapter: str
    description: str
    rank: int = 50
    test_only: bool = False
    sglang_range: SglangRange | None = None
    preload: tuple[str, ...] = ()
    prepare: str | None = None
    own_fork_server: str | None = None
    probe: str | None = None
    engine_settings: tuple[EngineSetting, ...] = ()
    tools: dict[str, str] = field(default_factory=dict)
    role_env: dict[str, str] = field(default_factory=dict)
    planted: dict[str, str] | None = None  # a mutant's id, requirement, bug and like (see mutants_of)

    @property
    def imports_sglang(self) -> bool:
        """Whether its roles import sglang (they then share the sglang fork server)."""
        return self.sglang_range is not None

    def unsupported_sglang(self, version: str | None) -> str | None:
        """Why this implementation cannot run against sglang ``version`` (None: it can).
        ``version`` None means sglang is not installed."""
        if self.sglang_range is None:
            return None
        if version is None:
            return f"{self.name} drives sglang's own classes, and sglang is not installed"
        if self.sglang_range.contains(version):
            return None
        return (f"sglang {version} is outside the releases the {self.name} adapter supports "
                f"({self.sglang_range}; {self.sglang_range.why})")

    def apply_role_env(self) -> None:
        """Set :attr:`role_env` in this process's environment, keeping what is already set."""
        for key, value in self.role_env.items():
            os.environ.setdefault(key, value)

    def hook(self, name: str) -> Any:
        """Import and return the object a ``"module:attribute"`` field or tool names:
        ``adapter``, ``prepare``, ``own_fork_server``, ``probe`` or a key of ``tools``.  KeyError
        when this implementation has none of that name."""
        fields = ("adapter", "prepare", "own_fork_server", "probe")
        spec = getattr(self, name, None) if name in fields else self.tools.get(name)
        if not spec:
            raise KeyError(f"{self.name} has no {name}")
        module, _, attribute = spec.partition(":")
        target = importlib.import_module(module)
        return getattr(target, attribute) if attribute else target


def _entry_points() -> list:
    return list(metadata.entry_points(group=ENTRY_POINT_GROUP))


@lru_cache(maxsize=None)
def registered() -> dict[str, Implementation]:
    """Every registered implementation by name, in report order (``rank``, then name).
    RegistryError names an entry point that does not load or is not an Implementation."""
    found: dict[str, Implementation] = {}
    where: dict[str, str] = {}
    for entry in _entry_points():
        try:
            impl = entry.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is named, not a traceback
            raise RegistryError(f"implementation entry point {entry.name} = {entry.value} does not load: "
                                f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(impl, Implementation) or impl.name != entry.name:
            raise RegistryError(f"implementation entry point {entry.name} = {entry.value} is not an "
                                f"Implementation named {entry.name!r}")
        if impl.name in found and where[impl.name] != entry.value:
            raise RegistryError(f"two implementations are registered as {impl.name!r}: {where[impl.name]} and "
                                f"{entry.value}")
        found[impl.name], where[impl.name] = impl, entry.value
    if mutants_listed():
        for impl in list(found.values()):
            for mutant in mutants_of(impl):
                if mutant.name in found:
                    raise RegistryError(f"two implementations declare the mutant {mutant.name!r}: "
                                        f"{found[mutant.name].planted['of']} and {impl.name}")
                found[mutant.name] = mutant
    if not found:
        raise RegistryError(f"no implementation is registered (entry point group {ENTRY_POINT_GROUP}): "
                            "run `make setup`, which installs pdconform and its entry points")
    return dict(sorted(found.items(), key=lambda kv: (kv[1].rank, kv[0])))


def mutants_listed() -> bool:
    """Whether the registry lists the planted-bug mutants (:data:`MUTANTS_ENV` is 1: a
    ``pdconform mutants`` run, its cells and roles)."""
    return os.environ.get(MUTANTS_ENV) == "1"


def list_mutants() -> None:
    """From now on, the registry in this process and every cell and role it starts lists the
    planted-bug mutants (:data:`MUTANTS_ENV` set, the cached registry dropped)."""
    os.environ[MUTANTS_ENV] = "1"
    registered.cache_clear()


def mutants_of(impl: Implementation) -> list[Implementation]:
    """``impl`` with each planted bug of its ``mutants`` tool (a sequence of objects with
    ``id``, ``requirement``, ``bug``, ``like``; e.g. backends.reference.mutants.MUTANTS), as
    test-only implementations ``mutant.<id>`` whose roles run with ``PDCONFORM_MUTANT=<id>``
    (:func:`load_role_adapter` sets it; the adapter applies it).  Empty when ``impl`` has
    none; RegistryError when its catalogue does not load."""
    if "mutants" not in impl.tools:
        return []
    try:
        catalogue = list(impl.hook("mutants"))
    except Exception as exc:  # noqa: BLE001 - a broken catalogue is named, not a traceback
        raise RegistryError(f"the mutants of {impl.name} ({impl.tools['mutants']}) do not load: "
                            f"{type(exc).__name__}: {exc}") from exc
    out = []
    for m in catalogue:
        out.append(replace(impl, name=f"{MUTANT_PREFIX}{m.id}", description=f"{impl.name} with a planted bug: {m.bug}",
                           rank=impl.rank + 1, test_only=True, tools={}, role_env=dict(impl.role_env),
                           planted={"id": m.id, "of": impl.name, "requirement": m.requirement, "bug": m.bug,
                                    "like": m.like, "across_hosts": getattr(m, "across_hosts", "")}))
    return out


def available(include_test_only: bool | None = None) -> dict[str, Implementation]:
    """Implementations a run may select; the self-test ones only with PDCONFORM_TEST_SCENARIOS=1, the
    planted-bug mutants only with :data:`MUTANTS_ENV` set."""
    if include_test_only is None:
        include_test_only = os.environ.get(TEST_SCENARIOS_ENV) == "1"
    mutants = mutants_listed()  # then a mutant may be named (repro, run)
    return {name: impl for name, impl in registered().items()
            if include_test_only or not impl.test_only or (mutants and impl.planted)}


def names() -> list[str]:
    """The names of the implementations a default run selects, in report order."""
    return [name for name, impl in registered().items() if not impl.test_only]


def implementation(name: str) -> Implementation:
    """Look up an implementation; KeyError names the known ones."""
    known = registered()
    try:
        return known[name]
    except KeyError:
        raise KeyError(f"unknown implementation {name!r} (known: {', '.join(names())})") from None


def engine_settings() -> dict[str, EngineSetting]:
    """Every registered implementation's engine settings, by name."""
    return {s.name: s for impl in registered().values() for s in impl.engine_settings}


def settings_env(values: dict[str, int]) -> dict[str, str]:
    """The role environment for engine-setting ``values`` (name -> value); KeyError for an unknown name."""
    known = engine_settings()
    return {known[name].env: str(value) for name, value in values.items()}


def load_role_adapter(name: str, *, role: str, recorder):
    """Import and build the role adapter for ``name`` (inside a role process); an
    :class:`OutOfRangeRole` when the sglang being driven (harness.target.version.sglang_version)
    is outside its declared range."""
    impl = implementation(name)
    reason = impl.unsupported_sglang(sglang_version())
    if reason is not None:
        return OutOfRangeRole(name, role, reason)
    impl.apply_role_env()
    # a mutant's own id, never one inherited from the caller's environment; none for any other
    if impl.planted:
        os.environ[MUTANT_ENV] = impl.planted["id"]
    else:
        os.environ.pop(MUTANT_ENV, None)
    return impl.hook("adapter")(role=role, recorder=recorder)


__all__ = ["ENTRY_POINT_GROUP", "MUTANTS_ENV", "MUTANT_ENV", "MUTANT_PREFIX", "EngineSetting", "Implementation",
           "OutOfRangeRole", "RegistryError", "available", "engine_settings", "implementation", "load_role_adapter",
           "list_mutants", "mutants_listed", "mutants_of", "names", "registered", "settings_env"]
