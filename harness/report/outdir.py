"""Where a run's result tree goes, safely: a fresh run folder per run, a ``latest`` link, a lock.

A run never writes into, or deletes from, a folder it did not make::

    OUT/                      the folder --out names (default reports/out); made if missing
      .pdconform.lock         held (flock) while a run writes here: a second run into OUT is refused
      runs/20261201-171500/   one folder per run, made fresh, marked with .pdconform-run
      latest -> runs/...      moved (atomically) when a run has written all its results
      trend.html              every stored run's verdicts side by side (harness.report.trend), rewritten then

So an interrupted run leaves ``latest`` (and every earlier run) as it was; only run
folders that carry the marker are ever removed (the oldest beyond :data:`KEEP_RUNS`),
never through a symlink.  :func:`check_out` checks an --out path without touching
anything: the checkout's own folders (the repository root, harness/, docs/...) are
refused, only reports/ inside it is allowed.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import shutil
from pathlib import Path

from harness import ROOT
from harness.judge.results import LATEST, LOCK, MARKER, RUNS

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
            self.out.mkdir(parents=True, exist_ok=True)
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
        runs.mkdir(exist_ok=True)
        for k in range(1000):
            path = runs / (stamp if k == 0 else f"{stamp}-{k}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            (path / MARKER).write_text(json.dumps({"pid": os.getpid(), "started": stamp}) + "\n")
            return path
        raise OSError(f"no free run folder name under {runs}")

    def finish(self) -> None:
        """Point ``OUT/latest`` at this run (atomically: a new link renamed over the old one)
        and remove the oldest marked run folders beyond ``keep``."""
        assert self.path is not None
        tmp = self.out / f".{LATEST}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        os.symlink(Path(RUNS) / self.path.name, tmp)
        os.replace(tmp, self.out / LATEST)
        prune(self.out, self.keep, spare=self.path)
        from harness.report.trend import write_trend

        try:
            write_trend(self.out)  # the stored runs side by side, this one included
        except OSError:  # the run itself is written and linked: the trend page is only a view of it
            pass

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    def __exit__(self, *exc) -> None:
        self._release()


def take_lock(folder: Path, doing: str) -> int:
    """Hold ``folder/.pdconform.lock`` (flock, released when the returned descriptor is
    closed, also by the kernel when the process dies); OutDirError naming the holder's pid
    when another process holds it."""
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise OutDirError(f"another pdconform run (pid {holder}) is {doing} {folder}; wait for it, "
                              "or give another folder") from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def is_run_folder(path: Path) -> bool:
    """A folder pdconform made for one run: a real directory (not a symlink) with the marker."""
    return path.is_dir() and not path.is_symlink() and (path / MARKER).is_file()


def prune(out: Path, keep: int, spare: Path | None = None) -> list[Path]:
    """Remove the oldest run folders of ``out`` beyond the newest ``keep`` (never ``spare``,
    never anything without the marker or behind a symlink); the removed paths."""
    runs = out / RUNS
    if not runs.is_dir() or runs.is_symlink():
        return []
    ours = sorted((p for p in runs.iterdir() if is_run_folder(p)), key=lambda p: p.name)
    removed = []
    for path in ours[:max(0, len(ours) - keep)]:
        if spare is not None and path == spare:
            continue
        shutil.rmtree(path, ignore_errors=True)  # rmtree removes symlinks inside, never their targets
        removed.append(path)
    return removed


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
