"""watch_checkpoints: a sidecar evaluator sees each committed checkpoint once."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor.testing import ManualClock

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_new_threads")]


async def test_each_committed_checkpoint_once_then_timeout(tmp_path: Path) -> None:
    """Existing checkpoints first, then new ones in order, each once; a quiet spell ends it."""
    clock = ManualClock()
    v = tf.Variable(0.0)
    sv = asv.Supervisor(tmp_path, state={"v": v}, save_model_secs=0, save_summaries_secs=0, handle_signals=False)
    watcher = asv.watch_checkpoints(tmp_path, timeout=30, interval_secs=5, clock=clock)
    got: list[str] = []
    async with sv.managed_session() as sess:
        await sess.run(lambda: v.assign_add(1.0))
        await sv.save_now()
        got.append(await watcher.__anext__())
        for _ in range(2):
            await sess.run(lambda: v.assign_add(1.0))
            await sv.save_now()
        got.append(await watcher.__anext__())
        got.append(await watcher.__anext__())

    async with anyio.create_task_group() as tg:
        tg.start_soon(clock.advance_on_sleep, 5)
        with pytest.raises(StopAsyncIteration):
            await watcher.__anext__()
        tg.cancel_scope.cancel()
    assert [Path(p).name for p in got] == ["model.ckpt-1", "model.ckpt-2", "model.ckpt-3"]
    restored = tf.Variable(0.0)
    tf.train.Checkpoint(v=restored).restore(got[1]).expect_partial()
    assert float(restored.numpy()) == 2.0


async def test_async_for_over_an_existing_run(tmp_path: Path) -> None:
    """``async for`` yields what a finished run left, then stops after the timeout."""
    v = tf.Variable(0.0)
    sv = asv.Supervisor(tmp_path, state={"v": v}, handle_signals=False, save_summaries_secs=0)
    async with sv.managed_session() as sess:  # start-up checkpoint at 0, final one at 4
        for step in range(1, 5):
            await sess.run(lambda: v.assign_add(1.0))
            if step == 2:
                await sv.save_now()
    seen = [Path(p).name async for p in asv.watch_checkpoints(tmp_path, timeout=0)]
    assert seen == ["model.ckpt-0", "model.ckpt-2", "model.ckpt-4"]


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    """A negative timeout, a zero interval or a logdir that is a file are refused by name."""
    with pytest.raises(ValueError, match="timeout"):
        asv.watch_checkpoints(tmp_path, timeout=-1)
    with pytest.raises(ValueError, match="interval_secs"):
        asv.watch_checkpoints(tmp_path, interval_secs=0)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        asv.watch_checkpoints(tmp_path / "f")
