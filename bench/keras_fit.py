"""Training rate of ``await sess.fit`` against Keras's own ``model.fit``, same model, same data.

Cases:

* **digits**: the MLP of TensorFlow's guide "Writing a training loop from scratch"
  (64-64-64-10, Adam, sparse categorical cross-entropy, accuracy) on ten classes of
  synthetic data shaped like scikit-learn's digits, 1,500 samples, shuffled, batch 64:
  24 short steps an epoch, so what happens between epochs weighs; no validation;
* **mlp**: a larger MLP (64-512-512-10, same compile) on 16,384 random examples (fixed
  seed), batch 256: 64 steps an epoch, the step dominates; no validation;
* **validated**: the same MLP with a ``Dropout(0.2)`` after each hidden layer, on 32,768
  examples shuffled through a buffer of 1,024 as keras.io's guides do (128 steps an
  epoch), with ``validation_data`` (4,096 examples, 16 batches)
  evaluated after each epoch and a checkpoint after each validated epoch: Keras's own
  ``BackupAndRestore`` (model, optimizer, epoch: at each epoch's end) against
  ``sess.fit``'s default save after a validated epoch (model, optimizer, epoch, data
  position, the seed generators).

Contenders, alternated within each round so that a noisy neighbour hurts all of them
(``verbose=0`` for all: no progress bar):

* **model.fit**: ``model.fit(data, epochs=E, verbose=0)`` (validated: with
  ``validation_data`` and a ``BackupAndRestore`` in a fresh directory);
* **sess.fit quiet**: ``sess.fit(model, data, epochs=E)`` in a ``Supervisor`` with a
  fresh logdir, ``save_model_secs`` far away and ``save_summaries_secs=0`` (what is left:
  the ``epoch_*`` scalars, the ``fit.epoch`` log line and, with validation, the
  checkpoint after each validated epoch);
* **sess.fit defaults**: the same with the ``Supervisor``'s defaults (every service on);
* **sess.fit no logdir** (not with validation): ``Supervisor(None, ...)``: no checkpoints,
  no summaries, so nothing at an epoch's end but the metrics read and reset and the log
  line: the cost of the step path alone (the data iterated by the step thread, the
  model's ``train_step`` in a ``tf.function``).

One model per case serves all contenders (the same variables, the same traced step's
shape). A round runs E epochs of each contender, each round starting with the next
contender in turn (so none always follows the same one); an epoch-end callback (not a batch one:
it leaves both on their fast path) takes the time, and the rate is the steps of epochs
2..E over the time from the end of epoch 1 to the end of epoch E: the first epoch
(tracing, a session's start) is the warm-up, and each timed epoch includes one epoch
end's work. Printed per case: each contender's median steps/sec and range over the
rounds, and the ratios of the medians both ways (sess.fit/model.fit and
model.fit/sess.fit; goal: sess.fit within 5 % of model.fit), with the median and range
of each round's own ratio. Log output is filtered to warnings.

Run: ``.venv/bin/python bench/keras_fit.py [--rounds 5] [--epochs 6] [--cases digits mlp validated]``;
``--quick``: one round of two epochs on an eighth of the data, for a check that it runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
from _common import machine, median

import asupervisor as asv

CASES = ("digits", "mlp", "validated")
CONTENDERS = ("model.fit", "sess.fit quiet", "sess.fit defaults", "sess.fit no logdir")
QUIET = {"save_model_secs": 10**9, "save_summaries_secs": 0}


def make_case(name: str, scale: int = 1) -> tuple[Any, Any, Any, int]:
    """The compiled model, the training dataset, the validation dataset (or ``None``) and
    the steps per epoch of case ``name``; ``scale``: the data divided by it."""
    import numpy as np
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    val = None
    if name == "digits":  # ten classes shaped like scikit-learn's digits
        y = rng.integers(0, 10, size=1797)[: 1500 // scale]
        x = (rng.normal(size=(10, 64))[y] + rng.normal(scale=2.0, size=(len(y), 64))).astype("float32")
        hidden, batch, dropout = (64, 64), 64, 0.0
    else:
        n = (16384 if name == "mlp" else 32768) // scale
        x = rng.normal(size=(n, 64)).astype("float32")
        y = rng.integers(0, 10, size=n)
        hidden, batch, dropout = (512, 512), 256, 0.0
        if name == "validated":
            m = 4096 // scale
            x_val, y_val = rng.normal(size=(m, 64)).astype("float32"), rng.integers(0, 10, size=m)
            val = tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch)
            dropout = 0.2
    # validated: the shuffle buffer of keras.io's guides (1,024): TF serialises a shuffle
    # iterator's whole buffer, ~5 ms a checkpoint here against ~0.2 s for one of 32,768
    buffer = 1024 if name == "validated" else len(x)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(buffer, seed=0).batch(batch)
    layers: list[Any] = [tf.keras.Input((64,))]
    for width in hidden:
        layers.append(tf.keras.layers.Dense(width, activation="relu"))
        if dropout:
            layers.append(tf.keras.layers.Dropout(dropout))
    model = tf.keras.Sequential([*layers, tf.keras.layers.Dense(10)])
    model.compile(
        optimizer=tf.keras.optimizers.Adam(1e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    return model, data, val, -(-len(x) // batch)


def epoch_clock() -> Any:
    """A Keras callback keeping ``time.perf_counter()`` at each epoch's end in ``.ends``."""
    import keras

    class EpochClock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.ends: list[float] = []

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.ends.append(time.perf_counter())

    return EpochClock()


