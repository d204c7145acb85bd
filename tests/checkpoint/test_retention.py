"""Retention deletes only the checkpoints it manages, as tf.train.CheckpointManager does;
max_to_keep=None keeps every checkpoint."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor._checkpoint.policy._policies import AnyKeepPolicy, LatestN, keep_policy_for
from asupervisor._checkpoint.store import _retention, _state_file

pytestmark = pytest.mark.usefixtures("checkpoint_store")  # a promise test: both stores


def bump(state: dict[str, Any]) -> Any:
    def step() -> None:
        state["w"].assign_add(1.0)

    return step


def supervisor(logdir: Path, state: dict[str, Any], **kwargs: Any) -> asv.Supervisor:
    kwargs.setdefault("save_model_secs", 0)
    kwargs.setdefault("save_model_steps", 1)
    return asv.Supervisor(logdir, state=state, save_summaries_secs=0, handle_signals=False, **kwargs)


def indexes(logdir: Path) -> list[str]:
    return sorted(n[: -len(".index")] for n in os.listdir(logdir) if n.endswith(".index") and ".asv-tmp-" not in n)


@pytest.mark.anyio
async def test_plain_tf_checkpoint_restored_from_is_not_deleted(tmp_path: Path) -> None:
    """A checkpoint written by plain tf.train.Checkpoint.save (ckpt-1), which the session
    restores from, survives retention with max_to_keep=1."""
    w = tf.Variable(7.0)
    plain = tf.train.Checkpoint(w=w).save(str(tmp_path / "ckpt"))
    assert Path(plain).name == "ckpt-1"
    w.assign(0.0)
    state = {"w": w}
    sv = supervisor(tmp_path, state, max_to_keep=1)
    async with sv.managed_session() as sess:
        assert float(w.numpy()) == 7.0  # restored from ckpt-1
        await sess.run_loop(bump(state), max_steps=4)
    assert "ckpt-1" in indexes(tmp_path)
    assert [n for n in indexes(tmp_path) if n.startswith("model.ckpt-")] == ["model.ckpt-4"]
    tf.train.Checkpoint(w=tf.Variable(0.0)).restore(str(tmp_path / "ckpt-1")).assert_consumed()


@pytest.mark.anyio
async def test_checkpoints_of_another_basename_are_left_alone(tmp_path: Path) -> None:
    """Checkpoints of another checkpoint_basename in the same directory, named in the state
    file, are neither counted nor deleted."""
    state = {"w": tf.Variable(0.0)}
    other = supervisor(tmp_path, state, checkpoint_basename="other.ckpt", max_to_keep=1)
    async with other.managed_session() as sess:
        await sess.run_loop(bump(state), max_steps=2)
    assert indexes(tmp_path) == ["other.ckpt-2"]
    ours = supervisor(tmp_path, state, max_to_keep=2)
    async with ours.managed_session() as sess:
        await sess.run_loop(bump(state), max_steps=6)
    assert indexes(tmp_path) == ["model.ckpt-5", "model.ckpt-6", "other.ckpt-2"]


def test_future_stamped_checkpoint_is_kept(tmp_path: Path) -> None:
    """A checkpoint whose commit time in the state file is later than now (the clock was
    set back since) is not deleted by retention, nor counted."""
    from asupervisor._checkpoint._manager import Checkpointer

    state = tf.train.Checkpoint(w=tf.Variable(0.0))
    future = Checkpointer(state, tmp_path, max_to_keep=1, wall_clock=lambda: time.time() + 86400)
    future.prepare()
    snap = future.snapshot(1)
    assert snap is not None
    future.write(snap)
    now = Checkpointer(state, tmp_path, max_to_keep=2)
    for step in (2, 3, 4):
        snap = now.snapshot(step)
        assert snap is not None
        now.write(snap)
    assert indexes(tmp_path) == ["model.ckpt-1", "model.ckpt-3", "model.ckpt-4"]
    named = _state_file.read_state(tmp_path)
    assert named is not None and named.latest == "model.ckpt-4" and "model.ckpt-1" in named.paths


@pytest.mark.anyio
async def test_max_to_keep_none_keeps_every_checkpoint(tmp_path: Path) -> None:
    """max_to_keep=None: every checkpoint stays on disk and named in the state file."""
    state = {"w": tf.Variable(0.0)}
    sv = supervisor(tmp_path, state, max_to_keep=None)
    async with sv.managed_session() as sess:
        await sess.run_loop(bump(state), max_steps=8)
    expected = [f"model.ckpt-{s}" for s in range(0, 9)]
    assert indexes(tmp_path) == sorted(expected)
    named = _state_file.read_state(tmp_path)
    assert named is not None and sorted(named.paths) == sorted(expected)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "5"])
def test_max_to_keep_below_one_or_not_an_int_is_refused(value: Any) -> None:
    """max_to_keep must be an int >= 1 or None; anything else is a ValueError naming it."""
    with pytest.raises(ValueError, match=f"max_to_keep.*{value!r}"):
        asv.Supervisor(None, max_to_keep=value, handle_signals=False)


def test_monitored_training_session_accepts_max_to_keep_none(tmp_path: Path) -> None:
    """MonitoredTrainingSession passes max_to_keep=None (keep all) to its supervisor."""
    mts = asv.MonitoredTrainingSession(tmp_path, state={"w": tf.Variable(0.0)}, max_to_keep=None)
    assert mts.supervisor.config.max_to_keep is None


def test_select_retention_counts_only_managed_and_keeps_two_in_flight() -> None:
    """select_retention deletes the oldest managed checkpoints beyond max_to_keep, skipping
    unmanaged ones, and max_to_keep is raised to 2 by a save in flight (min_keep)."""
    state = _state_file.CheckpointState("m-4", ["m-1", "ckpt-1", "m-2", "m-3", "m-4"], [1.0, 1.5, 2.0, 3.0, 4.0])
    kept, delete = _retention.select_retention(
        state, policy=keep_policy_for(1, None), managed=lambda p, t: p.startswith("m-")
    )
    assert delete == ["m-1", "m-2", "m-3"]
    assert kept.paths == ["ckpt-1", "m-4"]
    kept, delete = _retention.select_retention(
        state, policy=AnyKeepPolicy(keep_policy_for(1, None), LatestN(2)), managed=lambda p, t: p.startswith("m-")
    )
    assert delete == ["m-1", "m-2"] and kept.paths == ["ckpt-1", "m-3", "m-4"]
    kept, delete = _retention.select_retention(state, policy=keep_policy_for(None, None))
    assert delete == [] and kept.paths == state.paths
