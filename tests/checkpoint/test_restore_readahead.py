"""The restore's read-ahead: the kernel reads the data files while TF restores, then stops."""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

import pytest
import tensorflow as tf

from asupervisor import CheckpointError
from asupervisor._checkpoint import _restore
from asupervisor._checkpoint._manager import Checkpointer

pytestmark = [
    pytest.mark.usefixtures("no_new_threads"),
    pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this OS: no read-ahead"),
]


def _resident_share(path: str) -> float:
    """The share of ``path``'s pages in the page cache (``mincore`` on a private mapping,
    which reports the file's cached pages and changes nothing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        anchor = ctypes.c_char.from_buffer(mm)
        try:
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore({path})")
        finally:
            del anchor  # the mapping cannot close while exported
    return sum(v & 1 for v in vec) / pages


def _drop(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _saved(tmp_path: Path) -> tuple[tf.train.Checkpoint, str, list[str]]:
    """A committed 24 MB checkpoint (synced: its pages are clean, so they can be dropped)."""
    ckpt = tf.train.Checkpoint(a=tf.Variable(tf.random.uniform([4 << 20])), b=tf.Variable(tf.random.uniform([2 << 20])))
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    snap = checkpointer.snapshot(1)
    assert snap is not None
    path = checkpointer.write(snap).path
    data = sorted(str(p) for p in tmp_path.glob(Path(path).name + ".data-*"))
    return ckpt, path, data


def test_the_data_files_are_read_ahead_into_the_page_cache(tmp_path: Path) -> None:
    """Dropped from the cache, the data files come back into it through the read-ahead
    alone (no read by anyone): the kernel was asked to read them."""
    _, path, data = _saved(tmp_path)
    _drop(data)
    assert max(_resident_share(p) for p in data) < 0.5  # dropped (a little may be read back at once)
    ahead = _restore._ReadAhead(path)
    assert ahead._thread is not None
    ahead._thread.join()  # every hint given (join() would stop it early)
    deadline = time.monotonic() + 30
    while min(_resident_share(p) for p in data) < 0.99:  # the reads the hints started complete
        assert time.monotonic() < deadline, [_resident_share(p) for p in data]
        time.sleep(0.01)
    ahead.join()


def test_no_read_ahead_for_data_larger_than_half_the_free_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, path, data = _saved(tmp_path)
    total = sum(os.path.getsize(p) for p in data)
    monkeypatch.setattr(_restore, "_available_memory", lambda: 2 * total - 1)
    assert _restore._ReadAhead(path)._thread is None
    monkeypatch.setattr(_restore, "_available_memory", lambda: 2 * total)
    ahead = _restore._ReadAhead(path)
    assert ahead._thread is not None
    ahead.join()


def test_a_failed_restore_stops_the_read_ahead(tmp_path: Path) -> None:
    """Another model's checkpoint: the CheckpointError comes before anything is restored,
    and no read-ahead thread outlives it (the module's no_new_threads fixture)."""
    ckpt, path, _ = _saved(tmp_path)
    other = tf.train.Checkpoint(a=tf.Variable(tf.zeros([3])), b=tf.Variable(tf.zeros([2 << 20])))
    with pytest.raises(CheckpointError, match="a/"):
        _restore.restore_path(other, path)
    _restore.restore_path(ckpt, path)  # and the right model restores, read-ahead and all
