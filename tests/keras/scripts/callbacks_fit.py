"""Two ``sess.fit`` calls with Keras's stock callbacks firing, for a kill series.

``python callbacks_fit.py LOGDIR OUT [--kill-at STEP]``: a Dropout model trained first on
arrays (``validation_split``, shuffled by Keras's adapter), then on a shuffled
``keras.utils.PyDataset``, with ``EarlyStopping`` (stops the second fit),
``ReduceLROnPlateau`` and ``LearningRateScheduler`` (both change the learning rate each
epoch), ``TerminateOnNaN``, ``ModelCheckpoint`` and a callback of its own with
``get_state``/``set_state``. Writes the final weights, the optimizer's variables and what
the callbacks hold to ``OUT`` (``.npz``). ``--kill-at``: SIGKILL itself right after that
global step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from typing import Any

import anyio
import keras
import numpy as np
import tensorflow as tf

import asupervisor as asv

parser = argparse.ArgumentParser()
parser.add_argument("logdir")
parser.add_argument("out")
parser.add_argument("--kill-at", type=int, default=0)
args = parser.parse_args()

tf.config.experimental.enable_op_determinism()
rng = np.random.default_rng(0)
y = rng.integers(0, 10, size=1500)
x = (rng.normal(size=(10, 32))[y] + rng.normal(scale=2.0, size=(1500, 32))).astype("float32")
keras.utils.set_random_seed(0)
model = keras.Sequential(
    [keras.Input((32,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dropout(0.2), keras.layers.Dense(10)]
)
model.compile(
    optimizer=keras.optimizers.Adam(1e-2),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
sv = asv.Supervisor(
    args.logdir, state={"model": model}, save_model_steps=5, save_summaries_secs=0, handle_signals=False
)


class Batches(keras.utils.PyDataset):
    def __len__(self) -> int:
        return 15

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return x[100 * i : 100 * (i + 1)], y[100 * i : 100 * (i + 1)]


class Kill(keras.callbacks.Callback):
    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        if sv.global_step + 1 == args.kill_at:  # the step counter moves after the callback
            os.kill(os.getpid(), signal.SIGKILL)


class Count(keras.callbacks.Callback):
    """Its own state: the batches seen over the whole training."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.batches += 1

    def get_state(self) -> dict[str, int]:
        return {"batches": self.batches}

    def set_state(self, state: dict[str, int]) -> None:
        self.batches = state["batches"]


def callbacks() -> list[Any]:
    return [
        Kill(),
        count,
        keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=2),
        keras.callbacks.ReduceLROnPlateau(monitor="loss", min_delta=10.0, patience=0, factor=0.8),
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.9),
        keras.callbacks.TerminateOnNaN(),
        keras.callbacks.ModelCheckpoint(os.path.join(args.logdir, "best.weights.h5"), save_weights_only=True),
    ]


count = Count()


async def main() -> dict[str, Any]:
    async with sv.managed_session() as sess:
        first = callbacks()
        await sess.fit(model, x, y, batch_size=64, epochs=2, validation_split=0.2, verbose=0, callbacks=first)
        second = callbacks()
        history = await sess.fit(model, Batches(), epochs=8, verbose=0, callbacks=second)
        return {"history": history, "stopped_epoch": second[2].stopped_epoch, "batches": count.batches}
    raise AssertionError("unreachable")


out = anyio.run(main)
out.update(step=sv.status().global_step, stop_reason=sv.status().stop_reason)
values = [np.asarray(v) for v in (*model.weights, *model.optimizer.variables)]
np.savez(args.out, *values, record=json.dumps(out))
