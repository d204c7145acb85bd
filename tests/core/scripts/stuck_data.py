"""A training whose input stops answering, for the stuck-data stop's test (test_signals.py).

    python stuck_data.py BACKEND LOGDIR EXIT

A ``tf.data`` pipeline over a generator that, after batch 20, blocks on a
``threading.Event`` nobody sets (a reader on a dead mount: the step thread waits in the
iterator's ``next()``, in TensorFlow's C++); it prints ``stuck <step>`` once the step
thread is seen waiting there for batch 21 (tf.data reads ahead: the reader stops a step
or two before the step thread does, and a stop before that is an ordinary one). Signals
are the supervisor's (SIGTERM: a stop, 2 s of grace). At the end it prints
``stop_reason=<reason> latest=<checkpoint>`` and exits with the status: through
``asv.exit_now`` if ``EXIT`` is ``now`` (as the docs advise), else ``sys.exit``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import tensorflow as tf

import asupervisor as asv
from asupervisor._core._threads import current_frames  # (sys._current_frames can deadlock: see there)


def _inside(frame: FrameType | None, name: str) -> bool:
    while frame is not None:
        if frame.f_code.co_name == name:
            return True
        frame = frame.f_back
    return False


async def main(logdir: str) -> int:
    asv.configure_logging(level="info")  # events to stderr; stdout is for the test
    v = tf.Variable(0, dtype=tf.int64)
    never = threading.Event()

    def reads() -> Iterator[int]:
        yield from range(20)
        threading.Thread(target=tell_when_the_step_thread_waits, daemon=True).start()
        never.wait()
        yield 20

    def tell_when_the_step_thread_waits() -> None:
        while True:  # a condition's poll: the step thread inside the iterator's __next__
            step_thread = next((t for t in threading.enumerate() if t.name == "asv-step"), None)
            frame = None if step_thread is None else current_frames().get(step_thread.ident or 0)
            if int(v.numpy()) == 20 and _inside(frame, "__next__"):  # the 21st next(): no batch
                print(f"stuck {int(v.numpy())}", flush=True)
                return
            time.sleep(0.01)

    data = tf.data.Dataset.from_generator(reads, output_signature=tf.TensorSpec([], tf.int64))

    @tf.function
    def step(batch: tf.Tensor) -> None:
        v.assign_add(1)

    sv = asv.Supervisor(logdir, state={"v": v}, save_model_secs=3600, save_summaries_secs=0, stop_grace_secs=2)
    async with sv.managed_session() as sess:
        await sess.run_loop(step, data)
    status = sv.status()
    latest = None if status.last_checkpoint is None else status.last_checkpoint.path
    print(f"stop_reason={status.stop_reason} latest={latest}", flush=True)
    return asv.exit_code(status)


if __name__ == "__main__":
    code = anyio.run(main, sys.argv[2], backend=sys.argv[1])
    if sys.argv[3] == "now":
        asv.exit_now(code)
    sys.exit(code)
