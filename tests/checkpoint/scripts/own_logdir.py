"""A training that owns its logdir for the owner-lock tests.

Usage: ``own_logdir.py LOGDIR``. Saves every 5 steps; at step 12, once checkpoint 10 is
committed, it prints ``ready`` and waits for a line on stdin (the logdir quiet, its lock
held), then trains to step 15 and
exits with ``exit_code``.
"""

from __future__ import annotations

import os
import sys
import time

import anyio
import tensorflow as tf

import asupervisor as asv

#: a hang guard, stretched as the suite's are on a slow or busy machine (tests/_timing.py)
WAIT_SECS = 60 * float(os.environ.get("ASUPERVISOR_TEST_SLOWNESS", "1"))


async def main() -> None:
    asv.configure_logging()  # events to stderr; stdout is for the test
    v = tf.Variable(0, dtype=tf.int64)
    sv = asv.Supervisor(sys.argv[1], state={"v": v}, save_model_steps=5, save_model_secs=0, save_summaries_secs=0)

    def step() -> None:
        v.assign_add(1)
        if sv.global_step == 12:
            deadline = time.monotonic() + WAIT_SECS
            while (last := sv.status().last_checkpoint) is None or last.step < 10:  # step 10's write committed
                if time.monotonic() > deadline:
                    raise TimeoutError(f"checkpoint 10 was not committed within {WAIT_SECS:.0f} s")
                time.sleep(0.01)
            print("ready", flush=True)
            sys.stdin.readline()

    async with sv.managed_session() as sess:
        await sess.run_loop(step, max_steps=15)
    print(f"done step={sv.global_step}", flush=True)
    sys.exit(asv.exit_code(sv.status()))


if __name__ == "__main__":
    anyio.run(main)
