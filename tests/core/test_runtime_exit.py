"""The session's exit: when the body raises an exception group (a task group in the
body), and when the stop overruns its grace."""

from __future__ import annotations

import threading
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
