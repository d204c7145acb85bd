"""The fast local store: the plain store's protocol with the Linux fast path behind it.

:class:`FastStore` writes with the native bundle writer (:mod:`._bundle`, direct I/O by
:mod:`._direct`), gets the data to disk in abandonable chunks (early writeback, then
``sync_file_range``), does the kernel-heavy work on the idle I/O thread
(:mod:`._idle_io`) and restores with its own reader (:mod:`._direct_restore`). Each
mechanism has its switch in :class:`.._options.FastPath`, read here and nowhere else above
the store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _writeback
from .._options import FastPath
from .._types import Written
from ..plain import _restore, _write
from ..plain._store import PlainStore
from . import _bundle, _direct_restore, _slots
from ._idle_io import IdleIO

if TYPE_CHECKING:
    from ...snapshot._snapshot import Snapshot
    from .._types import IdleIO as AnyIdleIO
    from .._types import NativeWriter

__all__ = ["FastStore"]


class _Reader:
    """The own restore (:mod:`._direct_restore`) as :class:`.._types.DirectReader`."""

    def __init__(self, fast: FastPath) -> None:
        self.fast = fast

    def start(self, prefix: str) -> Any:
        return _direct_restore.start(prefix, direct_reads=self.fast.direct_reads, huge_pages=self.fast.huge_pages)

    def plan(self, checkpoint: Any, match: Any, entries: dict[str, Any]) -> Any:
        return _direct_restore.plan(checkpoint, match, entries)

    def assign(self, planned: Any, values: dict[str, Any]) -> None:
        _direct_restore.assign(planned, values)


def fast_slots(fast: FastPath) -> bool:
    """Whether ``fast`` has the RAM tier's staging files (they need the native writer)."""
    return fast.native_writer and fast.staging_files


class FastStore(PlainStore):
    """The local store with the Linux fast path (see the module docstring).

    Args:
        logdir: the directory.
        fast: which mechanisms of the fast path are on.
        slots: stage snapshots into this many reusable data files of ``logdir``
            (:mod:`._slots`: a RAM file system's; 0: none), with the native writer.
    """

    def __init__(self, logdir: Path, fast: FastPath | None = None, *, slots: int = 0) -> None:
        super().__init__(logdir)
        self.fast = FastPath() if fast is None else fast
        self._reader = _Reader(self.fast) if self.fast.own_restore else None
        self._slots = _slots.Slots(self.logdir, slots) if slots and fast_slots(self.fast) else None

    def write(
        self,
        snapshot: Snapshot,
        tmp: Path,
        check: Callable[[], None],
        io: AnyIdleIO | None = None,
        *,
        durable: bool = True,
        checksums: bool = False,
    ) -> Written:
        """Write ``snapshot`` under ``tmp`` (the native writer, direct I/O where on) and
        get its data to disk in abandonable chunks (early writeback, then
        ``sync_file_range``), the kernel-heavy parts on ``io``'s idle thread.
        ``durable=False``: not to disk (a temporary save, removed right after).
        ``checksums``: the native writer's files' sums, from the bytes it wrote."""
        check()
        slot = None if self._slots is None or not _bundle.checked() else self._slots.claim(snapshot.tensors)
        if slot is not None:  # staged into one of the slots: written where it lies
            assert self._slots is not None
            if all(_bundle.encodable(t, s) for t, s in zip(snapshot.tensors, snapshot.slices)):
                self._slots.write(slot, str(tmp), snapshot.keys, snapshot.tensors, check)
                return Written()
            self._slots.unclaim(slot)
        fast = self.fast
        native: NativeWriter | None = None
        if fast.native_writer:
            native = _bundle
        if fast.early_writeback:
            with _writeback.early_writeback(tmp):
                sums = _write.write_snapshot(
                    snapshot, str(tmp), check, io, native=native, direct=fast.direct_writes, checksums=checksums
                )
        else:
            sums = _write.write_snapshot(
                snapshot, str(tmp), check, io, native=native, direct=fast.direct_writes, checksums=checksums
            )
        if durable:
            sync = functools.partial(_writeback.sync_data, tmp, check)
            if io is None:
                sync()
            else:
                io.call(sync)  # the long wait for the disk, abandonable
        return Written(sums)

    def retire(self, prefix: Path, io: AnyIdleIO | None = None) -> None:
        """Delete a checkpoint retention dropped; a data file that is a slot's becomes
        that free slot again (:meth:`._slots.Slots.reclaim`)."""
        if self._slots is not None:
            self._slots.reclaim(prefix)
        super().retire(prefix, io)

    def remove_partial(self, tmp: Path) -> None:
        """Remove what a failed or abandoned save under ``tmp`` wrote (a slot taken back)."""
        if self._slots is not None:
            self._slots.reclaim(tmp)
        super().remove_partial(tmp)

    def staging(self) -> _slots.Slots | None:
        """The slots snapshots stage into (:mod:`._slots`), if this store has them."""
        return self._slots

    def close(self) -> None:
        """The slots' free files removed and their mappings let go."""
        if self._slots is not None:
            self._slots.close()

    def restore_newest(self, checkpoint: Any, *, strict: bool, basename: str | None) -> _restore.RestoreOutcome:
        """Restore the newest good checkpoint, with the own reader where it is on."""
        return _restore.restore_newest(checkpoint, self.logdir, strict=strict, basename=basename, direct=self._reader)

    def restore_path(self, checkpoint: Any, path: str, *, strict: bool = True) -> None:
        """Restore the checkpoint ``path``, with the own reader where it is on."""
        _restore.restore_path(checkpoint, path, strict=strict, direct=self._reader)

    def idle_io(self, thread: Callable[[], Callable[..., Any]]) -> IdleIO | None:
        """The idle-priority I/O runner over a thread ``thread()`` makes (its ``submit``),
        if that switch is on."""
        return IdleIO(thread()) if self.fast.idle_io else None

    def native_writer_checked(self) -> bool:
        """Whether the native writer has proven itself (staging may be used)."""
        return bool(self.fast.native_writer and _bundle.checked())
