"""A small training run for the disk field tests (tests/field/test_field_disk.py).

    python disk_train.py LOGDIR [--mb MB] [--steps N] [--save-steps N] [--keep N|none]
                                [--grace SECS] [--stall SECS] [--backend asyncio|trio]

The state is a ``big`` float32 variable of ``MB`` megabytes (its checkpoint is that big)
and a small ``w`` that each step bumps. Prints ``STEP <n>`` after each step, ``SAVED
<path>`` after the first explicit save (``--save-first``), ``STOP_SECS <secs>`` (the time
from the end of the body to the end of ``managed_session()``) and ``THREADS <names>``
(asupervisor threads still alive after it), then exits 0; an error propagates (exit 1,
traceback on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import anyio
import tensorflow as tf

import asupervisor as asv


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("logdir")
    parser.add_argument("--mb", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save-steps", type=int, default=None)
    parser.add_argument("--keep", default="5")
    parser.add_argument("--grace", type=float, default=120.0)
    parser.add_argument("--save-first", action="store_true")
    parser.add_argument("--stall", type=float, default=0.0, help="the final save's first write hangs this long")
    parser.add_argument("--backend", default="asyncio")
    args = parser.parse_args()

    n = int(args.mb * (1 << 20) / 4)
    state = {"big": tf.Variable(tf.fill([n], 1.5)), "w": tf.Variable(0.0)}

    def step() -> None:
        state["w"].assign_add(1.0)

    sv = asv.Supervisor(
        args.logdir,
        state=state,
        save_model_secs=3600,
        save_model_steps=args.save_steps,
        max_to_keep=None if args.keep == "none" else int(args.keep),
        save_summaries_secs=0,
        stop_grace_secs=args.grace,
        handle_signals=False,
    )
    stop_secs: list[float] = []

    async def run() -> None:
        async with sv.managed_session() as sess:
            if args.save_first:
                info = await sv.save_now()
                print("SAVED", info.path if info else None, flush=True)
            for _ in range(args.steps):
                await sess.run(step)
                print("STEP", sess.global_step, flush=True)
            if args.stall:  # the slow disk's next write of a checkpoint file (the final save's first) hangs
                marker = os.path.join(os.path.dirname(os.path.abspath(args.logdir)), f"asv-stall-{args.stall}")
                os.close(os.open(marker, os.O_CREAT | os.O_WRONLY, 0o644))
            stop_secs.append(time.perf_counter())
        stop_secs.append(time.perf_counter())

    anyio.run(run, backend=args.backend)
    print("STOP_SECS", round(stop_secs[1] - stop_secs[0], 3), flush=True)
    alive = [t.name for t in threading.enumerate() if t.name.startswith("asv-") and t.is_alive()]
    print("THREADS", ",".join(alive), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
