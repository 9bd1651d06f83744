"""Writing where someone else may have put a link: every file pdconform writes is opened
without following a symbolic link, in any component of its path.

An --out folder can be shared (a /tmp folder, a CI workspace restored from a cache): a
link planted there (``OUT/.pdconform.lock -> /etc/passwd``, ``OUT/runs/X/cells -> /etc``)
must never make a run, as root, write where it points.  So a folder is opened one
component at a time from ``/`` with ``O_DIRECTORY | O_NOFOLLOW``, and a file relative to
its folder's descriptor with ``O_NOFOLLOW``, then checked with ``fstat`` to be a regular
file; a link anywhere is :class:`LinkRefused` and nothing is touched.  The paths callers
pass are already resolved where the user named them (harness.report.outdir.check_out
resolves ``--out``), so a link below them is never the user's choice.

:func:`write_atomic` writes a whole file through a temporary one and a rename (a reader
sees the old file or the new one); :func:`open_write` opens one to write or append
(logs, histories); :func:`open_lock` opens a lock file; :func:`refuse_link` checks a
path before a run starts, so a planted link is refused before any work is done.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkRefused(OSError):
    """A symbolic link, or something other than a regular file or folder, where pdconform
    would write; ``strerror`` says which path and what it is (errno ELOOP)."""

    def __init__(self, path: str | Path, what: str):
        super().__init__(errno.ELOOP, f"{path} is {what}; pdconform does not write through it", str(path))

    def __str__(self) -> str:
        return self.strerror


def _what(path: str, dir_fd: int | None = None, name: str | None = None) -> str:
    """What ``path`` is, in words, for a refusal (a link says where it points)."""
    try:
        st = os.lstat(name if dir_fd is not None else path, dir_fd=dir_fd)
    except OSError:
        return "not a plain file or folder"
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a symbolic link (to {os.readlink(name if dir_fd is not None else path, dir_fd=dir_fd)})"
        except OSError:
            return "a symbolic link"
    return "not a plain file" if not stat.S_ISDIR(st.st_mode) else "a folder"


def open_dir(path: str | Path, create: bool = False) -> int:
    """A descriptor of the folder ``path`` (made absolute, not resolved), reached one
    component at a time without following a link; missing folders are made when
    ``create``.  The caller closes it.  LinkRefused when a component is a link or not a
    folder; FileNotFoundError when one is missing and not ``create``; OSError as it comes."""
    absolute = os.path.abspath(os.fspath(path))
    fd = os.open("/", _DIR_FLAGS)
    walked = ""
    try:
        for part in [p for p in absolute.split("/") if p]:
            walked += "/" + part
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:  # made meanwhile by another process: opened below, still without following
                    pass
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except (NotADirectoryError, OSError) as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise LinkRefused(walked, _what(walked)) from None
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_in(folder_fd: int, name: str, path: str, flags: int, mode: int) -> int:
    """``name`` opened in ``folder_fd`` with ``flags`` and no link followed, checked to be a
    regular file; LinkRefused otherwise."""
    try:  # O_NONBLOCK: a FIFO planted there must not block the open (it is refused below)
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # a link; a FIFO or socket; a folder
            raise LinkRefused(path, _what(path, folder_fd, name)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LinkRefused(path, "not a plain file")
    os.set_blocking(fd, True)
    return fd


def _split(path: str | Path) -> tuple[str, str, str]:
    absolute = os.path.abspath(os.fspath(path))
    folder, name = os.path.split(absolute)
    if not name:
        raise IsADirectoryError(errno.EISDIR, "a file name is needed", absolute)
    return absolute, folder, name


def open_write(path: str | Path, append: bool = False, create_dirs: bool = False, mode: int = 0o644) -> BinaryIO:
    """``path`` opened to write (truncated) or ``append``, made if missing, as a binary
    file object, with no link followed anywhere in its path (its folders made first when
    ``create_dirs``).  LinkRefused for a link or a non-regular file; OSError as it comes."""
    absolute, folder, name = _split(path)
    folder_fd = open_dir(folder, create=create_dirs)
    try:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        fd = _open_in(folder_fd, name, absolute, flags, mode)
    finally:
        os.close(folder_fd)
    return os.fdopen(fd, "ab" if append else "wb")


def open_fd(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags, mode)`` with no link followed anywhere in the path and the
    result checked to be a regular file (a lock file, a log a child inherits).
    LinkRefused for a link or a non-regular file; OSError as it comes."""
    absolute, folder, name = _split(path)
    folder_fd = open_dir(folder)
    try:
        return _open_in(folder_fd, name, absolute, flags, mode)
    finally:
        os.close(folder_fd)


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (its folders made if missing) through a temporary file in
    the same folder and a rename: a reader sees the old file or the whole new one, never a
    part.  No link is followed: a link in the path, or at ``path`` itself, is LinkRefused
    and nothing is written.  The file gets the mode ``open()`` would give (0666 less the
    umask).  OSError as it comes (the temporary file removed)."""
    absolute, folder, name = _split(path)
    folder_fd = open_dir(folder, create=True)
    try:
        try:
            st = os.lstat(name, dir_fd=folder_fd)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise LinkRefused(absolute, _what(absolute, folder_fd, name))
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        umask = os.umask(0)
        os.umask(umask)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666 & ~umask,
                     dir_fd=folder_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=folder_fd)
            except OSError:
                pass
            raise
    finally:
        os.close(folder_fd)


def refuse_link(path: str | Path) -> None:
    """LinkRefused when ``path`` exists and is a link or not a regular file or folder
    (checked before a run writes there, so nothing is done first); nothing otherwise."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise LinkRefused(path, _what(os.fspath(path)))


__all__ = ["LinkRefused", "open_dir", "open_write", "open_fd", "write_atomic", "refuse_link"]
