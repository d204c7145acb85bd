"""One owner per log directory: a lock the kernel drops when its process dies.

Two trainings writing one logdir clobber each other: the second one's start-up removes
the first one's save in flight as "leftovers", and both write ``model.ckpt-<step>``.
:class:`OwnerLock` makes the second fail at start instead, before it touches anything
but the lock file, with a :class:`CheckpointError` that names the owner (host, pid,
start time). The lock is ``flock(2)`` on ``<logdir>/asupervisor.lock``: the kernel drops
it when the owner's process ends, however it ends, so a SIGKILLed training never blocks
the next run; the file stays (deleting it would race a newcomer that opened it) and says
who held it last. Where the platform has no ``flock`` (Windows), or the filesystem takes
no locks (``ENOLCK``: NFS mounted ``nolock``; some FUSE filesystems), there is no lock,
and the latter is logged ``checkpoint.owner_unlocked``.

Only the process that writes the logdir (the chief) takes it; readers (evaluators,
``watch_checkpoints``, ``asupervisor inspect``, non-chief workers) never do. Plain file
work on the step thread at start-up; never on the event loop.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path

from ..._exceptions import CheckpointError
from ..._logging import describe, get_logger

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

__all__ = ["OWNER_FILE", "OwnerLock"]

log = get_logger(__name__)

#: The lock file in a logdir; holds the owner's host, pid and start time (JSON).
OWNER_FILE = "asupervisor.lock"

#: errnos of a filesystem that takes no locks (the training goes on unowned, with a warning)
_NO_LOCKS = frozenset(
    e
    for e in (errno.ENOLCK, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", None), errno.ENOSYS, errno.EINVAL)
    if e is not None
)


def _describe_owner(raw: bytes) -> str:
    """``host H, pid P, started T`` from the lock file's text (best effort)."""
    try:
        owner = json.loads(raw.decode())
        return f"host {owner['host']}, pid {owner['pid']}, started {owner['started']}"
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return "an unknown owner (it has not written its name yet)"


class OwnerLock:
    """The exclusive lock of one logdir for the lifetime of a session.

    Args:
        logdir: the directory (it must exist).
    """

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.path = logdir / OWNER_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or fail naming the owner. Idempotent while held.

        Raises:
            CheckpointError: another live process holds it (the message names it).
            OSError: the lock file cannot be created or written (a read-only logdir...).
        """
        if self._fd is not None or fcntl is None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _describe_owner(os.pread(fd, 4096, 0))
                raise CheckpointError(
                    f"logdir {self.logdir} is in use by another training ({owner}; lock {self.path}): "
                    "two trainings in one logdir would overwrite each other's checkpoints; stop that "
                    "one or give this training another logdir"
                ) from None
            except OSError as exc:
                if exc.errno not in _NO_LOCKS:
                    raise
                # a filesystem without locks (NFS mounted nolock, some FUSE): train unowned
                log.warning(
                    "checkpoint.owner_unlocked",
                    path=str(self.path),
                    error=describe(exc),
                    hint="this filesystem takes no locks: nothing stops a second training into this logdir",
                )
                os.close(fd)
                return
            me = {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            data = json.dumps(me).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        log.debug("checkpoint.owner_locked", path=str(self.path), pid=me["pid"])

    def release(self) -> None:
        """Drop the lock (the file stays); safe to call when not held."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock
