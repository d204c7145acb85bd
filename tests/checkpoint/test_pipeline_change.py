"""A saved data position belongs to the pipeline that wrote it: resuming with another batch
size, a transformation added or removed, or a source of another length is a
CheckpointError before the first step, naming both pipelines and the ways out; the same
pipeline resumes exactly; ``checkpoint_iterator=False`` resumes the model with the data
from its start. Both checkpoint stores."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor._checkpoint.snapshot._iterator_state import describe_pipeline

Pipeline = Callable[[], Any]


def _base() -> Any:
    return tf.data.Dataset.from_tensor_slices(tf.range(64, dtype=tf.float32)).shuffle(16, seed=3).batch(8)


async def _run(logdir: Path, pipeline: Pipeline, max_steps: int, **loop: Any) -> tuple[asv.Supervisor, list[float]]:
    v = tf.Variable(0.0)
    seen: list[float] = []
    sv = asv.Supervisor(logdir, state={"v": v}, save_model_secs=0, save_model_steps=2, handle_signals=False)

    def step(batch: Any) -> None:
        first = float(tf.reshape(batch, [-1])[0])
        seen.append(first)
        v.assign_add(first)

    async with sv.managed_session() as sess:
        await sess.run_loop(step, data=pipeline(), max_steps=max_steps, **loop)
    return sv, seen


def test_the_description_names_what_a_position_depends_on() -> None:
    base = describe_pipeline(_base())
    assert base.startswith("TensorSlice -> float32[] | Shuffle -> float32[] | Batch(8) -> float32[?]")
    assert base.endswith("| 8 elements")
    assert describe_pipeline(_base()) == base  # the same code, the same description
    assert describe_pipeline(_base().unbatch().batch(4)) != base


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("changed", "what"),
    [
        (lambda: _base().unbatch().batch(4), r"Batch\(4\)"),
        (lambda: _base().map(lambda x: x * 2), r"Map"),
        (
            lambda: tf.data.Dataset.from_tensor_slices(tf.range(80, dtype=tf.float32)).shuffle(16, seed=3).batch(8),
            r"10 elements",
        ),
    ],
    ids=["batch-size", "added-map", "other-source"],
)
async def test_a_changed_pipeline_fails_before_the_first_step(
    tmp_path: Path, checkpoint_store: str, changed: Pipeline, what: str
) -> None:
    await _run(tmp_path, _base, 3)
    with pytest.raises(
        asv.CheckpointError, match=rf"the data pipeline changed since checkpoint .*model\.ckpt-3.*it is .*{what}"
    ):
        await _run(tmp_path, changed, 6)
    sv, seen = await _run(tmp_path, changed, 6, checkpoint_iterator=False)  # the way out: the data restarts
    assert sv.status().global_step == 6 and len(seen) == 3


@pytest.mark.anyio
async def test_the_same_pipeline_resumes_where_it_stopped(tmp_path: Path, checkpoint_store: str) -> None:
    _, straight = await _run(tmp_path / "straight", _base, 6)
    await _run(tmp_path / "resumed", _base, 3)
    _, rest = await _run(tmp_path / "resumed", _base, 6)
    assert rest == straight[3:]
