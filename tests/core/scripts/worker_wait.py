"""A non-chief worker waiting for a chief that never saves, for test_early_signals.py:
``worker_wait.py LOGDIR BACKEND``. A ``MonitoredTrainingSession(is_chief=False)`` waits
for the chief's first checkpoint (checking every 30 s; its events go to stderr, where the
parent sees the wait begin); a stop signal ends the wait, the session stops as it starts,
and the script prints ``done <stop reason> <step>`` and exits with ``asv.exit_code``."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import tensorflow as tf

import asupervisor as asv

w = tf.Variable(0.0)
session = asv.MonitoredTrainingSession(sys.argv[1], state={"w": w}, is_chief=False)


async def main() -> None:
    asv.configure_logging(level="info")  # events to stderr; stdout is for the test
    async with session as sess:
        while not sess.should_stop():
            await sess.run(w.assign_add, 1.0)


anyio.run(main, backend=sys.argv[2])
status = session.supervisor.status()
print(f"done {status.stop_reason} {session.supervisor.global_step}", flush=True)
asv.exit_now(status)
