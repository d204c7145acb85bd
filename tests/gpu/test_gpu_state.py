"""Checkpoints of a state in device memory: the snapshot holds the values of its step
boundary while training goes on, and they come back bitwise. Run on the CPU everywhere
and on the GPU where TensorFlow sees one (``make bench-gpu`` measures the same path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import asupervisor as asv

GPUS = tf.config.list_physical_devices("GPU")
DEVICES = [
    "/cpu:0",
    pytest.param(
        "/gpu:0", marks=pytest.mark.skipif(not GPUS, reason="needs a GPU visible to TensorFlow (this machine has none)")
    ),
]


@pytest.mark.anyio
@pytest.mark.parametrize("device", DEVICES)
async def test_a_snapshot_holds_its_boundary_while_the_next_steps_update_the_state(tmp_path: Path, device: str) -> None:
    """Saves are taken in the background while every step rewrites the whole state on
    ``device``: each checkpoint holds exactly the values of its own step (never a mix
    of two steps), and the last one restores bitwise into a fresh state."""
    with tf.device(device):
        big = tf.Variable(tf.zeros([1 << 20]))  # 4 MiB, every element rewritten each step
        small = tf.Variable(tf.zeros([3, 5]))
    assert big.device.upper().endswith(device[1:].upper())

    @tf.function
    def step() -> None:
        big.assign_add(tf.ones_like(big))
        small.assign(small + 2.0)

    sv = asv.Supervisor(
        tmp_path, state={"big": big, "small": small}, save_model_steps=3, max_to_keep=None, handle_signals=False
    )
    async with sv.managed_session() as sess:
        await sess.run_loop(step, max_steps=12)
    for path in tf.train.get_checkpoint_state(str(tmp_path)).all_model_checkpoint_paths:
        saved_step = int(path.rsplit("-", 1)[1])
        reader = tf.train.load_checkpoint(path)
        keys = {k.split("/")[0]: k for k in reader.get_variable_to_shape_map() if k.endswith("VARIABLE_VALUE")}
        values = reader.get_tensor(keys["big"])
        assert values.min() == values.max() == saved_step, path  # one step's values, all of them
        assert np.all(reader.get_tensor(keys["small"]) == 2.0 * saved_step), path
    with tf.device(device):
        fresh = {"big": tf.Variable(tf.zeros([1 << 20])), "small": tf.Variable(tf.zeros([3, 5]))}
    sv2 = asv.Supervisor(tmp_path, state=fresh, handle_signals=False)
    async with sv2.managed_session():
        pass
    assert sv2.global_step == 12
    assert fresh["big"].numpy().tobytes() == big.numpy().tobytes()
    assert fresh["small"].numpy().tobytes() == small.numpy().tobytes()
