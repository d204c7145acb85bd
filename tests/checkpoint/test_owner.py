"""One owner per logdir: a second live training fails at start naming the owner, before
touching anything; a SIGKILLed or finished owner never blocks the next run; readers take
no lock; every directory a store creates is durable in its parent. The owners are real
child processes (``scripts/own_logdir.py``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf
from _timing import scaled

import asupervisor as asv
from asupervisor._checkpoint._manager import Checkpointer
from asupervisor._checkpoint.store import _writeback
from asupervisor._checkpoint.store._owner import OWNER_FILE

SCRIPT = Path(__file__).parent / "scripts" / "own_logdir.py"

pytestmark = pytest.mark.usefixtures("no_new_threads")  # the lock is the same code in both stores (PlainStore.prepare)


class Owner:
    """A training child that owns ``logdir`` and waits at step 12 until told to go on."""

    def __init__(self, logdir: Path) -> None:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(logdir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.strip() != "ready":
            self.proc.kill()
            _, err = self.proc.communicate(timeout=scaled(60))
            raise AssertionError(f"the owner did not get ready: {line!r}\n{err}")

    def finish(self) -> tuple[int, str]:
        out, err = self.proc.communicate("\n", timeout=scaled(120))
        return self.proc.returncode, out + err

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=scaled(60))


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[Owner]:
    child = Owner(tmp_path / "run")
    yield child
    if child.proc.poll() is None:
        child.kill()


def state() -> dict[str, Any]:
    return {"v": tf.Variable(0, dtype=tf.int64)}


def supervisor(logdir: Path, **kwargs: Any) -> asv.Supervisor:
    return asv.Supervisor(
        logdir, state=state(), save_model_secs=0, save_summaries_secs=0, handle_signals=False, **kwargs
    )


def snapshot_of(logdir: Path) -> dict[str, tuple[int, int]]:
    """Every file of ``logdir`` with its size and modification time, but the goodput
    ledger's, which the owner (a live training) rewrites at its own commits."""
    return {
        p.name: (p.stat().st_size, p.stat().st_mtime_ns)
        for p in logdir.iterdir()
        if not p.name.startswith("asupervisor-goodput.json")
    }


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # (an owner child each: the backends in turn)
async def test_second_training_fails_naming_the_owner_and_touches_nothing(owner: Owner, tmp_path: Path) -> None:
    """While a live training owns the logdir, a second one fails at start with a
    CheckpointError naming the owner's host and pid; the logdir is left exactly as it
    was (a save in flight of the owner, which start-up would remove as a leftover,
    included), and the owner goes on to finish normally."""
    logdir = tmp_path / "run"
    in_flight = logdir / "model.ckpt-13.asv-tmp-0123abcd.index"
    in_flight.write_bytes(b"the owner's save in flight")
    before = snapshot_of(logdir)
    sv = supervisor(logdir)
    with pytest.raises(asv.CheckpointError) as info:
        async with sv.managed_session():
            pytest.fail("the second training started")
    message = str(info.value)
    assert f"pid {owner.proc.pid}" in message and socket.gethostname() in message, message
    assert str(logdir) in message and "in use by another training" in message, message
    assert snapshot_of(logdir) == before
    in_flight.unlink()
    rc, output = owner.finish()
    assert rc == 0, output
    assert "done step=15" in output


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # (an owner child each: the backends in turn)
async def test_a_sigkilled_owner_never_blocks_the_next_run(owner: Owner, tmp_path: Path) -> None:
    """An owner killed with SIGKILL holds nothing: the next training starts, resumes from
    the owner's newest checkpoint and owns the logdir (the lock file names it)."""
    logdir = tmp_path / "run"
    owner.kill()
    sv = supervisor(logdir)
    async with sv.managed_session() as sess:
        assert sv.global_step in (5, 10), sv.global_step
        owned = json.loads((logdir / OWNER_FILE).read_text())
        assert owned["pid"] == os.getpid() and owned["host"] == socket.gethostname()
        await sess.run_loop(lambda: None, max_steps=sv.global_step + 1)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # (an owner child each: the backends in turn)
async def test_an_owner_that_ended_normally_leaves_the_logdir_free(owner: Owner, tmp_path: Path) -> None:
    """After the owner finished, a new training starts from its final checkpoint; after
    that one ends, a third one starts too (the lock was let go at the session's end)."""
    logdir = tmp_path / "run"
    rc, output = owner.finish()
    assert rc == 0, output
    for _ in range(2):
        sv = supervisor(logdir)
        async with sv.managed_session() as sess:
            assert sv.global_step >= 15
            await sess.run_loop(lambda: None, max_steps=sv.global_step + 1)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # (an owner child each: the backends in turn)
async def test_readers_take_no_lock(owner: Owner, tmp_path: Path) -> None:
    """While a training owns the logdir, an evaluator (``is_chief=False``) restores from
    it and ``watch_checkpoints`` lists its checkpoints: readers take no lock."""
    logdir = tmp_path / "run"
    sv = supervisor(logdir, is_chief=False)
    async with sv.managed_session():
        assert sv.global_step in (5, 10), sv.global_step
    rc, output = owner.finish()
    assert rc == 0, output


@pytest.mark.anyio
async def test_a_failed_start_lets_the_lock_go(tmp_path: Path) -> None:
    """A session whose start fails after the lock was taken (an init_fn raising) lets
    it go: the next session into the logdir starts."""
    logdir = tmp_path / "run"

    def broken_init() -> None:
        raise RuntimeError("init failed")

    with pytest.raises(RuntimeError, match="init failed"):
        async with supervisor(logdir, init_fn=broken_init).managed_session():
            pass
    async with supervisor(logdir).managed_session():
        pass


@pytest.mark.skipif(
    not os.path.isdir("/proc/self/fd"), reason="names fsynced descriptors through /proc/self/fd (Linux)"
)
def test_created_directories_are_fsynced_into_their_parents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A logdir created with its missing parents is durable: the parent of each new
    directory is fsynced (a power loss would otherwise take the committed checkpoints
    away with the directory entry). An existing logdir's parent is fsynced too."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    logdir = tmp_path / "a" / "b" / "run"
    Checkpointer(tf.train.Checkpoint(v=tf.Variable(1.0)), logdir).prepare()
    for directory in (tmp_path, tmp_path / "a", tmp_path / "a" / "b"):
        assert str(directory) in synced, (directory, synced)
    synced.clear()
    _writeback.make_dirs_durable(logdir)
    assert str(logdir.parent) in synced


@pytest.mark.anyio
async def test_a_filesystem_without_locks_trains_unowned_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem that takes no locks (``ENOLCK``: NFS mounted nolock) does not fail the
    start as an unwritable logdir would: the training goes on unowned, and the warning
    says that nothing stops a second one."""
    import errno

    from asupervisor._checkpoint.store import _owner
    from asupervisor.testing import capture_logs

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(_owner.fcntl, "flock", no_locks)
    with capture_logs() as logs:
        async with supervisor(tmp_path / "run", save_model_steps=1).managed_session() as sess:
            await sess.run_loop(lambda: None, max_steps=2)
    warned = [e for e in logs if e["event"] == "checkpoint.owner_unlocked"]
    assert warned and "No locks available" in warned[0]["error"], warned
    assert tf.train.latest_checkpoint(str(tmp_path / "run")) is not None
