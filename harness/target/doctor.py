"""``pdconform doctor``: what this machine can run, and why not.

Each engine is probed in a child process with a timeout, so a crashing or
hanging native library cannot take the CLI down.  Returns plain data; the CLI
prints it.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from harness import ROOT
from harness.target.sglang import installed_info

PROBE_TIMEOUT_S = 60.0

_MOONCAKE_PROBE = "from mooncake.engine import TransferEngine; TransferEngine()"
_NIXL_PROBE = """
import os
os.environ.setdefault('UCX_TLS', 'tcp'); os.environ.setdefault('UCX_NET_DEVICES', 'lo')
from nixl._api import nixl_agent, nixl_agent_config
agent = nixl_agent('pdconform-doctor', nixl_agent_config(backends=['UCX']))
"""
_MORI_REAL_PROBE = "from backends.mori.adapter import real_mori_error as e; r = e()\nif r: raise SystemExit(r)"
_MORI_STANDIN_PROBE = """
import sys
from backends.mori.adapter import STANDIN_PATH
sys.path.insert(0, str(STANDIN_PATH))
import mori, mori.io, mori.cpp
assert getattr(mori, '__pdconform_standin__', False)
"""


@dataclass
class EngineStatus:
    impl: str
    engine: str  # real | standin | unusable
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


PROBE_OK = "PDCONFORM-PROBE-OK"


def _probe(code: str) -> tuple[bool, str]:
    """Run ``code`` in a child; success means it reached the end.  The child leaves
    with ``os._exit`` because NIXL 1.5.1's agent segfaults at interpreter exit."""
    code += f"\nimport os; print({PROBE_OK!r}, flush=True); os._exit(0)\n"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return False, f"probe did not finish within {PROBE_TIMEOUT_S:.0f} s"
    if PROBE_OK in proc.stdout:
        return True, ""
    lines = [ln for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip()]
    return False, lines[-1] if lines else f"probe exited with code {proc.returncode}"


def _libibverbs_present() -> bool:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "libibverbs.so.1 " in out


def engine_statuses() -> list[EngineStatus]:
    """Probe Mooncake, NIXL and Mori; each result says real, standin or unusable, and why."""
    statuses = []
    ok, why = _probe(_MOONCAKE_PROBE)
    if ok:
        statuses.append(EngineStatus("mooncake", "real", "mooncake.engine.TransferEngine loads (TCP protocol)"))
    else:
        hint = "" if _libibverbs_present() else " (libibverbs.so.1 missing: install the Debian package libibverbs1)"
        statuses.append(EngineStatus("mooncake", "unusable", why + hint))
    ok, why = _probe(_NIXL_PROBE)
    statuses.append(EngineStatus("nixl", "real", "NIXL agent with the UCX backend starts (UCX_TLS=tcp, lo)")
                    if ok else EngineStatus("nixl", "unusable", why))
    ok, why = _probe(_MORI_REAL_PROBE)
    if ok:
        statuses.append(EngineStatus("mori", "real", "amd-mori imports"))
    else:
        standin_ok, standin_why = _probe(_MORI_STANDIN_PROBE)
        statuses.append(EngineStatus("mori", "standin", f"real mori unusable: {why}; using the pdconform stand-in")
                        if standin_ok else EngineStatus("mori", "unusable", f"{why}; stand-in failed: {standin_why}"))
    return statuses


def diagnose() -> dict:
    """Everything doctor reports, as JSON-ready data."""
    info = installed_info()
    return {
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "sglang": {"version": info.version, "path": info.path},
        "libibverbs": _libibverbs_present(),
        "engines": [s.to_dict() for s in engine_statuses()],
    }
