"""Parity: TensorFlow's ``tensorflow/python/checkpoint/checkpoint_management_test.py``.

Most of that file tests ``tf.train.CheckpointManager``; here the ``Supervisor`` is the
checkpoint manager: ``manager.save()`` maps to a step then ``await sv.save_now()``,
``max_to_keep``/``keep_checkpoint_every_n_hours`` to the supervisor's retention, and
``manager.checkpoints``/``latest_checkpoint`` to what plain TensorFlow reads from the
``checkpoint`` state file (``tf.train.get_checkpoint_state``/``latest_checkpoint``).
Checkpoints are numbered by the global step. TF's tests move a mocked ``time.time``;
here time passing is simulated by ageing the commit timestamps in the state file
(``age``), which is what retention reads. Cases without meaning in TF2 are listed in
``README.md``.
"""

from __future__ import annotations

import os
import pathlib
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor.testing import ManualClock

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_new_threads")]

HOUR = 3600.0


def make_sv(logdir: Any, **kwargs: Any) -> asv.Supervisor:
    kwargs.setdefault("handle_signals", False)
    kwargs.setdefault("clock", ManualClock())
    kwargs.setdefault("save_summaries_secs", 0)
    kwargs.setdefault("save_model_secs", 0)  # only explicit saves, as manager.save()
    kwargs.setdefault("state", {"v": tf.Variable(0.0)})
    return asv.Supervisor(logdir, **kwargs)


async def save_steps(sv: asv.Supervisor, count: int, *, every: int = 1) -> list[str]:
    """Run ``every`` steps then save, ``count`` times in one session; returns the paths."""
    paths = []
    async with sv.managed_session() as sess:
        for _ in range(count):
            for _ in range(every):
                await sess.run(lambda: None)
            paths.append((await sv.save_now()).path)
    return paths


def exists(path: str) -> bool:
    """``checkpoint_exists``: the checkpoint's index file is there."""
    return os.path.exists(path + ".index")


def state(logdir: Path) -> Any:
    return tf.train.get_checkpoint_state(str(logdir))


def managed(logdir: Path) -> list[str]:
    """``manager.checkpoints``: the absolute paths the state file lists."""
    return list(state(logdir).all_model_checkpoint_paths)


def age(logdir: Path, secs: float) -> None:
    """Pretend ``secs`` passed since every checkpoint in ``logdir`` was committed: move
    each timestamp in the state file (and the last preserved one) ``secs`` back, as
    another writer would (written aside, then renamed over it)."""
    from google.protobuf import text_format
    from tensorflow.python.training.checkpoint_state_pb2 import CheckpointState

    path = logdir / "checkpoint"
    proto = text_format.Parse(path.read_text(), CheckpointState())
    stamps = [t - secs for t in proto.all_model_checkpoint_timestamps]
    del proto.all_model_checkpoint_timestamps[:]
    proto.all_model_checkpoint_timestamps.extend(stamps)
    proto.last_preserved_timestamp -= secs
    tmp = logdir / "checkpoint.test-tmp"
    tmp.write_text(text_format.MessageToString(proto))
    os.replace(tmp, path)


# -- LatestCheckpointWithRelativePaths ------------------------------------------------


async def test_name_collision_with_the_state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """checkpoint_management_test.py::LatestCheckpointWithRelativePaths::testNameCollision —
    a checkpoint basename equal to the state file's name ("checkpoint") never collides
    with it (files are "checkpoint-<step>"), and latest_checkpoint finds the checkpoint."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("train")
    sv = make_sv("train", checkpoint_basename="checkpoint")
    await save_steps(sv, 1)
    assert tf.train.latest_checkpoint("train") == os.path.join("train", "checkpoint-1")
    assert (tmp_path / "train" / "checkpoint").is_file()


async def test_relative_logdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """checkpoint_management_test.py::LatestCheckpointWithRelativePaths::testRelativePath —
    a short training history saved to a relative logdir: latest_checkpoint(traindir)
    names the newest, plain TF restores v0 == 2.0 from it, and a new supervisor on the
    same relative logdir resumes there."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("train")
    v0 = tf.Variable(0.0)
    sv = make_sv("train", state={"v0": v0})
    async with sv.managed_session() as sess:
        await sv.save_now()
        for _ in range(2):
            await sess.run(lambda: v0.assign_add(1.0))
            await sv.save_now()
    name = tf.train.latest_checkpoint("train")
    assert name == os.path.join("train", "model.ckpt-2")
    fresh = tf.Variable(-1.0)
    tf.train.Checkpoint(v0=fresh).restore(name).expect_partial()
    assert float(fresh) == 2.0
    again = tf.Variable(-1.0)
    async with make_sv("train", state={"v0": again}).managed_session() as sess:
        assert (sess.global_step, float(again)) == (2, 2.0)


