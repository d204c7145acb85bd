"""A training that catches the stop signals before its session:
``early_signal.py LOGDIR MAX_STEPS [catch|supervisor]``. ``catch`` (default): the script's
first lines call ``asv.catch_stop_signals()``, before TensorFlow is imported;
``supervisor``: the ``Supervisor`` is made first (its construction catches them) and the
session starts later. Prints ``ready``, then waits for a line on stdin (the parent
signals it meanwhile: a SIGTERM while it would be importing or building its data), then
trains to ``MAX_STEPS`` (resuming from LOGDIR) and prints ``done <stop reason> <step>``;
exits with ``asv.exit_code``."""

from __future__ import annotations

import sys

import asupervisor as asv

mode = sys.argv[3] if len(sys.argv) > 3 else "catch"
if mode == "catch":
    assert asv.catch_stop_signals()
    print("ready", flush=True)
    sys.stdin.readline()

import anyio  # noqa: E402 - the heavy imports come after the signals are caught, on purpose
import tensorflow as tf  # noqa: E402

w = tf.Variable(0.0)
sv = asv.Supervisor(sys.argv[1], state={"w": w}, save_summaries_secs=0)
if mode == "supervisor":
    print("ready", flush=True)
    sys.stdin.readline()


async def main() -> None:
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: w.assign_add(1.0), max_steps=int(sys.argv[2]))


anyio.run(main)
status = sv.status()
print(f"done {status.stop_reason} {sv.global_step}", flush=True)
sys.exit(asv.exit_code(status))