def rate(clock: Any, steps_per_epoch: int) -> float:
    """Steps/sec over the epochs after the first."""
    ends = clock.ends
    return steps_per_epoch * (len(ends) - 1) / (ends[-1] - ends[0])


def keras_fit(model: Any, data: Any, val: Any, epochs: int, steps_per_epoch: int) -> float:
    import keras

    clock = epoch_clock()
    with tempfile.TemporaryDirectory() as tmp:
        # With validation, Keras's own checkpoint at each epoch's end, before the clock's reading
        backup = [keras.callbacks.BackupAndRestore(tmp)] if val is not None else []
        model.fit(
            data, epochs=epochs, verbose=0, validation_data=val, callbacks=[*backup, clock], shuffle=False
        )  # the dataset shuffles
    return rate(clock, steps_per_epoch)


async def sess_fit(
    model: Any, data: Any, val: Any, epochs: int, steps_per_epoch: int, *, logdir: bool = True, **supervisor: Any
) -> float:
    clock = epoch_clock()
    with tempfile.TemporaryDirectory() as tmp:
        sv = asv.Supervisor(tmp if logdir else None, state={"model": model}, **supervisor)
        async with sv.managed_session() as sess:
            await sess.fit(model, data, epochs=epochs, validation_data=val, callbacks=[clock], verbose=0)
        status = sv.status()
        assert status.stop_reason == "epochs", status
        if val is not None:  # a checkpoint after each validated epoch
            blocked = status.save_seconds.get("blocked")
            assert blocked is not None, status
            assert blocked.count >= epochs, status
    return rate(clock, steps_per_epoch)


def spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


async def run_case(name: str, rounds: int, epochs: int, scale: int = 1) -> None:
    model, data, val, steps_per_epoch = make_case(name, scale)
    # with validation, every contender checkpoints: no "no logdir"
    contenders = CONTENDERS if val is None else CONTENDERS[:3]
    rates: dict[str, list[float]] = {c: [] for c in contenders}
    for r in range(rounds):
        for contender in contenders[r % len(contenders) :] + contenders[: r % len(contenders)]:
            if contender == "model.fit":
                found = keras_fit(model, data, val, epochs, steps_per_epoch)
            elif contender == "sess.fit quiet":
                found = await sess_fit(model, data, val, epochs, steps_per_epoch, **QUIET)
            elif contender == "sess.fit defaults":
                found = await sess_fit(model, data, val, epochs, steps_per_epoch)
            else:
                found = await sess_fit(model, data, val, epochs, steps_per_epoch, logdir=False)
            rates[contender].append(found)
    base = rates["model.fit"]
    print(f"{name}: {steps_per_epoch} steps/epoch, {rounds} rounds of {epochs} epochs ({epochs - 1} timed)")
    print(f"  {'contender':18s} {'steps/sec: median (range)':>28s}")
    for contender in contenders:
        print(f"  {contender:18s} {spread(rates[contender]):>28s}")
    for contender in contenders[1:]:
        ours, b = median(rates[contender]), median(base)
        per_round = [o / k for o, k in zip(rates[contender], base)]
        print(
            f"  {contender + ':':19s} sess.fit/model.fit {ours / b:.3f}x, model.fit/sess.fit {b / ours:.3f}x; "
            f"per round sess.fit/model.fit {spread(per_round, '{:.3f}')}"
        )


async def main(cases: list[str], rounds: int, epochs: int, scale: int = 1) -> None:
    logging.getLogger("asupervisor").setLevel(logging.WARNING)
    print(machine())
    print("load average (1, 5, 15 min) at the start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    for name in cases:
        await run_case(name, rounds, epochs, scale)
    print("load average (1, 5, 15 min) at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each running every contender (5)")
    parser.add_argument("--epochs", type=int, default=6, help="epochs a run, the first one untimed (6)")
    parser.add_argument("--cases", nargs="*", choices=CASES, default=list(CASES))
    parser.add_argument("--quick", action="store_true", help="one round of two epochs on 1/8 of the data")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first is the warm-up)")
    if args.quick:
        args.rounds, args.epochs = 1, 2
    anyio.run(main, args.cases, args.rounds, args.epochs, 8 if args.quick else 1)
