"""An evaluator beside a multi-worker training, for test_multi_worker.py.

Usage: ``python mw_eval.py LOGDIR FINAL_STEP``. Follows ``asv.watch_checkpoints(LOGDIR)``
and reads every tensor of each checkpoint it is given with TensorFlow's own reader
(which checks each tensor's CRC); prints ``EVAL <step>`` for one that loads and
``FAILED <step> <error>`` for one that does not; ends after the checkpoint of
``FINAL_STEP``, or after 120 s without a new checkpoint (times the suite's slowness figure,
``ASUPERVISOR_TEST_SLOWNESS``).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import anyio
import tensorflow as tf

import asupervisor as asv


async def main(logdir: str, final_step: int) -> None:
    async for path in asv.watch_checkpoints(
        logdir, timeout=120 * float(os.environ.get("ASUPERVISOR_TEST_SLOWNESS", "1")), interval_secs=0.05
    ):
        step = int(path.rsplit("-", 1)[1])
        try:
            reader = tf.train.load_checkpoint(path)
            for key in reader.get_variable_to_shape_map():
                reader.get_tensor(key)
        except Exception as exc:
            print(f"FAILED {step} {type(exc).__name__}: {exc}", flush=True)
        else:
            print(f"EVAL {step}", flush=True)
        if step >= final_step:
            return


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
