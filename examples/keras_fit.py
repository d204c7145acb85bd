"""A compiled Keras model trained by ``sess.fit``: ``model.fit``, resumable exactly.

The model of TensorFlow's guide "Writing a training loop from scratch" (an MLP, Adam,
sparse categorical cross-entropy) on ten classes of synthetic data shaped like scikit-learn's digits,
validated after each epoch. The model, the optimizer, the epoch and the position in it
are checkpointed: Ctrl-C (or a kill) and a second run goes on from where it stopped;
TensorBoard shows ``epoch_loss`` and ``epoch_accuracy`` in the runs ``train`` and
``validation``::

    python examples/keras_fit.py --logdir runs/keras_fit --epochs 10
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads

import argparse
import sys

import anyio
import numpy as np
import tensorflow as tf

import asupervisor as asv


async def main(logdir: str, epochs: int) -> int:
    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)  # ten classes of 64 features, shaped like scikit-learn's digits
    y = rng.integers(0, 10, size=1797)
    x = (rng.normal(size=(10, 64))[y] + rng.normal(scale=2.0, size=(1797, 64))).astype("float32")
    train = tf.data.Dataset.from_tensor_slices((x[:1500], y[:1500])).shuffle(1500, seed=0).batch(64)
    val = tf.data.Dataset.from_tensor_slices((x[1500:], y[1500:])).batch(64)

    model = tf.keras.Sequential(
        [
            tf.keras.Input((64,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(1e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )

    sv = asv.Supervisor(logdir, state={"model": model})
    async with sv.managed_session() as sess:
        history = await sess.fit(model, train, epochs=epochs, validation_data=val)
    status = sv.status()
    # empty when the logdir's checkpoint had already reached --epochs: nothing to train
    accuracy = f"val accuracy {history['val_accuracy'][-1]:.4f}" if history else "nothing to train"
    print(f"done: epoch {status.epoch}/{epochs}, {accuracy}, stop reason {status.stop_reason}")
    return asv.exit_code(status)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="runs/keras_fit", help="checkpoints and summaries")
    parser.add_argument("--epochs", type=int, default=10, help="train up to this epoch (absolute)")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    sys.exit(anyio.run(main, args.logdir, args.epochs, backend=args.backend))
