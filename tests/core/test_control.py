"""Control of a running session from other tasks: ``save_now`` and ``request_stop``."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import tensorflow as tf

import asupervisor as asv

pytestmark = pytest.mark.anyio


async def test_save_now_from_several_tasks_and_after_the_session(tmp_path: Path) -> None:
    """Two tasks calling ``save_now`` at once while ``run_loop`` trains each get a
    committed checkpoint on disk; after the session, ``save_now`` is a clear
    ``RuntimeError`` and ``request_stop`` does nothing."""
    v = tf.Variable(0.0)
    sv = asv.Supervisor(tmp_path, state={"v": v}, handle_signals=False, save_model_secs=0, save_summaries_secs=0)
    infos: list[asv.CheckpointInfo] = []

    def step() -> None:
        v.assign_add(1.0)

    async with sv.managed_session() as sess:

        async def save() -> None:
            infos.append(await sv.save_now())

        async def control() -> None:
            while sess.global_step < 5:
                await anyio.sleep(0.001)
            async with anyio.create_task_group() as tg:
                tg.start_soon(save)
                tg.start_soon(save)
            sv.request_stop()
            sv.request_stop()  # idempotent

        async with anyio.create_task_group() as tg:
            tg.start_soon(control)
            await sess.run_loop(step)
    assert len(infos) == 2
    for info in infos:
        assert Path(info.path + ".index").exists() and info.step >= 5
    sv.request_stop()  # the session is gone: nothing happens
    with pytest.raises(RuntimeError, match="needs a running managed_session"):
        await sv.save_now()
