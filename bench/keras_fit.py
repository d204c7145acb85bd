"""Training rate of ``await sess.fit`` against Keras's own ``model.fit``, same model, same data.

Cases (no validation data: training steps only):

* **digits**: the MLP of TensorFlow's guide "Writing a training loop from scratch"
  (64-64-64-10, Adam, sparse categorical cross-entropy, accuracy) on ten classes of
  synthetic data shaped like scikit-learn's digits, 1,500 samples, shuffled, batch 64:
  24 short steps an epoch, so what happens between epochs weighs;
* **mlp**: a larger MLP (64-512-512-10, same compile) on 16,384 random examples (fixed
  seed), batch 256: 64 steps an epoch, the step dominates.

Contenders, alternated within each round so that a noisy neighbour hurts all of them:

* **model.fit**: ``model.fit(data, epochs=E, verbose=0)``;
* **sess.fit quiet**: ``sess.fit(model, data, epochs=E)`` in a ``Supervisor`` with a
  fresh logdir, ``save_model_secs`` far away and ``save_summaries_secs=0`` (what is left:
  the checkpoint ``fit`` saves at each epoch's end, the ``epoch_*`` scalars, the
  ``fit.epoch`` log line);
* **sess.fit defaults**: the same with the ``Supervisor``'s defaults (every service on);
* **sess.fit no logdir**: ``Supervisor(None, ...)``: no checkpoints, no summaries, so
  nothing at an epoch's end but the metrics read and reset and the log line: the cost of
  the step path alone (the data iterated by the step thread, the model's ``train_step``
  in a ``tf.function``).

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

Run: ``.venv/bin/python bench/keras_fit.py [--rounds 5] [--epochs 6] [--cases digits mlp]``.
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

CONTENDERS = ("model.fit", "sess.fit quiet", "sess.fit defaults", "sess.fit no logdir")
QUIET = {"save_model_secs": 10**9, "save_summaries_secs": 0}


def make_case(name: str) -> tuple[Any, Any, int]:
    """The compiled model, the training dataset and its steps per epoch of case ``name``."""
    import numpy as np
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    if name == "digits":
        rng = np.random.default_rng(0)  # ten classes shaped like scikit-learn's digits
        y = rng.integers(0, 10, size=1797)[:1500]
        x = (rng.normal(size=(10, 64))[y] + rng.normal(scale=2.0, size=(1500, 64))).astype("float32")
        hidden, batch = (64, 64), 64
    else:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(16384, 64)).astype("float32")
        y = rng.integers(0, 10, size=16384)
        hidden, batch = (512, 512), 256
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).batch(batch)
    model = tf.keras.Sequential(
        [tf.keras.Input((64,))]
        + [tf.keras.layers.Dense(width, activation="relu") for width in hidden]
        + [tf.keras.layers.Dense(10)]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(1e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    return model, data, -(-len(x) // batch)


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


def keras_fit(model: Any, data: Any, epochs: int, steps_per_epoch: int) -> float:
    clock = epoch_clock()
    model.fit(data, epochs=epochs, verbose=0, callbacks=[clock], shuffle=False)  # the dataset shuffles
    return rate(clock, steps_per_epoch)


async def sess_fit(
    model: Any, data: Any, epochs: int, steps_per_epoch: int, *, logdir: bool = True, **supervisor: Any
) -> float:
    clock = epoch_clock()
    with tempfile.TemporaryDirectory() as tmp:
        sv = asv.Supervisor(tmp if logdir else None, state={"model": model}, **supervisor)
        async with sv.managed_session() as sess:
            await sess.fit(model, data, epochs=epochs, callbacks=[clock])
        assert sv.status().stop_reason == "epochs", sv.status()
    return rate(clock, steps_per_epoch)


def spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


async def run_case(name: str, rounds: int, epochs: int) -> None:
    model, data, steps_per_epoch = make_case(name)
    rates: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    for r in range(rounds):
        for contender in CONTENDERS[r % len(CONTENDERS) :] + CONTENDERS[: r % len(CONTENDERS)]:
            if contender == "model.fit":
                found = keras_fit(model, data, epochs, steps_per_epoch)
            elif contender == "sess.fit quiet":
                found = await sess_fit(model, data, epochs, steps_per_epoch, **QUIET)
            elif contender == "sess.fit defaults":
                found = await sess_fit(model, data, epochs, steps_per_epoch)
            else:
                found = await sess_fit(model, data, epochs, steps_per_epoch, logdir=False)
            rates[contender].append(found)
    base = rates["model.fit"]
    print(f"{name}: {steps_per_epoch} steps/epoch, {rounds} rounds of {epochs} epochs ({epochs - 1} timed)")
    print(f"  {'contender':18s} {'steps/sec: median (range)':>28s}")
    for contender in CONTENDERS:
        print(f"  {contender:18s} {spread(rates[contender]):>28s}")
    for contender in CONTENDERS[1:]:
        ours, b = median(rates[contender]), median(base)
        per_round = [o / k for o, k in zip(rates[contender], base)]
        print(
            f"  {contender + ':':19s} sess.fit/model.fit {ours / b:.3f}x, model.fit/sess.fit {b / ours:.3f}x; "
            f"per round sess.fit/model.fit {spread(per_round, '{:.3f}')}"
        )


async def main(cases: list[str], rounds: int, epochs: int) -> None:
    logging.getLogger("asupervisor").setLevel(logging.WARNING)
    print(machine())
    print("load average (1, 5, 15 min) at the start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    for name in cases:
        await run_case(name, rounds, epochs)
    print("load average (1, 5, 15 min) at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each running every contender (5)")
    parser.add_argument("--epochs", type=int, default=6, help="epochs a run, the first one untimed (6)")
    parser.add_argument("--cases", nargs="*", choices=["digits", "mlp"], default=["digits", "mlp"])
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first is the warm-up)")
    anyio.run(main, args.cases, args.rounds, args.epochs)
