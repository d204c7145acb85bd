"""The plain store: TF's ``SaveV2`` writes a checkpoint's files, TF's ``Checkpoint.restore``
(``RestoreV2``) reads them back, and the commit protocol of :mod:`.._commit` (fsync,
rename, directory fsync, state file) makes them the latest with plain file calls. It runs
wherever TensorFlow does: macOS, file systems that refuse ``O_DIRECT``, or wherever a
user switched the fast path off (``checkpoint_store="plain"``). It implements
:class:`.._types.CheckpointStore`; the fast store (``store/fast/``) is this store with
the Linux fast path behind the same methods. This package imports nothing of ``fast/``,
``memory/`` or ``remote/``.

What a store does, and on which thread: :meth:`PlainStore.prepare` (start-up, the step
thread: the directory made durably, the owner's lock, the proof it is writable, the
leftovers of interrupted saves removed); :meth:`~PlainStore.write` and
:meth:`~PlainStore.commit`, :meth:`~PlainStore.retire`, :meth:`~PlainStore.remove_partial`
(the writer thread); the state file and setting damaged checkpoints aside
(:meth:`~PlainStore.read_state`, :meth:`~PlainStore.set_aside`, ...);
:meth:`~PlainStore.restore_newest` (the step thread). Never on the event loop.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _commit, _names, _state_file, _writeback
from .._options import PLAIN, FastPath
from .._types import Written
from . import _restore, _write

if TYPE_CHECKING:
    from ...snapshot._snapshot import Snapshot, Staging
    from .._owner import OwnerLock
    from .._types import IdleIO

__all__ = ["PlainStore", "commit_lock"]

# One commit at a time per directory: the writer thread and a synchronous save (a
# CheckpointSaverHook on the step thread) must not interleave their read-modify-write of
# the state file.
_commit_locks: dict[str, threading.Lock] = {}
_commit_locks_guard = threading.Lock()


def commit_lock(logdir: Path) -> threading.Lock:
    """The lock serialising commits to ``logdir`` in this process, however it is spelled."""
    key = os.path.realpath(logdir)
    with _commit_locks_guard:
        return _commit_locks.setdefault(key, threading.Lock())


def _here(fn: Callable[[], Any]) -> Any:
    return fn()


class PlainStore:
    """The portable local store (see the module docstring).

    Args:
        logdir: the directory of the checkpoints and the state file.
    """

    #: the fast path's switches (all off here)
    fast: FastPath = PLAIN

    def __init__(self, logdir: Path) -> None:
        self.logdir = Path(logdir)
        self.commit_lock = commit_lock(self.logdir)

    @property
    def kind(self) -> str:
        """``"plain"`` or ``"fast"``."""
        return self.fast.kind

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.logdir)!r})"

    # -- start-up ------------------------------------------------------------------

    def prepare(self, owner: OwnerLock | None = None) -> None:
        """Create the directory durably, take ``owner`` (before anything in it is
        touched), prove it can be written, remove the leftovers of interrupted saves.

        Raises:
            OSError: the directory cannot be created or written (named in the error).
            CheckpointError: another live training owns it.
        """
        _writeback.make_dirs_durable(self.logdir)
        if owner is not None:
            owner.acquire()
        _commit.probe_writable(self.logdir)

    def clean_leftovers(self) -> list[str]:
        """Remove what interrupted saves left (:func:`._commit.clean_leftovers`)."""
        return _commit.clean_leftovers(self.logdir)

    # -- the writer thread -----------------------------------------------------------

    def write(
        self,
        snapshot: Snapshot,
        tmp: Path,
        check: Callable[[], None],
        io: IdleIO | None = None,
        *,
        durable: bool = True,
        checksums: bool = False,
    ) -> Written:
        """Write ``snapshot``'s files under the temporary prefix ``tmp`` (``SaveV2``).
        ``check`` raises to abandon the save (between parts: ``SaveV2`` itself cannot be
        interrupted). ``durable`` changes nothing here: the commit syncs. No checksums:
        TF computes only its own, per value."""
        check()
        _write.write_snapshot(snapshot, str(tmp), check, None)
        check()
        return Written()

    def commit(
        self,
        tmp: Path,
        final: Path,
        state: _state_file.CheckpointState,
        retiring: Sequence[Path] = (),
    ) -> None:
        """Make ``tmp`` the checkpoint ``final``, durable and named in the state file
        ``state`` (:func:`._commit.commit`); hold :attr:`commit_lock`. On the
        calling thread at normal priority: the commit lock is held meanwhile."""
        _commit.commit(tmp, final, state, retiring)

    def retire(self, prefix: Path, io: IdleIO | None = None) -> None:
        """Delete a checkpoint retention dropped (marked pending meanwhile)."""
        (_here if io is None else io.call)(functools.partial(_commit.retire_checkpoint, prefix))

    def remove_partial(self, tmp: Path) -> None:
        """Remove everything a failed or abandoned save under ``tmp`` wrote."""
        _commit.remove_partial(tmp)

    # -- the state file and damaged checkpoints ----------------------------------------

    def read_state(self) -> _state_file.CheckpointState | None:
        """The state file, if it is this package's own and readable."""
        return _state_file.read_own_state(self.logdir)

    def inspect_state(self) -> tuple[_state_file.CheckpointState | None, str | None]:
        """The state file and what is wrong with it (``None``: nothing)."""
        return _state_file.inspect_state(self.logdir)

    def write_state(self, state: _state_file.CheckpointState) -> None:
        """Replace the state file atomically and durably (hold :attr:`commit_lock`)."""
        _state_file.write_state(self.logdir, state)

    def complete_checkpoints(self, basename: str) -> list[str]:
        """The names of the complete checkpoints ``<basename>-<step>`` on disk (index and
        every data shard), newest step first; read-only."""
        return [
            n for n in _names.scan_checkpoints(self.logdir, basename) if _names.missing_files(self.logdir / n) is None
        ]

    def committed_at(self, prefix: str | Path) -> float:
        """When the checkpoint ``prefix`` (its path, as a restore returns it) was
        committed: its index file's modification time."""
        return os.path.getmtime(f"{prefix}.index")

    def set_aside(self, name: str, tag: str) -> list[str]:
        """Rename the files of checkpoint ``name`` to ``<name>.<tag>...``; the new names."""
        return _commit.set_aside(self.logdir / name, tag)

    def set_aside_state(self, tag: str) -> str | None:
        """Rename a damaged state file to ``checkpoint.<tag>``; its new name, or ``None``
        if there is none (hold :attr:`commit_lock`)."""
        return _state_file.set_aside_state(self.logdir, tag)

    # -- restore -------------------------------------------------------------------

    def restore_newest(self, checkpoint: Any, *, strict: bool, basename: str | None) -> _restore.RestoreOutcome:
        """Restore the newest good checkpoint (:func:`._restore.restore_newest`)."""
        return _restore.restore_newest(checkpoint, self.logdir, strict=strict, basename=basename)

    def restore_path(self, checkpoint: Any, path: str, *, strict: bool = True) -> None:
        """Restore the checkpoint ``path`` (:func:`._restore.restore_path`)."""
        _restore.restore_path(checkpoint, path, strict=strict)

    # -- services and lifetime --------------------------------------------------------

    def idle_io(self, thread: Callable[[], Callable[..., Any]]) -> IdleIO | None:
        """No idle-priority I/O here (no thread is made): the file work runs on the caller."""
        del thread
        return None

    def native_writer_checked(self) -> bool:
        """Whether a native writer has proven itself (snapshots may be staged): never here."""
        return False

    def staging(self) -> Staging | None:
        """No staging buffers of its own: the checkpointer's, if any."""
        return None

    def close(self) -> None:
        """Nothing held (the owner's lock is the session's)."""
