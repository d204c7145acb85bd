"""``MonitoredTrainingSession``: TF1's defaults and chief-only hooks on the Supervisor engine."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import anyio
import pytest
import tensorflow as tf
from eventfiles import read_events, steps_of

import asupervisor as asv
from asupervisor.testing import ManualClock

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_new_threads")]


def mts(checkpoint_dir: Path | None = None, **kwargs: Any) -> asv.MonitoredTrainingSession:
    kwargs.setdefault("state", {"v": tf.Variable(0.0)})
    return asv.MonitoredTrainingSession(checkpoint_dir, handle_signals=False, **kwargs)


def kinds(session: asv.MonitoredTrainingSession) -> list[str]:
    return [type(h).__name__ for h in session.hooks]


def test_chief_gets_tf1_default_hooks_in_tf1_order(tmp_path: Path) -> None:
    """Chief: chief-only hooks, step counter, summaries, checkpoints, then the user's hooks."""
    user, chief_only = asv.StopAtStepHook(last_step=1), asv.FinalOpsHook(lambda: None)
    session = mts(tmp_path, hooks=[user], chief_only_hooks=[chief_only])
    assert kinds(session) == [
        "FinalOpsHook",
        "StepCounterHook",
        "SummarySaverHook",
        "CheckpointSaverHook",
        "StopAtStepHook",
    ]
    counter, summaries, saver = session.hooks[1:4]
    assert counter._timer.every_steps == 100  # type: ignore[attr-defined]
    assert summaries._timer.every_steps == 100  # type: ignore[attr-defined]
    assert saver._timer.every_secs == 600  # type: ignore[attr-defined]
    assert session.supervisor.config.save_model_secs == 0  # the hooks save, not the service
    assert session.supervisor.config.stop_grace_secs == 120


def test_the_checkpoint_hook_takes_the_basename_of_either_spelling(tmp_path: Path) -> None:
    """``CheckpointSaverHook`` names its files as the supervisor does, whether the basename
    comes as ``checkpoint_basename=`` or as ``checkpoint=asv.CheckpointOptions(basename=)``."""
    grouped = mts(tmp_path, checkpoint=asv.CheckpointOptions(basename="weights"))
    flat = mts(tmp_path, checkpoint_basename="weights")
    for session in (grouped, flat):
        assert session.supervisor.config.checkpoint_basename == "weights"
        assert session.hooks[-1]._basename == "weights"  # type: ignore[attr-defined]


def test_non_chief_gets_no_checkpoint_or_summary_hooks(tmp_path: Path) -> None:
    """A non-chief runs only ``hooks``: no chief-only, checkpoint or summary hooks."""
    user = asv.StopAtStepHook(last_step=1)
    session = mts(tmp_path, hooks=[user], chief_only_hooks=[asv.FinalOpsHook(lambda: None)], is_chief=False)
    assert session.hooks == (user,)


def test_steps_and_secs_arguments_follow_tf1() -> None:
    """Steps given: no default seconds for checkpoints; seconds given: no default steps for summaries."""
    session = mts("ckpt", save_checkpoint_steps=50, save_summaries_secs=30, log_step_count_steps=0)
    assert kinds(session) == ["SummarySaverHook", "CheckpointSaverHook"]
    summaries, saver = session.hooks
    assert summaries._timer.every_secs == 30  # type: ignore[attr-defined]
    assert saver._timer.every_steps == 50 and saver._timer.every_secs is None  # type: ignore[attr-defined]
    assert kinds(mts("ckpt", save_checkpoint_secs=None, save_summaries_steps=None)) == ["StepCounterHook"]
    assert kinds(mts(None)) == []
    with pytest.raises(ValueError):
        mts("ckpt", save_checkpoint_secs=-1)
    with pytest.raises(TypeError):
        mts("ckpt", save_model_secs=5)


