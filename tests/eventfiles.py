"""Reading event files back with TensorBoard's own reader (a test helper)."""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


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
