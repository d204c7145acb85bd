"""What a snapshot costs the step thread as the number of variables grows, same process.

A snapshot at a step boundary reads every variable. Read one by one, each read is two
eager op dispatches; a remembered walk of many variables reads them all in one traced
function (the batched read, traced on the writer thread after a save). This bench takes
snapshots of the same state both ways, alternating, with staging (the default), and
prints the median blocked time of each, its range over the rounds, and the ratio; also
TF's full walk (what every snapshot would cost without the remembered walk), how long
the batched read took to make (traced and run once, off the step thread in a session)
and what the first snapshot using it blocked.

States: ``N`` plain variables of 256 float32 each (``--counts``), a Keras MLP of
``--layers`` Dense(64) layers with Adam after one step (weights and both moments), and
one of ``--strategy-layers`` layers with Adam and a Mean metric made under
``MirroredStrategy`` (one CPU). Run: ``python bench/snapshot_vars.py [--rounds 40]
[--counts 16 100 1000] [--layers 150] [--strategy-layers 20]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _common import machine, mlp_step


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:7.2f} ms ({min(xs) * 1e3:.2f}-{max(xs) * 1e3:.2f})"


def measure(name: str, ckpt: Any, rounds: int) -> None:
    """Snapshots of ``ckpt``: batched read vs one by one, alternating; TF's full walk."""
    from asupervisor._checkpoint.snapshot._snapshot import Staging, take_snapshot
    from asupervisor._checkpoint.snapshot._walk_cache import WalkCache

    caches = {"batched": WalkCache(), "one by one": WalkCache()}
    stagings = {mode: Staging() for mode in caches}
    for mode, walks in caches.items():  # the first snapshot learns the walk
        stagings[mode].prepared = True
        take_snapshot(ckpt, 0, walks, stagings[mode])
    t0 = time.perf_counter()
    assert caches["batched"].prepare()
    trace = time.perf_counter() - t0
    blocked: dict[str, list[float]] = {mode: [] for mode in caches}
    full: list[float] = []
    first = 0.0
    for i in range(rounds + 2):
        for mode, walks in caches.items():
            snap = take_snapshot(ckpt, i + 1, walks, stagings[mode])
            if i >= 2:  # warm-up rounds left out
                blocked[mode].append(snap.blocked_secs)
            elif i == 0 and mode == "batched":
                first = snap.blocked_secs  # the batched read's first use on the step thread
            del snap
        if i % 4 == 0:
            snap = take_snapshot(ckpt, i + 1)  # no walk cache, no staging: TF's walk every time
            full.append(snap.blocked_secs)
            del snap
    assert caches["batched"].batched == rounds + 2
    assert caches["one by one"].batched == 0
    variables = len(caches["batched"]._walk.variables)  # type: ignore[union-attr]
    b, o = statistics.median(blocked["batched"]), statistics.median(blocked["one by one"])
    print(f"  {name} ({variables} variables), batched read made in {trace:.2f} s (writer thread)")
    print(f"    first batched snapshot {first * 1e3:7.2f} ms (left out of the medians)")
    print(f"    one by one   {_spread(blocked['one by one'])}")
    print(f"    batched      {_spread(blocked['batched'])}   {o / b:.2f}x faster")
    print(f"    TF's walk    {_spread(full)} (copy-on-write, no cache)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--counts", type=int, nargs="*", default=[16, 100, 1000])
    parser.add_argument("--layers", type=int, default=150)
    parser.add_argument("--strategy-layers", type=int, default=20)
    args = parser.parse_args()
    import numpy as np
    import tensorflow as tf

    print(f"snapshot blocked time vs variables: {machine()}")
    print(f"  medians of {args.rounds} snapshots (range), staged, batched and one by one alternating")
    for count in args.counts:
        state = [tf.Variable(np.full((256,), i, np.float32)) for i in range(count)]
        measure(f"{count} plain variables", tf.train.Checkpoint(v=state), args.rounds)
    if args.layers:
        step, state = mlp_step(hidden=(64,) * args.layers, optimizer=tf.keras.optimizers.Adam())
        step()
        measure(f"MLP of {args.layers} layers + Adam", tf.train.Checkpoint(**state), args.rounds)
    if args.strategy_layers:
        measure(
            f"MLP of {args.strategy_layers} layers + Adam + Mean, MirroredStrategy",
            mirrored_state(args.strategy_layers),
            args.rounds,
        )


def mirrored_state(layers: int) -> Any:
    """A Keras MLP, Adam and a Mean metric made under ``MirroredStrategy`` (one CPU), after
    one traced step: MirroredVariables (read through their primary copy) and two
    SyncOnRead ones (read as TF's walk reads them)."""
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input((784,))] + [tf.keras.layers.Dense(64) for _ in range(layers)] + [tf.keras.layers.Dense(10)]
        )
        opt = tf.keras.optimizers.Adam()
        mean = tf.keras.metrics.Mean()
    x = tf.random.normal((64, 784))

    @tf.function
    def step() -> None:
        def replica() -> None:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x)))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            mean.update_state(loss)

        strategy.run(replica)

    step()
    return tf.train.Checkpoint(model=model, optimizer=opt, metric=list(mean.variables))


if __name__ == "__main__":
    main()
