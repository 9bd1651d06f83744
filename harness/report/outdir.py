"""Where a run's result tree goes, safely: a fresh run folder per run, a ``latest`` link, a lock.

A run never writes into, or deletes from, a folder it did not make::

    OUT/                      the folder --out names (default reports/out); made if missing
      .pdconform.lock         held (flock) while a run writes here: a second run into OUT is refused
      runs/20261201-171500/   one folder per run, made fresh, marked with .pdconform-run
      latest -> runs/...      moved (atomically) when a run has written all its results
      trend.html              every stored run's verdicts side by side (harness.report.trend), rewritten then

So an interrupted run leaves ``latest`` (and every earlier run) as it was.  Pruning (the
oldest run folders beyond :data:`KEEP_RUNS`) removes only the files pdconform writes, by
name (:data:`harness.judge.results.OWN_FILES`), from folders whose marker names the folder
itself (a user's ``cp -a`` copy of a run carries a marker of another folder), and a folder
only once it is empty: a run folder holding anything else is left, and named.  Every file
is written and the lock taken without following a link (harness.nofollow): a link planted
in OUT is refused, never followed.  :func:`check_out` checks an --out path without touching
anything: the checkout's own folders (the repository root, harness/, docs/...) are
refused, only reports/ inside it is allowed.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import fnmatch
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from harness import ROOT, nofollow
from harness.judge.results import LATEST, LOCK, MARKER, OWN_FILES, RUNS, TREND_PAGE

KEEP_RUNS = 10  # finished or interrupted run folders kept per OUT (the newest)


class OutDirError(ValueError):
    """An --out folder pdconform must not use, or one another run holds; the message says why."""


def check_out(path: str | Path) -> Path:
    """The absolute --out folder for ``path``, checked without touching anything: not empty,
    not a file, not the checkout or a folder of it other than reports/, and, when it exists,
    with ``runs``/``latest`` entries that are pdconform's own.  OutDirError otherwise."""
    if str(path).strip() in ("", "."):  # typer turns an empty --out into "."
        raise OutDirError("--out needs a directory path (got an empty one, or the current directory)")
    try:
        out = Path(path).expanduser().resolve()
    except (OSError, RuntimeError) as exc:  # symlink loops, unknown ~user, names too long
        raise OutDirError(f"cannot use --out {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if out == ROOT or (out.is_relative_to(ROOT) and not out.is_relative_to(ROOT / "reports")):
        raise OutDirError(f"--out {out} is inside the pdconform checkout; use a folder under {ROOT / 'reports'} "
                          "or outside the checkout")
    if out.exists() and not out.is_dir():
        raise OutDirError(f"--out {out} is a file, not a directory")
    for name in (LOCK, TREND_PAGE):  # written into OUT itself: a planted link there is refused before anything runs
        try:
            nofollow.refuse_link(out / name)
        except nofollow.LinkRefused as exc:
            raise OutDirError(f"--out {out}: {exc.strerror}") from None
        if (out / name).is_dir() and not (out / name).is_symlink():
            raise OutDirError(f"--out {out}: {name} there is a folder, not pdconform's file")
    busy = _held_by(out / LOCK)
    if busy:  # said now, before a command prints its plan or starts anything
        raise OutDirError(f"another pdconform run (pid {busy}) is writing into {out}; wait for it, or give another folder")
    runs, latest = out / RUNS, out / LATEST
    if runs.exists() and (runs.is_symlink() or not runs.is_dir()):
        raise OutDirError(f"--out {out}: {RUNS} there is not pdconform's (not a plain folder)")
    if latest.exists() or latest.is_symlink():
        target = os.readlink(latest) if latest.is_symlink() else None
        if target is None or Path(target).parts[:1] != (RUNS,):
            older = " (a run folder of an older pdconform: move it away)" if (latest / "results.json").is_file() else ""
            raise OutDirError(f"--out {out}: {LATEST} there is not pdconform's link into {RUNS}/{older}")
    return out


class RunFolder:
    """One run's folder under an --out folder (see the module docstring); a context manager.

    ``with RunFolder(out) as run_dir:`` takes the lock (OutDirError when another run holds
    it), makes ``OUT/runs/<time>/`` with its marker and returns it; :meth:`finish` points
    ``latest`` at it and removes the oldest marked run folders beyond ``keep``.  Leaving the
    block without :meth:`finish` (an interrupt, an error) releases the lock and changes
    nothing else.  OutDirError when OUT cannot be made or locked; OSError when the run folder
    cannot be made."""

    def __init__(self, out: Path, keep: int = KEEP_RUNS):
        self.out, self.keep = out, keep
        self.path: Path | None = None
        self._lock_fd: int | None = None

    def __enter__(self) -> Path:
        try:
            os.close(nofollow.open_dir(self.out, create=True))
            self._lock_fd = take_lock(self.out, "writing into")
        except OSError as exc:
            raise OutDirError(f"cannot use --out {self.out}: {exc.strerror or exc}") from None
        try:
            self.path = self._new_run_dir()
        except BaseException:
            self._release()
            raise
        return self.path

    def _new_run_dir(self) -> Path:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        runs = self.out / RUNS
        os.close(nofollow.open_dir(runs, create=True))  # OUT/runs itself may not be a link
        for k in range(1000):
            path = runs / (stamp if k == 0 else f"{stamp}-{k}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            info = os.lstat(path)  # the marker names its own folder: a copy of the folder is not this run
            nofollow.write_atomic(path / MARKER, (json.dumps({"pid": os.getpid(), "started": stamp,
                                                              "dev": info.st_dev, "ino": info.st_ino}) + "\n").encode())
            return path
        raise OSError(f"no free run folder name under {runs}")

    def finish(self) -> list[str]:
        """Point ``OUT/latest`` at this run (atomically: a new link renamed over the old one),
        remove the oldest run folders beyond ``keep`` (:func:`prune`) and rewrite the trend
        page; what the user should know, one line each (run folders left because they hold
        files pdconform did not write, a trend page that is not pdconform's).  LinkRefused
        (an OSError) when a link was planted where it writes."""
        assert self.path is not None
        folder = nofollow.open_dir(self.out)
        try:
            tmp = f".{LATEST}.{secrets.token_hex(4)}"
            os.symlink(Path(RUNS) / self.path.name, tmp, dir_fd=folder)
            try:
                os.replace(tmp, LATEST, src_dir_fd=folder, dst_dir_fd=folder)
            except BaseException:
                os.unlink(tmp, dir_fd=folder)
                raise
        finally:
            os.close(folder)
        notes = [f"{left}: not pruned, it holds files pdconform did not write ({', '.join(names)})"
                 for left, names in prune(self.out, self.keep, spare=self.path).left.items()]
        from harness.report.trend import write_trend

        if write_trend(self.out) is None:
            notes.append(f"{self.out / TREND_PAGE}: not pdconform's, left as it is (no trend page written)")
        return notes

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    def __exit__(self, *exc) -> None:
        self._release()


def _held_by(lock: Path) -> str:
    """The pid of the process that holds the lock file ``lock`` ("?" when it wrote none), or
    "" when nobody does or there is none.  The file is only read (a shared flock tried and
    dropped), never made or followed."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return (os.pread(fd, 64, 0).decode(errors="replace").strip()[:20] or "?") if \
            exc.errno in (errno.EAGAIN, errno.EACCES) else ""
    finally:
        os.close(fd)  # closing drops the shared lock, if it was taken
    return ""


def take_lock(folder: Path, doing: str) -> int:
    """Hold ``folder/.pdconform.lock`` (flock, released when the returned descriptor is
    closed, also by the kernel when the process dies); OutDirError naming the holder's pid
    when another process holds it, or naming the link when the lock file is one (nothing
    is written through it: harness.nofollow)."""
    try:
        fd = nofollow.open_fd(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except nofollow.LinkRefused as exc:
        raise OutDirError(f"cannot use {folder}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise OutDirError(f"another pdconform run (pid {holder[:20]}) is {doing} {folder}; wait for it, "
                              "or give another folder") from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def is_run_folder(path: Path) -> bool:
    """A folder pdconform made for one run, or a copy of one: a real directory (not a
    symlink) with the marker (what ``judge``, ``scrub`` and the trend page read)."""
    return path.is_dir() and not path.is_symlink() and (path / MARKER).is_file()


def made_here(path: Path) -> bool:
    """Whether ``path`` is the very run folder its marker was written in (its device and
    inode; a marker of an older pdconform without them: the folder's name is the time it
    names), not a copy of one: only such a folder is pdconform's to prune."""
    if not is_run_folder(path):
        return False
    try:
        marker = json.loads(nofollow_read(path / MARKER))
        info = os.lstat(path)
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict):
        return False
    if "ino" in marker:
        return marker.get("ino") == info.st_ino and marker.get("dev") == info.st_dev
    return str(marker.get("started", "")) != "" and path.name.split("-")[:2] == str(marker["started"]).split("-")[:2]


def nofollow_read(path: Path, limit: int = 4096) -> bytes:
    """At most ``limit`` bytes of the regular file ``path``, no link followed; OSError otherwise."""
    fd = nofollow.open_fd(path, os.O_RDONLY)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def is_own_file(name: str) -> bool:
    """Whether a file named ``name`` is one pdconform writes in a run folder (OWN_FILES)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in OWN_FILES)


@dataclass
class Pruned:
    """What :func:`prune` did: the run folders ``removed`` whole; those ``left``, each with
    the names (at most five) of what it holds that pdconform did not write."""

    removed: list[Path] = field(default_factory=list)
    left: dict[Path, list[str]] = field(default_factory=dict)


def _walk(folder_fd: int, remove: bool, where: str = "") -> list[str]:
    """What under the folder ``folder_fd`` pdconform did not write (:func:`is_own_file`; a
    link or a FIFO is never its own), as paths relative to it; with ``remove``, pdconform's
    files and the folders they leave empty are removed as they are met.  No link followed."""
    foreign: list[str] = []
    for entry in list(os.scandir(folder_fd)):
        if entry.is_dir(follow_symlinks=False):
            sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder_fd)
            try:
                inner = _walk(sub, remove, f"{where}{entry.name}/")
            finally:
                os.close(sub)
            foreign += inner
            if remove and not inner:
                os.rmdir(entry.name, dir_fd=folder_fd)
        elif entry.is_file(follow_symlinks=False) and is_own_file(entry.name):
            if remove:
                os.unlink(entry.name, dir_fd=folder_fd)
        else:
            foreign.append(f"{where}{entry.name}" + (" (a link)" if entry.is_symlink() else ""))
    return foreign


def prune(out: Path, keep: int, spare: Path | None = None) -> Pruned:
    """Remove the oldest run folders of ``out`` made here (:func:`made_here`) beyond the
    newest ``keep`` (never ``spare``), each only when everything in it is a file pdconform
    writes (by name, OWN_FILES): those files, then the folder.  A folder that holds anything
    else is left whole and listed in ``left``.  Nothing behind a link is followed."""
    pruned = Pruned()
    runs = out / RUNS
    if not runs.is_dir() or runs.is_symlink():
        return pruned
    ours = sorted((p for p in runs.iterdir() if made_here(p)), key=lambda p: p.name)
    for path in ours[:max(0, len(ours) - keep)]:
        if spare is not None and path == spare:
            continue
        foreign: list[str] = []
        try:
            fd = nofollow.open_dir(path)
            try:
                foreign = _walk(fd, remove=False)
                if not foreign:
                    _walk(fd, remove=True)
            finally:
                os.close(fd)
            if not foreign:
                os.rmdir(path)
                pruned.removed.append(path)
                continue
        except OSError as exc:
            foreign = foreign or [f"cannot be removed: {exc.strerror or exc}"]
        pruned.left[path] = foreign[:5]
    return pruned


def run_folder_of(path: Path) -> Path:
    """The run folder ``path`` names: itself when it is one, the run an ``OUT/latest`` link
    points at, else ``path/latest`` (an --out folder).  OutDirError when neither is a pdconform run folder."""
    path = Path(path).expanduser()
    if is_run_folder(path):
        return path.resolve()
    if path.is_symlink() and path.name == LATEST and is_run_folder(path.resolve()):  # OUT/latest itself
        return path.resolve()
    latest = path / LATEST
    if latest.is_symlink() and is_run_folder(latest.resolve()):
        return latest.resolve()
    raise OutDirError(f"{path} is not a pdconform run folder (no {MARKER}), nor an --out folder with a "
                      f"{LATEST} run")
