"""Which sglang the cells run against: the installed one, a source tree, or a released version.

- installed (default): the ``sglang`` package in pdconform's own environment.
- ``--sglang-src PATH``: a checkout (its ``python/`` folder is used), the ``python/``
  folder itself, or an unpacked wheel or sdist (a folder holding ``sglang/``).  Every cell
  process, and every role it starts, gets the folder first on ``PYTHONPATH`` and
  ``PDCONFORM_SGLANG_VERSION`` set to the tree's version (package metadata would name the
  installed release instead).  The version is read from the tree (:func:`tree_version`:
  version files, package metadata, ``pyproject.toml``, ``git describe``) or, when the tree
  says nothing, given with ``--sglang-version X``; results.json records where it came from
  (``SglangInfo.version_source``).
- ``--sglang VERSION``: a released version, set up once by ``scripts/setup.sh`` into
  the cached environment ``.venv-sglang-VERSION`` beside ``.venv``, with the same pins
  and shims (``requirements/sglang-VERSION.txt`` says which packages); its Python
  runs the cells.

Where the tree's bootstrap server wants a token (:func:`bootstrap_token_env`), every cell
and role of the run gets the same fresh one in that variable (:attr:`SglangTarget.env`).

:func:`resolve_target` raises :class:`TargetError` with a message meant for the user
(the CLI turns it into exit code 2).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import msgspec

from harness import ROOT
from harness.target.version import VERSION_ENV, installed_version, parse_version, release_of

SETUP_TIMEOUT_S = 1800.0
VENV_PROBE_TIMEOUT_S = 60.0


class SglangInfo(msgspec.Struct, kw_only=True):
    """Which sglang the cells imported.

    ``source``: ``installed`` (the package in pdconform's environment), ``src`` (a
    checkout's ``python/`` folder or an unpacked wheel given with ``--sglang-src``) or
    ``venv`` (a cached environment made for ``--sglang VERSION``).  ``path`` is the
    imported ``sglang`` package directory; ``commit`` the checkout's git commit (None
    when not a git checkout).  ``version_source``: where ``version`` was read, in words
    (``package metadata``, ``tree: sglang/_version.py``, ``tree: pyproject.toml``,
    ``git describe: v0.5.23-12-g0123abc``, ``option --sglang-version``; None in runs made
    before it was recorded).  ``expectations_for``: the release whose shipped expectations
    this version takes by default (harness.judge.expectations.shipped_path): the version
    itself, or for a dev, pre, post or local version the newest shipped release at or below
    it (``0.5.24.dev0`` -> ``0.5.23``); None when none is shipped for it.
    ``bootstrap_token_env``: the variable that carried a fresh bootstrap token to every role
    (:func:`bootstrap_token_env`; never the token itself); None when the tree takes none.
    """

    version: Optional[str]
    path: Optional[str]
    source: str = "installed"
    commit: Optional[str] = None
    version_source: Optional[str] = None
    expectations_for: Optional[str] = None
    bootstrap_token_env: Optional[str] = None

    @property
    def from_option(self) -> bool:
        """True when :attr:`version` was given with ``--sglang-version`` (a reproduce line must give it too)."""
        return (self.version_source or "").startswith("option")

    def expectations_note(self, expectations: str | None) -> str:
        """``expectations of sglang 0.5.23 (newest shipped release at or below 0.5.24.dev0)`` when
        ``expectations`` (the path of the file a run was judged against) is the file shipped for
        another release than :attr:`version` that this version takes by default; "" otherwise."""
        if not (self.expectations_for and expectations and self.expectations_for != self.version):
            return ""
        if Path(expectations).name != f"sglang-{self.expectations_for}.toml":
            return ""
        return (f"expectations of sglang {self.expectations_for} (newest shipped release at or below "
                f"{self.version})")


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
            return SglangInfo(version=version, path=str(candidate.parent.resolve()), version_source="package metadata")
    return SglangInfo(version=version, path=None, version_source="package metadata")


_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""", re.M)
GIT_TIMEOUT_S = 10.0


def _placeholder(version: str) -> bool:
    """A version a build writes when it knows none (setuptools-scm's and sglang's ``0.0.0.dev0``
    fallback): no information."""
    try:
        return release_of(version) == (0, 0, 0)
    except ValueError:
        return True


