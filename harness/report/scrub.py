"""Traces safe to share: a copy of a result tree with host names, IP addresses, user names
and home or install paths replaced by consistent pseudonyms (``pdconform scrub``).

What is an identifier (:func:`find_identifiers`): the host names this machine goes by and
any a run recorded (``hosts`` in results.json), every IPv4 or IPv6 address in any file
except loopback and the unspecified address, the user names of home folders
(``/home/NAME``, ``/Users/NAME``) and of this process, the home folder, the install
prefixes the run recorded or runs from (the sglang install's prefix, this interpreter's,
the checkout's) and the folder the run was written under; plus any the caller names.
Each gets a pseudonym from faker, seeded by the seed and the identifier itself, so the
same input gives the same name in every file of the tree (and in every tree scrubbed with
that seed): an address stays an address (an endpoint keeps its port), a path keeps its
shape below the replaced prefix.  What verdicts depend on (statuses, room ids, ports,
bytes, requirement IDs) is never an identifier, so ``pdconform judge`` gives the scrubbed
tree the same verdicts.

A host or user name shorter than :data:`MIN_NAME` characters, or one of the tree's own
words (``root``, a role or check name), is left as it is and listed, since replacing it
everywhere would rewrite the trace's own text; name it with ``--also`` to force it.

Time is linear in the tree's size whatever its files hold (a 2 MB frame of digits a role
logged, runs of colons or dotted digits): every pattern does bounded work per position or
scans a run once, and no candidate longer than an address can be is parsed.
"""

from __future__ import annotations

import getpass
import hashlib
import ipaddress
import os
import re
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness import nofollow

MIN_NAME = 3  # a host or user name shorter than this is too common a string to replace blindly
#: names that are not identifying, or are words of the trace itself
COMMON_NAMES = {"root", "nobody", "localhost", "user", "admin", "prefill", "decode", "reference", "mooncake", "nixl",
                "mori", "runner", "ubuntu", "debian"}
# the same boundaries find an address and replace it: digits and dots end an IPv4 address
# (a letter, "-" or "_" may touch it: peer-10.0.0.1, node_10.0.0.1); IPv6 candidates are runs
# of hex digits, colons and dots, trimmed of a stray colon at either end (addr:fd00::1: refused).
# A boundary before is what may not come just before (fixed-width texts, so the replacer can
# also check it as a lookbehind placed after the identifier, see replacer)
_V4_NOT_BEFORE, _V4_AFTER = (rb"[\d.]",), rb"(?!\d|\.\d)"
_V6_NOT_BEFORE, _V6_AFTER = (rb"[0-9A-Fa-f.]", rb"[0-9A-Fa-f:]:"), rb"(?![0-9A-Fa-f.]|:[0-9A-Fa-f:])"
_NAME_NOT_BEFORE, _NAME_AFTER = (rb"[A-Za-z0-9-]",), rb"(?![A-Za-z0-9-])"  # host and user names
_PATH_AFTER = rb"(?![\w-])"


def _not_before(texts: tuple[bytes, ...], literal: bytes = b"") -> bytes:
    """Lookbehinds: none of ``texts`` just before the current position less ``literal``
    (a regex, fixed width) - placed after ``literal``, the boundary before it."""
    return b"".join(b"(?<!" + text + literal + b")" for text in texts)


# every candidate pattern does bounded work per start position or scans a run once (no
# nested or overlapping unbounded repeats): scrub is linear in its input, whatever it holds
_IPV4 = re.compile(_not_before(_V4_NOT_BEFORE) + rb"(?:\d{1,3}\.){3}\d{1,3}" + _V4_AFTER)
# a whole run with two colons or more, started only at the run's first character (the
# lookbehind), so a long run of hex digits is scanned once, not once per position in it
_V6_RUN = re.compile(rb"(?<![0-9A-Fa-f:.])[0-9A-Fa-f.]*:[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*")
MAX_V6_TEXT = 45  # the longest IPv6 address text (ffff:...:ffff:255.255.255.255); longer runs are none
_HOME = re.compile(rb"/(?:home|Users)/([A-Za-z0-9._-]+)")


class ScrubError(Exception):
    """The tree cannot be scrubbed as asked (no run folder, an output that exists)."""