# -- CheckpointStateTest --------------------------------------------------------------


async def test_state_file_holds_relative_paths(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointStateTest::testUpdateCheckpointStateSaveRelativePaths
    (and ::testRelPath) — the state file names checkpoints relative to the logdir
    (no directory part), and get_checkpoint_state returns them absolute."""
    await save_steps(make_sv(tmp_path, max_to_keep=5), 2)
    text = (tmp_path / "checkpoint").read_text()
    assert 'model_checkpoint_path: "model.ckpt-2"' in text
    assert 'all_model_checkpoint_paths: "model.ckpt-1"' in text
    assert str(tmp_path) not in text
    ckpt = state(tmp_path)
    assert ckpt.model_checkpoint_path == str(tmp_path / "model.ckpt-2")
    assert list(ckpt.all_model_checkpoint_paths) == [str(tmp_path / "model.ckpt-1"), str(tmp_path / "model.ckpt-2")]


async def test_pathlib_logdir(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointStateTest::testFSPath,
    ::CheckpointManagerTest::testCheckpointManagerFSpathDirectory and
    ::CheckpointManagerTest::testLatestCheckpointFSpathDirectory —
    a pathlib.Path logdir works: the saved path is str(directory / "<name>-1"), TF's
    readers accept the Path, and the next session restores from it."""
    directory = pathlib.Path(tmp_path)
    (path,) = await save_steps(make_sv(directory, checkpoint_basename="ckpt_name"), 1)
    assert path == str(directory / "ckpt_name-1")
    assert tf.train.latest_checkpoint(directory) == str(directory / "ckpt_name-1")
    assert tf.train.get_checkpoint_state(directory).model_checkpoint_path == str(directory / "ckpt_name-1")
    sv = make_sv(directory, checkpoint_basename="ckpt_name")
    async with sv.managed_session() as sess:
        assert sess.global_step == 1
    assert sv.status().last_checkpoint is not None
    assert sv.status().last_checkpoint.path == str(directory / "ckpt_name-1")


async def test_empty_state_file_never_restarts_training(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointStateTest::testCheckPointStateFailsWhenIncomplete —
    TF's get_checkpoint_state refuses an empty state file (ValueError). DESIGN differs
    (a damaged state file never restarts training): the newest complete checkpoint is
    restored and the state file rewritten, so TF reads it again."""
    await save_steps(make_sv(tmp_path, max_to_keep=5), 2)
    (tmp_path / "checkpoint").write_text("")
    inits: list[int] = []
    sv = make_sv(tmp_path, init_fn=lambda: inits.append(1))
    async with sv.managed_session() as sess:
        assert sess.global_step == 2
    assert inits == []
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-2")


async def test_state_file_with_dot_relative_paths(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointStateTest::testCheckPointCompletesRelativePaths —
    a state file naming "./model.ckpt-687529" (paths relative with a "./") is read as
    relative to the logdir: the supervisor resumes from step 687529."""
    for step in (687500, 687529):
        ckpt = tf.train.Checkpoint(v=tf.Variable(float(step)), global_step=tf.Variable(step, dtype=tf.int64))
        ckpt.write(str(tmp_path / f"model.ckpt-{step}"))
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "./model.ckpt-687529"\n'
        'all_model_checkpoint_paths: "./model.ckpt-687500"\n'
        'all_model_checkpoint_paths: "./model.ckpt-687529"\n'
    )
    v = tf.Variable(0.0)
    async with make_sv(tmp_path, state={"v": v}).managed_session() as sess:
        assert sess.global_step == 687529
        assert float(v) == 687529.0


# -- CheckpointManagerTest ------------------------------------------------------------


async def test_deletion(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testDeletion —
    with max_to_keep=3, the fourth save deletes the first."""
    first, second, third, fourth = await save_steps(make_sv(tmp_path, max_to_keep=3), 4)
    assert exists(fourth) and exists(third) and exists(second)
    assert not exists(first)
    assert managed(tmp_path) == [second, third, fourth]


async def test_keep_all(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testKeepAll —
    max_to_keep=None keeps every checkpoint, across a restart; a later supervisor with
    max_to_keep=3 lists them all and deletes the oldest only at its first save."""
    first, second, third = await save_steps(make_sv(tmp_path, max_to_keep=None), 3)
    assert all(exists(p) for p in (first, second, third))
    assert tf.train.latest_checkpoint(str(tmp_path)) == third
    assert managed(tmp_path) == [first, second, third]
    (fourth,) = await save_steps(make_sv(tmp_path, max_to_keep=None), 1)
    assert managed(tmp_path) == [first, second, third, fourth]
    sv = make_sv(tmp_path, max_to_keep=3)
    async with sv.managed_session() as sess:
        assert managed(tmp_path) == [first, second, third, fourth]
        assert all(exists(p) for p in (first, second, third, fourth))
        await sess.run(lambda: None)
        fifth = (await sv.save_now()).path
    assert managed(tmp_path) == [third, fourth, fifth]
    assert all(exists(p) for p in (third, fourth, fifth))
    assert not exists(first) and not exists(second)


async def test_save_restore_state_keep_every_n_hours(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testSaveRestoreState —
    commit timestamps go into the state file and survive restarts; with max_to_keep=2
    and keep_checkpoint_every_n_hours=1.5, a checkpoint pushed out of the newest two is
    kept for good when 1.5 h passed since the last one kept that way (the start), and
    last_preserved_timestamp records it. Checkpoints at (relative to the start) 0,
    1 h 10 s, +12 min, +30 min, +30 min, +10 s: only the fourth is kept beside the newest
    two."""
    c1, c2 = [], []
    sv1 = make_sv(tmp_path, max_to_keep=2)
    async with sv1.managed_session() as sess:
        await sess.run(lambda: None)
        c1.append((await sv1.save_now()).path)
        age(tmp_path, 3610)
        await sess.run(lambda: None)
        c2.append((await sv1.save_now()).path)
    first, second = c1[0], c2[0]
    stamps = list(state(tmp_path).all_model_checkpoint_timestamps)
    assert stamps[1] - stamps[0] == pytest.approx(3610, abs=60)
    assert managed(tmp_path) == [first, second]

    paths = []
    sv2 = make_sv(tmp_path, max_to_keep=2, keep_checkpoint_every_n_hours=1.5)
    async with sv2.managed_session() as sess:
        assert managed(tmp_path) == [first, second]
        for secs in (0.2 * HOUR, 0.5 * HOUR, 0.5 * HOUR):
            age(tmp_path, secs)
            await sess.run(lambda: None)
            paths.append((await sv2.save_now()).path)
    third, fourth, fifth = paths
    assert managed(tmp_path) == [fourth, fifth]
    assert not exists(first) and not exists(second) and not exists(third)
    fourth_stamp = state(tmp_path).all_model_checkpoint_timestamps[0]

    age(tmp_path, 10)
    (sixth,) = await save_steps(make_sv(tmp_path, max_to_keep=2, keep_checkpoint_every_n_hours=1.5), 1)
    ckpt = state(tmp_path)
    assert ckpt.last_preserved_timestamp == pytest.approx(fourth_stamp - 10)
    assert managed(tmp_path) == [fifth, sixth]
    assert all(exists(p) for p in (fourth, fifth, sixth))


async def test_continue_from_unmanaged(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testContinueFromUnmanaged —
    checkpoints written by plain tf.train.Checkpoint.save under another prefix are
    restored from (the latest), then left alone by retention: after three saves with
    max_to_keep=2, both plain ones and the newest two of ours exist."""
    v = tf.Variable(1.0)
    plain = tf.train.Checkpoint(v=v, global_step=tf.Variable(0, dtype=tf.int64))
    first = plain.save(str(tmp_path / "unusual_prefix"))
    v.assign(2.0)
    second = plain.save(str(tmp_path / "unusual_prefix"))
    restored = tf.Variable(0.0)
    sv = make_sv(tmp_path, state={"v": restored}, max_to_keep=2)
    async with sv.managed_session() as sess:
        assert float(restored) == 2.0
        paths = []
        for _ in range(3):
            await sess.run(lambda: None)
            paths.append((await sv.save_now()).path)
    third, fourth, fifth = paths
    assert managed(tmp_path)[-2:] == [fourth, fifth]
    assert exists(first) and exists(second)
    assert not exists(third)
    assert exists(fourth) and exists(fifth)


async def test_clock_reset_keeps_future_stamped_checkpoints(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testClockReset —
    max_to_keep=1 and keep_checkpoint_every_n_hours=1, saves an hour apart: the first
    goes, the second is kept for good. Then the clock is set back (every stamp is now
    hours in the future): a new supervisor with max_to_keep=1 keeps the future-stamped
    checkpoints (it cannot tell whether they were preserved) and its own latest."""
    paths = []
    sv = make_sv(tmp_path, max_to_keep=1, keep_checkpoint_every_n_hours=1.0)
    async with sv.managed_session() as sess:
        for i in range(3):
            if i:
                age(tmp_path, HOUR)
            await sess.run(lambda: None)
            paths.append((await sv.save_now()).path)
    first, second, third = paths
    assert not exists(first) and exists(second) and exists(third)
    assert managed(tmp_path) == [third]
    age(tmp_path, -5 * HOUR)  # the clock went back 5 hours
    fourth, fifth = await save_steps(make_sv(tmp_path, max_to_keep=1), 2)
    assert exists(second) and exists(third)
    assert not exists(fourth) and exists(fifth)
    assert tf.train.latest_checkpoint(str(tmp_path)) == fifth


async def test_custom_numbering(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testCustomNumbering —
    checkpoints are numbered by the global step (saves every 2 steps end in -0, -2,
    -4, ...); only the newest two stay in the state file; latest_checkpoint is the
    last save."""
    sv = make_sv(tmp_path, max_to_keep=2)
    paths = []
    async with sv.managed_session() as sess:
        for i in range(5):
            path = (await sv.save_now()).path
            assert path.endswith(f"-{2 * i}")
            paths.append(path)
            for _ in range(2):
                await sess.run(lambda: None)
    assert tf.train.latest_checkpoint(str(tmp_path)) == paths[-1]
    assert managed(tmp_path) == paths[-2:]


async def test_custom_checkpoint_prefix(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testCustomCheckpointPrefix —
    checkpoint_basename names the files ("ckpt_name-5"); the default is "model.ckpt"."""
    for basename, logdir in (("ckpt_name", tmp_path / "a"), (None, tmp_path / "b")):
        kwargs = {} if basename is None else {"checkpoint_basename": basename}
        (path,) = await save_steps(make_sv(logdir, **kwargs), 1, every=5)
        assert os.path.basename(path) == f"{basename or 'model.ckpt'}-5"


async def test_two_prefixes_in_one_directory(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testCustomCheckpointPrefix,
    as TF runs it (two prefixes in one directory) — a supervisor with the default
    basename, resuming from the other prefix's checkpoint, saves under its own name;
    its retention (max_to_keep=1) leaves the other prefix's checkpoint alone (DESIGN:
    retention deletes only what it manages)."""
    (other,) = await save_steps(make_sv(tmp_path, checkpoint_basename="ckpt_name", max_to_keep=2), 1, every=5)
    paths = await save_steps(make_sv(tmp_path, max_to_keep=1), 2)
    assert [os.path.basename(p) for p in paths] == ["model.ckpt-6", "model.ckpt-7"]
    assert exists(other)
    assert not exists(paths[0]) and exists(paths[1])


async def test_restore_or_initialize(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testRestoreOrInitialize —
    the first session calls init_fn (here: restore a warm-start checkpoint elsewhere,
    v == 2.0); once a checkpoint is saved, the next session restores it and init_fn is
    not called."""
    init_path = tf.train.Checkpoint(v=tf.Variable(2.0)).save(str(tmp_path / "init"))
    v = tf.Variable(1.0)
    inits: list[str] = []

    def init_fn() -> None:
        inits.append("init")
        tf.train.Checkpoint(v=v).restore(init_path).expect_partial()

    ckpt_dir = tmp_path / "ckpt"
    sv = make_sv(ckpt_dir, state={"v": v}, init_fn=init_fn)
    async with sv.managed_session():
        assert float(v) == 2.0
        await sv.save_now()
    assert inits == ["init"]
    v.assign(0.0)
    sv = make_sv(ckpt_dir, state={"v": v}, init_fn=init_fn)
    async with sv.managed_session():
        assert float(v) == 2.0
    assert inits == ["init"]


async def test_checkpoint_interval(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testCheckpointInterval —
    save_model_steps=2 saves at step 0 (start-up) and 2, not at 1 or 3; a step already
    saved is not saved twice (the save asked at step 0 returns the start-up one); an
    explicit save always saves."""
    sv = make_sv(tmp_path, save_model_steps=2, max_to_keep=10)
    async with sv.managed_session() as sess:
        assert (await sv.save_now()).step == 0  # the start-up save, committed
        await sess.run(lambda: None)  # step 1
        await sess.run(lambda: None)  # step 2
        await sess.run(lambda: None)  # step 3
        info = await sv.save_now()
    assert info.step == 3
    assert [os.path.basename(p) for p in managed(tmp_path)] == ["model.ckpt-0", "model.ckpt-2", "model.ckpt-3"]


async def test_checkpoint_interval_with_fast_steps(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testCheckpointInterval, with
    DESIGN's cadence promise — steps faster than the disk still get a checkpoint at
    every multiple of save_model_steps (the step thread waits for the previous write;
    none is skipped)."""
    sv = make_sv(tmp_path, save_model_steps=2, max_to_keep=100)
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: None, max_steps=40)
    steps = [int(p.rsplit("-", 1)[1]) for p in managed(tmp_path)]
    assert steps == list(range(0, 41, 2))


async def test_checkpoint_interval_after_resuming_between_multiples(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testCheckpointIntervalWithLastCheckpointStep —
    TF counts the interval from the last checkpoint's step (1: next save at 3). DESIGN
    differs: save_model_steps=N saves at every multiple of N, so a run resumed at step 1
    saves at 2 and 4, not 3: a resumed run saves at the same steps as one never stopped."""
    async with make_sv(tmp_path, save_model_secs=600).managed_session() as sess:
        await sess.run(lambda: None)  # final checkpoint at step 1
    sv = make_sv(tmp_path, save_model_steps=2, max_to_keep=10)
    async with sv.managed_session() as sess:
        assert sess.global_step == 1
        await sess.run(lambda: None)  # step 2: saved
        assert (await sv.save_now()).step == 2  # that save, once committed
        await sess.run(lambda: None)  # step 3
        await sess.run(lambda: None)  # step 4: saved
    steps = [int(p.rsplit("-", 1)[1]) for p in managed(tmp_path)]
    assert steps == [0, 1, 2, 4]


async def test_no_save_of_the_restored_step(tmp_path: Path) -> None:
    """checkpoint_management_test.py::CheckpointManagerTest::testCheckpointIntervalWithRestore —
    after restoring a checkpoint, a save at the same step writes nothing new: the
    restored checkpoint is returned."""
    (path,) = await save_steps(make_sv(tmp_path), 1)
    mtime = os.stat(path + ".index").st_mtime_ns
    sv = make_sv(tmp_path, save_model_steps=2)
    async with sv.managed_session():
        info = await sv.save_now()
    assert info.path == path and info.step == 1
    assert os.stat(path + ".index").st_mtime_ns == mtime
    assert managed(tmp_path) == [path]
