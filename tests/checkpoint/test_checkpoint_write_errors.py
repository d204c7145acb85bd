"""Write errors say where and leave nothing behind; a save can be abandoned; the logdir is
proved writable at start-up."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf
from _timing import scaled

import asupervisor as asv
from asupervisor._checkpoint._manager import Checkpointer
from asupervisor._checkpoint.store import SaveAbandoned, _commit, _names
from asupervisor._checkpoint.store.plain import _write

pytestmark = pytest.mark.usefixtures("checkpoint_store")  # a promise test: both stores


def make_checkpoint(n: int = 1 << 20) -> Any:
    return tf.train.Checkpoint(big=tf.Variable(tf.ones([n])), global_step=tf.Variable(0, dtype=tf.int64))


def listing(logdir: Path) -> list[str]:
    return sorted(os.listdir(logdir))


def temp_leftovers(logdir: Path) -> list[str]:
    return [n for n in listing(logdir) if _names.TMP_MARKER in n or n.endswith("_temp")]


def test_abandoned_write_removes_its_files_and_keeps_the_latest(tmp_path: Path) -> None:
    """A write abandoned (the stop's deadline) raises SaveAbandoned, removes every file it
    wrote, and the previous checkpoint stays the latest."""
    ckpt = make_checkpoint()
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    first = checkpointer.snapshot(1)
    assert first is not None
    checkpointer.write(first)
    snap = checkpointer.snapshot(2)
    assert snap is not None
    checkpointer.abandon()
    with pytest.raises(SaveAbandoned):
        checkpointer.write(snap)
    assert temp_leftovers(tmp_path) == []
    assert not (tmp_path / "model.ckpt-2.index").exists()
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-1")


@pytest.mark.fast_store
def test_abandon_between_chunks_stops_a_large_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundle writer checks the abandon flag between chunks: abandoned after its first
    chunk, a 64 MB write stops there and its partial files are removed."""
    from asupervisor._checkpoint.store.fast import _idle_io

    assert _idle_io.CHUNK_BYTES == 1 << 20
    ckpt = make_checkpoint(16 << 20)
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    snap = checkpointer.snapshot(1)
    assert snap is not None
    writes: list[int] = []
    real_pwrite = os.pwrite

    def counting_pwrite(fd: int, data: Any, offset: int) -> int:
        writes.append(len(data))
        if len(writes) == 2:
            checkpointer.abandon()
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(_idle_io.os, "pwrite", counting_pwrite)
    with pytest.raises(SaveAbandoned):
        checkpointer.write(snap)
    assert len(writes) == 2  # not the 64 chunks of the whole tensor
    assert temp_leftovers(tmp_path) == []
    assert tf.train.latest_checkpoint(str(tmp_path)) is None


def _fail_writes_after(monkeypatch: pytest.MonkeyPatch, module: Any, count: int, err: int = errno.ENOSPC) -> None:
    real_pwrite = os.pwrite
    calls = [0]

    def pwrite(fd: int, data: Any, offset: int) -> int:
        calls[0] += 1
        if calls[0] > count:
            raise OSError(err, os.strerror(err))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(module.os, "pwrite", pwrite)


@pytest.mark.fast_store
def test_write_error_names_the_file_and_cause_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data write failing with ENOSPC is a CheckpointError naming the file and "No space
    left on device", chained to the OSError; the failed save leaves no file behind."""
    from asupervisor._checkpoint.store.fast import _bundle

    ckpt = make_checkpoint()
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    first = checkpointer.snapshot(1)
    assert first is not None
    checkpointer.write(first)
    before = listing(tmp_path)
    snap = checkpointer.snapshot(2)
    assert snap is not None
    _fail_writes_after(monkeypatch, _bundle, 0)
    with pytest.raises(asv.CheckpointError) as info:
        checkpointer.write(snap)
    message = str(info.value)
    assert "No space left on device" in message
    assert f"{tmp_path}/model.ckpt-2.asv-tmp-" in message and ".data-00000-of-00001" in message
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert listing(tmp_path) == before
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-1")


@pytest.mark.fast_store
def test_mixed_write_error_removes_the_temp_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save of plain tensors plus a tf.data iterator (two bundles under <tmp>_temp/ then
    merged) that fails midway leaves neither its files nor its _temp directory."""
    ds = tf.data.Dataset.range(10)
    iterator = iter(ds)
    ckpt = tf.train.Checkpoint(v=tf.Variable(tf.ones([1000])), it=iterator, global_step=tf.Variable(0, dtype=tf.int64))
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    snap = checkpointer.snapshot(1)
    assert snap is not None

    parts: list[str] = []

    def failing_save_v2(snapshot: Any, prefix: str, groups: Any) -> None:
        parts.append(prefix)  # the plain tensors are already under <tmp>_temp/part-00000-...
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), prefix)

    monkeypatch.setattr(_write, "_save_v2", failing_save_v2)
    with pytest.raises(asv.CheckpointError, match="No space left on device"):
        checkpointer.write(snap)
    assert parts and "_temp/part-00001" in parts[0]
    assert temp_leftovers(tmp_path) == []


def test_state_file_write_error_removes_its_temporary_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure writing the state file's temporary copy (checkpoint.asv-tmp-<pid>) removes
    it, and the whole save, and names that file."""
    ckpt = make_checkpoint(1000)
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    snap = checkpointer.snapshot(1)
    assert snap is not None
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"checkpoint{_names.TMP_MARKER}{os.getpid()}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(_commit.os, "fsync", fsync)
    with pytest.raises(asv.CheckpointError, match=f"checkpoint{_names.TMP_MARKER}{os.getpid()}: No space left"):
        checkpointer.write(snap)
    assert temp_leftovers(tmp_path) == []
    assert tf.train.latest_checkpoint(str(tmp_path)) is None
    assert not [n for n in listing(tmp_path) if n.startswith("model.ckpt-1")]


def _limit_file_size() -> None:  # in the child, before exec
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_file_size_limit_in_a_child_fails_with_a_clear_error(tmp_path: Path) -> None:
    """A child under RLIMIT_FSIZE (2 MB) saving a 4 MB state: the save fails with a
    CheckpointError on stderr naming the file and "File too large"; no temporary file is
    left."""
    code = (
        "import sys, anyio, tensorflow as tf, asupervisor as asv\n"
        "state = {'big': tf.Variable(tf.ones([1 << 20]))}\n"
        "sv = asv.Supervisor(sys.argv[1], state=state, save_summaries_secs=0, handle_signals=False)\n"
        "async def main():\n"
        "    async with sv.managed_session() as sess:\n"
        "        await sv.save_now()\n"
        "anyio.run(main)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        preexec_fn=_limit_file_size,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert out.returncode != 0
    assert "CheckpointError" in out.stderr and "File too large" in out.stderr
    assert f"{tmp_path}/model.ckpt-0" in out.stderr
    assert temp_leftovers(tmp_path) == []


@pytest.mark.anyio
async def test_unwritable_logdir_fails_the_start_before_any_step(tmp_path: Path) -> None:
    """A logdir that is a path under a regular file cannot be created: managed_session()
    entry raises CheckpointError naming the path and the cause, before any step runs."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    steps: list[int] = []
    sv = asv.Supervisor(blocker / "run", state={"w": tf.Variable(0.0)}, save_summaries_secs=0, handle_signals=False)
    with pytest.raises(asv.CheckpointError, match="Not a directory") as info:
        async with sv.managed_session() as sess:
            await sess.run(lambda: steps.append(1))
    assert str(blocker / "run") in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert steps == []
