"""The implementations pdconform knows, declared as data.

Each entry names the role-adapter class (imported only inside a role process,
since importing it imports sglang and an engine) and says in one line what runs.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from harness.scenario import TEST_SCENARIOS_ENV


@dataclass(frozen=True)
class Implementation:
    name: str
    adapter: str  # "module:Class" of a harness.adapter.RoleAdapter subclass
    description: str
    test_only: bool = False


IMPLEMENTATIONS: dict[str, Implementation] = {
    impl.name: impl
    for impl in (
        Implementation(
            "reference",
            "backends.reference.adapter:ReferenceRole",
            "pdconform's reference cores (docs/protocol.md) on ZMQ, HTTP and torch pools",
        ),
        Implementation(
            "mooncake",
            "backends.mooncake.adapter:MooncakeRole",
            "sglang MooncakeKVManager on the real Mooncake TransferEngine (TCP, loopback)",
        ),
        Implementation(
            "nixl",
            "backends.nixl.adapter:NixlRole",
            "sglang NixlKVManager on a real NIXL agent (UCX over TCP on lo, DRAM)",
        ),
        Implementation(
            "mori",
            "backends.mori.adapter:MoriRole",
            "sglang MoriKVManager on amd-mori, or on the pdconform stand-in engine when mori cannot import",
        ),
    )
}

# The harness's own test double: hidden unless the self-test switch is on.
SELFTEST = Implementation("selftest", "backends.selftest.adapter:SelftestRole",
                          "in-memory role for the harness's own tests (no sglang)", test_only=True)


def available(include_test_only: bool | None = None) -> dict[str, Implementation]:
    """Implementations a run may select; the self-test one only with PDCONFORM_TEST_SCENARIOS=1."""
    if include_test_only is None:
        include_test_only = os.environ.get(TEST_SCENARIOS_ENV) == "1"
    return {**IMPLEMENTATIONS, **({SELFTEST.name: SELFTEST} if include_test_only else {})}


def implementation(name: str) -> Implementation:
    """Look up an implementation; KeyError names the known ones."""
    known = available(include_test_only=True)
    try:
        return known[name]
    except KeyError:
        raise KeyError(f"unknown implementation {name!r} (known: {', '.join(IMPLEMENTATIONS)})") from None


def load_role_adapter(name: str, *, role: str, recorder):
    """Import and build the role adapter for ``name`` (inside a role process)."""
    module_name, _, class_name = implementation(name).adapter.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(role=role, recorder=recorder)
