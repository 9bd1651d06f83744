"""Reading the files a user hands pdconform (results.json, expectations, histories), bounded.

A FIFO, a device such as /dev/zero, a folder or a huge file is refused before it is read,
so no input can hang pdconform or exhaust its memory.
"""

from __future__ import annotations

import stat
from pathlib import Path

MAX_INPUT_BYTES = 64 << 20  # the largest results.json, expectations or history file pdconform reads


class InputError(ValueError):
    """An input file pdconform refuses to read: missing, not a regular file, or too large."""


def read_input(path: str | Path, what: str, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes`` bytes; InputError (saying
    ``what`` it is) otherwise, before anything is read from it: a FIFO, a device such as
    /dev/zero or a folder is never opened for reading."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} {path} is not a regular file")
    if st.st_size > max_bytes:
        raise InputError(f"{what} {path} is {st.st_size} bytes, more than pdconform reads ({max_bytes})")
    try:
        with open(path, "rb") as f:
            return f.read(max_bytes + 1)[:max_bytes]
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
