"""A tiny deterministic training for ``verify-resume``'s tests: a linear model fitted by
Adam on a seeded, shuffled ``tf.data`` pipeline, with a ``tf.random.Generator`` adding
noise, all in the state. ``--untracked`` plants a batch source outside the state: batches
from a Python generator, as scripts keep one, which a resumed run starts again from its
first batch. Each step also waits ``--step-secs`` so that kills land
mid-training.

    python regression.py --logdir DIR [--steps 80] [--untracked]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import tensorflow as tf

import asupervisor as asv


async def main(args: argparse.Namespace) -> int:
    kernel = tf.Variable(tf.random.stateless_normal((4, 2), seed=(1, 2)))
    bias = tf.Variable(tf.zeros((2,)))
    opt = tf.keras.optimizers.Adam(0.05)
    rng = tf.random.Generator.from_seed(3)
    x = tf.random.stateless_normal((64, 4), seed=(5, 6))
    y = x @ tf.constant([[1.0, -1.0], [2.0, 0.5], [0.0, 1.0], [-1.0, 3.0]])
    data: Iterable[tuple[tf.Tensor, tf.Tensor]] = (
        tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(32, seed=7).batch(8)
    )
    if args.untracked:  # planted: the batches' position is outside the state
        data = ((x[k % 8 * 8 :][:8] * (1 + k / 1000), y[k % 8 * 8 :][:8]) for k in range(10**6))

    @tf.function
    def train(batch: tuple[tf.Tensor, tf.Tensor]) -> dict[str, tf.Tensor]:
        features, target = batch
        features = features + rng.normal(tf.shape(features), stddev=0.01)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((features @ kernel + bias - target) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, [kernel, bias]), [kernel, bias]))
        return {"loss": loss}

    def step(batch: tuple[tf.Tensor, tf.Tensor]) -> dict[str, tf.Tensor]:
        time.sleep(args.step_secs)
        return train(batch)

    sv = asv.Supervisor(args.logdir, state={"kernel": kernel, "bias": bias, "optimizer": opt, "rng": rng})
    async with sv.managed_session() as sess:
        await sess.run_loop(step, data=data, max_steps=args.steps)
    return asv.exit_code(sv.status())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--step-secs", type=float, default=0.02)
    parser.add_argument("--untracked", action="store_true")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    arguments = parser.parse_args()
    sys.exit(anyio.run(main, arguments, backend=arguments.backend))
