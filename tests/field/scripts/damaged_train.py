"""Field-test child: a Keras + Adam training run that checkpoints every 5 steps.

Usage: damaged_train.py LOGDIR MAX_STEPS BACKEND [--hold] [--build] [--wide]

Prints ``start <step> <latest checkpoint at start>`` once the session is up, ``saved
<step>`` after each checkpoint, ``end <step>`` at the end. With ``--hold`` it waits
(without exiting) after the save at MAX_STEPS, for the test to kill it. With ``--build``
the optimizer is built before the session (its slots exist, so a restore reads the
files straight into the variables) and ``read <how> <checkpoint>`` and ``corrupt
<checkpoint> <reason>`` are printed for the restore's ``checkpoint.read`` and
``checkpoint.corrupt`` events. With ``--wide`` the model takes 1024 inputs (a 2 MiB
first kernel, which a restore reads with direct I/O when it is not in the page cache).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import keras
import tensorflow as tf

import asupervisor as asv
from asupervisor.testing import capture_logs

logdir, max_steps, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]
hold = "--hold" in sys.argv[4:]
build = "--build" in sys.argv[4:]
inputs, units = (1024, 512) if "--wide" in sys.argv[4:] else (4, 8)

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(units), keras.layers.Dense(1)])
opt = keras.optimizers.Adam(0.01)
if build:
    opt.build(model.trainable_variables)
x = tf.random.stateless_normal((16, inputs), (1, 2))
y = tf.reduce_sum(x, 1, keepdims=True)


@tf.function
def train_step() -> dict[str, tf.Tensor]:
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return {"loss": loss}


def init_fn() -> None:
    print("init_fn", flush=True)


sv = asv.Supervisor(
    logdir,
    state=tf.train.Checkpoint(model=model, optimizer=opt),
    init_fn=init_fn,
    save_model_secs=600,
    save_summaries_secs=0,
    handle_signals=False,
)


async def main() -> None:
    with capture_logs() as events:
        async with sv.managed_session() as sess:
            for event in events:
                if build and event["event"] == "checkpoint.read":
                    print("read", event["how"], event["path"], flush=True)
                if build and event["event"] == "checkpoint.corrupt":
                    print("corrupt", event["path"], event["reason"], flush=True)
            print("start", sess.global_step, tf.train.latest_checkpoint(logdir), flush=True)
            while sess.global_step < max_steps:
                await sess.run(train_step)
                if sess.global_step % 5 == 0:
                    info = await sv.save_now()
                    print("saved", info.step if info is not None else None, flush=True)
            if hold:
                print("holding", flush=True)
                await anyio.sleep_forever()
    print("end", sv.global_step, flush=True)


anyio.run(main, backend=backend)