def _metadata_version(path: Path) -> str | None:
    """The ``Version:`` header of a METADATA or PKG-INFO file at ``path``; None without one."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if not line.strip():  # the headers end at the first blank line
            break
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip() or None
    return None


def _git(package_parent: Path, *args: str) -> str | None:
    """``git -C package_parent ARGS`` 's output, stripped; None when git fails or is missing."""
    try:
        proc = subprocess.run(["git", "-C", str(package_parent), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def _own_checkout(package_parent: Path) -> bool:
    """True when ``package_parent`` is the top of a git work tree, or the ``python/`` folder at the
    top of one (an sglang checkout): a tree unpacked inside some other repository must not take
    that repository's tags or commit."""
    top = _git(package_parent, "rev-parse", "--show-toplevel")
    if top is None:
        return False
    top_path = Path(top).resolve()
    return top_path == package_parent or (package_parent.name == "python" and top_path == package_parent.parent)


def _described_version(package_parent: Path) -> tuple[str, str] | None:
    """The version ``git describe`` gives the checkout at ``package_parent``, and how it was told:
    on a ``vX.Y.Z`` tag that release; N commits past it the next release's dev N with the commit
    as its local part (setuptools-scm's ``guess-next-dev``, what sglang's own build writes:
    ``v0.5.23`` + 12 commits -> ``0.5.24.dev12+g0123abc``); past a tag that is not a plain
    release, the tag with the distance and commit as its local part.  None without such a tag."""
    if not _own_checkout(package_parent):
        return None
    described = _git(package_parent, "describe", "--tags", "--long", "--match", "v[0-9]*")
    match = re.fullmatch(r"v(.+)-(\d+)-g([0-9a-f]+)", described or "")
    if not match or parse_version(match.group(1)) is None:
        return None
    tag, distance, commit = match.group(1), int(match.group(2)), match.group(3)
    how = f"git describe: {described}"
    if distance == 0:
        return tag, how
    parsed = parse_version(tag)
    if not (parsed.is_prerelease or parsed.is_postrelease or parsed.local):
        release = list(parsed.release) + [0] * (3 - len(parsed.release))
        release[-1] += 1
        return f"{'.'.join(map(str, release))}.dev{distance}+g{commit}", how
    if parsed.local:
        return f"{tag}.{distance}.g{commit}", how
    return f"{tag}+{distance}.g{commit}", how


def tree_version(package_parent: Path) -> tuple[str, str] | None:
    """The version of the sglang under ``package_parent`` (the folder holding ``sglang/``) and where
    it was read, without importing it; None when the tree says nothing.

    In order: ``sglang/_version.py`` (written by the build: wheels, built checkouts);
    ``sglang/version.py`` with a literal ``__version__`` (older releases); a
    ``sglang-*.dist-info/METADATA`` (an unpacked wheel); ``PKG-INFO`` or
    ``*.egg-info/PKG-INFO`` (an unpacked sdist, an editable install); ``pyproject.toml``'s
    ``[project] version`` when it is a literal (not ``dynamic``); ``git describe`` against
    the newest ``vX.Y.Z`` tag, when ``package_parent`` is its own git checkout
    (:func:`_described_version`).  A placeholder such as ``0.0.0.dev0`` counts as nothing.
    """
    found: list[tuple[str | None, str]] = []
    for name in ("_version.py", "version.py"):
        candidate = package_parent / "sglang" / name
        if candidate.is_file():
            match = _VERSION_RE.search(candidate.read_text(errors="replace"))
            found.append((match.group(1) if match else None, f"tree: sglang/{name}"))
    for meta in sorted(package_parent.glob("sglang-*.dist-info/METADATA")):
        found.append((_metadata_version(meta), f"tree: {meta.relative_to(package_parent)}"))
    for meta in [package_parent / "PKG-INFO", *sorted(package_parent.glob("*.egg-info/PKG-INFO"))]:
        if meta.is_file():
            found.append((_metadata_version(meta), f"tree: {meta.relative_to(package_parent)}"))
    pyproject = package_parent / "pyproject.toml"
    if pyproject.is_file():
        try:
            project = tomllib.loads(pyproject.read_text(errors="replace")).get("project", {})
        except tomllib.TOMLDecodeError:
            project = {}
        version = project.get("version") if isinstance(project, dict) else None
        found.append((version if isinstance(version, str) else None, "tree: pyproject.toml"))
    for version, where in found:
        if version and not _placeholder(version):
            return version, where
    described = _described_version(package_parent)
    return described if described and not _placeholder(described[0]) else None


def _git_commit(path: Path) -> str | None:
    """The commit checked out at ``path`` when it is its own checkout (:func:`_own_checkout`); else None."""
    return _git(path, "rev-parse", "HEAD") if _own_checkout(path) else None


BOOTSTRAP_TOKEN_ENV = "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN"


def bootstrap_token_env(package_dir: str | Path | None) -> str | None:
    """The environment variable through which the sglang at ``package_dir`` (the ``sglang``
    package folder) takes the bootstrap server's write token, or None when it takes none.

    Looks, without importing anything, for sglang PR #39416's shape: a module
    ``srt/disaggregation/common/bootstrap_auth.py``, or the name :data:`BOOTSTRAP_TOKEN_ENV`
    in ``srt/environ.py`` (where sglang declares its environment variables).  With that PR the
    bootstrap server answers ``PUT /route`` and ``POST /register_dp_rank`` with 401 unless they
    carry ``Authorization: Bearer <token>``, the token read from that variable (else
    ``--api-key``); a launched server sets it in its parent process so that every scheduler
    shares it, which pdconform's roles, started one by one, do not have.  sglang 0.5.23 has
    neither.  Unverified against a merged sglang: the names are those of the PR's open
    revision (its ``bootstrap_auth.py`` and tests), and may change before it lands.
    """
    if not package_dir:
        return None
    root = Path(package_dir)
    if (root / "srt" / "disaggregation" / "common" / "bootstrap_auth.py").is_file():
        return BOOTSTRAP_TOKEN_ENV
    try:
        return BOOTSTRAP_TOKEN_ENV if BOOTSTRAP_TOKEN_ENV in (root / "srt" / "environ.py").read_text(errors="replace") \
            else None
    except OSError:
        return None


def with_bootstrap_token(target: "SglangTarget") -> "SglangTarget":
    """``target`` with a fresh bootstrap token (32 random bytes, URL-safe) in its environment when
    its sglang takes one (:func:`bootstrap_token_env`): every cell and every role of the run
    read the same one, so a prefill's ``PUT /route`` is authorized by its own bootstrap
    server.  The variable's name goes into ``info.bootstrap_token_env``, the token nowhere
    but the cells' environment.  ``target`` unchanged when the tree takes no token."""
    name = bootstrap_token_env(target.info.path)
    if name is None:
        return target
    target.info.bootstrap_token_env = name
    return SglangTarget(python=target.python, info=target.info,
                        env={**target.env, name: secrets.token_urlsafe(32)})


def source_target(path: str | Path, version: str | None = None) -> SglangTarget:
    """A target for a checkout, its ``python/`` folder, or an unpacked wheel or sdist at ``path``.

    ``version`` (``--sglang-version``): the tree's version, for a tree that does not say it
    (:func:`tree_version`); given, it wins over what the tree says.  Raises TargetError when
    ``path`` holds no ``sglang`` package, ``version`` is not a PEP 440 version, or neither the
    tree nor ``version`` tells the version.
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
    read = tree_version(parent)
    if version is not None:
        version = version.strip()
        if parse_version(version) is None:
            raise TargetError(f"--sglang-version {version[:40]!r}: not a version (PEP 440, e.g. 0.5.23 or 0.5.24.dev0)")
        said = f" (the tree says {read[0]}: {read[1].removeprefix('tree: ')})" if read and read[0] != version else ""
        version, source = version, f"option --sglang-version{said}"
    elif read is None:
        raise TargetError(f"--sglang-src {path}: cannot tell the sglang version (no sglang/_version.py or version.py "
                          "with a literal __version__, no sglang-*.dist-info or PKG-INFO, no version in "
                          "pyproject.toml, no vX.Y.Z git tag); give it with --sglang-version X (e.g. 0.5.24.dev0)")
    else:
        version, source = read
    info = SglangInfo(version=version, path=str(parent / "sglang"), source="src", commit=_git_commit(parent),
                      version_source=source)
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
    return SglangInfo(version=version, path=path, source="venv", version_source="package metadata")


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


def resolve_target(src: str | Path | None = None, version: str | None = None, log=None,
                   tree_version: str | None = None) -> SglangTarget:
    """The target the options ask for: ``src`` (--sglang-src, its version ``tree_version`` when
    --sglang-version gives it), ``version`` (--sglang), else installed; with a fresh bootstrap
    token in its environment where its sglang takes one (:func:`with_bootstrap_token`).

    Raises TargetError when both ``src`` and ``version`` are given, ``tree_version`` without
    ``src``, or for the reasons of the functions above.
    """
    if src is not None and version is not None:
        raise TargetError("give either --sglang-src or --sglang, not both")
    if tree_version is not None and src is None:
        raise TargetError("--sglang-version names the version of an --sglang-src tree that does not say it; "
                          "the installed sglang and --sglang releases say their own")
    if src is not None:
        return with_bootstrap_token(source_target(src, tree_version))
    if version is not None:
        return with_bootstrap_token(release_target(version, log=log))
    return with_bootstrap_token(installed_target())
