"""The session's exit when the body raises an exception group (a task group in the body)."""

from __future__ import annotations

import threading

import anyio
import pytest

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
        started.wait(20)
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
