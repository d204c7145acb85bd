"""Test helpers for summaries: reading event files back with TensorBoard's own reader, and
moving a ``ManualClock`` through the summary services' ticks."""

from __future__ import annotations

import os
from typing import Any

import anyio.lowlevel
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from asupervisor.testing import ManualClock

SERVICES = 2  # the step counter and the summary service sleep on the clock


def read_events(logdir: str | os.PathLike[str]) -> dict[str, list[tuple[int, Any]]]:
    """Every summary in ``logdir``: tag -> [(step, value)], values as NumPy (floats for scalars)."""
    acc = EventAccumulator(os.fspath(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    out: dict[str, list[tuple[int, Any]]] = {}
    for tag in acc.Tags()["tensors"]:
        rows = []
        for event in acc.Tensors(tag):
            value = tf.make_ndarray(event.tensor_proto)
            rows.append((event.step, float(value) if value.ndim == 0 and value.dtype.kind == "f" else value))
        out[tag] = rows
    return out


def steps_of(events: dict[str, list[tuple[int, Any]]], tag: str) -> list[int]:
    """The steps ``tag`` was written at."""
    return [step for step, _ in events.get(tag, [])]


async def tick(clock: ManualClock, secs: float, sleepers: int = SERVICES, *, settle: bool = True) -> None:
    """Move the clock and return once every service has done its tick and sleeps again.

    The summary service always awaits the step thread in a tick, so the number of
    sleepers drops below ``sleepers`` until its tick is done. ``settle=False`` returns
    as soon as they woke (for a tick whose work the test follows itself).
    """
    await clock.wait_for_sleepers(sleepers)
    clock.advance(secs)
    while clock.sleepers >= sleepers:  # let them wake up
        await anyio.lowlevel.checkpoint()
    if settle:
        await clock.wait_for_sleepers(sleepers)
