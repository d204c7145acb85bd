"""The first restore in a new process, cold: what a restarted training pays.

``bench/checkpoint.py`` restores the same checkpoint again and again in one process,
where each restore's new tensors can reuse the memory the previous one gave up. A
restarted training restores once, into a process whose variables were just made. So here
each measurement is a new Python process: it builds the state (the variables of
``bench/checkpoint.py``'s ``make_state``), drops the checkpoint's files from the page
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
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # pagecache: the tests' helpers

MODES = ("raw", "tf", "asv", "asv-tf")


def child(mode: str, size: int, directory: Path) -> None:
    """One measurement, printed as JSON: milliseconds of ``mode``'s restore."""
    import tensorflow as tf
    from checkpoint import _read_files, make_state
    from pagecache import drop_cached

    from asupervisor._checkpoint import _restore

    logging.getLogger("asupervisor").propagate = False
    ckpt, _ = make_state(size)
    latest = tf.train.latest_checkpoint(str(directory))
    files = sorted(str(p) for p in directory.glob(Path(latest).name + ".*"))
    _restore.DIRECT_RESTORE = mode != "asv-tf"
    drop_cached(files)
    t0 = time.perf_counter()
    if mode == "raw":
        _read_files(files)
    elif mode == "tf":
        ckpt.restore(latest).expect_partial()
    else:
        _restore.restore_latest(ckpt, directory)
    print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3}))


def write_checkpoint(size: int, directory: Path) -> None:
    import tensorflow as tf  # noqa: F401  (imported before the bench module, quietly)
    from checkpoint import make_state

    from asupervisor._checkpoint._manager import Checkpointer

    ckpt, _ = make_state(size)
    saver = Checkpointer(ckpt, directory, max_to_keep=1)
    saver.prepare()
    saver.write(saver.snapshot(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[16, 128])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--at", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.size, Path(args.at))
        return
    logging.getLogger("asupervisor").propagate = False
    root = Path(tempfile.mkdtemp(prefix="asv-restore-first-", dir=args.dir))
    print(f"first restore in a new process, cold; medians of {args.repeats}, ms (range); ratio to raw")
    print(f"{'MB':>5} | " + " | ".join(f"{m:>22}" for m in MODES))
    for size in args.sizes:
        directory = root / f"{size}"
        write_checkpoint(size, directory)
        times: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(args.repeats):
            for mode in MODES:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", mode, "--size", str(size), "--at", str(directory)],
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
