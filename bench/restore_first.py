"""The first restore in a new process, cold: what a restarted training pays.

``bench/checkpoint.py`` restores the same checkpoint again and again in one process,
where each restore's new tensors can reuse the memory the previous one gave up. A
restarted training restores once, into a process whose variables were just made. So here
each measurement is a new Python process: it builds the state (``--state variables``:
those of ``bench/checkpoint.py``'s ``make_state``, read directly; ``--state keras``: a
Keras MLP and an Adam not built yet, whose slots TF defers, so TF's restore does it, the
readers checking every value ahead of it), drops the checkpoint's files from the page
cache (``posix_fadvise(DONTNEED)``), and times one of

* ``raw``: a raw read of the files (8 MiB ``readv`` calls, one thread, as ``cat``),
* ``tf``: plain ``tf.train.Checkpoint.restore``,
* ``asv``: asupervisor's ``restore_latest`` (state file, model check, direct read),
* ``asv-tf``: the same through TF's restore (``--no-direct-restore``'s path),

alternating modes, ``--repeats`` rounds per size; medians and ranges, ratios to ``raw``.
Linux only (``posix_fadvise``).

    python bench/restore_first.py --sizes 16 128 512 --repeats 7
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # pagecache: the tests' helpers

MODES = ("raw", "tf", "asv", "asv-tf")


def keras_state(size: int, trained: bool) -> object:
    """A Keras MLP (two square layers) and Adam, about ``size`` MB with Adam's slots; the
    optimizer built by one step if ``trained``, else not built (TF defers its slots)."""
    import keras
    import tensorflow as tf

    width = int((size * (1 << 20) / 4 / 3 / 2) ** 0.5)
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(width), keras.layers.Dense(width)])
    optimizer = keras.optimizers.Adam()
    if trained:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(tf.ones([2, width])) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return tf.train.Checkpoint(model=model, optimizer=optimizer)


def make(state: str, size: int, trained: bool) -> object:
    from checkpoint import make_state

    return make_state(size)[0] if state == "variables" else keras_state(size, trained)


def child(mode: str, size: int, directory: Path, state: str) -> None:
    """One measurement, printed as JSON: milliseconds of ``mode``'s restore."""
    import tensorflow as tf
    from checkpoint import _read_files
    from pagecache import drop_cached

    from asupervisor._checkpoint import store
    from asupervisor._checkpoint.store import FastPath

    logging.getLogger("asupervisor").propagate = False
    ckpt: Any = make(state, size, trained=False)
    latest = tf.train.latest_checkpoint(str(directory))
    files = sorted(str(p) for p in directory.glob(Path(latest).name + ".*"))
    fast = FastPath(own_restore=mode != "asv-tf")
    drop_cached(files)
    gc.collect()  # with TensorFlow loaded a full collection takes ~0.1 s: not inside the timing
    t0 = time.perf_counter()
    if mode == "raw":
        _read_files(files)
    elif mode == "tf":
        ckpt.restore(latest).expect_partial()
    else:
        store.restore_latest(ckpt, directory, setting=fast)
    print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3}))


def write_checkpoint(size: int, directory: Path, state: str) -> None:
    import tensorflow as tf  # noqa: F401  (imported before the bench module, quietly)

    from asupervisor._checkpoint._manager import Checkpointer

    ckpt = make(state, size, trained=True)
    saver = Checkpointer(ckpt, directory, max_to_keep=1)
    saver.prepare()
    saver.write(saver.snapshot(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[16, 128])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    parser.add_argument(
        "--state",
        choices=("variables", "keras"),
        default="variables",
        help="tf.Variables of 8 MB (the direct read), or a Keras MLP and an Adam not built yet (TF's restore)",
    )
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--at", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.size, Path(args.at), args.state)
        return
    logging.getLogger("asupervisor").propagate = False
    root = Path(tempfile.mkdtemp(prefix="asv-restore-first-", dir=args.dir))
    print(
        f"first restore in a new process, cold, state: {args.state}; medians of {args.repeats}, ms (range); ratio to raw"
    )
    print(f"{'MB':>5} | " + " | ".join(f"{m:>22}" for m in MODES))
    for size in args.sizes:
        directory = root / f"{size}"
        write_checkpoint(size, directory, args.state)
        times: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(args.repeats):
            for mode in MODES:
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        mode,
                        "--size",
                        str(size),
                        "--at",
                        str(directory),
                        "--state",
                        args.state,
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                times[mode].append(json.loads(out.strip().splitlines()[-1])["ms"])
        raw = statistics.median(times["raw"])
        cells = []
        for mode in MODES:
            med = statistics.median(times[mode])
            cells.append(f"{med:6.1f} ({min(times[mode]):5.1f}-{max(times[mode]):5.1f}) {med / raw:4.2f}x")
        print(f"{size:>5} | " + " | ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
