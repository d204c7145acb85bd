"""Writing a checkpoint's data files with direct I/O (``O_DIRECT``), past the page cache.

A buffered write copies every byte into the page cache first, and page-cache memory is
allocated on the spot. On the VMs measured (Firecracker, Linux 6.18, DAMON paging out
cold page cache, free memory returned to the host) that allocation swings: a 512 MB
buffered write + fsync took 0.25 s in some rounds and 0.6-1.5 s in others, as the pages
came from memory the host had taken back (~2 ms per MiB to touch again). A direct write
goes from the process's own memory to the disk: 0.18-0.24 s for the same 512 MB, every
round, and no page cache is filled with a checkpoint nobody reads until a restart.

Direct I/O wants the memory address, the file offset and the length aligned to the
device's block (:data:`ALIGN`, 4 KiB, covers 512-byte and 4 KiB sectors). So
:class:`AlignedStream` lays the tensors out as the bundle format allows (each index
entry has its own offset): small tensors back to back through a reused aligned *bounce*
buffer; a large one at the next aligned offset (:func:`placed_at`, in every data file,
buffered ones too: a restore reads it from there with direct I/O), the few bytes before
it zero padding (TensorFlow's own writer pads the same way with its ``data_alignment``
option), written from its own memory if that is aligned (the staging buffers,
:func:`aligned_empty`), else through the bounce buffer. The file is truncated to its
last byte at the end.

A filesystem that refuses ``O_DIRECT`` (an errno of :data:`REFUSALS` when opening or
writing: ``EINVAL`` from tmpfs on older kernels and some FUSE filesystems,
``EOPNOTSUPP``/``ENOSYS`` from network and overlay filesystems) raises :class:`DirectRefused`; the
caller writes the file buffered instead, and :func:`refused` remembers the device for
the process. Plain file work for the checkpoint writer thread; never the event loop.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "ALIGN",
    "REFUSALS",
    "AlignedStream",
    "DirectRefused",
    "aligned_empty",
    "is_refusal",
    "open_direct",
    "placed_at",
    "refused",
    "wanted",
]

#: The alignment of addresses, offsets and lengths of direct writes.
ALIGN = 4096

#: Data files smaller than this are written buffered: a 16 MB file took ~1 ms longer direct
#: (each direct write waits for the disk) and buffered writes that small did not swing.
DIRECT_FILE_MIN_BYTES = 32 << 20

#: Tensors at least this large, in aligned memory, are written from their own memory.
DIRECT_MIN_BYTES = 1 << 20

#: One direct ``pwrite``: large enough to keep the disk busy (8 MiB wrote 512 MB in
#: 0.75x the time of 1 MiB pieces here), small enough to check a save's abandon flag often.
DIRECT_PIECE = 8 << 20

_BOUNCE_BYTES = 8 << 20

# Switch for A/B benchmarks and tests: False writes every data file buffered.
ENABLED = hasattr(os, "O_DIRECT") and sys.platform.startswith("linux")

#: The errnos by which a filesystem says "no direct I/O here" (any other is a real error)
REFUSALS = frozenset(
    e for e in (errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", None), errno.ENOSYS) if e is not None
)

_refused_devices: set[int] = set()
# Bounce buffers, reused (fresh memory is slow to touch here): one per data file being
# written at the same time (at most the writer's shards, 4), kept for the process.
_pool: list[np.ndarray] = []
_pool_lock = threading.Lock()


class DirectRefused(Exception):
    """The filesystem does not take direct writes: write the file buffered."""


def is_refusal(exc: OSError) -> bool:
    """Whether ``exc`` is a filesystem refusing direct I/O (an errno of :data:`REFUSALS`)."""
    return exc.errno in REFUSALS


def aligned_empty(shape: Any, dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous array whose memory starts at an :data:`ALIGN` boundary
    (its last partial block is written through the bounce buffer, so nothing past it is read)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    aligned: np.ndarray = raw[start : start + nbytes].view(dtype).reshape(shape)
    return aligned


def placed_at(offset: int, nbytes: int) -> int:
    """Where a tensor of ``nbytes`` goes in a data file whose next free byte is ``offset``:
    a large one (:data:`DIRECT_MIN_BYTES` or more) at the next :data:`ALIGN` boundary, so
    that a restore can read it with direct I/O straight into its array (the bundle format
    allows the gap: each index entry has its own offset; TensorFlow's writer pads the same
    way with its ``data_alignment`` option); a small one right there."""
    return offset + (-offset % ALIGN if nbytes >= DIRECT_MIN_BYTES else 0)


def wanted(directory: str, nbytes: int) -> bool:
    """Whether a data file of ``nbytes`` in ``directory`` is to be written with direct I/O."""
    return nbytes >= DIRECT_FILE_MIN_BYTES and not refused(directory)


def refused(directory: str) -> bool:
    """Whether direct writes are off for ``directory``'s filesystem (switched off, or it refused them)."""
    if not ENABLED:
        return True
    try:
        return os.stat(directory).st_dev in _refused_devices
    except OSError:
        return True


