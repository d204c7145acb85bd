"""Data files written with direct I/O: past the page cache, laid out for it, read back by TF;
a filesystem that refuses it gets the same checkpoint written buffered."""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from pagecache import drop_cached, resident_share

from asupervisor._checkpoint._manager import Checkpointer
from asupervisor._checkpoint.snapshot._iterator_state import index_entries
from asupervisor._checkpoint.snapshot._snapshot import Staged
from asupervisor._checkpoint.store.fast import _bundle, _direct


def _takes_direct_io(directory: str) -> bool:
    probe = tempfile.mktemp(prefix="asv-direct-probe-", dir=directory)
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600))
    except (OSError, AttributeError):
        return False
    os.unlink(probe)
    return True


def _page_cache_drops(directory: str) -> bool:
    """Whether files there live in a page cache that a synced file's pages leave (not tmpfs)."""
    with tempfile.NamedTemporaryFile(dir=directory) as f:
        f.write(b"x" * (64 << 10))
        f.flush()
        os.fsync(f.fileno())
        drop_cached([f.name])
        return resident_share(f.name) == 0.0


TMP = tempfile.gettempdir()
DIRECT = _direct.ENABLED and _takes_direct_io(TMP)
pytestmark = pytest.mark.usefixtures("no_new_threads")
needs_direct = pytest.mark.skipif(not DIRECT, reason=f"{TMP}'s filesystem (or this OS) takes no O_DIRECT writes")


