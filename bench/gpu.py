"""The GPU path, against baselines run in the same process (``make bench-gpu``).

(a) ``sess.run_loop`` vs a bare Python loop calling the same ``@tf.function`` step, with
    the variables on the GPU: a conv net (batch 128, 64x64x3) and an MLP (batch 1024,
    4096-wide). Goal: <= 1.02x.
(b) What a checkpoint costs the training thread with the state in device memory: the
    snapshot's ``blocked`` time (``status().save_seconds``) per save, next to one
    device-to-host copy of the whole state (``v.numpy()`` of every variable), the floor
    of any save that reads the state on the training thread.
(c) ``MirroredStrategy`` on one GPU: ``run_loop`` vs a bare loop, as (a) for the MLP.
(d) A state of 1 GiB on the device (eight 128 MiB variables, each rewritten every step):
    the training thread's cost per save next to one device-to-host copy, and the commit
    (snapshot handed over -> committed: ``save_seconds`` ``write`` + ``commit``) next to
    the larger of that copy and a write+fsync of the same bytes to the same disk, the
    floors of a commit that copies the state off the device and then writes it.

Repetitions alternate between the contenders; the figures are medians with their range.
On a machine where TensorFlow sees no GPU the script says so and exits 0; ``--smoke``
runs every case at toy sizes (the big state: 4 MiB) on the CPU in seconds.
Run: ``.venv/bin/python bench/gpu.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
from _common import machine, median

import asupervisor as asv

SCALE = 1  # --smoke: sizes divided by 16, to check the script on a CPU
BIG_BYTES = 1 << 30  # (d)'s state; --smoke: 4 MiB


def conv_step(batch: int = 128) -> tuple[Any, dict[str, Any]]:
    """A small conv net's training step on one fixed batch, and its state."""
    import tensorflow as tf

    tf.random.set_seed(0)
    batch //= SCALE
    model = tf.keras.Sequential(
        [
            tf.keras.Input((64, 64, 3)),
            tf.keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            tf.keras.layers.Conv2D(128, 3, strides=2, padding="same", activation="relu"),
            tf.keras.layers.Conv2D(256, 3, strides=2, padding="same", activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(1000),
        ]
    )
    return _train_step(
        model, tf.random.normal((batch, 64, 64, 3)), tf.random.uniform((batch,), maxval=1000, dtype=tf.int32)
    )


def mlp_step(batch: int = 1024, width: int = 4096) -> tuple[Any, dict[str, Any]]:
    """An MLP's training step (1024, width, width, 10) on one fixed batch, and its state."""
    import tensorflow as tf

    tf.random.set_seed(0)
    batch, width = batch // SCALE, width // SCALE
    model = tf.keras.Sequential(
        [
            tf.keras.Input((1024,)),
            tf.keras.layers.Dense(width, activation="relu"),
            tf.keras.layers.Dense(width, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    return _train_step(model, tf.random.normal((batch, 1024)), tf.random.uniform((batch,), maxval=10, dtype=tf.int32))


def _train_step(model: Any, x: Any, y: Any, strategy: Any = None) -> tuple[Any, dict[str, Any]]:
    import tensorflow as tf

    opt = tf.keras.optimizers.Adam(1e-4)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def replica() -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step() -> Any:
        return replica() if strategy is None else strategy.run(replica)

    return step, {"model": model, "optimizer": opt}


def _wait(state: dict[str, Any]) -> None:
    """Wait for the device: one host read of a variable the last step updated."""
    state["model"].weights[0].numpy()


def bare_loop(step: Any, state: dict[str, Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    _wait(state)
    return (time.perf_counter() - t0) / n


async def supervised_loop(step: Any, state: dict[str, Any], n: int, logdir: str) -> float:
    sv = asv.Supervisor(logdir, state=state, save_model_secs=0, handle_signals=False, save_summaries_secs=0)
    async with sv.managed_session() as sess:
        t0 = time.perf_counter()
        await sess.run_loop(step, max_steps=sess.global_step + n)
    _wait(state)  # the final checkpoint read the state already: nothing is queued
    return (time.perf_counter() - t0) / n


def _row(name: str, base: list[float], ours: list[float], unit: str = "ms") -> str:
    b, o = median(base), median(ours)
    ratios = sorted(x / y for x, y in zip(ours, base))
    return f"| {name} | {b * 1e3:.3f} {unit} | {o * 1e3:.3f} {unit} | {o / b:.3f}x | {ratios[0]:.3f}-{ratios[-1]:.3f} |"


async def loop_rows(reps: int, n: int, root: str, device: str) -> list[str]:
    import tensorflow as tf

    rows = []
    makers = [("conv net, batch 128", conv_step), ("MLP 4096, batch 1024", mlp_step)]
    for i, (name, make) in enumerate(makers):
        step, state = make()
        for _ in range(3):
            step()
        base, ours = [], []
        for r in range(reps):
            base.append(bare_loop(step, state, n))
            ours.append(await supervised_loop(step, state, n, f"{root}/loop{i}-{r}"))
        rows.append(_row(f"run_loop / bare loop: {name}", base, ours))
    strategy = tf.distribute.MirroredStrategy([device])
    batch, width = 1024 // SCALE, 4096 // SCALE
    with strategy.scope():
        layers = [tf.keras.Input((1024,)), tf.keras.layers.Dense(width, activation="relu"), tf.keras.layers.Dense(10)]
        model = tf.keras.Sequential(layers)
        x, y = tf.random.normal((batch, 1024)), tf.random.uniform((batch,), maxval=10, dtype=tf.int32)
        step, state = _train_step(model, x, y, strategy)
    for _ in range(3):
        step()
    base, ours = [], []
    for r in range(reps):
        base.append(bare_loop(step, state, n))
        ours.append(await supervised_loop(step, state, n, f"{root}/mirrored-{r}"))
    rows.append(_row("run_loop / bare loop: MirroredStrategy, 1 GPU", base, ours))
    return rows


async def save_rows(reps: int, root: str) -> list[str]:
    """The training thread's cost per save vs one device-to-host copy of the state."""
    step, state = mlp_step()
    step()
    _wait(state)
    variables = state["model"].weights + state["optimizer"].variables
    copies, nbytes = [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        nbytes = sum(v.numpy().nbytes for v in variables)
        copies.append(time.perf_counter() - t0)
    sv = asv.Supervisor(f"{root}/saves", state=state, save_model_secs=0, handle_signals=False, max_to_keep=2)
    async with sv.managed_session() as sess:
        for _ in range(reps):
            await sess.run(step)
            await sv.save_now()
    blocked = sv.status().save_seconds["blocked"]
    per_save = blocked.sum / blocked.count
    name = f"training thread per save ({nbytes / 2**20:.0f} MiB state) / one device-to-host copy"
    copy = median(copies)
    return [f"| {name} | {copy * 1e3:.3f} ms | {per_save * 1e3:.3f} ms (mean) | {per_save / copy:.3f}x | - |"]


def _write_fsync(arrays: list[Any], path: str) -> float:
    """Seconds to write ``arrays`` to a new file at ``path`` and fsync it (then removed)."""
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for array in arrays:
            f.write(memoryview(array).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    secs = time.perf_counter() - t0
    os.unlink(path)
    return secs


def _mean(histogram: Any) -> float:
    return float(histogram.sum / histogram.count) if histogram is not None and histogram.count else 0.0


async def big_state_rows(reps: int, root: str) -> list[str]:
    """(d): a state of BIG_BYTES on the device, each value rewritten by every step."""
    import tensorflow as tf

    pieces = 8
    variables = [tf.Variable(tf.zeros([BIG_BYTES // pieces // 4])) for _ in range(pieces)]

    @tf.function
    def step() -> None:
        for v in variables:
            v.assign_add(tf.ones_like(v))

    step()
    state = {f"v{i}": v for i, v in enumerate(variables)}
    copies, disk = [], []
    for r in range(reps):
        t0 = time.perf_counter()
        arrays = [v.numpy() for v in variables]
        copies.append(time.perf_counter() - t0)
        disk.append(_write_fsync(arrays, f"{root}/disk-{r}.bin"))
        del arrays
    sv = asv.Supervisor(f"{root}/big", state=state, save_model_secs=0, handle_signals=False, max_to_keep=1)
    async with sv.managed_session() as sess:
        for _ in range(reps):
            await sess.run(step)
            await sv.save_now()
    seconds = sv.status().save_seconds
    blocked = _mean(seconds.get("blocked"))
    commit = _mean(seconds.get("write")) + _mean(seconds.get("commit"))
    copy, write = median(copies), median(disk)
    floor = max(copy, write)
    mib = BIG_BYTES / 2**20
    per_save = f"training thread per save ({mib:.0f} MiB state) / one device-to-host copy"
    committed = f"commit, handed over -> committed ({mib:.0f} MiB)"
    floors = f"max(copy {copy * 1e3:.0f} ms, write+fsync {write * 1e3:.0f} ms)"
    commit_cells = f"{commit * 1e3:.3f} ms (mean) | {commit / floor:.3f}x"
    return [
        f"| {per_save} | {copy * 1e3:.3f} ms | {blocked * 1e3:.3f} ms (mean) | {blocked / copy:.3f}x | - |",
        f"| {committed} / {floors} | {floor * 1e3:.3f} ms | {commit_cells} | - |",
    ]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes on the CPU: checks the script, measures nothing"
    )
    args = parser.parse_args()
    import tensorflow as tf

    global SCALE, BIG_BYTES
    gpus = tf.config.list_physical_devices("GPU")
    device = "/cpu:0" if args.smoke else "/gpu:0"
    if args.smoke:
        SCALE = 16
        BIG_BYTES = 4 << 20
        print("# --smoke: tiny sizes on the CPU; the figures mean nothing")
    elif not gpus:
        print("bench/gpu.py: TensorFlow sees no GPU on this machine: nothing to measure.")
        return 0
    else:
        details = tf.config.experimental.get_device_details(gpus[0])
        print(
            f"# {details.get('device_name', 'GPU')} (compute capability {details.get('compute_capability')}); {machine()}"
        )
    reps, n = (2, 3) if args.smoke else (3, 50) if args.quick else (7, 200)
    with tempfile.TemporaryDirectory(prefix="asv-bench-gpu-") as root, tf.device(device):
        rows = await loop_rows(reps, n, root, device) + await save_rows(reps, root) + await big_state_rows(reps, root)
    print("| case | baseline | asupervisor | ratio (median) | ratio range |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
