"""A training process for the notice-window tests: one session per phase, each stopped
by a SIGUSR1 that carries a deadline (``StopOptions(deadline_secs={"SIGUSR1": ...})``).

Usage: ``notice_window.py BACKEND ROOT PHASE[:DEADLINE[:stretch]] ...``. Before each phase's
notice is due it prints ``ready <phase>`` (the parent then sends SIGUSR1); after each session
one JSON line: the phase, its deadline, the final step, each step's end (``time.monotonic()``,
the clock the parent shares), one save's measured time, when the session ended, its stop
reason. The process exits with ``asv.exit_code`` of the last session.

A deadline marked ``stretch`` stretches as the phase starts on a busy machine
(``tests/_timing.stretch``: a 200 MB save does not fit a 4 s window under a second
suite's load); the JSON line says by how much.

Phases: ``steady`` (0.05 s steps), ``first_trace`` (a ``tf.function`` whose trace takes
1 s), ``validation`` (``sess.fit``; the notice comes during a slow validation),
``warmup`` (the first batch takes 4 s), ``save_in_flight`` (0.05 s steps, a 200 MB state
saved every 5 steps; the notice comes while a save is being written).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import anyio
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from _timing import stretch

import asupervisor as asv
from asupervisor._core._notice import save_estimate
from asupervisor.testing import capture_logs


def ready(phase: str) -> None:
    print(f"ready {phase}", flush=True)


def slow_dataset(n: int, secs: float, phase: str, *, first_only: bool = False) -> tf.data.Dataset:
    """``n`` batches, each ``secs`` to make (the first only, with ``first_only``); the
    first one announces the phase."""
    seen = [0]

    def make(i: Any) -> Any:
        if seen[0] == 0:
            ready(phase)
        seen[0] += 1
        if not first_only or seen[0] == 1:
            time.sleep(secs)
        return np.float32(i)

    ds = tf.data.Dataset.range(n).map(lambda i: tf.py_function(make, [i], tf.float32))
    return ds.map(lambda x: (tf.reshape(x, (1, 1)), tf.reshape(x, (1, 1))))


async def run_phase(backend: str, root: str, phase: str, deadline: float, stretchable: bool) -> asv.Status:
    factor = stretch() if stretchable else 1.0
    deadline *= factor
    ends: list[float] = []
    v = tf.Variable(0, dtype=tf.int64)
    state: dict[str, Any] = {"v": v}
    model = None
    saving: dict[str, Any] = {}
    if phase == "save_in_flight":  # 200 MB: its write lasts a while
        state["big"] = tf.Variable(tf.zeros([50_000_000]))
        saving = {"save_model_steps": 5}
    if phase == "validation":
        import keras

        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        state = {"model": model}
    sv = asv.Supervisor(
        f"{root}/{phase}",
        state=state,
        save_summaries_secs=0,
        stop=asv.StopOptions(signals=("SIGTERM", "SIGUSR1"), deadline_secs={"SIGUSR1": deadline}),
        **saving,
    )

    with capture_logs() as logs:
        await _train(sv, phase, root, v, model, ends)
    status = sv.status()
    save = save_estimate(status.save_seconds)
    # the save's time the window's last plan reserved (the final save, measured after it,
    # moves the estimate)
    planned = [e["save_secs"] for e in logs if e["event"] == "notice.stopping" and "save_secs" in e]
    print(
        json.dumps(
            {
                "phase": phase,
                "deadline_secs": deadline,
                "stretch": factor,
                "final_step": sv.global_step,
                "step_ends": ends,
                "save_secs": planned[-1] if planned else save,
                "ended_at": time.monotonic(),
                "reason": status.stop_reason,
                "last_checkpoint": None if status.last_checkpoint is None else status.last_checkpoint.step,
            }
        ),
        flush=True,
    )
    return status


async def _train(sv: asv.Supervisor, phase: str, root: str, v: Any, model: Any, ends: list[float]) -> None:
    async with sv.managed_session() as sess:
        while sv.status().last_checkpoint is None:  # the start-up save measured: the window's rule needs it
            await anyio.sleep(0.01)
        if phase == "steady":

            def step() -> None:
                v.assign_add(1)
                time.sleep(0.05)
                ends.append(time.monotonic())
                if len(ends) == 3:
                    ready(phase)

            await sess.run_loop(step)
        elif phase == "save_in_flight":
            logdir = f"{root}/{phase}"
            announced: list[bool] = []

            def step() -> None:
                v.assign_add(1)
                time.sleep(0.05)
                ends.append(time.monotonic())
                if not announced and any(".asv-tmp-" in n for n in os.listdir(logdir)):
                    announced.append(True)  # a periodic save's files are being written
                    ready(phase)

            await sess.run_loop(step)
        elif phase == "first_trace":

            @tf.function
            def traced() -> Any:
                ready(phase)  # Python runs here at the trace only
                time.sleep(1.0)  # a long first trace (a big model's compile)
                return v.assign_add(1)

            def step() -> None:
                traced()
                time.sleep(0.05)
                ends.append(time.monotonic())

            await sess.run_loop(step)
        elif phase == "validation":
            assert model is not None
            train = slow_dataset(5, 0.0, "train")
            val = slow_dataset(400, 0.02, phase)

            class Ends(__import__("keras").callbacks.Callback):
                def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                    ends.append(time.monotonic())

            await sess.fit(model, train, epochs=3, validation_data=val, callbacks=[Ends()], verbose=0)
        elif phase == "warmup":
            data = slow_dataset(100, 4.0, phase, first_only=True).map(lambda x, y: x)

            def step(batch: Any) -> None:
                v.assign_add(1)
                ends.append(time.monotonic())

            await sess.run_loop(step, data)


async def main() -> asv.Status:
    backend, root, *phases = sys.argv[1:]
    asv.configure_logging()  # events to stderr; stdout is for the test
    status = None
    for item in phases:
        phase, _, rest = item.partition(":")
        secs, _, flag = rest.partition(":")
        status = await run_phase(backend, root, phase, float(secs or 3.0), flag == "stretch")
    assert status is not None
    return status


if __name__ == "__main__":
    # as the docs advise on a notice: the process ends right after the stop, skipping the
    # interpreter's and TensorFlow's teardown (which a thread stuck in tf.data slows)
    asv.exit_now(anyio.run(main, backend=sys.argv[1]))
