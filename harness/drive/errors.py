"""What can go wrong while a cell runs: a role that fails, one that does not answer, a cell that cannot go on."""

from __future__ import annotations

import traceback


class RoleError(RuntimeError):
    """A role process failed to start, died, or answered a command with an error."""

    def __init__(self, message: str, *, remote_error: str | None = None, remote_traceback: str = "",
                 unsupported: bool = False, remote_message: str | None = None):
        super().__init__(message)
        self.remote_error = remote_error
        self.remote_message = remote_message  # the exception's own message in the role, when it raised
        self.remote_traceback = remote_traceback
        self.unsupported = unsupported


class RoleTimeout(RoleError):
    """A role did not become ready or did not answer within its deadline."""


class CellAborted(Exception):
    """The cell cannot go on: a role failed to start (``unsupported`` False: the cell is
    ERROR), or a step is one the implementation cannot perform (``unsupported`` True:
    UNSUPPORTED).  The message is the reason."""

    def __init__(self, message: str, unsupported: bool = False):
        super().__init__(message)
        self.unsupported = unsupported


def ended_early(exc: BaseException, step: int | None) -> dict:
    """The ``outcome`` a cell's :attr:`Op.CELL_END` records when ``exc`` ended it at ``step``:
    ``unsupported`` or ``aborted`` for CellAborted, else ``crashed`` (a harness bug or an
    interrupt), each with its ``reason`` (a crash's with the last frames of its traceback)."""
    if isinstance(exc, CellAborted):
        return {"outcome": "unsupported" if exc.unsupported else "aborted", "reason": str(exc), "step": step}
    return {"outcome": "crashed", "step": step,
            "reason": f"{type(exc).__name__}: {exc}" + "".join(traceback.format_exception(exc)[-3:-1])[-1500:]}
