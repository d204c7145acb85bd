"""A training run whose output goes through a pipe, for tests/field/test_field_pipe.py.

    python pipe_train.py <backend> <logdir> <outcome.json>

Trains a tiny linear model under a Supervisor with frequent checkpoints and summaries,
asupervisor's events configured at info level on stderr (the test joins stdout and stderr
into a pipe, as ``python train.py 2>&1 | tee log`` does), until a signal stops it. When
the session has ended, writes ``{"step": <global step reached>, "error": null | "..."}`` to
``outcome.json`` (not to the pipe, which is dead by then).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import tensorflow as tf

import asupervisor as asv


async def main(logdir: str, outcome_path: str) -> None:
    asv.configure_logging(level="info")
    w = tf.Variable([[0.0], [0.0]])
    b = tf.Variable([0.0])
    opt = tf.keras.optimizers.SGD(0.01)
    x = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    y = tf.constant([[1.0], [2.0], [3.0], [4.0]])

    @tf.function
    def step() -> dict[str, tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w + b - y) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
        return {"loss": loss}

    sv = asv.Supervisor(
        logdir,
        state={"w": w, "b": b, "opt": opt},
        save_model_secs=0.2,
        save_summaries_secs=0.2,
        handle_signals=True,
    )
    error: str | None = None
    try:
        async with sv.managed_session() as sess:
            await sess.run_loop(step)
    except Exception as exc:  # reported through the outcome file, then re-raised
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        with open(outcome_path + ".tmp", "w") as f:
            json.dump({"step": sv.global_step, "error": error}, f)
        os.replace(outcome_path + ".tmp", outcome_path)


if __name__ == "__main__":
    backend, logdir, outcome = sys.argv[1:4]
    anyio.run(main, logdir, outcome, backend=backend)
