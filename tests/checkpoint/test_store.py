"""The store seam: which store a logdir gets and how it is switched, what the plain store
writes (TF's SaveV2, in abandonable pieces) and that it never uses the fast path's
mechanisms, and that a commit never runs at idle priority."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import tensorflow as tf
from _timing import scaled

import asupervisor as asv
from asupervisor._checkpoint._manager import Checkpointer
from asupervisor._checkpoint.snapshot._iterator_state import index_entries
from asupervisor._checkpoint.store import ENV_VAR, PLAIN, FastPath, SaveAbandoned, _commit, resolve_store
from asupervisor._checkpoint.store.fast import _direct, _idle_io
from asupervisor._checkpoint.store.fast._store import FastStore
from asupervisor._checkpoint.store.plain import _write
from asupervisor._checkpoint.store.plain._store import PlainStore

pytestmark = pytest.mark.usefixtures("no_new_threads")
LINUX = sys.platform.startswith("linux")


def test_the_store_is_chosen_by_keyword_then_environment_then_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    """``checkpoint_store`` wins over ``ASUPERVISOR_CHECKPOINT_STORE``, which wins over
    "auto" (the fast store on Linux, the plain one elsewhere); "plain" is every mechanism
    off."""
    assert resolve_store("plain") is PLAIN and PLAIN.kind == "plain"
    assert resolve_store().kind == ("fast" if LINUX else "plain")
    monkeypatch.setenv(ENV_VAR, "plain")
    assert resolve_store() is PLAIN
    if LINUX:
        assert resolve_store("fast") == FastPath()
    assert FastPath(native_writer=False).kind == "fast"


def test_bad_store_settings_are_errors_naming_the_value(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An unknown store is a ValueError at construction naming the value (and, from the
    environment, the variable)."""
    with pytest.raises(ValueError, match="checkpoint_store must be one of 'auto', 'fast', 'plain', got 'quick'"):
        asv.Supervisor(tmp_path, state={"v": tf.Variable(1.0)}, checkpoint_store="quick")
    monkeypatch.setenv(ENV_VAR, "fastest")
    with pytest.raises(ValueError, match=f"the environment variable {ENV_VAR} must be one of .*got 'fastest'"):
        asv.Supervisor(tmp_path, state={"v": tf.Variable(1.0)})


def test_checkpointer_opens_the_store_it_was_given(tmp_path: Path) -> None:
    """A Checkpointer's store is chosen once, from its fast path: the plain store for
    PLAIN, the fast store with exactly the switches given otherwise."""
    ckpt = tf.train.Checkpoint(v=tf.Variable(1.0))
    assert type(Checkpointer(ckpt, tmp_path, fast_path=PLAIN).store) is PlainStore
    store = Checkpointer(ckpt, tmp_path, fast_path=FastPath(huge_pages=False)).store
    assert isinstance(store, FastStore) and store.fast == FastPath(huge_pages=False)


def big_state() -> dict[str, tf.Variable]:
    return {
        "wide": tf.Variable(tf.random.uniform([5, 1 << 20], seed=1)),  # 20 MiB: two pieces of 4 MiB rows
        "tall": tf.Variable(tf.random.uniform([3 << 20], seed=2)),  # 12 MiB
        "small": tf.Variable(tf.range(7, dtype=tf.float32)),
        "count": tf.Variable(3, dtype=tf.int64),
    }


