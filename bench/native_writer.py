"""The native bundle writer against TensorFlow's ``SaveV2``: a durable save, same process.

``Checkpointer.write`` (write, fsync, commit) of a 16 MB and a 128 MB state, alternating
the writer (the fast store's ``FastPath.native_writer``) between repetitions; medians without the first
repetition, and each repetition's times. Issue 15 asks the writer to earn its place:
a gain >= 1.3x over ``SaveV2``. Run: ``python bench/native_writer.py [--reps 6]
[--dir DIR]`` (the default directory is on the project's disk, not a tmpfs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _common import machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--dir", default=str(Path(__file__).resolve().parent.parent))
    args = parser.parse_args()
    import tensorflow as tf

    from asupervisor._checkpoint._manager import Checkpointer
    from asupervisor._checkpoint.store import FastPath

    print(f"native writer vs SaveV2: {machine()}")
    for mb in (16, 128):
        ckpt = tf.train.Checkpoint(
            v=tf.Variable(tf.random.uniform([mb << 18])), global_step=tf.Variable(0, dtype=tf.int64)
        )
        times: dict[bool, list[float]] = {True: [], False: []}
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-native-") as directory:
            writers = {
                native: Checkpointer(ckpt, Path(directory), fast_path=FastPath(native_writer=native))
                for native in (True, False)
            }
            writers[True].prepare()
            step = 0
            for _ in range(args.reps):
                for native in (True, False):
                    checkpointer = writers[native]
                    step += 1
                    snap = checkpointer.snapshot(step)
                    assert snap is not None
                    t0 = time.perf_counter()
                    checkpointer.write(snap)
                    times[native].append(time.perf_counter() - t0)
                    checkpointer.prepare_next(snap)  # as the writer thread does after a save
        native, save_v2 = statistics.median(times[True][1:]), statistics.median(times[False][1:])
        print(
            f"  {mb:4d} MB durable save: native {native * 1e3:.0f} ms, SaveV2 {save_v2 * 1e3:.0f} ms, "
            f"gain {save_v2 / native:.2f}x (goal >= 1.3x)   runs native "
            f"{' '.join(f'{x * 1e3:.0f}' for x in times[True])} / SaveV2 {' '.join(f'{x * 1e3:.0f}' for x in times[False])} ms"
        )


if __name__ == "__main__":
    main()
