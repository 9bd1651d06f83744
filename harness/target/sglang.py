"""Which sglang the cells run against: the installed one, a source tree, or a released version.

- installed (default): the ``sglang`` package in pdconform's own environment.
- ``--sglang-src PATH``: a checkout (its ``python/`` folder is used), the ``python/``
  folder itself, or an unpacked wheel (a folder holding ``sglang/`` and
  ``sglang-*.dist-info/``).  Every cell process, and every role it starts, gets the
  folder first on ``PYTHONPATH`` and ``PDCONFORM_SGLANG_VERSION`` set to the tree's
  version (package metadata would name the installed release instead).
- ``--sglang VERSION``: a released version, set up once by ``scripts/setup.sh`` into
  the cached environment ``.venv-sglang-VERSION`` beside ``.venv``, with the same pins
  and shims (``requirements/sglang-VERSION.txt`` says which packages); its Python
  runs the cells.

:func:`resolve_target` raises :class:`TargetError` with a message meant for the user
(the CLI turns it into exit code 2).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import msgspec

from harness import ROOT
from harness.target.version import VERSION_ENV, installed_version

SETUP_TIMEOUT_S = 1800.0
VENV_PROBE_TIMEOUT_S = 60.0


class SglangInfo(msgspec.Struct, kw_only=True):
    """Which sglang the cells imported.

    ``source``: ``installed`` (the package in pdconform's environment), ``src`` (a
    checkout's ``python/`` folder or an unpacked wheel given with ``--sglang-src``) or
    ``venv`` (a cached environment made for ``--sglang VERSION``).  ``path`` is the
    imported ``sglang`` package directory; ``commit`` the checkout's git commit (None
    when not a git checkout).
    """

    version: Optional[str]
    path: Optional[str]
    source: str = "installed"
    commit: Optional[str] = None


class TargetError(ValueError):
    """The requested sglang cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class SglangTarget:
    """How to start a cell process against one sglang.

    ``python``: the interpreter that runs ``python -m harness.drive.cell``; ``env``: variables
    added to the cell's environment (inherited by its roles); ``info``: what goes into
    results.json.
    """

    python: str
    info: SglangInfo
    env: dict[str, str] = field(default_factory=dict)

    def cell_env(self) -> dict[str, str]:
        """``os.environ`` plus this target's variables (PYTHONPATH prepended, not replaced)."""
        env = dict(os.environ)
        env.pop(VERSION_ENV, None)  # only a source-tree target says which version its tree is
        for key, value in self.env.items():
            if key == "PYTHONPATH" and env.get("PYTHONPATH"):
                value = value + os.pathsep + env["PYTHONPATH"]
            env[key] = value
        return env


def installed_info() -> SglangInfo:
    """The sglang installed in this Python environment (version, package directory), without importing it."""
    version = installed_version()
    if version is None:
        return SglangInfo(version=None, path=None)
    for entry in sys.path:
        candidate = Path(entry or ".") / "sglang" / "__init__.py"
        if candidate.is_file():
            return SglangInfo(version=version, path=str(candidate.parent.resolve()))
    return SglangInfo(version=version, path=None)


