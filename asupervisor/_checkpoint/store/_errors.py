"""What a failed or abandoned save raises, for every store: :class:`SaveAbandoned` (the
stop's deadline) and :func:`write_error` (the :class:`~asupervisor.CheckpointError`
naming the file and the cause)."""

from __future__ import annotations

from pathlib import Path

from ..._exceptions import CheckpointError
from ..._tf import tf

__all__ = ["SaveAbandoned", "write_error"]


class SaveAbandoned(Exception):
    """A save given up at a stop's deadline (:meth:`Checkpointer.abandon`); nothing of it
    stays on disk and the previous checkpoint stays the latest."""


def write_error(exc: BaseException, final: Path, step: int) -> CheckpointError | None:
    """The :class:`CheckpointError` saying where and why the save of ``final`` failed, for
    an ``OSError`` or a TensorFlow error; ``None`` for anything else."""
    where = f"could not save checkpoint {final.name} (step {step}) in {final.parent}"
    if isinstance(exc, OSError):
        cause = exc.strerror or str(exc)
        errno = f" (errno {exc.errno})" if exc.errno is not None else ""
        target = f"{exc.filename}: " if exc.filename else ""
        return CheckpointError(f"{where}: {target}{cause}{errno}; nothing of this save was kept")
    op_error = getattr(getattr(tf(), "errors", None), "OpError", None)
    if op_error is not None and isinstance(exc, op_error):
        message = getattr(exc, "message", "") or str(exc)
        return CheckpointError(f"{where}: {type(exc).__name__}: {message}; nothing of this save was kept")
    return None
