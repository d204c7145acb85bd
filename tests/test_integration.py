"""Features from different modules working together, as a user combines them."""

from __future__ import annotations

import itertools
from pathlib import Path

import anyio
import pytest
from _timing import scaled
from eventfiles import read_events, tick

import asupervisor as asv
from asupervisor.testing import ManualClock

pytestmark = pytest.mark.anyio


async def test_queue_fill_level_reaches_tensorboard(tmp_path: Path, no_new_threads: None) -> None:
    """A queue runner's fraction_full is written to the event file by the summary service."""
    clock = ManualClock()
    qr = asv.QueueRunner(itertools.count(), capacity=8, name="feed")
    sv = asv.Supervisor(
        tmp_path,
        queue_runners=[qr],
        save_summaries_secs=60,
        save_model_secs=0,
        handle_signals=False,
        clock=clock,
    )
    async with sv.managed_session() as sess:
        with anyio.fail_after(scaled(30)):
            while qr.statistics().size < 8:  # the producer fills the queue, then waits
                await anyio.sleep(0.005)
        await sess.run(lambda: None)
        await tick(clock, 60)
        assert sv.status().queues["feed"].fraction_full == 1.0
    events = read_events(tmp_path)
    assert events["queue/feed/fraction_full"] == [(1, 1.0)]