async def test_tf1_style_loop_stops_at_step_and_writes_checkpoints_and_summaries(tmp_path: Path) -> None:
    """``while not sess.should_stop(): await sess.run(step)`` with TF1 hooks ends at the last step."""
    v = tf.Variable(0.0)

    @tf.function
    def step() -> dict[str, tf.Tensor]:
        return {"loss": v.assign_add(1.0)}

    session = mts(
        tmp_path,
        state={"v": v},
        hooks=[asv.StopAtStepHook(last_step=10)],
        save_checkpoint_steps=4,
        save_summaries_steps=3,
        log_step_count_steps=5,
    )
    async with session as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert sess.global_step == 10
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest is not None and latest.endswith("model.ckpt-10")
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert [Path(p).name for p in state.all_model_checkpoint_paths][-3:] == [
        "model.ckpt-4",
        "model.ckpt-8",
        "model.ckpt-10",
    ]
    events = read_events(tmp_path)
    assert events["loss"] == [(1, 1.0), (4, 4.0), (7, 7.0), (10, 10.0)]
    assert steps_of(events, "global_step/sec") == [6]


async def test_run_step_fn_and_request_stop(tmp_path: Path) -> None:
    """The session runs ``run_step_fn``; a step function's ``request_stop`` ends the loop."""

    def step_fn(ctx: asv.StepContext) -> int:
        ctx.run_with_hooks(lambda: {"loss": 1.0})
        if ctx.global_step == 3:
            ctx.request_stop()
        return ctx.global_step

    async with mts(tmp_path, save_checkpoint_secs=None) as sess:
        steps = [await sess.run_step_fn(step_fn) for _ in range(3)]
        assert sess.should_stop()
    assert steps == [1, 2, 3]
    assert sess.stop_reason == "requested"


async def test_request_stop_from_the_body(tmp_path: Path) -> None:
    """``sess.request_stop()`` ends the session cleanly; the final checkpoint is the last step."""
    async with mts(tmp_path) as sess:
        for _ in range(2):
            await sess.run(lambda: None)
        sess.request_stop()
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-2")


async def test_seconds_based_hooks_use_the_injected_clock(tmp_path: Path) -> None:
    """A ``clock=`` given to the session drives its seconds-based hooks too."""
    clock = ManualClock()
    async with mts(tmp_path, save_checkpoint_secs=10, save_summaries_secs=10, clock=clock) as sess:
        for _ in range(3):
            await sess.run(lambda: {"loss": 2.0})
            clock.advance(6)
    assert steps_of(read_events(tmp_path), "loss") == [1, 3]
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert [Path(p).name for p in state.all_model_checkpoint_paths] == [
        "model.ckpt-0",
        "model.ckpt-3",
    ]  # steps run at t=0, 6, 12


async def test_non_chief_starts_from_the_chiefs_checkpoint_and_writes_nothing(tmp_path: Path) -> None:
    """A non-chief waits for the chief's checkpoint, restores it, trains, writes nothing."""
    v = tf.Variable(0.0)
    async with mts(tmp_path, state={"v": v}, hooks=[asv.StopAtStepHook(last_step=4)]) as sess:
        await sess.run_loop(lambda: v.assign_add(1.0))
    before = sorted(p.name for p in tmp_path.iterdir())
    worker_v = tf.Variable(0.0)
    async with mts(tmp_path, state={"v": worker_v}, is_chief=False, hooks=[asv.StopAtStepHook(num_steps=3)]) as sess:
        assert sess.global_step == 4 and float(worker_v.numpy()) == 4.0
        await sess.run_loop(lambda: worker_v.assign_add(1.0))
    assert sess.global_step == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == before


async def test_non_chief_without_a_chief_checkpoint_times_out(tmp_path: Path) -> None:
    """With no checkpoint from the chief, a non-chief gives up after max_wait_secs."""
    clock = ManualClock()
    session = mts(tmp_path, is_chief=False, max_wait_secs=90, clock=clock, recovery_wait_secs=30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(clock.advance_on_sleep, 30, times=3))
        with pytest.raises(asv.DeadlineExceededError, match="90"):
            async with session:
                pytest.fail("a non-chief must not start without the chief's checkpoint")
    assert list(tmp_path.iterdir()) == []
