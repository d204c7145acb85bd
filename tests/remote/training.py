"""The small training the remote-tier tests run in-process: a seeded state (weights and a
random generator), a deterministic step, and a training into a URL logdir."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

import asupervisor as asv


def model() -> dict[str, Any]:
    """A fresh seeded state: 64x32 weights and a generator."""
    tf.keras.utils.set_random_seed(1)
    w = tf.Variable(tf.random.normal([64, 32]), name="w")
    gen = tf.random.Generator.from_seed(7)
    return {"w": w, "gen": gen}


def step(state: dict[str, Any]) -> None:
    """One deterministic step of ``state``."""
    state["w"].assign_add(state["gen"].normal([64, 32]))


async def train(url: str, local: Path, steps: int, **kwargs: Any) -> tuple[asv.Supervisor, dict[str, Any]]:
    """Train a fresh state into ``url`` (``local``: its working directory) to ``steps``;
    saves every 5 steps unless told otherwise."""
    state = model()
    kwargs.setdefault("save_model_steps", 5)
    sv = asv.Supervisor(url, local_dir=local, state=state, save_model_secs=0, handle_signals=False, **kwargs)
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: step(state), max_steps=steps)
    return sv, state


async def fresh_machine_resumes_bitwise(
    url: str, tmp_path: Path, keys: Callable[[], list[str]], read: Callable[[str], bytes]
) -> None:
    """The fresh-machine scenario, on any store: train 12 steps into ``url``; its objects
    (``keys()``, ``read(name)``) hold a committed checkpoint 12 with its marker and the
    state object, and no probe; a second training with an empty local working directory
    downloads checkpoint 12 and ends at step 20 bitwise where an uninterrupted run does."""
    sv, _ = await train(url, tmp_path / "machine-a", 12)
    remote = sv.status().remote
    assert remote is not None and remote.uploaded_step == 12 and remote.lag_steps == 0 and remote.error is None
    assert sv.logdir == url
    names = keys()
    assert "model.ckpt-12.asv-commit" in names and "checkpoint" in names, names
    assert not [k for k in names if k.startswith(".asv-probe-")], names
    marker = json.loads(read("model.ckpt-12.asv-commit"))
    assert marker["step"] == 12 and "model.ckpt-12.index" in marker["files"]

    sv2, resumed = await train(url, tmp_path / "machine-b", 20)
    assert sv2.status().global_step == 20
    reference = model()
    for _ in range(20):
        step(reference)
    np.testing.assert_array_equal(resumed["w"].numpy(), reference["w"].numpy())
    assert sorted(p.name for p in (tmp_path / "machine-b").glob("model.ckpt-12.*")) == [
        "model.ckpt-12.data-00000-of-00001",
        "model.ckpt-12.index",
    ]