@dataclass
class Identifiers:
    """What a tree holds that identifies a machine or a person, by kind: ``hosts``,
    ``addresses``, ``users``, ``paths``; ``left`` the names kept as they are, and why."""

    hosts: set[str] = field(default_factory=set)
    addresses: set[str] = field(default_factory=set)
    users: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    left: dict[str, str] = field(default_factory=dict)

    def all(self) -> set[str]:
        return self.hosts | self.addresses | self.users | self.paths


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _local_prefixes() -> set[str]:
    """This machine's install prefixes: the interpreter's, the checkout's, the home folder."""
    from harness import ROOT

    return {sys.prefix, str(ROOT), os.path.expanduser("~")} - {"/", ""}


def _recorded(results: dict) -> tuple[set[str], set[str]]:
    """Host names and install prefixes a run recorded in its results.json (what is not of
    the shape a run writes is ignored: the tree's own scan still finds addresses and paths)."""
    listed = results.get("hosts")
    hosts = {str(h.get("name") or "") for h in listed if isinstance(h, dict)} if isinstance(listed, list) else set()
    sglang = results.get("sglang")
    path = str(sglang.get("path") or "") if isinstance(sglang, dict) else ""
    prefixes = {path.split("/lib/python")[0]} if "/lib/python" in path else {str(Path(path).parent)} if path else set()
    return hosts - {""}, prefixes - {"", "/"}


def find_identifiers(run_dir: Path, results: dict, also: tuple[str, ...] = ()) -> Identifiers:
    """The identifiers of the tree ``run_dir`` (its parsed results.json ``results``) and the
    caller's ``also`` (kept whatever their length); see the module docstring."""
    ids = Identifiers()
    hosts, prefixes = _recorded(results)
    candidates = {socket.gethostname(), socket.getfqdn(), *hosts}
    candidates |= {h.split(".")[0] for h in candidates if "." in h}  # a host's short name names it too
    users = {getpass.getuser()}
    prefixes |= _local_prefixes() | {str(run_dir.resolve().parent.parent)}
    for path in _files(run_dir):
        data = path.read_bytes()
        users |= {m.decode("utf-8", "replace") for m in _HOME.findall(data)}
        prefixes |= {m.group(0).decode("utf-8", "replace") for m in _HOME.finditer(data)}  # each home folder
        ids.addresses |= {m.decode() for m in _IPV4.findall(data) if _is_identifying(m.decode())}
        ids.addresses |= {a for m in _V6_RUN.findall(data) if (a := _v6_in(m.decode()))}
    words = _trace_words(run_dir)
    for kind, names in (("hosts", candidates), ("users", users)):
        for name in names - {"", "localhost", "localhost.localdomain"}:  # no one's name: not worth a line
            if len(name) < MIN_NAME or name.lower() in COMMON_NAMES or name.lower() in words:
                ids.left[name] = "too short" if len(name) < MIN_NAME else \
                    "a common name or a word of the trace (replaced inside home paths only)"
            else:
                getattr(ids, kind).add(name)
    home = os.path.expanduser("~").rstrip("/")
    # a prefix of one component (/tmp, /opt) names no one; the home folder (/root) does
    ids.paths = {p.rstrip("/") for p in prefixes if p.rstrip("/") == home or p.strip("/").count("/") >= 1}
    ids.hosts |= {a for a in also if a}
    return ids


def _v6_in(run: str) -> str | None:
    """The identifying IPv6 address a run of hex digits, colons and dots is (a stray colon
    at either end dropped), else None."""
    trimmed = run.rstrip(":")
    candidates = [run, trimmed]
    if run.startswith(":") and not run.startswith("::"):  # "addr:fd00::1": the colon is the text's
        candidates += [run[1:], trimmed[1:]]
    for candidate in candidates:
        if len(candidate) > MAX_V6_TEXT:  # no address: not worth parsing (a frame of hex digits)
            continue
        try:
            ipaddress.IPv6Address(candidate)
        except ValueError:
            continue
        if _is_identifying(candidate):
            return candidate
    return None


def _trace_words(run_dir: Path) -> set[str]:
    """The tree's own words, lowercased: results.json's keys, the cell folders' scenario and
    implementation names, the role names: a user or host name equal to one is not replaced
    blindly (it would rewrite the trace itself)."""
    words = set(COMMON_NAMES)
    cells = run_dir / "cells"
    for folder in cells.iterdir() if cells.is_dir() else ():
        words |= {part.lower() for part in folder.name.split("--")}
    try:
        import json

        def keys(node) -> None:
            if isinstance(node, dict):
                words.update(str(k).lower() for k in node)
                for value in node.values():
                    keys(value)
            elif isinstance(node, list):
                for value in node:
                    keys(value)

        keys(json.loads((run_dir / "results.json").read_text()))
    except (OSError, ValueError):
        pass
    return words


