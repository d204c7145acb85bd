"""A Keras training on digits-shaped synthetic data through ``sess.fit``, or Keras's own ``fit``.

``python digits_fit.py LOGDIR OUT [--epochs N] [--kill-at STEP] [--keras]``: trains, then
writes the final weights and the history to ``OUT`` (``.npz``). ``--kill-at``: SIGKILL
itself right after that global step (a preemption without warning). ``--keras``:
``model.fit`` with ``BackupAndRestore`` into LOGDIR instead, for a side-by-side run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal

import anyio
import keras
import numpy as np
import tensorflow as tf

import asupervisor as asv

parser = argparse.ArgumentParser()
parser.add_argument("logdir")
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--kill-at", type=int, default=0)
parser.add_argument("--keras", action="store_true")
args = parser.parse_args()

tf.config.experimental.enable_op_determinism()
rng = np.random.default_rng(0)  # ten classes of 64 features, shaped like scikit-learn's digits
y = rng.integers(0, 10, size=1797)
x = (rng.normal(size=(10, 64))[y] + rng.normal(scale=2.0, size=(1797, 64))).astype("float32")
train = tf.data.Dataset.from_tensor_slices((x[:1500], y[:1500])).shuffle(1500, seed=0).batch(64)
val = tf.data.Dataset.from_tensor_slices((x[1500:], y[1500:])).batch(256)
keras.utils.set_random_seed(0)
model = keras.Sequential(
    [
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(10),
    ]
)
model.compile(
    optimizer=keras.optimizers.Adam(1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
sv = asv.Supervisor(
    args.logdir, state={"model": model}, save_model_steps=5, save_summaries_secs=0, handle_signals=False
)


class Kill(keras.callbacks.Callback):
    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        if sv.global_step + 1 == args.kill_at:  # the step counter moves after the callback
            os.kill(os.getpid(), signal.SIGKILL)


async def main() -> dict[str, list[float]]:
    async with sv.managed_session() as sess:
        return await sess.fit(model, train, epochs=args.epochs, validation_data=val, callbacks=[Kill()])
    raise AssertionError("unreachable")


if args.keras:
    history = model.fit(
        train,
        epochs=args.epochs,
        validation_data=val,
        verbose=0,
        callbacks=[keras.callbacks.BackupAndRestore(args.logdir)],
    ).history
else:
    history = anyio.run(main)
np.savez(args.out, *[v.numpy() for v in model.weights], history=json.dumps(history))
