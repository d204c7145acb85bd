"""The restore's read-ahead: the kernel reads the data files while TF restores, then stops."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import tensorflow as tf
from pagecache import drop_cached, resident_share

from asupervisor import CheckpointError
from asupervisor._checkpoint import _restore
from asupervisor._checkpoint._manager import Checkpointer

pytestmark = [
    pytest.mark.usefixtures("no_new_threads"),
    pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this OS: no read-ahead"),
]


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
    drop_cached(data)
    assert max(resident_share(p) for p in data) < 0.5  # dropped (a little may be read back at once)
    ahead = _restore._ReadAhead(path)
    assert ahead._thread is not None
    ahead._thread.join()  # every hint given (join() would stop it early)
    deadline = time.monotonic() + 30
    while min(resident_share(p) for p in data) < 0.99:  # the reads the hints started complete
        assert time.monotonic() < deadline, [resident_share(p) for p in data]
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