def _is_identifying(text: str) -> bool:
    """An address worth replacing: valid, not loopback, unspecified, a mask or link-local broadcast."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return not (address.is_loopback or address.is_unspecified or text.startswith("255."))


class Pseudonyms:
    """Consistent pseudonyms: the same (kind, identifier) gives the same name for a seed,
    never one already given to another identifier or equal to an identifier."""

    def __init__(self, seed: int, identifiers: Identifiers):
        from faker import Faker

        self.fake = Faker()
        self.seed = seed
        self.taken = set(identifiers.all())
        self.given: dict[str, str] = {}

    def _draw(self, kind: str, original: str, make) -> str:
        if original in self.given:
            return self.given[original]
        for attempt in range(100):
            digest = hashlib.sha256(f"{self.seed}\0{kind}\0{original}\0{attempt}".encode()).digest()
            self.fake.seed_instance(int.from_bytes(digest[:8], "big"))
            name = make()
            if name not in self.taken:
                break
        self.taken.add(name)
        self.given[original] = name
        return name

    def host(self, name: str) -> str:
        return self._draw("host", name, lambda: self.fake.hostname(levels=name.count(".")) if "." in name
                          else self.fake.hostname(levels=0))

    def address(self, text: str) -> str:
        return self._draw("ip", text, self.fake.ipv6 if ":" in text else self.fake.ipv4_private)

    def user(self, name: str) -> str:
        return self._draw("user", name, self.fake.user_name)

    def path(self, prefix: str, users: set[str]) -> str:
        home = _HOME.fullmatch(prefix.encode())
        if home and home.group(1).decode() in users:
            return self._draw("path", prefix, lambda: prefix[:prefix.rindex("/") + 1] + self.user(home.group(1).decode()))
        return self._draw("path", prefix, lambda: f"/srv/{self.fake.word()}-{self.fake.word()}")


def mapping(identifiers: Identifiers, seed: int) -> dict[str, str]:
    """Every identifier -> its pseudonym (paths first: a home path maps through its user)."""
    names = Pseudonyms(seed, identifiers)
    out = {p: names.path(p, identifiers.users) for p in sorted(identifiers.paths)}
    out |= {u: names.user(u) for u in sorted(identifiers.users)}
    out |= {h: names.host(h) for h in sorted(identifiers.hosts)}
    out |= {a: names.address(a) for a in sorted(identifiers.addresses)}
    return out


_Form = tuple[bytes, bytes, tuple[bytes, ...], bytes, bool]


def _forms(table: dict[str, str], identifiers: Identifiers) -> list[_Form]:
    """(original, pseudonym, boundary before (:func:`_not_before`), boundary after,
    case-insensitive) for every form an identifier takes in a trace: a path also URL-encoded
    and JSON-escaped."""
    forms = []
    for original, pseudonym in table.items():
        o, p = original.encode(), pseudonym.encode()
        if original in identifiers.paths:
            for slash in (b"/", b"%2F", b"%2f", b"\\/"):
                forms.append((o.replace(b"/", slash), p.replace(b"/", slash), (), _PATH_AFTER, False))
        elif original in identifiers.addresses:
            v6 = ":" in original
            forms.append((o, p, _V6_NOT_BEFORE if v6 else _V4_NOT_BEFORE, _V6_AFTER if v6 else _V4_AFTER, v6))
        else:
            forms.append((o, p, _NAME_NOT_BEFORE, _NAME_AFTER, True))
    return forms


def replacer(table: dict[str, str], identifiers: Identifiers | None = None):
    """bytes -> bytes replacing every identifier of ``table`` in every form it takes (longest
    first; names and addresses only where they stand alone, so ``alice`` is not replaced
    inside ``malice``; host names and IPv6 addresses whatever their case).  Linear in the
    input's length (times the table's size at worst), whatever the input holds."""
    if not table:
        return lambda data: data
    ids = identifiers or Identifiers(hosts=set(table))
    forms = sorted(_forms(table, ids), key=lambda f: len(f[0]), reverse=True)
    # Each form's own pattern decides, tried in this order at a position: the leftmost
    # position where one matches, the first that does (what one alternation of them all
    # would match).  An alternation of patterns that each open with a lookbehind gives the
    # regex engine no first character to skip ahead to, so it tries every form at every
    # byte; instead a prefilter finds the candidate positions: every form lowercased and
    # matched in the lowercased input (the same length, and every boundary class is closed
    # under case), its boundary before checked by a lookbehind after it, so each alternative
    # opens with a plain character the engine scans for.  It matches wherever a form does
    # (and where only a form's case differs: the form's own pattern then says no).
    exact: dict[int, list[tuple[re.Pattern, bytes]]] = {}
    alternatives: dict[bytes, None] = {}
    for o, p, before, after, fold in forms:
        literal = re.escape(o)
        own = re.compile(_not_before(before) + (b"(?i:" + literal + b")" if fold else literal) + after)
        exact.setdefault(o[:1].lower()[0], []).append((own, p))
        lowered = re.escape(o.lower())
        alternatives[lowered + _not_before(before, lowered) + after] = None
    prefilter = re.compile(b"|".join(alternatives))

    def rewrite(data: bytes) -> bytes:
        lowered = data.lower()
        out, done, at = [], 0, 0
        while match := prefilter.search(lowered, at):
            start = match.start()
            for own, pseudonym in exact[lowered[start]]:
                if hit := own.match(data, start):  # its lookbehinds see the text before start
                    out += [data[done:start], pseudonym]
                    done = at = hit.end()
                    break
            else:  # only a case-sensitive form's case differs here: go on from the next byte
                at = start + 1
        if not out:
            return data
        out.append(data[done:])
        return b"".join(out)

    return rewrite


@dataclass
class ScrubReport:
    """What a scrub did: files written, identifiers replaced by kind, names left as they are."""

    out: Path
    files: int
    replaced: dict[str, int]
    left: dict[str, str]


def scrub(run_dir: Path, out: Path, seed: int = 0, also: tuple[str, ...] = ()) -> ScrubReport:
    """Write a scrubbed copy of the run folder ``run_dir`` (or an --out folder's latest run) as ``out``,
    which must not exist (nothing of the user's is overwritten); written beside it in a
    temporary folder and renamed into place at the end, so ``out`` is whole or absent.
    ScrubError for a folder that is no run or an ``out`` that exists; OSError as it comes."""
    import json

    from harness.report.outdir import OutDirError, run_folder_of

    try:
        run_dir = run_folder_of(run_dir)
    except OutDirError as exc:
        raise ScrubError(str(exc)) from None
    results_file = run_dir / "results.json"
    if not results_file.is_file():
        raise ScrubError(f"{run_dir}: not a run folder (no results.json)")
    if out.exists() or out.is_symlink():  # a dangling link too: nothing is written through one
        raise ScrubError(f"{out}: exists; scrub writes a new folder and never overwrites one")
    from harness import ROOT

    where = Path(os.path.abspath(out.parent)).resolve() / out.name  # the folder as it will be, its name not followed
    if where.is_relative_to(run_dir.resolve()):
        raise ScrubError(f"{out}: inside the run being scrubbed; give a folder outside it")
    if where.is_relative_to(ROOT) and not where.is_relative_to(ROOT / "reports"):  # as run's --out (outdir.check_out)
        raise ScrubError(f"{out}: inside the pdconform checkout; use a folder under {ROOT / 'reports'} or outside it")
    try:
        results = json.loads(results_file.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ScrubError(f"{results_file}: not readable JSON ({exc})") from None
    identifiers = find_identifiers(run_dir, results if isinstance(results, dict) else {}, also)
    table = mapping(identifiers, seed)
    rewrite = replacer(table, identifiers)
    os.close(nofollow.open_dir(out.parent, create=True))  # no link followed on the way (harness.nofollow)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        files = _files(run_dir)
        for path in files:
            relative = os.fsdecode(rewrite(os.fsencode(path.relative_to(run_dir))))  # any bytes a name holds
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(rewrite(path.read_bytes()))
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    kinds = {"hosts": identifiers.hosts, "addresses": identifiers.addresses, "users": identifiers.users,
             "paths": identifiers.paths}
    return ScrubReport(out, len(files), {k: len(v) for k, v in kinds.items()}, identifiers.left)


__all__ = ["scrub", "find_identifiers", "mapping", "replacer", "Identifiers", "ScrubError", "ScrubReport"]
