"""Which sglang release a process drives, read in one place, and ranges of releases.

Inside any pdconform process, :func:`sglang_version` is the one reader: the declared-range
gate (harness.implementations), the role context (harness.target.role_context) and the
target the reports name (harness.target.sglang) all agree.  A source tree's version is read
from the tree once, when its target is resolved (harness.target.sglang.source_target), and
handed to every cell and role as :data:`VERSION_ENV`.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from importlib import metadata

#: set by a source-tree target (--sglang-src) in every cell and role: the tree's version,
#: which package metadata would not tell (it names the installed release)
VERSION_ENV = "PDCONFORM_SGLANG_VERSION"

Release = tuple[int, int, int]


@functools.lru_cache(maxsize=1)
def installed_version() -> str | None:
    """The installed sglang package's version (its metadata, no import); None when it is not installed.
    Read once per process (9 ms a read; a role asked three times): what is installed does not change
    under a running process's feet, and a fork server's children inherit the answer."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def sglang_version() -> str | None:
    """The version of the sglang this process imports, without importing it:
    :data:`VERSION_ENV` when a source-tree target set it, else the installed package's
    metadata; None when neither says (sglang is not installed)."""
    return os.environ.get(VERSION_ENV) or installed_version()


def release_of(version: str) -> Release:
    """The release a version string belongs to, as ``(major, minor, patch)``: the
    leading digits of its first three dot-separated pieces, so ``"0.5.18.post1"``,
    ``"0.5.18rc2"`` and ``"0.5.18+cpu"`` are all ``(0, 5, 18)``; missing pieces are 0.
    Raises ValueError when the first piece has no leading digit."""
    numbers = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            if not numbers:
                raise ValueError(f"not a release version: {version!r}")
            break
        numbers.append(int(digits))
    return tuple(numbers + [0] * (3 - len(numbers)))  # type: ignore[return-value]


@dataclass(frozen=True)
class SglangRange:
    """sglang releases: ``spans`` of ``(first, last)`` releases, both ends included,
    ``last`` None for no upper end; a version's post/rc/local parts count as its release
    (:func:`release_of`).  ``why`` says in one line where the ends come from."""

    spans: tuple[tuple[Release, Release | None], ...]
    why: str = ""

    def contains(self, version: str) -> bool:
        """True when ``version`` (e.g. ``"0.5.17"``) falls in one of the spans;
        False for a version string with no release number."""
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


def parse_version(version: str):
    """``version`` as a :class:`packaging.version.Version` (PEP 440 ordering: ``0.5.24.dev0`` <
    ``0.5.24rc1`` < ``0.5.24`` < ``0.5.24+abc`` < ``0.5.24.post1``); None when it is not a PEP 440
    version."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version)
    except (InvalidVersion, TypeError):
        return None


def is_plain_release(version: str) -> bool:
    """True for a final release with nothing after it (``0.5.23``); False for a dev, pre, post or
    local version (``0.5.24.dev0``, ``0.5.24rc1``, ``0.5.23.post1``, ``0.5.23+abc``) and for a
    string that is not a PEP 440 version."""
    parsed = parse_version(version)
    return bool(parsed is not None and not (parsed.is_prerelease or parsed.is_postrelease or parsed.local))


def newest_release_at_or_below(version: str, releases) -> str | None:
    """The newest of ``releases`` (version strings; only plain final releases count, anything else
    is skipped) at or below ``version`` in PEP 440 order, for a ``version`` that is a dev, pre,
    post or local version: ``0.5.24.dev0`` and ``0.5.23.post1`` -> ``"0.5.23"`` out of
    ``["0.5.17", "0.5.23"]``; ``0.5.23.dev0`` -> ``"0.5.17"`` (a dev of 0.5.23 comes before it).
    None for a plain release (it has its own, or none), a non-PEP 440 string, or when no release
    is at or below it."""
    wanted = parse_version(version)
    if wanted is None or is_plain_release(version):
        return None
    candidates = [(parse_version(r), r) for r in releases if is_plain_release(r)]
    below = [(parsed, r) for parsed, r in candidates if parsed <= wanted]
    return max(below)[1] if below else None
