"""The implementations pdconform knows, declared as data.

Each entry names the role-adapter class (imported only inside a role process,
since importing it imports sglang and an engine), says in one line what runs,
and declares the sglang releases its adapter supports (:class:`SglangRange`;
None: any, for implementations that never import sglang).  A role of an
implementation whose range excludes the installed sglang gets an adapter that
answers every step with :class:`harness.role.adapter.Unsupported` naming the release
and the range, so its cells are UNSUPPORTED instead of crashing on a changed
internal signature.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from harness.role.adapter import RoleAdapter, Unsupported
from harness.spec.scenario import TEST_SCENARIOS_ENV

Release = tuple[int, int, int]


@dataclass(frozen=True)
class SglangRange:
    """The sglang releases an adapter supports: ``spans`` of ``(first, last)``
    releases, both ends included, ``last`` None for no upper end; a version's
    post/rc/local parts count as its release (``role_context.release_of``).
    ``why`` says in one line where the ends come from."""

    spans: tuple[tuple[Release, Release | None], ...]
    why: str = ""

    def contains(self, version: str) -> bool:
        """True when ``version`` (e.g. ``"0.5.17"``) falls in one of the spans;
        False for a version string with no release number."""
        from harness.target.role_context import release_of

        try:
            release = release_of(version)
        except ValueError:
            return False
        return any(first <= release and (last is None or release <= last) for first, last in self.spans)

    def __str__(self) -> str:
        def dotted(release: Release) -> str:
            return ".".join(map(str, release))

        return ", ".join(f">= {dotted(first)}" if last is None else
                         (dotted(first) if first == last else f"{dotted(first)} - {dotted(last)}")
                         for first, last in self.spans)


# Mooncake, NIXL and Mori drive the same Common classes through backends/sglang_common.py.
SGLANG_COMMON_RANGE = SglangRange(
    spans=(((0, 5, 17), (0, 5, 18)), ((0, 5, 22), None)),
    why="0.5.17 - 0.5.18: Common protocol before AbortNotification (matrix run on 0.5.17, three scenarios on 0.5.18); "
        ">= 0.5.22: AbortNotification, handle_abort_ack_message, SpawnRanks (run on 0.5.23); "
        "0.5.19 - 0.5.21 have neither shape",
)


@dataclass(frozen=True)
class Implementation:
    """One implementation: ``name``; ``adapter``, the ``"module:Class"`` of its
    :class:`harness.role.adapter.RoleAdapter`; a one-line ``description``; ``test_only``
    (hidden unless the self-test switch is on); ``sglang_range``, the sglang
    releases its adapter supports (None: any, it does not use sglang)."""

    name: str
    adapter: str  # "module:Class" of a harness.role.adapter.RoleAdapter subclass
    description: str
    test_only: bool = False
    sglang_range: SglangRange | None = None

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
            sglang_range=SGLANG_COMMON_RANGE,
        ),
        Implementation(
            "nixl",
            "backends.nixl.adapter:NixlRole",
            "sglang NixlKVManager on a real NIXL agent (UCX over TCP on lo, DRAM)",
            sglang_range=SGLANG_COMMON_RANGE,
        ),
        Implementation(
            "mori",
            "backends.mori.adapter:MoriRole",
            "sglang MoriKVManager on amd-mori, or on the pdconform stand-in engine when mori cannot import",
            sglang_range=SGLANG_COMMON_RANGE,
        ),
    )
}

# The harness's own test double: hidden unless the self-test switch is on.
SELFTEST = Implementation("selftest", "backends.selftest.adapter:SelftestRole",
                          "in-memory role for the harness's own tests (no sglang)", test_only=True)
# The same test double declaring a range no sglang release is in: its cells take the
# out-of-range path (OutOfRangeRole) whatever sglang is installed.
SELFTEST_OUT_OF_RANGE = Implementation(
    "selftest-out-of-range", "backends.selftest.adapter:SelftestRole",
    "the self-test role behind a declared sglang range that excludes every release (harness self-test)",
    test_only=True, sglang_range=SglangRange(spans=(((0, 0, 0), (0, 0, 0)),), why="no real release (self-test)"),
)
TEST_ONLY = (SELFTEST, SELFTEST_OUT_OF_RANGE)


def available(include_test_only: bool | None = None) -> dict[str, Implementation]:
    """Implementations a run may select; the self-test ones only with PDCONFORM_TEST_SCENARIOS=1."""
    if include_test_only is None:
        include_test_only = os.environ.get(TEST_SCENARIOS_ENV) == "1"
    return {**IMPLEMENTATIONS, **({impl.name: impl for impl in TEST_ONLY} if include_test_only else {})}


def implementation(name: str) -> Implementation:
    """Look up an implementation; KeyError names the known ones."""
    known = available(include_test_only=True)
    try:
        return known[name]
    except KeyError:
        raise KeyError(f"unknown implementation {name!r} (known: {', '.join(IMPLEMENTATIONS)})") from None


class OutOfRangeRole(RoleAdapter):
    """Stands in a role process for an adapter whose declared sglang range excludes
    the installed release: it never imports that adapter (its imports may already
    fail there), and every step raises :class:`Unsupported` with ``reason``."""

    def __init__(self, impl: str, role: str, reason: str):
        self.impl = impl
        self.role = role
        self.reason = reason

    def _refuse(self, *args, **kwargs):
        raise Unsupported(self.reason)

    engine = start_prefill = start_decode = open_sender = init_sender = send_chunk = _refuse
    open_receiver = request_kv = verify = poll = failure_reason = clear = abort = _refuse
    arm_point = set_engine_faults = abort_frames = plan_layouts = unsupported_layout = _refuse

    def teardown(self) -> None:
        return None

    def observe(self) -> dict:
        return {"role": self.role, "loops": {}, "log_records": [], "dead_threads": [], "rooms": {},
                "remembered": {}}


def installed_sglang() -> str | None:
    """The installed sglang's version (package metadata, no import); None when absent."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def load_role_adapter(name: str, *, role: str, recorder):
    """Import and build the role adapter for ``name`` (inside a role process); an
    :class:`OutOfRangeRole` when the installed sglang is outside its declared range."""
    impl = implementation(name)
    reason = impl.unsupported_sglang(installed_sglang())
    if reason is not None:
        return OutOfRangeRole(name, role, reason)
    module_name, _, class_name = impl.adapter.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(role=role, recorder=recorder)
