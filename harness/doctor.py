"""``pdconform doctor``: what this machine can run, and why not.

Each implementation's engine is probed in a child process with a timeout (``python -m
harness.doctor --impl NAME --probe MODULE:FUNCTION`` calls the implementation's
``probe`` hook, harness.implementations), so a crashing or hanging native library cannot take the CLI
down.  Returns plain data; the CLI prints it.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass

from harness import ROOT
from harness.target.sglang import installed_info

PROBE_TIMEOUT_S = 60.0
PROBE_MARK = "PDCONFORM-PROBE:"


@dataclass
class EngineStatus:
    """One implementation's engine here: ``engine`` real | standin | reference | unusable, and why."""

    impl: str
    engine: str
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def probe_in_child(impl: str, probe: str) -> EngineStatus:
    """Run ``impl``'s ``probe`` (``"module:function"``) in a child process (bounded by
    PROBE_TIMEOUT_S seconds).  The child leaves with ``os._exit`` because NIXL 1.5.1's agent
    segfaults at interpreter exit."""
    try:
        proc = subprocess.run([sys.executable, "-m", "harness.doctor", "--impl", impl, "--probe", probe],
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return EngineStatus(impl, "unusable", f"probe did not finish within {PROBE_TIMEOUT_S:.0f} s")
    for line in proc.stdout.splitlines():
        if line.startswith(PROBE_MARK):
            return EngineStatus(**json.loads(line[len(PROBE_MARK):]))
    lines = [ln for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip()]
    return EngineStatus(impl, "unusable", lines[-1] if lines else f"probe exited with code {proc.returncode}")


def _probe_here(impl_name: str, probe: str) -> None:
    """In the probe child: print the EngineStatus ``probe`` finds as one marked JSON line, then ``os._exit``."""
    import importlib
    import os

    try:
        module, _, function = probe.partition(":")
        engine, reason = getattr(importlib.import_module(module), function)()
        status = EngineStatus(impl_name, engine, reason)
    except Exception as exc:  # noqa: BLE001 - the reason is the report
        status = EngineStatus(impl_name, "unusable", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    print(PROBE_MARK + json.dumps(status.to_dict()), flush=True)
    os._exit(0)


def _libibverbs_present() -> bool:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "libibverbs.so.1 " in out


def diagnose(impls: list, target=None) -> dict:
    """Everything doctor reports, as JSON-ready data: Python; the sglang of ``target``
    (harness.target.sglang.SglangTarget, e.g. an ``--sglang-src`` tree; None: the installed one):
    ``version``, ``version_source`` (where it was read), ``path``, ``source``, ``commit``,
    ``expectations`` (which shipped expectations it takes by default, in words; "" when none),
    ``bootstrap_token`` (the variable a fresh bootstrap token goes into, None when it takes
    none); libibverbs; whether cells get a private network (harness.drive.contain); and each of
    ``impls`` (harness.implementations.Implementation) that has a probe: its engine here, its
    declared sglang range, whether that sglang is in it (``in_range``) and its engine settings."""
    from harness.target.sglang import bootstrap_token_env

    info = target.info if target is not None else installed_info()
    engines = []
    for impl in impls:
        if not impl.probe:
            continue
        status = probe_in_child(impl.name, impl.probe).to_dict()
        status["sglang_range"] = str(impl.sglang_range) if impl.sglang_range else "any (imports no sglang)"
        status["in_range"] = impl.unsupported_sglang(info.version) is None
        status["settings"] = {s.name: s.default for s in impl.engine_settings}
        engines.append(status)
    from harness.drive.contain import isolation_available

    why_not = isolation_available()
    return {
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "sglang": {"version": info.version, "path": info.path, "source": info.source, "commit": info.commit,
                   "version_source": info.version_source,
                   "expectations": _expectations_words(info),
                   "bootstrap_token": info.bootstrap_token_env or bootstrap_token_env(info.path)},
        "libibverbs": _libibverbs_present(),
        "network": {"isolated": why_not is None,
                    "detail": "each cell gets a private loopback-only network namespace (not with run --bind ADDR)"
                    if why_not is None
                    else why_not},
        "engines": engines,
    }


def _expectations_words(info) -> str:
    """Which shipped expectations ``info``'s version takes by default (harness.judge.expectations.shipped_path),
    in words; "" when none is shipped for it."""
    from harness.judge.expectations import shipped_path

    shipped = shipped_path(info.version)
    if shipped is None:
        return ""
    release = shipped.stem.removeprefix("sglang-")
    if release == info.version:
        return f"expectations/{shipped.name}"
    return f"expectations of sglang {release} (newest shipped release at or below {info.version})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.doctor")
    parser.add_argument("--impl", required=True, help="the implementation whose engine is probed")
    parser.add_argument("--probe", required=True, help="its probe hook, module:function")
    args = parser.parse_args(argv)
    _probe_here(args.impl, args.probe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
