"""Mori: sglang's ``MoriKVManager`` on amd-mori, or on pdconform's stand-in engine when mori cannot import.

Registered as the ``mori`` implementation (pyproject.toml entry point); the adapter is
backends/mori/adapter.py, the stand-in backends/mori/standin/.
"""

from backends.sglang_releases import COMMON_PRELOAD, SGLANG_COMMON_RANGE
from harness.implementations import Implementation

IMPLEMENTATION = Implementation(
    "mori",
    "backends.mori.adapter:MoriRole",
    "sglang MoriKVManager on amd-mori, or on the pdconform stand-in engine when mori cannot import",
    rank=30,
    sglang_range=SGLANG_COMMON_RANGE,
    # Mori's conn module imports whichever mori the adapter would pick: prepare decides first
    preload=(*COMMON_PRELOAD, "backends.mori.adapter", "sglang.srt.disaggregation.mori.conn"),
    prepare="backends.mori.adapter:use_standin_if_needed",
    probe="backends.mori:probe",
)


def probe() -> tuple[str, str]:
    """``real`` when amd-mori imports, else ``standin`` when the stand-in does; RuntimeError when neither."""
    import sys

    from backends.mori.adapter import STANDIN_PATH, real_mori_error

    why = real_mori_error()
    if why is None:
        return "real", "amd-mori imports"
    sys.path.insert(0, str(STANDIN_PATH))
    try:
        import mori
        import mori.cpp  # noqa: F401
        import mori.io  # noqa: F401

        assert getattr(mori, "__pdconform_standin__", False), "the mori that imported is not the stand-in"
    except Exception as exc:
        raise RuntimeError(f"{why}; stand-in failed: {type(exc).__name__}: {exc}") from exc
    return "standin", f"real mori unusable: {why}; using the pdconform stand-in"
