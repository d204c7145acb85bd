"""A user's training script fed by ``tf.data.Dataset.from_generator`` (field test).

``python generator_train.py LOGDIR BACKEND MAX_STEPS MODE`` with ``MODE`` one of ``auto``,
``true``, ``false`` (``run_loop``'s ``checkpoint_iterator``). Saves every 10 steps. Prints
one ``result {...}`` JSON line on stdout at the end: the step it started at, the first
batch it saw, the steps ``run_loop`` returned, the global step. Events go to stderr.
"""

from __future__ import annotations

import itertools
import json
import sys
import time

import anyio
import numpy as np
import tensorflow as tf

import asupervisor as asv


def records() -> object:
    """The user's Python data source: 0, 1, 2, ... (state TF cannot serialise)."""
    for i in itertools.count():
        yield np.float32(i)


async def main(logdir: str, max_steps: int, mode: bool | None) -> None:
    asv.configure_logging()
    data = tf.data.Dataset.from_generator(records, output_signature=tf.TensorSpec((), tf.float32)).batch(2)
    w = tf.Variable(0.0)
    sv = asv.Supervisor(logdir, state={"w": w}, save_model_steps=10, save_summaries_secs=0, max_to_keep=50)
    seen: list[float] = []

    def step(batch: tf.Tensor) -> None:
        if not seen:
            print("first_step", flush=True)
        seen.append(float(batch[0]))
        w.assign_add(tf.reduce_sum(batch))
        time.sleep(0.005)  # the step's work

    async with sv.managed_session() as sess:
        start = sess.global_step
        ran = await sess.run_loop(step, data=data, max_steps=max_steps, checkpoint_iterator=mode)
    result = {"start": start, "first_batch": seen[0] if seen else None, "ran": ran, "global_step": sv.global_step}
    print("result " + json.dumps(result), flush=True)


if __name__ == "__main__":
    modes = {"auto": None, "true": True, "false": False}
    anyio.run(main, sys.argv[1], int(sys.argv[3]), modes[sys.argv[4]], backend=sys.argv[2])