def test_plain_store_writes_pieces_tensorflow_reads_back_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain store writes with SaveV2 alone (no direct I/O is even tried), a value
    larger than a piece in slices; TF's reader and a session's restore give every value
    back bit for bit."""
    monkeypatch.setattr(_write, "PIECE_BYTES", 8 << 20)
    opened_direct: list[str] = []
    real_open = os.open

    def watching_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            opened_direct.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", watching_open)
    state = big_state()
    checkpointer = Checkpointer(tf.train.Checkpoint(**state), tmp_path, fast_path=PLAIN)
    checkpointer.prepare()
    snap = checkpointer.snapshot(1)
    assert snap is not None
    path = checkpointer.write(snap).path
    assert opened_direct == []
    entries = index_entries(path)
    assert len(entries["wide/.ATTRIBUTES/VARIABLE_VALUE"].slices) == 3  # 2 + 2 + 1 rows of 4 MiB
    assert not entries["small/.ATTRIBUTES/VARIABLE_VALUE"].slices
    reader = tf.train.load_checkpoint(path)
    for name, variable in state.items():
        assert np.array_equal(reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE"), variable.numpy()), name
    fresh = {k: tf.Variable(tf.zeros_like(v)) for k, v in state.items()}
    restorer = Checkpointer(tf.train.Checkpoint(**fresh), tmp_path, fast_path=PLAIN)
    assert restorer.restore() == path
    for name, variable in state.items():
        assert np.array_equal(fresh[name].numpy(), variable.numpy()), name


def test_plain_store_save_is_abandoned_between_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SaveV2 cannot be interrupted, so the plain store checks the abandon flag between its
    pieces: abandoned during the first, the save stops after it, leaves nothing, and the
    previous checkpoint stays the latest."""
    monkeypatch.setattr(_write, "PIECE_BYTES", 8 << 20)
    checkpointer = Checkpointer(tf.train.Checkpoint(**big_state()), tmp_path, fast_path=PLAIN)
    checkpointer.prepare()
    first = checkpointer.snapshot(1)
    assert first is not None
    checkpointer.write(first)
    before = sorted(os.listdir(tmp_path))
    calls: list[str] = []
    real_save = _write._save_op  # TF's SaveV2

    def save_then_abandon(prefix: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(str(prefix))
        checkpointer.abandon()  # the stop's deadline comes while this piece is written
        return real_save(prefix, *args, **kwargs)

    monkeypatch.setattr(_write, "_save_op", save_then_abandon)
    snap = checkpointer.snapshot(2)
    assert snap is not None
    with pytest.raises(SaveAbandoned):
        checkpointer.write(snap)
    assert len(calls) == 1
    assert sorted(os.listdir(tmp_path)) == before
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-1")


@pytest.mark.anyio
async def test_a_plain_session_starts_no_idle_io_thread(tmp_path: Path) -> None:
    """A session on the plain store writes from its checkpoint writer thread alone: no
    idle-priority I/O thread is started (it is a fast-store mechanism)."""
    v = tf.Variable(0.0)
    sv = asv.Supervisor(
        tmp_path,
        state={"v": v},
        save_model_steps=2,
        save_model_secs=0,
        save_summaries_secs=0,
        handle_signals=False,
        checkpoint_store="plain",
    )
    async with sv.managed_session() as sess:
        for _ in range(6):
            await sess.run(lambda: v.assign_add(1.0))
        await sv.save_now()
        names = {t.name for t in threading.enumerate()}
    assert "asv-checkpoint" in names and "asv-checkpoint-io" not in names
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-6")


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is a Linux scheduling policy")
@pytest.mark.anyio
async def test_the_commit_never_runs_at_idle_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast store's data writes go to its SCHED_IDLE thread, but the commit (renames,
    state file, under the commit lock) runs at the writer's normal priority: at idle
    priority it would crawl while tf.data saturates the CPUs, holding the lock and a
    stop's grace. Checked on the thread that runs each commit."""
    policies: list[int] = []
    idle_used: list[int] = []
    real_commit, real_lower = _commit.commit, _idle_io.lower_to_idle_priority

    def observed_commit(*args: Any, **kwargs: Any) -> None:
        policies.append(os.sched_getscheduler(0))
        real_commit(*args, **kwargs)

    def observed_lower() -> bool:
        lowered = real_lower()
        idle_used.append(int(lowered))
        return lowered

    monkeypatch.setattr(_commit, "commit", observed_commit)
    monkeypatch.setattr(_idle_io, "lower_to_idle_priority", observed_lower)
    v = tf.Variable(tf.zeros([1 << 18]))
    sv = asv.Supervisor(
        tmp_path,
        state={"v": v},
        save_model_steps=1,
        save_model_secs=0,
        save_summaries_secs=0,
        handle_signals=False,
        checkpoint_store="fast",
    )
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: v.assign_add(tf.ones([1 << 18])), max_steps=4)
    assert idle_used and policies  # the idle thread ran, and commits happened
    assert os.SCHED_IDLE not in policies, policies


def test_refusal_errnos_cover_not_supported() -> None:
    """EINVAL, EOPNOTSUPP and ENOSYS all mean "no direct I/O here" (a fallback, not a
    failed save); another errno is a real error."""
    import errno

    for code in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
        assert _direct.is_refusal(OSError(code, os.strerror(code)))
    assert not _direct.is_refusal(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))


@pytest.mark.anyio
async def test_a_step_save_reaches_the_writer_while_the_event_loop_is_blocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer thread starts with the session and the step thread hands each snapshot
    straight to it: a step save is written while the event loop is blocked (it used to
    be scheduled through the loop, and waited for it)."""
    written = threading.Event()
    loop_blocked = threading.Event()
    real_write = Checkpointer.write

    def write(self: Checkpointer, snapshot: Any, *args: Any, **kwargs: Any) -> Any:
        if snapshot.step == 3:  # the step save (not the start-up save at step 0)
            written.set()
        return real_write(self, snapshot, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, "write", write)
    v = tf.Variable(0.0)
    sv = asv.Supervisor(
        tmp_path,
        state={"v": v},
        save_model_steps=3,
        save_model_secs=0,
        save_summaries_secs=0,
        handle_signals=False,
    )

    def step() -> None:
        v.assign_add(1.0)
        if sv.global_step == 0:
            assert loop_blocked.wait(scaled(30))  # the loop is blocked from here on

    got: list[bool] = []

    async def block_the_loop() -> None:
        loop_blocked.set()
        got.append(written.wait(scaled(30)))  # blocks the event loop's thread until the write begins

    async with sv.managed_session() as sess:
        async with anyio.create_task_group() as tg:
            tg.start_soon(block_the_loop)
            await sess.run_loop(step, max_steps=5)
    assert got == [True]
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-5")
