"""A training process for the signal tests: steps until a signal asks it to stop."""

from __future__ import annotations

import sys
import time

import anyio
import tensorflow as tf

import asupervisor as asv


async def main() -> None:
    asv.configure_logging()  # events to stderr; stdout is for the test
    v = tf.Variable(0, dtype=tf.int64)
    sv = asv.Supervisor(None, state={"v": v}, handle_signals=True, save_summaries_secs=0)

    def step() -> None:
        v.assign_add(1)
        if sv.global_step == 0:
            print("ready", flush=True)
        time.sleep(0.001)

    async with sv.managed_session() as sess:
        await sess.run_loop(step)
    print(f"stop_reason={sv.status().stop_reason} v={int(v.numpy())} step={sv.global_step}", flush=True)
    sys.exit(asv.exit_code(sv.status()))  # what a training command should exit with


if __name__ == "__main__":
    anyio.run(main, backend=sys.argv[1])
