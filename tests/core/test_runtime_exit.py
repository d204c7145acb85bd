"""The session's exit: when the body raises an exception group (a task group in the
body), and when the stop overruns its grace."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import tensorflow as tf
from _timing import scaled

import asupervisor as asv


@pytest.mark.anyio
async def test_step_error_inside_a_body_task_group_shuts_down(no_new_threads: None) -> None:
    """A step error raised through a task group in the body still stops everything in order.

    On trio the stop scope's exit re-raises the body's exception group without its
    ``Cancelled``; the shutdown must run anyway (step thread joined, services stopped) and
    the step's error come out as itself.
    """
    sv = asv.Supervisor(handle_signals=False, save_summaries_secs=0, stop_grace_secs=20)
    started = threading.Event()

    def bad_step() -> None:
        started.wait(scaled(20))
        raise ValueError("bad step")

    async def sibling() -> None:
        started.set()
        await anyio.sleep_forever()

    with pytest.raises(ValueError, match="bad step"):
        async with sv.managed_session() as sess:
            async with anyio.create_task_group() as tg:
                tg.start_soon(sibling)
                await sess.run(bad_step)
    status = sv.status()
    assert not status.running and status.stop_reason == "error:ValueError"


@pytest.mark.anyio
async def test_a_stop_past_its_grace_says_it_in_one_line_naming_the_next_start(tmp_path: Path) -> None:
    """A stop whose grace is spent before its final checkpoint: one error line names the
    phase that overran, the phases it left out, and the checkpoint the next start uses."""
    from asupervisor.testing import capture_logs

    v = tf.Variable(0.0)
    sv = asv.Supervisor(tmp_path, state={"v": v}, handle_signals=False, save_summaries_secs=0)
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: v.assign_add(1.0), max_steps=4)
    hurried = asv.Supervisor(tmp_path, state={"v": v}, handle_signals=False, save_summaries_secs=0, stop_grace_secs=0)
    with capture_logs() as logs:
        async with hurried.managed_session() as sess:
            await sess.run_loop(lambda: v.assign_add(1.0), max_steps=6)
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["event"] for e in errors] == ["shutdown.overrun"], errors
    (overrun,) = errors
    assert overrun["phase"] == "final_checkpoint" and "hooks_end" in overrun["skipped"], overrun
    assert overrun["next_start"] == str(tmp_path / "model.ckpt-4"), overrun


@pytest.mark.anyio
async def test_a_stop_while_the_data_hangs_ends_within_its_grace_and_the_late_batch_changes_nothing(
    tmp_path: Path,
) -> None:
    """A stop that comes while the step thread waits in the data's ``next()`` (a reader
    stuck on a dead mount) ends the session ``stop_grace_secs`` + the 1 s wind-down after
    it was requested, not when the data comes: the final checkpoint is left out (the
    thread that owns the state is stuck; the last committed one is the restart point).
    When the batch comes after all, it is not trained on and nothing queued behind it
    runs (no save after the session's end), but the logdir's lock is let go then, so the
    logdir can be trained into again by this process."""
    from asupervisor.testing import capture_logs

    data_comes = threading.Event()
    stop_at = threading.Event()

    def data() -> Iterator[int]:
        yield from range(3)
        stop_at.set()
        data_comes.wait(scaled(15))  # the stuck read (the old stop waited for it)
        yield 99

    v = tf.Variable(0, dtype=tf.int64)
    sv = asv.Supervisor(
        tmp_path,
        state={"v": v},
        handle_signals=False,
        save_summaries_secs=0,
        stop_grace_secs=1,
        stop=asv.StopOptions(watchdog=asv.WatchdogOptions(enabled=False)),  # (it would end the process at 8 s)
    )
    requested: list[float] = []

    def step(batch: int) -> None:
        v.assign_add(1)

    with capture_logs() as logs:
        async with sv.managed_session() as sess:

            async def stop_when_stuck() -> None:
                await anyio.to_thread.run_sync(stop_at.wait)
                requested.append(time.monotonic())
                sv.request_stop(reason="test")

            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_when_stuck)
                await sess.run_loop(step, data())
    took = time.monotonic() - requested[0]
    assert took <= 1 + 1 + scaled(0.5), took  # the grace and the wind-down
    (overrun,) = [e for e in logs if e["event"] == "shutdown.overrun"]
    assert "final_checkpoint" in overrun["skipped"] and overrun["next_start"] == str(tmp_path / "model.ckpt-0")
    last = sv.status().last_checkpoint
    assert last is not None and last.step == 0
    stuck = [t for t in threading.enumerate() if t.name == "asv-step"]
    assert stuck, "the step thread was joined: it was not stuck"
    data_comes.set()
    for thread in stuck:
        await anyio.to_thread.run_sync(thread.join, scaled(10))
        assert not thread.is_alive()
    assert int(v.numpy()) == 3  # the late batch: not trained on
    assert sorted(p.name for p in tmp_path.glob("model.ckpt-*.index")) == ["model.ckpt-0.index"]
    again = asv.Supervisor(tmp_path, state={"v": v}, handle_signals=False, save_summaries_secs=0)
    async with again.managed_session() as sess:  # the lock was let go
        assert sess.global_step == 0
