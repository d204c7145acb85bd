"""Staging into the data files themselves: the RAM tier's save as one copy.

A save to a RAM file system costs the bytes twice over the usual way: the step thread
copies the state into staging buffers, then the writer copies the buffers into a new
file, whose pages the kernel must first allocate and zero (~0.4 ms per MiB on the 2-vCPU
VMs measured, 3-4x the copy itself). On a machine whose cores the step already uses,
that work is the training's loss.

:class:`Slots` lends the snapshot buffers that *are* a data file: ``count`` files of the
tier's directory, each mapped into memory for the session, laid out as a tensor bundle's
data file (each stageable value at its own offset, a large one at a 4 KiB boundary). The
step thread's staging copy lands in a free slot's pages; the write (:meth:`Slots.write`)
then only sums the values (the index's CRC32C), writes the few values that were not
staged (the object graph, scalars) after them, writes the index and renames the slot's
file to the checkpoint's data file. When retention drops that checkpoint, its data file
is renamed back to a free slot (:meth:`Slots.reclaim`), pages and mapping kept: the next
save's copy touches memory already there.

States of a slot: *free* (named ``<slots name>-<k>.asv-tmp-slot``, a leftover name the
next start removes after a crash), *staged* (a snapshot holds its buffers), *used* (its
file is a checkpoint's data file, by inode: renames by the commit do not matter). Memory:
``count`` files of the state's size while the session runs (the chooser gives the tier's
``max_to_keep`` + 1); :meth:`Slots.close` removes the free one, so what stays after the
session is the committed checkpoints. A slot whose file was removed by anything else
(its pages would stay mapped) is made new.

A value that does not fit the layout (a shape changed, a variable added) is staged into
ordinary memory and written after the slot's values; the next :meth:`Slots.prepare`
lays the slots out again. Snapshots are staged one at a time, as with
:class:`..snapshot._snapshot.Staging`, whose interface this is.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .... import _tf_internals as internals
from ...._logging import describe, get_logger
from ...snapshot import _snapshot
from .. import _names
from . import _bundle

__all__ = ["Slots"]

log = get_logger(__name__)

FREE, STAGED, WRITING, USED = "free", "staged", "writing", "used"

_VALUE_ALIGN = 64  # a small value's offset in a slot (numpy views want their dtype's alignment)
_PAGE = mmap.PAGESIZE


class _Slot:
    __slots__ = ("base", "fd", "free_path", "key", "layout", "map", "size", "state", "views")

    def __init__(self, free_path: Path) -> None:
        self.free_path = free_path
        self.fd = os.open(free_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        info = os.fstat(self.fd)
        self.key = (info.st_dev, info.st_ino)
        self.state = FREE
        self.map: mmap.mmap | None = None
        self.base = 0  # the mapping's address
        self.size = 0  # bytes mapped (the slot's values end there)
        self.layout: list[tuple[int, tuple[int, ...], np.dtype]] | None = None
        self.views: list[np.ndarray] = []

    def contains(self, array: np.ndarray) -> int | None:
        """``array``'s offset in this slot's mapping, or ``None`` if it lies elsewhere."""
        address = int(array.__array_interface__["data"][0])
        if self.map is not None and self.base <= address and address + array.nbytes <= self.base + self.size:
            return address - self.base
        return None

    def unmap(self) -> None:
        self.views = []
        old, self.map, self.base, self.size = self.map, None, 0, 0
        if old is not None:
            with contextlib.suppress(BufferError):  # a view still held: unmapped when it goes
                old.close()

    def close(self) -> None:
        self.unmap()
        with contextlib.suppress(OSError):
            os.close(self.fd)


class Slots(_snapshot.Staging):
    """``count`` reusable data files of ``directory`` as staging buffers (see the module
    docstring). The step thread stages into them (:meth:`begin`, :meth:`buffer`,
    :meth:`end`); the writer thread lays them out (:meth:`prepare`), writes (:meth:`write`)
    and gets them back (:meth:`reclaim`)."""

    def __init__(self, directory: Path, count: int, name: str = "asupervisor-slot") -> None:
        super().__init__()
        self.directory = Path(directory)
        self.count = count
        self.name = name
        self._slots: list[_Slot] = []
        self._layout: list[tuple[int, tuple[int, ...], np.dtype]] | None = None
        self._layout_size = 0
        self._current: _Slot | None = None
        self.stale = False  # a value did not fit the layout: prepare() lays it out again
        self.closed = False

    # -- the step thread -------------------------------------------------------------

    def ready(self) -> bool:
        """Whether a snapshot taken now would be staged here (step thread: only it begins)."""
        with self._lock:
            return not self._busy and self._pick() is not None

    def _pick(self) -> _Slot | None:
        for slot in self._slots:
            if slot.state == FREE and slot.layout is not None and slot.layout is self._layout:
                return slot
        return None

    def begin(self) -> bool:
        """Take a free, laid-out slot for a new snapshot; ``False`` if there is none now."""
        with self._lock:
            if self._busy or self.closed:
                return False
            slot = self._pick()
            if slot is None:
                return False
            self._busy = True
            slot.state = STAGED
            self._current = slot
            return True

    def buffer(self, index: int, like: np.ndarray) -> np.ndarray:
        """Value ``index``'s place in the slot taken; ordinary memory if it does not fit
        the layout (written after the slot's values, and the slots laid out again)."""
        slot = self._current
        if slot is not None and index < len(slot.views):
            view = slot.views[index]
            if view.shape == like.shape and view.dtype == like.dtype:
                return view
        self.stale = True
        return np.empty(like.shape, like.dtype)

    def release(self) -> Callable[[], None]:
        """The call freeing the slot just taken once its snapshot is gone, unless a write
        made it a checkpoint's (:meth:`write` lets the next snapshot stage before then)."""
        slot = self._current
        return lambda: self._end(slot)

    def end(self) -> None:
        """The slot taken last given back (see :meth:`release`)."""
        self._end(self._current)

    def _end(self, slot: _Slot | None) -> None:
        with self._lock:
            if slot is not None and slot.state == STAGED:
                slot.state = FREE
            if self._current is slot:
                self._current = None
                self._busy = False

    # -- the writer thread -----------------------------------------------------------

    def prepare(self, tensors: list[Any], stopping: Callable[[], bool] | None = None) -> bool:
        """After a RAM save: the layout taken from ``tensors`` (the values of a snapshot
        that was not staged here, or one that did not fit) and the free slots laid out,
        their pages touched now rather than by the step thread's copy. ``False``: nothing
        done (a snapshot holds a slot, or ``stopping()``)."""
        staged_here = any(self._holder_of(t) is not None for t in tensors)
        with self._lock:
            if self._busy or self.closed:
                return False
            if not staged_here or self.stale or self._layout is None:
                self._relayout(tensors)
            self._reclaim_removed()
            while len(self._slots) < self.count:
                self._slots.append(_Slot(self.directory / f"{self.name}-{len(self._slots)}{_names.TMP_MARKER}slot"))
            todo = [s for s in self._slots if s.state == FREE and s.layout is not self._layout]
            self._busy = True  # nothing stages while the mappings change
        try:
            for slot in todo:
                if stopping is not None and stopping():
                    return False
                self._lay_out(slot)
            self.prepared = self._layout is not None and bool(self._layout)
        except OSError as exc:  # no room on the RAM file system: the usual writes (which say so)
            log.warning("checkpoint.ram_slots_off", dir=str(self.directory), error=describe(exc))
            with self._lock:
                self._busy = False
            self.close()
            return False
        finally:
            with self._lock:
                self._busy = False
        return True

    def _holder_of(self, tensor: Any) -> _Slot | None:
        if not isinstance(tensor, _snapshot.Staged):
            return None
        for slot in self._slots:
            if slot.contains(tensor.array) is not None:
                return slot
        return None

    def _relayout(self, tensors: Sequence[Any]) -> None:
        layout: list[tuple[int, tuple[int, ...], np.dtype]] = []
        offset = 0
        for tensor in tensors:
            if isinstance(tensor, _snapshot.Staged):
                like = tensor.array
            elif _snapshot._stageable(tensor):
                like = internals.numpy_view(tensor)
            else:
                continue
            offset = _bundle.slot_offset(offset, like.nbytes, _VALUE_ALIGN)
            layout.append((offset, tuple(like.shape), like.dtype))
            offset += like.nbytes
        size = offset + (-offset % _PAGE)
        if self._layout is None or [(o, s, d) for o, s, d in layout] != [(o, s, d) for o, s, d in self._layout]:
            self._layout = layout
            self._layout_size = size
            self.nbytes = size * self.count
            log.info("checkpoint.ram_slots", slots=self.count, bytes_each=size, values=len(layout))
        self.stale = False

    def _lay_out(self, slot: _Slot) -> None:
        """Map ``slot`` at the layout's size and touch its pages (writer thread, off the lock:
        a free slot is no one else's)."""
        layout, size = self._layout, self._layout_size
        assert layout is not None
        if slot.map is None or slot.size != size:
            slot.unmap()
            os.ftruncate(slot.fd, size)
            if size:
                # the pages reserved now: a full file system is an error here, where a
                # page touched through the mapping would be a SIGBUS
                os.posix_fallocate(slot.fd, 0, size)
                slot.map = mmap.mmap(slot.fd, size)
                whole = np.frombuffer(slot.map, np.uint8)
                whole[::_PAGE] = 0  # the pages allocated now, not in the step thread's copy
                slot.base = int(whole.__array_interface__["data"][0])
                slot.size = size
                del whole
        mapping = slot.map
        slot.views = (
            []
            if mapping is None
            else [np.ndarray(shape, dtype, buffer=mapping, offset=o) for o, shape, dtype in layout]
        )
        slot.layout = layout

    def _reclaim_removed(self) -> None:
        """A used slot whose file is gone (removed by other code than :meth:`reclaim`) is
        made new: its pages would stay mapped for nothing (under the lock)."""
        for i, slot in enumerate(self._slots):
            if slot.state != USED:
                continue
            try:
                gone = os.fstat(slot.fd).st_nlink == 0
            except OSError:
                gone = True
            if gone:
                slot.close()
                self._slots[i] = _Slot(slot.free_path)

    def claim(self, tensors: Sequence[Any]) -> _Slot | None:
        """The slot a snapshot of ``tensors`` staged into, now being written; ``None``: none."""
        with self._lock:
            slot = self._current
            if slot is None or slot.state != STAGED:
                return None
            if not any(isinstance(t, _snapshot.Staged) and slot.contains(t.array) is not None for t in tensors):
                return None
            slot.state = WRITING
            return slot

    def unclaim(self, slot: _Slot) -> None:
        """A claimed slot not written after all (the snapshot is written the usual way)."""
        with self._lock:
            if slot.state == WRITING:
                slot.state = STAGED

    def write(
        self, slot: _Slot, prefix: str, keys: Sequence[str], tensors: Sequence[Any], check: Callable[[], None]
    ) -> None:
        """The checkpoint ``prefix`` from ``slot`` (claimed): the values not in it written
        after its own, its file renamed to the data file, the index written. On an error
        before the rename the slot is the snapshot's again (freed with it)."""
        renamed = False
        try:

            def offset_of(tensor: Any) -> int | None:
                return slot.contains(tensor.array) if isinstance(tensor, _snapshot.Staged) else None

            end, entries = _bundle.write_data_over(
                keys, tensors, slot.fd, str(slot.free_path), offset_of, slot.size, check
            )
            if os.fstat(slot.fd).st_size != end:
                os.ftruncate(slot.fd, end)  # a longer tail of an earlier save cut off
            check()
            os.rename(slot.free_path, _bundle.data_path(prefix, 0, 1))
            renamed = True
            _bundle.write_index_file(f"{prefix}.index", _bundle.index_bytes(entries, 1))
        finally:
            with self._lock:
                if renamed:  # a checkpoint's now: the next snapshot may stage (another slot)
                    slot.state = USED
                    if self._current is slot:
                        self._current = None
                        self._busy = False
                elif slot.state == WRITING:
                    slot.state = STAGED

    def reclaim(self, prefix: Path) -> None:
        """Before the checkpoint ``prefix`` is deleted (retention, a failed save): a data
        file of it that is a slot's is renamed back to that free slot."""
        for path in _names.checkpoint_files(prefix):
            self._take_back(path)
        parent = prefix.parent
        with contextlib.suppress(OSError):
            for entry in os.listdir(parent):
                if entry.startswith(f"{prefix.name}.data-"):
                    self._take_back(parent / entry)

    def _take_back(self, path: Path) -> None:
        try:
            info = os.lstat(path)
        except OSError:
            return
        with self._lock:
            for slot in self._slots:
                if slot.key == (info.st_dev, info.st_ino) and slot.state in (USED, WRITING):
                    os.rename(path, slot.free_path)
                    slot.state = FREE if slot.state == USED else STAGED
                    return

    def close(self) -> None:
        """At the session's end: the free slots' files removed (their memory given back),
        every mapping let go; the checkpoints' files stay."""
        with self._lock:
            self.closed = True
            slots, self._slots = self._slots, []
        for slot in slots:
            if slot.state != USED:
                with contextlib.suppress(OSError):
                    os.unlink(slot.free_path)
            slot.close()
