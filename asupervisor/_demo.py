"""``asupervisor demo``: a real, resumable training run on built-in data.

Trains a small MLP to classify points of three interleaved spirals (data generated here,
deterministically, so nothing is downloaded) under an ``asupervisor.Supervisor``:
checkpoints and TensorBoard summaries go to ``--logdir``, progress is printed every few
seconds by a looped service, Ctrl-C stops gracefully (with a final checkpoint), and
running the command again resumes from the last checkpoint::

    asupervisor demo --logdir runs/demo                     # 3000 more steps each run
    asupervisor demo --logdir runs/demo --max-steps 10000   # up to global step 10000

A front door (it imports TensorFlow, so only when the command runs); the process exits
with ``asv.exit_code`` (0 done, 130 after Ctrl-C, 143 after SIGTERM).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads: no start-up noise

import anyio
import numpy as np
import tensorflow as tf

import asupervisor as asv


def spirals(n_per_class: int = 2000, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Points on ``classes`` interleaved noisy spirals, and their labels."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c in range(classes):
        r = np.linspace(0.05, 1.0, n_per_class)
        t = np.linspace(c * 2 * math.pi / classes, c * 2 * math.pi / classes + 3 * math.pi, n_per_class)
        t = t + rng.normal(0, 0.15, n_per_class)
        xs.append(np.stack([r * np.sin(t), r * np.cos(t)], axis=1))
        ys.append(np.full(n_per_class, c))
    return np.concatenate(xs).astype("float32"), np.concatenate(ys).astype("int32")


def say(line: str) -> None:
    """Print a line of progress. When standard output is a pipe whose reader died
    (``demo.py | tee log`` and tee was killed), point it at ``os.devnull`` instead of
    failing, as Python's documentation advises: losing the output must not stop training
    (asupervisor's own log lines on stderr are dropped the same way)."""
    try:
        print(line, flush=True)  # noqa: T201 - the demo's output
    except (BrokenPipeError, ValueError):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


async def main(args: argparse.Namespace) -> int:
    asv.configure_logging(level="info")
    tf.keras.utils.set_random_seed(0)
    x, y = spirals()
    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x), seed=0, reshuffle_each_iteration=True)
        .repeat()
        .batch(args.batch_size)
    )
    model = tf.keras.Sequential(
        [
            tf.keras.Input((2,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(3),
        ]
    )
    optimizer = tf.keras.optimizers.Adam(1e-2)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(batch: tuple[tf.Tensor, tf.Tensor]) -> dict[str, tf.Tensor]:
        features, labels = batch
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            loss = loss_fn(labels, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels), tf.float32))
        return {"loss": loss, "accuracy": accuracy}

    sv = asv.Supervisor(
        args.logdir,
        state={"model": model, "optimizer": optimizer},
        save_model_secs=args.save_secs,
        save_summaries_secs=args.summary_secs,
    )

    def progress() -> None:  # a sync looped service: runs on its own thread
        status = sv.status()
        rate = f"{status.steps_per_sec:.0f}" if status.steps_per_sec else "-"
        say(f"progress: step {status.global_step}/{target}  steps/sec {rate}")

    sv.loop(args.progress_secs, progress, name="progress")

    target: int | str = "?"
    async with sv.managed_session() as sess:
        start = sess.global_step
        if start:
            say(f"resumed at step {start}")
        goal: int = args.max_steps if args.max_steps is not None else start + args.steps
        target = goal
        await sess.run_loop(train_step, data=data, max_steps=goal)

    logits = model(x, training=False)
    accuracy = float(np.mean(np.argmax(logits.numpy(), 1) == y))
    say(
        f"done: step {sv.global_step}, stop reason {sv.status().stop_reason}, "
        f"training-set accuracy {accuracy:.3f}, logdir {args.logdir}"
    )
    tensorboard = Path(sys.executable).parent / "tensorboard"
    say(f"curves: {tensorboard if tensorboard.exists() else 'tensorboard'} --logdir {args.logdir}")
    return asv.exit_code(sv.status())


def run(args: argparse.Namespace) -> int:
    """Run the demo; its exit status."""
    status: int = anyio.run(main, args, backend=args.backend)
    return status
