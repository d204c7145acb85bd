"""A training whose script catches the stop signals in its first lines, before importing
TensorFlow: ``early_signal.py LOGDIR MAX_STEPS``. Prints ``ready``, then waits for a line
on stdin (the parent signals it meanwhile: a SIGTERM while it would be importing), then
imports TensorFlow, trains to ``MAX_STEPS`` (resuming from LOGDIR) and prints ``done
<stop reason> <step>``; exits with ``asv.exit_code``."""

from __future__ import annotations

import sys

import asupervisor as asv

assert asv.catch_stop_signals()
print("ready", flush=True)
sys.stdin.readline()

import anyio  # noqa: E402 - the heavy imports come after the signals are caught, on purpose
import tensorflow as tf  # noqa: E402

w = tf.Variable(0.0)
sv = asv.Supervisor(sys.argv[1], state={"w": w}, save_summaries_secs=0)


async def main() -> None:
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: w.assign_add(1.0), max_steps=int(sys.argv[2]))


anyio.run(main)
status = sv.status()
print(f"done {status.stop_reason} {sv.global_step}", flush=True)
sys.exit(asv.exit_code(status))
