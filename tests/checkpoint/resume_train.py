"""A small deterministic training run for tests/checkpoint/test_resume.py (run as a subprocess).

Usage: ``python resume_train.py LOGDIR MAX_STEPS SAVE_STEPS WIDTH [OUT.npz]``, or import
it and call :func:`train` (the tests also fork it from a pre-warmed process).

Seeded, op determinism on, CPU only. The state holds a dense model (``w1`` of 16 x WIDTH
and ``w2`` of WIDTH x 1 float32), momentum slots for both, a ``tf.random.Generator``
(dropout-like noise) and, through ``run_loop``, the iterator of a shuffled
``tf.data.Dataset``: 136 * WIDTH bytes of float32 in all. Prints ``START <n>`` once the
session has restored (or initialised, ``n`` = 0) its state, then ``STEP <n>`` after every
step, so that the parent can check where it resumed and kill it at a random moment while
it trains. When OUT is given, every variable of the state is written there (after the
session has stopped), by its checkpoint name (:func:`variables`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import anyio
import numpy as np
import tensorflow as tf

import asupervisor as asv


def build(width: int) -> tuple[dict[str, Any], Any, Any]:
    """The state, the dataset and the (tf.function) train step, all seeded."""
    tf.config.experimental.enable_op_determinism()
    tf.random.set_seed(1)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 16)).astype("float32")
    y = rng.normal(size=(512, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512, seed=2).batch(8, drop_remainder=True).repeat()
    init = np.random.default_rng(1)
    w1 = tf.Variable(init.standard_normal(size=(16, width), dtype=np.float32) * 0.1, name="w1")
    w2 = tf.Variable(init.standard_normal(size=(width, 1), dtype=np.float32) * 0.1, name="w2")
    slots = [tf.Variable(tf.zeros_like(w1)), tf.Variable(tf.zeros_like(w2))]  # momentum
    gen = tf.random.Generator.from_seed(3)
    state = {"w1": w1, "w2": w2, "m": slots, "gen": gen}

    @tf.function
    def train_step(batch: tuple[tf.Tensor, tf.Tensor]) -> dict[str, tf.Tensor]:
        xb, yb = batch
        keep = tf.cast(gen.uniform(tf.shape(xb)) > 0.1, tf.float32)
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(xb * keep, w1))
            # scaled by 1/sqrt(width) so that a wide model does not diverge (to NaN) either
            loss = tf.reduce_mean(tf.square(tf.matmul(h, w2) * width**-0.5 - yb))
        for v, m, g in zip((w1, w2), slots, tape.gradient(loss, [w1, w2])):
            m.assign(0.9 * m + g)
            v.assign_sub(0.01 * m)
        return {"loss": loss}

    return state, data, train_step


def variables(state: dict[str, Any], global_step: Any = None) -> dict[str, Any]:
    """Every variable of ``state`` (and ``global_step`` if given) by its checkpoint key."""
    found = {
        "w1": state["w1"],
        "w2": state["w2"],
        "m/0": state["m"][0],
        "m/1": state["m"][1],
        "gen/_state_var": state["gen"].state,
    }
    if global_step is not None:
        found["global_step"] = global_step
    return {f"{name}/.ATTRIBUTES/VARIABLE_VALUE": v for name, v in found.items()}


def _print_report(kind: str, step: int) -> None:
    # one write: print()'s separate writes of the parts can interleave with a log line
    # the checkpoint writer thread prints meanwhile
    sys.stdout.write(f"{kind} {step}\n")
    sys.stdout.flush()


def train(
    logdir: str,
    max_steps: int,
    save_steps: int,
    width: int,
    out: str | None = None,
    report: Callable[[str, int], None] = _print_report,
    *,
    tracked_data: bool = True,
) -> None:
    """Train to ``max_steps`` (resuming from ``logdir``).

    Calls ``report("START", n)`` once the session holds its restored (or initialised)
    state at step ``n``, then ``report("STEP", n)`` after each step; by default these are
    printed as ``START n`` and ``STEP n`` lines. With ``tracked_data=False`` the dataset
    is iterated by the step itself, so its iterator is not in the checkpoint (which then
    holds only plain tensors: asupervisor's own bundle writer writes it all, without
    ``SaveV2``).
    """
    state, data, train_step = build(width)
    batches = None if tracked_data else iter(data)

    def step(batch: Any = None) -> None:
        train_step(batch if batches is None else next(batches))
        report("STEP", sv.global_step + 1)

    sv = asv.Supervisor(
        logdir,
        state=state,
        save_model_secs=3600,
        save_model_steps=save_steps,
        max_to_keep=3,
        save_summaries_secs=0,
        handle_signals=False,
    )

    async def run() -> None:
        async with sv.managed_session() as sess:
            report("START", sv.global_step)
            await sess.run_loop(step, data if tracked_data else None, max_steps=max_steps)

    anyio.run(run)
    if out is not None:
        np.savez(out, **{k: v.numpy() for k, v in variables(state).items()}, global_step=sv.global_step)
    print("DONE", sv.global_step, flush=True)


if __name__ == "__main__":
    train(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else None)
