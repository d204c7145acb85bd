"""The checkpoint stores of a local directory: the seam every checkpoint byte goes through.

:class:`PlainStore` is the portable one: TF's own ``SaveV2`` writes a checkpoint's files,
TF's ``Checkpoint.restore`` (``RestoreV2``) reads them back, and the commit protocol of
:mod:`._commit` (fsync, rename, directory fsync, state file) makes them the latest
with plain file calls. It runs wherever TensorFlow does: macOS, file systems that refuse
``O_DIRECT``, or wherever a user switched the fast path off
(``checkpoint_store="plain"``). :class:`FastStore` is the same store with the Linux fast
path behind the same methods: the native bundle writer, direct I/O, early writeback,
idle-priority I/O and the project's own restore, each switched by its
:class:`~._options.FastPath`. :func:`open_store` picks one, once per logdir.

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

from . import _commit, _names, _restore, _state_file, _write, _writeback
from ._options import PLAIN, FastPath

if TYPE_CHECKING:
    from ..snapshot._snapshot import Snapshot
    from ._owner import OwnerLock
    from .fast._idle_io import IdleIO

__all__ = ["FastStore", "PlainStore", "open_store"]

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

    def write(self, snapshot: Snapshot, tmp: Path, check: Callable[[], None], io: IdleIO | None = None) -> None:
        """Write ``snapshot``'s files under the temporary prefix ``tmp`` (``SaveV2``).
        ``check`` raises to abandon the save (between parts: ``SaveV2`` itself cannot be
        interrupted)."""
        check()
        _write.write_snapshot(snapshot, str(tmp), check, None, native=False)
        check()

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
        """Restore the newest good checkpoint (:func:`.._restore.restore_newest`)."""
        return _restore.restore_newest(checkpoint, self.logdir, strict=strict, basename=basename, fast=self.fast)


class FastStore(PlainStore):
    """The local store with the Linux fast path (see the module docstring).

    Args:
        logdir: the directory.
        fast: which mechanisms of the fast path are on.
    """

    def __init__(self, logdir: Path, fast: FastPath | None = None) -> None:
        super().__init__(logdir)
        self.fast = FastPath() if fast is None else fast

    def write(self, snapshot: Snapshot, tmp: Path, check: Callable[[], None], io: IdleIO | None = None) -> None:
        """Write ``snapshot`` under ``tmp`` (the native writer, direct I/O where on) and
        get its data to disk in abandonable chunks (early writeback, then
        ``sync_file_range``), the kernel-heavy parts on ``io``'s idle thread."""
        check()
        fast = self.fast
        if fast.early_writeback:
            with _writeback.early_writeback(tmp):
                _write.write_snapshot(
                    snapshot, str(tmp), check, io, native=fast.native_writer, direct=fast.direct_writes
                )
        else:
            _write.write_snapshot(snapshot, str(tmp), check, io, native=fast.native_writer, direct=fast.direct_writes)
        sync = functools.partial(_writeback.sync_data, tmp, check)
        (_here if io is None else io.call)(sync)  # the long wait for the disk, abandonable


def open_store(logdir: Path, fast: FastPath) -> PlainStore:
    """The store of ``logdir`` for ``fast`` (:data:`~._options.PLAIN`: the plain store)."""
    return PlainStore(logdir) if fast.kind == "plain" else FastStore(logdir, fast)
