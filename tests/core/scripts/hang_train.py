"""A training process for the hang watchdog's tests (tests/core/test_watchdog.py).

    python hang_train.py BACKEND LOGDIR MODE

The watchdog has small deadlines here (floor 1 s, 2 s before anything is learned, the
process ended 1 s after the stop). ``MODE``:

* ``wedge``: the step is a ``tf.function`` around a ``tf.py_function``; at step 30 the
  Python function prints ``wedged <step>`` and waits on a ``threading.Event`` that is
  never set;
* ``save``: five steps and a checkpoint, then it ends (for ``restore``);
* ``restore``: restores ``LOGDIR`` (its disk holds the read), then would train.

At the end it prints ``stop_reason=<reason>`` and exits with ``asv.exit_code``; a hang
ends it with ``asv``'s hang status before that.
"""

from __future__ import annotations

import os
import sys
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import tensorflow as tf

import asupervisor as asv

WATCHDOG = asv.WatchdogOptions(floor_secs=1.0, unlearned_secs=2.0, exit_after_secs=1.0)


async def main(backend: str, logdir: str, mode: str) -> int:
    asv.configure_logging(level="info")  # events to stderr; stdout is for the test
    state = {"w": tf.Variable(0.0), "big": tf.Variable(tf.zeros([1 << 18]))}
    never = threading.Event()

    def maybe_wedge(w: tf.Tensor) -> tf.Tensor:
        if int(w.numpy()) == 30:
            print(f"wedged {int(w.numpy())}", flush=True)
            never.wait()
        return w

    @tf.function
    def step() -> tf.Tensor:
        w = state["w"].assign_add(1.0)
        return tf.py_function(maybe_wedge, [w], tf.float32)

    sv = asv.Supervisor(
        logdir,
        state=state,
        save_model_secs=3600,
        save_summaries_secs=0,
        stop=asv.StopOptions(watchdog=WATCHDOG),
    )
    async with sv.managed_session() as sess:
        print("started", flush=True)
        if mode == "save":
            await sess.run_loop(step, max_steps=5)
        else:
            await sess.run_loop(step, max_steps=1000)
    print(f"stop_reason={sv.status().stop_reason}", flush=True)
    return asv.exit_code(sv.status())


if __name__ == "__main__":
    backend, logdir, mode = sys.argv[1:4]
    sys.exit(anyio.run(main, backend, logdir, mode, backend=backend))
