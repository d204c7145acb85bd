"""A Keras model trained by a custom ``tf.function`` step over a ``tf.data`` pipeline.

The model, the optimizer and the data iterator's position are all in the checkpoint,
so a resumed run continues with the very next batch::

    python examples/keras_custom_step.py --logdir runs/keras --steps 300
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads

import sys

import anyio
import numpy as np
import tensorflow as tf
from _cli import arguments

import asupervisor as asv


async def main(logdir: str, steps: int) -> int:
    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(4096, 1))).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512, seed=0).repeat().batch(32)
    model = tf.keras.Sequential(
        [tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"), tf.keras.layers.Dense(1)]
    )
    optimizer = tf.keras.optimizers.Adam(0.01)

    @tf.function
    def train_step(batch: tuple[tf.Tensor, tf.Tensor]) -> dict[str, tf.Tensor]:
        features, targets = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(features, training=True) - targets))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return {"loss": loss}

    first = float(tf.reduce_mean(tf.square(model(x) - y)))
    sv = asv.Supervisor(logdir, state={"model": model, "optimizer": optimizer})
    async with sv.managed_session() as sess:
        await sess.run_loop(train_step, data=data, max_steps=steps)
    last = float(tf.reduce_mean(tf.square(model(x) - y)))
    print(f"done: step {sv.global_step}, loss before {first:.4f}, after {last:.4f}")
    return asv.exit_code(sv.status())


if __name__ == "__main__":
    args = arguments(__doc__.splitlines()[0], steps=300)
    sys.exit(anyio.run(main, args.logdir, args.steps, backend=args.backend))