_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""", re.M)


def _tree_version(package_parent: Path) -> str | None:
    """Version of the sglang under ``package_parent``, without importing it.

    In order: ``sglang/_version.py`` (written by the build: wheels, built checkouts),
    ``sglang/version.py`` with a literal ``__version__`` (older releases), a
    ``sglang-*.dist-info/METADATA``, the checkout's newest ``vX.Y.Z`` git tag.
    """
    for name in ("_version.py", "version.py"):
        candidate = package_parent / "sglang" / name
        if candidate.is_file():
            match = _VERSION_RE.search(candidate.read_text(errors="replace"))
            if match:
                return match.group(1)
    for dist_info in sorted(package_parent.glob("sglang-*.dist-info")):
        meta = dist_info / "METADATA"
        if meta.is_file():
            for line in meta.read_text(errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    try:
        proc = subprocess.run(["git", "-C", str(package_parent), "describe", "--tags", "--abbrev=0",
                               "--match", "v[0-9]*"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    tag = proc.stdout.strip()
    return tag[1:] if proc.returncode == 0 and tag else None


def _git_commit(path: Path) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def source_target(path: str | Path) -> SglangTarget:
    """A target for a checkout, its ``python/`` folder, or an unpacked wheel at ``path``.

    Raises TargetError when ``path`` holds no ``sglang`` package or its version cannot
    be read (``sglang/version.py`` or a ``sglang-*.dist-info``).
    """
    try:
        path = Path(path).expanduser().resolve()
        is_dir = path.is_dir()
    except (OSError, RuntimeError) as exc:  # symlink loop, unknown ~user, name too long
        raise TargetError(f"--sglang-src {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    if not is_dir:
        raise TargetError(f"--sglang-src {path}: not a directory")
    for parent in (path / "python", path):
        if (parent / "sglang" / "__init__.py").is_file():
            break
    else:
        raise TargetError(f"--sglang-src {path}: no sglang package found (looked for python/sglang/ and sglang/; "
                          "give an sglang checkout, its python/ folder or an unpacked wheel)")
    version = _tree_version(parent)
    if version is None:
        raise TargetError(f"--sglang-src {path}: cannot tell the sglang version (no sglang/_version.py or "
                          "version.py with a literal __version__, no sglang-*.dist-info, no vX.Y.Z git tag)")
    info = SglangInfo(version=version, path=str(parent / "sglang"), source="src", commit=_git_commit(parent))
    return SglangTarget(python=sys.executable, info=info, env={"PYTHONPATH": str(parent), VERSION_ENV: version})


def venv_dir(version: str) -> Path:
    """The cached environment for a released sglang ``version`` (beside ``.venv``)."""
    return ROOT / f".venv-sglang-{version}"


def available_versions() -> list[str]:
    """Released sglang versions with a pinned package set (``requirements/sglang-*.txt``)."""
    return sorted(p.stem.removeprefix("sglang-") for p in (ROOT / "requirements").glob("sglang-*.txt"))


def _venv_info(python: Path) -> SglangInfo:
    code = ("import importlib.metadata as m, importlib.util as u, json, os\n"
            "s = u.find_spec('sglang')\n"
            "print(json.dumps([m.version('sglang'), os.path.dirname(s.origin) if s and s.origin else None]))")
    try:
        proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=VENV_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TargetError(f"cannot query sglang in {python}: {exc}") from exc
    if proc.returncode != 0:
        raise TargetError(f"sglang is not importable metadata-wise in {python}: {proc.stderr.strip()[-300:]}")
    import json

    version, path = json.loads(proc.stdout.strip().splitlines()[-1])
    return SglangInfo(version=version, path=path, source="venv")


def release_target(version: str, setup: bool = True, log=None) -> SglangTarget:
    """A target for a released sglang ``version``, setting up its cached environment if needed.

    When ``version`` is the one installed here, the installed one is used.  ``setup``:
    run ``scripts/setup.sh`` (a no-op when the environment is up to date; minutes the
    first time), its output going to ``log`` (a file object; default stderr).
    Raises TargetError for a version with no pinned package set or a failed setup.
    """
    version = version.strip()
    here = installed_info()
    if here.version == version:
        return SglangTarget(python=sys.executable, info=here)
    if version not in available_versions():
        raise TargetError(f"--sglang {version}: no pinned package set requirements/sglang-{version}.txt "
                          f"(available: {', '.join(available_versions())}); for another release or a branch use "
                          "--sglang-src with an unpacked wheel or a checkout")
    venv = venv_dir(version)
    if setup:
        env = dict(os.environ, SGLANG_VERSION=version, VENV=str(venv))
        try:
            proc = subprocess.run([str(ROOT / "scripts" / "setup.sh")], cwd=str(ROOT), env=env,
                                  stdout=log or sys.stderr, stderr=subprocess.STDOUT, timeout=SETUP_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise TargetError(f"--sglang {version}: setting up {venv} took over {SETUP_TIMEOUT_S:.0f} s") from exc
        if proc.returncode != 0:
            raise TargetError(f"--sglang {version}: setting up {venv} failed (scripts/setup.sh exit "
                              f"{proc.returncode}; its output is above)")
    python = venv / "bin" / "python"
    if not python.exists():
        raise TargetError(f"--sglang {version}: {venv} has no bin/python (run "
                          f"`make setup SGLANG_VERSION={version} VENV={venv.name}`)")
    return SglangTarget(python=str(python), info=_venv_info(python))


def installed_target() -> SglangTarget:
    """The sglang of pdconform's own environment; TargetError when none is installed."""
    info = installed_info()
    if info.version is None:
        raise TargetError("sglang is not installed in this Python environment (run `make setup`)")
    return SglangTarget(python=sys.executable, info=info)


def resolve_target(src: str | Path | None = None, version: str | None = None, log=None) -> SglangTarget:
    """The target the options ask for: ``src`` (--sglang-src), ``version`` (--sglang), else installed.

    Raises TargetError when both are given, or for the reasons of the functions above.
    """
    if src is not None and version is not None:
        raise TargetError("give either --sglang-src or --sglang, not both")
    if src is not None:
        return source_target(src)
    if version is not None:
        return release_target(version, log=log)
    return installed_target()
