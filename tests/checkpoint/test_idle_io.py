"""The kernel-heavy part of a background save runs on an idle-priority thread, and the
writer thread takes it over when that thread starves, is closed, or the save is abandoned."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor._checkpoint.store.fast._idle_io import CHUNK_BYTES, IdleIO

pytestmark = pytest.mark.skipif(
    not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is a Linux scheduling policy; elsewhere IdleIO runs in the caller"
)


def payload(nbytes: int) -> np.ndarray:
    return np.random.default_rng(nbytes).integers(0, 255, nbytes, dtype=np.uint8)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    """A real one-thread executor standing in for the session's ``asv-checkpoint-io`` thread."""
    executor = ThreadPoolExecutor(1, thread_name_prefix="test-idle-io")
    yield executor
    executor.shutdown(wait=True)


def submit_to(pool: ThreadPoolExecutor) -> Callable[[Callable[[], None]], None]:
    def submit(fn: Callable[[], None]) -> None:
        pool.submit(fn)

    return submit


def policy_of(pool: ThreadPoolExecutor) -> int:
    native = pool.submit(threading.get_native_id).result()
    return os.sched_getscheduler(native)


def test_data_written_at_idle_priority_match_a_plain_write(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    """A 5.5 MiB buffer written at an offset through IdleIO gives the file a plain write
    gives, and the thread that wrote it now has the SCHED_IDLE policy."""
    data = payload(5 * CHUNK_BYTES + CHUNK_BYTES // 2 + 3)
    io = IdleIO(submit_to(pool))
    fd = os.open(tmp_path / "data", os.O_WRONLY | os.O_CREAT)
    try:
        os.pwrite(fd, b"head", 0)
        io.write(fd, data, 4)
    finally:
        os.close(fd)
    assert (tmp_path / "data").read_bytes() == b"head" + data.tobytes()
    assert policy_of(pool) == os.SCHED_IDLE


def test_call_returns_the_result_and_raises_the_error(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    """``call`` runs a function on the idle thread, returns its result, and raises its
    error in the caller: an OSError of a write to a read-only descriptor keeps its errno."""
    io = IdleIO(submit_to(pool))
    assert io.call(threading.get_native_id) != threading.get_native_id()
    (tmp_path / "ro").write_bytes(b"")
    fd = os.open(tmp_path / "ro", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            io.write(fd, payload(3 * CHUNK_BYTES), 0)
    finally:
        os.close(fd)
    assert info.value.errno == 9  # EBADF


def test_an_abandoned_write_writes_nothing_after_it_returns(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    """Abandoned (``check`` raises) before the idle thread could start, the write raises,
    and the idle thread, released afterwards, writes none of its pieces: the caller may
    close the descriptor at once."""
    gate = threading.Event()
    pool.submit(gate.wait)  # the idle thread is held until the write has returned

    class Abandoned(Exception):
        pass

    def check() -> None:
        raise Abandoned

    io = IdleIO(submit_to(pool))
    fd = os.open(tmp_path / "data", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(Abandoned):
            io.write(fd, payload(4 * CHUNK_BYTES), 0, check)
        gate.set()
        pool.submit(lambda: None).result()  # the idle thread has run the write's job by now
        assert os.fstat(fd).st_size == 0
    finally:
        gate.set()
        os.close(fd)


def test_a_closed_thread_leaves_the_work_to_the_caller(tmp_path: Path) -> None:
    """When the idle thread is already closed (the session is ending), the caller writes
    everything itself."""
    executor = ThreadPoolExecutor(1)
    executor.shutdown()
    io = IdleIO(submit_to(executor))
    data = payload(2 * CHUNK_BYTES + 1)
    fd = os.open(tmp_path / "data", os.O_WRONLY | os.O_CREAT)
    try:
        io.write(fd, data, 0)
    finally:
        os.close(fd)
    assert (tmp_path / "data").read_bytes() == data.tobytes()
    assert io.caller_units == 3


SPIN = "import time\nprint('spinning', flush=True)\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"


def test_a_starved_idle_thread_is_taken_over(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    """With every CPU of the process busy with normal-priority processes, the idle thread
    gets (almost) no CPU; the caller takes the pieces over after ``starved_secs`` of no
    progress, and the 32 MiB write completes correctly in seconds, not never. The next
    job is the caller's from the start (a unit the starved thread were in could not be
    taken over)."""
    cpus = len(os.sched_getaffinity(0))
    io = IdleIO(submit_to(pool), starved_secs=0.1)
    io.call(lambda: None)  # the thread is at idle priority from now on
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE) for _ in range(cpus + 1)]
    try:
        for p in spinners:  # each spins already (a busy machine starts a python in seconds)
            assert p.stdout is not None and p.stdout.readline() == b"spinning\n"
        data = payload(32 * CHUNK_BYTES)
        fd = os.open(tmp_path / "data", os.O_WRONLY | os.O_CREAT)
        t0 = time.monotonic()
        try:
            io.write(fd, data, 0)
        finally:
            os.close(fd)
        elapsed = time.monotonic() - t0
        taken = io.caller_units
        assert io.call(threading.get_ident) == threading.get_ident()  # ran here, at once
    finally:
        for p in spinners:
            p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
    assert (tmp_path / "data").read_bytes() == data.tobytes()
    assert taken > 0 and io.caller_units == taken + 1
    assert elapsed < 30


@pytest.mark.anyio
async def test_background_saves_use_an_idle_priority_thread_that_ends_with_the_session(tmp_path: Path) -> None:
    """A session's background saves run their file work on ``asv-checkpoint-io``, at
    SCHED_IDLE, and the checkpoints restore with plain TF; the thread is gone once
    ``managed_session()`` has exited."""
    v = tf.Variable(tf.zeros([1 << 20]))
    sv = asv.Supervisor(tmp_path, state={"v": v}, save_model_secs=0, save_summaries_secs=0, handle_signals=False)

    def step() -> Any:
        return v.assign_add(tf.ones_like(v))

    async with sv.managed_session() as sess:
        for _ in range(3):
            await sess.run(step)
        info = await sv.save_now()
        threads = [t for t in threading.enumerate() if t.name == "asv-checkpoint-io"]
        assert len(threads) == 1 and threads[0].native_id is not None
        assert os.sched_getscheduler(threads[0].native_id) == os.SCHED_IDLE
    assert not [t for t in threading.enumerate() if t.name.startswith("asv-")]
    restored = tf.Variable(tf.zeros([1 << 20]))
    tf.train.Checkpoint(v=restored).restore(info.path).expect_partial()
    assert float(restored[0]) == 3.0
