"""One worker of a two-worker ``MultiWorkerMirroredStrategy`` training, for test_multi_worker.py.

Usage: ``python mw_train.py LOGDIR MAX_STEPS SAVE_STEPS BACKEND OUT.npz [signals]`` with
``TF_CONFIG`` set by the parent. The process prints ``RUNNING`` after its 20th step of
this run. With ``signals`` the session handles SIGINT/SIGTERM and the process exits with
``asv.exit_code``; with ``GCE_METADATA_HOST`` set it also watches that (fake) metadata
server for a preemption notice; with ``keep-all`` no checkpoint is deleted (``max_to_keep=None``);
with ``watchdog`` the hang watchdog has short deadlines (a collective 2 s at least, the
process ended 1 s after the stop: under TensorFlow's 10 s heartbeat timeout) and the
library's events go to stderr; with ``notice`` SIGUSR1 is a notice with a deadline
(``MW_NOTICE_SECS`` seconds, 4 by default), each step takes 0.05 s more, and the end prints
``ENDS <each step's end, time.monotonic(), as JSON>`` and ``SAVE_SECS <one save's time>``, ``ENDED <when the session ended>``. The state holds a Keras model and optimizer, a Keras ``Mean`` metric and
an ``ON_READ``/``SUM`` counter (both SyncOnRead: reading them is a collective all-reduce),
a ``tf.Variable`` (which TF's walk saves through a saveable converter) or, with
``keras-counter``, a Keras variable. Either way snapshots after the first reuse the walk.
Each worker trains on its own data; gradients are all-reduced.

Prints, one line each: ``RESTORED <step> <path>``, then for every save this process took
part in ``SAVED <step>`` (the chief's commit) or ``WORKER_SAVED <step> <tmp dir>`` (a
non-chief's temporary save), then ``DONE <global step> <stop reason>``. The final
weights, metric and counter go to OUT.npz. A session that raised prints its error on
stderr and ``FAILED <stop reason>``, and exits with ``asv.exit_code``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import anyio
import numpy as np
import tensorflow as tf

import asupervisor as asv
from asupervisor._core._notice import save_estimate


async def main(
    logdir: str,
    max_steps: int,
    save_steps: int,
    out: str,
    signals: bool,
    keep_all: bool,
    keras_counter: bool,
    watchdog: bool,
    notice: bool,
) -> int:
    info = asv.cluster_info()
    tf.keras.utils.set_random_seed(0)  # the same initial weights in every run: runs compare bitwise
    tf.config.experimental.enable_op_determinism()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
        opt = tf.keras.optimizers.SGD(0.05)
        mean = tf.keras.metrics.Mean()
        if keras_counter:  # the whole state Keras variables
            counter = tf.keras.Variable(0.0, synchronization="on_read", aggregation="sum", name="counter")
        else:  # a tf.Variable under a strategy: TF's walk wraps it in a SaveableCompatibilityConverter
            counter = tf.Variable(
                0.0, synchronization=tf.VariableSynchronization.ON_READ, aggregation=tf.VariableAggregation.SUM
            )
    worker = 0 if info.is_chief else 1 + info.task_index

    @tf.function
    def train_step() -> None:
        def replica_fn() -> None:
            seed = tf.stack([tf.cast(opt.iterations, tf.int32), worker])
            x = tf.random.stateless_normal([8, 4], seed=seed)
            y = tf.reduce_sum(x, axis=1, keepdims=True) * tf.constant([[1.0, -1.0]])
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            mean.update_state(loss)
            counter.assign_add(1.0)

        strategy.run(replica_fn)

    stop: dict[str, Any] = {"handle_signals": signals}
    if watchdog:
        asv.configure_logging(level="info")  # events to stderr
        dog = asv.WatchdogOptions(floor_secs=1.0, peer_secs=2.0, exit_after_secs=1.0)
        stop = {"stop": asv.StopOptions(handle_signals=signals, watchdog=dog)}
    if notice:
        deadline = {"SIGUSR1": float(os.environ.get("MW_NOTICE_SECS", "4"))}
        stop = {"stop": asv.StopOptions(signals=("SIGTERM", "SIGUSR1"), deadline_secs=deadline)}
    sv = asv.Supervisor(
        logdir,
        state={"model": model, "opt": opt, "metric": list(mean.variables), "counter": counter},
        save_model_steps=save_steps,  # save_model_secs keeps its default: not used here
        max_to_keep=None if keep_all else 5,
        **stop,
    )
    if os.environ.get("GCE_METADATA_HOST"):  # a (fake) metadata server to watch: this task's VM
        sv.add_service(asv.GcePreemptionNotice())
    taken = [0]
    ends: list[float] = []

    def step() -> None:
        train_step()
        if notice:
            time.sleep(0.05)
            ends.append(time.monotonic())
        taken[0] += 1
        if taken[0] == 20:
            print("RUNNING", flush=True)

    events: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            events.append({**getattr(record, "event_dict", {}), "log_level": record.levelname.lower()})

    logging.getLogger("asupervisor").addHandler(Collect())
    logging.getLogger("asupervisor").setLevel(logging.DEBUG)
    try:
        async with sv.managed_session() as sess:
            print(f"RESTORED {sv.global_step} {sv.status().last_checkpoint}", flush=True)
            await sess.run_loop(step, max_steps=max_steps)
        ended = time.monotonic()
    except Exception as exc:  # as a cluster's training script ends: the error, then the status
        traceback.print_exception(exc)
        print(f"FAILED {sv.status().stop_reason}", flush=True)
        return asv.exit_code(sv.status())  # no collective reads: a peer may be gone
    for event in events:
        if event["event"] == "checkpoint.saved":
            print(f"SAVED {event['step']}", flush=True)
        elif event["event"] == "checkpoint.worker_saved":
            print(f"WORKER_SAVED {event['step']} {event['tmp']}", flush=True)
        elif event["event"] == "notice.stop_step":
            print(f"PLANNED {event['step']} {event['stop_step']} {event.get('save_secs')}", flush=True)
        elif event["event"] == "cluster.saved_now":
            print(f"NOTICE_SAVED {event['step']} {event['saved']}", flush=True)
        elif event.get("log_level") in ("error", "critical"):
            print(f"ERROR {event}", flush=True)
    # reading SyncOnRead variables is a collective: every worker does it, in this order
    arrays = {f"w{i}": v.numpy() for i, v in enumerate(model.weights)}
    arrays["mean"] = np.array(mean.result().numpy())
    arrays["counter"] = np.array(
        tf.convert_to_tensor(counter).numpy() if keras_counter else counter.read_value().numpy()
    )
    np.savez(out, **arrays)
    if notice:
        print(f"ENDS {json.dumps(ends)}", flush=True)
        print(f"ENDED {ended}", flush=True)
        print(f"SAVE_SECS {save_estimate(sv.status().save_seconds)}", flush=True)
    print(f"DONE {sv.global_step} {sv.status().stop_reason}", flush=True)
    return asv.exit_code(sv.status())


if __name__ == "__main__":
    logdir, max_steps, save_steps, backend, out = sys.argv[1:6]
    flags = sys.argv[6:]
    code = anyio.run(
        main,
        logdir,
        int(max_steps),
        int(save_steps),
        out,
        "signals" in flags,
        "keep-all" in flags,
        "keras-counter" in flags,
        "watchdog" in flags,
        "notice" in flags,
        backend=backend,
    )
    sys.exit(code)
