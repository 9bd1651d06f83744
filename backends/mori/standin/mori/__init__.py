"""pdconform stand-in for the ``mori`` package of amd-mori 1.2.4 (IO engine only).

This is **not** AMD's mori.  It is a pure-Python stand-in that pdconform puts on
``sys.path`` on machines where the real ``mori`` cannot be imported (no ROCm).
It mirrors, name for name, the part of the amd-mori 1.2.4 API that sglang's
``sglang/srt/disaggregation/mori/conn.py`` uses -- ``mori.cpp`` (the pybind11
module ``libmori_pybinds``) and ``mori.io`` (the Python wrapper
``mori/io/engine.py``) -- and it moves bytes for real: every engine runs a small
TCP data plane, so transfers work inside one process and between processes.

Only the ``cpp`` and ``io`` submodules exist; the real package's other lazily
imported submodules (``ops``, ``shmem``, ``ccl``, ...) are absent and raise
``AttributeError`` / ``ImportError``.

Markers: ``__pdconform_standin__ = True`` and ``__version__ =
"1.2.4+pdconform-standin"`` let callers tell the stand-in from the real wheel.
"""

import importlib

from ._version import __version__

__pdconform_standin__ = True

# Mirrors mori/__init__.py: submodules are imported on first attribute access.
_LAZY_SUBMODULES = {"cpp", "io"}


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(
        f"module {__name__!r} has no attribute {name!r} "
        "(pdconform stand-in: only mori.cpp and mori.io are provided)"
    )


def __dir__():
    return list(globals().keys()) + sorted(_LAZY_SUBMODULES)
