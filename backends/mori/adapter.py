"""Mori: sglang's ``MoriKVManager`` on amd-mori, or on pdconform's stand-in engine.

Mirrors ``sglang/srt/disaggregation/mori/conn.py``.  amd-mori 1.2.4 needs ROCm
and ships only cp310/cp312 wheels; when ``import mori.io`` fails, the stand-in
package in ``backends/mori/standin`` (same API, real byte movement over TCP) is
put on ``sys.path`` and results say ``engine: standin``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from backends.sglang_common import SglangCommonRole

STANDIN_PATH = Path(__file__).resolve().parent / "standin"


def real_mori_error() -> str | None:
    """None when the real ``mori.io`` imports; otherwise why it does not."""
    if importlib.util.find_spec("mori") is None:
        return "amd-mori is not installed (ROCm-only wheels for cp310/cp312)"
    try:
        importlib.import_module("mori.io")
    except Exception as exc:  # ImportError or a missing ROCm library
        for name in [m for m in sys.modules if m == "mori" or m.startswith("mori.")]:
            del sys.modules[name]
        return f"import mori.io failed: {exc}"
    return None


class MoriRole(SglangCommonRole):
    impl = "mori"
    backend = "mori"
    conn_module = "sglang.srt.disaggregation.mori.conn"
    manager_class = "MoriKVManager"
    sender_class = "MoriKVSender"
    receiver_class = "MoriKVReceiver"
    bootstrap_class = "MoriKVBootstrapServer"

    def prepare_imports(self) -> None:
        self.real_error = real_mori_error()
        if self.real_error is not None:
            sys.path.insert(0, str(STANDIN_PATH))

    def engine(self) -> str:
        import mori

        return "standin" if getattr(mori, "__pdconform_standin__", False) else "real"
