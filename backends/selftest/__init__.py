"""The harness's own test double (not a backend): an in-memory role, hidden unless PDCONFORM_TEST_SCENARIOS=1.

Two registry entries: ``selftest``, and ``selftest-out-of-range``, the same role behind
a declared sglang range no release is in (its cells take the out-of-range path).
"""

from harness.implementations import Implementation
from harness.target.version import SglangRange

IMPLEMENTATION = Implementation("selftest", "backends.selftest.adapter:SelftestRole",
                                "in-memory role for the harness's own tests (no sglang)", rank=90, test_only=True)

OUT_OF_RANGE = Implementation(
    "selftest-out-of-range", "backends.selftest.adapter:SelftestRole",
    "the self-test role behind a declared sglang range that excludes every release (harness self-test)",
    rank=91, test_only=True, sglang_range=SglangRange(spans=(((0, 0, 0), (0, 0, 0)),), why="no real release (self-test)"),
)