def open_direct(path: str) -> int:
    """Create ``path`` for direct writes; :class:`DirectRefused` if its filesystem says no."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_DIRECT, 0o644)
    except OSError as exc:
        if is_refusal(exc):
            _refuse(path)
        raise


def _refuse(path: str) -> None:
    try:
        _refused_devices.add(os.stat(os.path.dirname(path) or ".").st_dev)
    except OSError:
        pass
    raise DirectRefused(path)


def _take_bounce() -> np.ndarray:
    with _pool_lock:
        if _pool:
            return _pool.pop()
    buf = aligned_empty((_BOUNCE_BYTES,), np.uint8)
    buf[::ALIGN] = 0  # touched once, here
    return buf


class AlignedStream:
    """Tensors' bytes appended to a file opened by :func:`open_direct`, every write aligned.

    Args:
        fd: the file.
        path: its name (for :class:`DirectRefused`).
        write: ``write(fd, data, offset, chunk)`` writes the buffer ``data`` (aligned) at
            ``offset`` in pieces of at most ``chunk`` bytes (the caller's abandon checks
            and idle-priority thread go there).

    :attr:`offset` is where the next appended byte lands. Use as a context manager: the
    bounce buffer goes back to the pool at the end.
    """

    def __init__(self, fd: int, path: str, write: Callable[[int, Any, int, int], None]) -> None:
        self.fd = fd
        self.path = path
        self._write = write
        self.offset = 0
        self._bounce = _take_bounce()
        self._fill = 0  # bytes of the bounce buffer in use; it starts at offset - fill (aligned)

    def __enter__(self) -> AlignedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        with _pool_lock:
            _pool.append(self._bounce)

    def _put(self, data: Any, offset: int) -> None:
        try:
            self._write(self.fd, data, offset, DIRECT_PIECE)
        except OSError as exc:
            if is_refusal(exc):  # the filesystem took the open but not the write
                _refuse(self.path)
            raise

    def _flush(self) -> None:
        """Write the bounce buffer's whole blocks (zero padded to a block)."""
        fill = self._fill
        if not fill:
            return
        padded = -(-fill // ALIGN) * ALIGN
        self._bounce[fill:padded] = 0
        self._put(self._bounce[:padded], self.offset - fill)
        self._fill = 0

    def append(self, data: Any) -> None:
        """Append the bytes of ``data`` (a buffer) through the bounce buffer."""
        view = (
            np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
        )
        done = 0
        while done < view.nbytes:
            n = min(view.nbytes - done, _BOUNCE_BYTES - self._fill)
            self._bounce[self._fill : self._fill + n] = view[done : done + n]
            self._fill += n
            self.offset += n
            done += n
            if self._fill == _BOUNCE_BYTES:
                self._flush()

    def append_array(self, array: np.ndarray) -> int:
        """Append a tensor's bytes (a C-contiguous ``uint8`` view); the offset it starts at.

        A large one starts at the next block (:func:`placed_at`), where a restore can read
        it with direct I/O; in aligned memory it is written from its own memory (its last
        partial block through the bounce buffer), else through the bounce buffer."""
        nbytes = array.nbytes
        if nbytes < DIRECT_MIN_BYTES:
            start = self.offset
            self.append(array)
            return start
        pad = placed_at(self.offset, nbytes) - self.offset  # zeros, in the bounce buffer's last block
        self._bounce[self._fill : self._fill + pad] = 0
        self._fill += pad
        self.offset += pad
        start = self.offset
        if array.ctypes.data % ALIGN:
            self.append(array)
            return start
        self._flush()
        whole = nbytes // ALIGN * ALIGN
        self._put(array[:whole], start)
        self.offset += whole
        self.append(array[whole:])
        return start

    def close(self) -> int:
        """Write what is left and cut the file at its last byte; the file's size."""
        self._flush()
        os.ftruncate(self.fd, self.offset)
        return self.offset
