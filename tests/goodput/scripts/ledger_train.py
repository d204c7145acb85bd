"""A training for the goodput ledger's kill test: ``ledger_train.py LOGDIR MAX_STEPS [HOLD_AT]``.

Checkpoints every 10 steps and rewrites the ledger every 0.1 s. With ``HOLD_AT``, the step
after global step ``HOLD_AT`` never ends (it waits for nothing, as a wedged step does),
and ``holding`` is printed: the parent kills the process there, once the ledger records
that step. Prints ``done <time.monotonic()>`` once its session has ended (before the
interpreter's own teardown, which no ledger can record) and exits with ``exit_code``.
"""

from __future__ import annotations

import sys
import threading
import time

import anyio
import tensorflow as tf

import asupervisor as asv


async def main() -> None:
    asv.configure_logging()  # events to stderr; stdout is for the test
    logdir, max_steps = sys.argv[1], int(sys.argv[2])
    hold_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
    w = tf.Variable(tf.ones((4, 4)))
    data = tf.data.Dataset.range(1_000_000).map(lambda i: tf.fill((4, 4), tf.cast(i % 7, tf.float32)))
    sv = asv.Supervisor(
        logdir,
        state={"w": w},
        save_model_steps=10,
        save_model_secs=0,
        save_summaries_secs=0.1,
        handle_signals=False,
    )

    @tf.function
    def train(x: tf.Tensor) -> dict[str, tf.Tensor]:
        w.assign(0.9 * w + 0.01 * tf.matmul(x, w))
        return {"loss": tf.reduce_sum(w)}

    def step(x: tf.Tensor) -> dict[str, tf.Tensor]:
        if sv.global_step == hold_at:
            print("holding", flush=True)
            threading.Event().wait()  # wedged until killed
        return train(x)

    async with sv.managed_session() as sess:
        await sess.run_loop(step, data=data, max_steps=max_steps)
    print(f"done {time.monotonic()}", flush=True)  # the parent's stopwatch ends here: its clock
    sys.exit(asv.exit_code(sv.status()))


if __name__ == "__main__":
    anyio.run(main)