def _variables() -> dict[str, tf.Variable]:
    """The state: tensors in every alignment and size class, a data file written direct."""
    return {
        "odd": tf.Variable(tf.random.uniform([(1 << 18) + 3], seed=1)),  # 1 MiB + 12 bytes
        "whole": tf.Variable(tf.random.uniform([_direct.DIRECT_FILE_MIN_BYTES // 4], seed=2)),  # a direct-sized file
        "half": tf.Variable(tf.cast(tf.random.uniform([700_001], seed=3), tf.bfloat16)),
        "small": tf.Variable(tf.range(10, dtype=tf.float32)),
        "count": tf.Variable(7, dtype=tf.int64),
        "empty": tf.Variable(tf.zeros([0, 3])),
    }


def _two_saves(logdir: Path) -> tuple[dict[str, tf.Variable], list[Any], dict[str, np.ndarray]]:
    """Step 1 (copy-on-write reads: through the bounce buffer), then step 2 (staged)."""
    variables = _variables()
    ckpt = tf.train.Checkpoint(**variables)
    checkpointer = Checkpointer(ckpt, logdir, staging=True)
    checkpointer.prepare()
    snapshots = []
    for step in (1, 2):
        for v in variables.values():
            if v.shape.rank and v.shape.num_elements():
                v.assign(v + tf.ones_like(v))
        snap = checkpointer.snapshot(step)
        assert snap is not None
        snapshots.append([type(t) for t in snap.tensors])
        checkpointer.write(snap)
        checkpointer.prepare_next(snap)  # as the writer thread does after a save
        del snap
    return variables, snapshots, {k: v.numpy() for k, v in variables.items()}


def _restored(prefix: Path) -> dict[str, np.ndarray]:
    fresh = {k: tf.Variable(tf.zeros_like(v)) for k, v in _variables().items()}
    tf.train.Checkpoint(**fresh).restore(str(prefix)).assert_existing_objects_matched()
    return {k: v.numpy() for k, v in fresh.items()}


@needs_direct
def test_staged_tensors_are_written_aligned_from_their_buffers_and_read_back(tmp_path: Path) -> None:
    """The staged save writes each large tensor at a 4 KiB boundary (zero padding before it,
    as TF's own ``data_alignment`` does) and TensorFlow restores every value of both saves."""
    _, kinds, values = _two_saves(tmp_path)
    assert Staged not in kinds[0] and Staged in kinds[1]
    entries = index_entries(str(tmp_path / "model.ckpt-2"))
    big = [key for key, e in entries.items() if e.size >= _direct.DIRECT_MIN_BYTES]
    assert len(big) == 3, entries.keys()
    assert all(entries[key].offset % _direct.ALIGN == 0 for key in big)
    unaligned = sorted(e.offset + e.size for e in entries.values() if e.offset % _direct.ALIGN)
    assert unaligned, "small tensors are packed back to back, not padded"
    data = tmp_path / "model.ckpt-2.data-00000-of-00001"
    assert data.stat().st_size == max(e.offset + e.size for e in entries.values())  # cut at the last byte
    got = _restored(tmp_path / "model.ckpt-2")
    for key, want in values.items():
        assert got[key].dtype == want.dtype and np.array_equal(got[key], want), key
    first = _restored(tmp_path / "model.ckpt-1")
    assert not np.array_equal(first["odd"], values["odd"])
    np.testing.assert_array_equal(first["odd"] + 1, values["odd"])


@pytest.mark.skipif(not DIRECT or not _page_cache_drops(TMP), reason=f"{TMP} keeps files in memory (tmpfs)")
def test_a_save_leaves_the_page_cache_alone(tmp_path: Path) -> None:
    """Both saves' data go past the page cache: none of their pages is cached after the
    commit, where a buffered write of the same bytes is cached whole."""
    _two_saves(tmp_path)
    files = sorted(str(p) for p in tmp_path.glob("model.ckpt-*.data-*"))
    assert len(files) == 2
    assert [resident_share(f) for f in files] == [0.0, 0.0]
    control = tmp_path / "buffered"
    control.write_bytes(Path(files[1]).read_bytes())
    assert resident_share(str(control)) == 1.0


@pytest.mark.skipif(not _direct.ENABLED, reason="this OS has no O_DIRECT: the fast store is never chosen here")
@pytest.mark.parametrize("code", ["EINVAL", "EOPNOTSUPP", "ENOSYS"])
@pytest.mark.parametrize("refused_at", ["open", "write"])
def test_a_filesystem_refusing_direct_io_gets_buffered_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused_at: str, code: str
) -> None:
    """A refusal of ``O_DIRECT`` by any errno that means "not supported here" (at the
    open, or at the first write as some FUSE filesystems do): the file is written again
    buffered, the filesystem is remembered (no second try), the checkpoints restore, and
    nothing is left over. Runs on every Linux host, whether or not its own filesystem
    takes direct I/O (the refusal is injected at the system call)."""
    refusal = getattr(errno, code)
    _bundle.self_check()  # its own bundle (in the same temporary filesystem) is written before the fault
    monkeypatch.setattr(_direct, "_refused_devices", set())
    real_open, real_pwrite = os.open, os.pwrite
    tries: list[str] = []

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_DIRECT and str(path).startswith(str(tmp_path)):
            tries.append(str(path))
            if refused_at == "open":
                raise OSError(refusal, os.strerror(refusal), str(path))
        return real_open(path, flags, *args, **kwargs)

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if refused_at == "write" and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(refusal, os.strerror(refusal))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "pwrite", pwrite)
    _, _, values = _two_saves(tmp_path)
    assert len(tries) == 1  # the second save knew
    assert _direct.refused(str(tmp_path))
    entries = index_entries(str(tmp_path / "model.ckpt-2"))
    layout = sorted((e.offset, e.size) for e in entries.values())
    placed, end = [], 0
    for _, size in layout:
        placed.append(_direct.placed_at(end, size))
        end = placed[-1] + size
    assert [offset for offset, _ in layout] == placed  # back to back, a large one at the next block
    assert any(size >= _direct.DIRECT_MIN_BYTES for _, size in layout)
    got = _restored(tmp_path / "model.ckpt-2")
    for key, want in values.items():
        assert np.array_equal(got[key], want), key
    assert sorted(p.name for p in tmp_path.iterdir() if "tmp" in p.name or "temp" in p.name) == []


@needs_direct
@pytest.mark.anyio
async def test_a_session_saves_direct_and_resumes_exactly(tmp_path: Path) -> None:
    """Through a real session (the background writer and its idle-priority I/O thread):
    step saves of a 40 MB state are written direct (none of their pages cached where the
    page cache is real) and a second session resumes the last step's values exactly.
    (Whether a save's large tensor sits at an aligned offset depends on whether it was
    staged, which the writer's pace decides here: the layout is tested above.)"""
    import asupervisor as asv

    def make() -> dict[str, tf.Variable]:
        return {"w": tf.Variable(tf.zeros([10 << 20])), "b": tf.Variable(tf.zeros([3]))}

    state = make()

    def step() -> None:
        state["w"].assign_add(tf.ones([10 << 20]))
        state["b"].assign_add(tf.ones([3]))

    def supervisor(state: dict[str, tf.Variable]) -> asv.Supervisor:
        return asv.Supervisor(
            tmp_path, state=state, save_model_secs=0, save_model_steps=4, save_summaries_secs=0, handle_signals=False
        )

    async with supervisor(state).managed_session() as sess:
        await sess.run_loop(step, max_steps=12)
    assert index_entries(str(tmp_path / "model.ckpt-12"))["w/.ATTRIBUTES/VARIABLE_VALUE"].size == 40 << 20
    if _page_cache_drops(TMP):
        data = sorted(str(p) for p in tmp_path.glob("model.ckpt-12.data-*"))
        assert data and all(resident_share(p) == 0.0 for p in data)
    resumed = make()
    async with supervisor(resumed).managed_session() as sess:
        assert sess.global_step == 12
    assert resumed["w"].numpy().min() == resumed["w"].numpy().max() == 12.0
    assert resumed["b"].numpy().tolist() == [12.0] * 3
