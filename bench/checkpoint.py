"""Checkpoint benchmark: asupervisor's save/restore next to plain TensorFlow and raw numpy.

Run from the repository root::

    python bench/checkpoint.py            # 16, 128 and 512 MB states, 7 repeats
    python bench/checkpoint.py --quick    # 16 and 128 MB, 3 repeats

For each state size (float32 variables of 8 MB, or one variable for small states) it
prints medians over the repeats (the first save is measured apart from the steady state,
the first raw write is left out likewise):

* ``blocked``: how long the step thread is blocked per save: the snapshot taken at the
  step boundary (asupervisor) against ``tf.train.CheckpointManager.save`` (synchronous).
  ``cow`` is the extra time of the next training step: TensorFlow's reads are
  copy-on-write, so the first in-place update of a variable whose snapshot is still
  being written copies its buffer. ``blocked+cow`` is what training loses per save.
  asupervisor stages the variables into buffers kept from one save to the next (a
  memcpy at the boundary, no copy-on-write after), from the second save on.
* ``training-thread cost``: ``blocked+cow`` against ``memcpy`` (numpy copies of the
  same state into reused buffers, the floor of a consistent in-memory copy; ``+next``
  adds the excess of the step after that copy, as ``cow`` does for ours), the copy taken
  in the same rounds as the snapshots, after the same preamble (``os.sync()``, a step),
  and against TensorFlow's own async checkpoint (``CheckpointOptions(
  experimental_enable_async_checkpoint=True)``, ``Checkpoint.write``: its blocked time
  plus the next step's copy-on-write), in rounds of its own.
* ``durable``: from the snapshot until the checkpoint is committed (files fsynced,
  renamed, directory fsynced, ``checkpoint`` state file replaced; retention's deletions
  come after), against writing the same bytes with numpy plus ``fsync``. The two
  alternate, each after an ``os.sync()`` so that neither pays for the writeback of
  earlier files (TF's unsynced saves above all).
* ``restore``: asupervisor's restore (state file, model check, restore) against plain
  ``tf.train.Checkpoint.restore`` of the same checkpoint, both with a warm page cache,
  alternating, over four times as many rounds as saves (at least 30).
* ``cold restore``: the same two, and a raw read of the checkpoint's files (8 MiB
  ``readv`` calls, one thread, as ``cat`` would; ``direct``: the same with direct I/O),
  and asupervisor's restore with every value read buffered (``buffered``: the reader
  before direct reads) and with the values read directly in small pages (``small pg``:
  before huge pages), each after dropping the files from the page cache
  (``posix_fadvise(DONTNEED)``; they are clean, so the kernel does drop them),
  alternating, as many rounds as saves. Linux only.
* ``durable vs raw`` again, with the range of each over the steady rounds and the ratio of
  the best rounds: on a virtual disk whose speed swings from round to round (freshly
  allocated or discarded blocks on the host) a median of 7 can land on either mode.

* ``plain store``: the same save and restore measures of the plain store
  (``checkpoint_store="plain"``: ``SaveV2`` in pieces, TF's restore), in rounds of its
  own after the fast store's, beside the fast store's ratios: what the switch costs.

Then, unless ``--no-backpressure``, what back-pressure costs when saves are due faster
than the disk writes them (``--bp-size`` MB state, a save every ``--bp-every`` steps of
about a millisecond, ``--bp-steps`` steps through ``Supervisor.run_loop``): steps/sec
with no checkpointing, with ``checkpoint_when_busy="wait"`` (the default: every due save
is written, the step thread waits for the writer) and with ``"skip"``, the ratios
``wait/none`` and ``wait/skip``, and how many saves each wrote, waited for or skipped.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # pagecache: the tests' helpers

import numpy as np
import tensorflow as tf
from pagecache import drop_cached

from asupervisor._checkpoint._manager import Checkpointer
from asupervisor._checkpoint.store import PLAIN, FastPath, restore_latest
from asupervisor._checkpoint.store.fast import _direct
from asupervisor.testing import capture_logs

MB = 1 << 20

#: the fast store measured (``--no-direct``, ``--no-direct-restore`` switch parts off)
FAST = FastPath()


def make_state(size_mb: int) -> tuple[tf.train.Checkpoint, list[tf.Variable]]:
    per_var = min(size_mb, 8) * MB // 4
    count = max(1, size_mb // 8)
    variables = [tf.Variable(tf.random.uniform([per_var]), name=f"v{i}") for i in range(count)]
    gs = tf.Variable(0, dtype=tf.int64, name="global_step")
    return tf.train.Checkpoint(vars=variables, global_step=gs), variables


def train_step(variables: list[tf.Variable]) -> float:
    """An in-place update of every variable (what an optimizer does); returns its secs."""
    t0 = time.perf_counter()
    for v in variables:
        v.assign_add(_ONES[v.shape[0]])
    return time.perf_counter() - t0


_ONES: dict[int, tf.Tensor] = {}
STAGING = True  # --no-staging: copy-on-write snapshots only (the A/B of staging)


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def bench_size(size_mb: int, repeats: int, root: Path) -> dict[str, float]:
    ckpt, variables = make_state(size_mb)
    for v in variables:
        _ONES.setdefault(v.shape[0], tf.ones([v.shape[0]]))
    base_step = med([train_step(variables) for _ in range(5)])

    # plain TF, synchronous
    tf_dir = root / f"tf-{size_mb}"
    manager = tf.train.CheckpointManager(ckpt, str(tf_dir), max_to_keep=2)
    tf_saves = []
    for _ in range(repeats + 1):
        train_step(variables)
        t0 = time.perf_counter()
        manager.save()
        tf_saves.append(time.perf_counter() - t0)

    # raw numpy write + fsync of the same bytes, alternating with asupervisor's save:
    # snapshot on "the step thread", write + commit on "the writer thread". Each starts
    # with no dirty page cache (os.sync), so neither pays for writing back the other's
    # (or TF's unsynced) files.
    arrays = [v.numpy() for v in variables]
    buffers = [np.ones_like(a) for a in arrays]  # the memcpy's destination, touched, kept across rounds
    memcpy, memcpy_next = [], []
    asv_dir = root / f"asv-{size_mb}"
    checkpointer = Checkpointer(ckpt, asv_dir, max_to_keep=2, staging=STAGING, fast_path=FAST)
    checkpointer.prepare()
    plain_dir = root / f"plain-{size_mb}"  # the plain store (checkpoint_store="plain"), same rounds
    plain_store = Checkpointer(ckpt, plain_dir, max_to_keep=2, fast_path=PLAIN)
    plain_store.prepare()
    raw, blocked, cow, durable = [], [], [], []
    plain_cost, plain_durable = [], []
    for i in range(repeats + 1):
        path = root / f"raw-{size_mb}-{i}.npy"
        os.sync()
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            for a in arrays:
                f.write(a.data)
            f.flush()
            os.fsync(f.fileno())
        raw.append(time.perf_counter() - t0)
        path.unlink()
        os.sync()  # before the step: the snapshot follows a step, as in training
        train_step(variables)
        ckpt.global_step.assign(i + 1)
        t0 = time.perf_counter()
        snap = checkpointer.snapshot(i + 1)
        t1 = time.perf_counter()
        blocked.append(t1 - t0)
        cow.append(train_step(variables) - base_step)  # the next step, snapshot alive
        assert snap is not None
        checkpointer.write(snap)
        assert checkpointer.last_commit_secs is not None
        durable.append(checkpointer.last_commit_secs)  # write, fsync, publish, state file
        checkpointer.prepare_next(snap)  # as the writer thread does after a save
        del snap
        # the floor, in the same round and after the same preamble as the snapshot (a
        # sync, a step; the kernel's work after the writes before it hits both alike):
        # one memcpy of the state into the buffers kept (and touched) across rounds
        os.sync()
        train_step(variables)
        t0 = time.perf_counter()
        for b, a in zip(buffers, arrays):
            np.copyto(b, a)
        memcpy.append(time.perf_counter() - t0)
        memcpy_next.append(max(train_step(variables) - base_step, 0.0))  # the copy's wake: caches, TLB
    # the plain store, in rounds of its own after the fast store's (so that its work does
    # not change the fast store's figures), after the same preamble
    for i in range(repeats + 1):
        os.sync()
        train_step(variables)
        t0 = time.perf_counter()
        plain_snap = plain_store.snapshot(i + 1)
        plain_blocked = time.perf_counter() - t0
        plain_cost.append(plain_blocked + max(train_step(variables) - base_step, 0.0))
        assert plain_snap is not None
        plain_store.write(plain_snap)
        assert plain_store.last_commit_secs is not None
        plain_durable.append(plain_store.last_commit_secs)
        del plain_snap
    # TF's own async checkpoint (blocked + the next step's copy-on-write)
    async_options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
    async_ckpt = tf.train.Checkpoint(vars=variables, global_step=ckpt.global_step)
    tf_async = []
    for i in range(repeats + 1):
        train_step(variables)
        t0 = time.perf_counter()
        async_ckpt.write(str(root / f"tf-async-{size_mb}-{i}"), options=async_options)
        blocked_async = time.perf_counter() - t0
        tf_async.append(blocked_async + max(train_step(variables) - base_step, 0.0))
        async_ckpt.sync()
        shutil.rmtree(root / f"tf-async-{size_mb}-{i}", ignore_errors=True)
        for leftover in root.glob(f"tf-async-{size_mb}-{i}*"):
            leftover.unlink()
    del arrays, buffers
    costs = [b + max(c, 0.0) for b, c in zip(blocked[1:], cow[1:])]  # what training loses per save

    # restore: plain TF vs asupervisor, alternating, warm cache; a restore is short, so
    # more rounds than saves (a ~1 ms difference needs them on a noisy machine)
    latest = tf.train.latest_checkpoint(str(asv_dir))
    plain, ours, ours_plain = [], [], []
    for _ in range(max(4 * repeats, 30)):
        t0 = time.perf_counter()
        ckpt.restore(latest).expect_partial()
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        restore_latest(ckpt, asv_dir, setting=FAST)
        ours.append(time.perf_counter() - t0)

    cold_raw, cold_raw_direct, cold_plain, cold_ours, cold_buffered, cold_small = [], [], [], [], [], []
    cold_plain_store: list[float] = []
    cold_plain_raw: list[float] = []
    files = sorted(str(p) for p in asv_dir.glob(Path(latest).name + ".*"))
    plain_files = sorted(str(p) for p in plain_dir.glob(Path(latest).name + ".*"))

    def restore_with(switch: str) -> Callable[[], None]:
        """asupervisor's restore with one of the fast path's switches off (an A/B)."""
        fast = dataclasses.replace(FAST, **{switch: False})
        return lambda: restore_latest(ckpt, asv_dir, setting=fast)

    if hasattr(os, "posix_fadvise"):
        for _ in range(repeats):
            for out, fn in (
                (cold_raw, lambda: _read_files(files)),
                (cold_raw_direct, lambda: _read_files(files, direct=True)),
                (cold_plain, lambda: ckpt.restore(latest).expect_partial()),
                (cold_ours, lambda: restore_latest(ckpt, asv_dir, setting=FAST)),
                (cold_buffered, restore_with("direct_reads")),
                (cold_small, restore_with("huge_pages")),
            ):
                drop_cached(files)
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)

    # the plain store's restores, in rounds of their own (warm, then cold against a raw
    # read of its own files)
    for _ in range(max(4 * repeats, 30)):
        t0 = time.perf_counter()
        restore_latest(ckpt, plain_dir, setting=PLAIN)
        ours_plain.append(time.perf_counter() - t0)
    if hasattr(os, "posix_fadvise"):
        for _ in range(repeats):
            for out, fn in (
                (cold_plain_raw, lambda: _read_files(plain_files)),
                (cold_plain_store, lambda: restore_latest(ckpt, plain_dir, setting=PLAIN)),
            ):
                drop_cached(plain_files)
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
    shutil.rmtree(tf_dir, ignore_errors=True)
    shutil.rmtree(asv_dir, ignore_errors=True)
    shutil.rmtree(plain_dir, ignore_errors=True)
    return {
        "plain_cost": med(plain_cost[1:]),
        "plain_durable": med(plain_durable[1:]),
        "plain_restore": med(ours_plain),
        "plain_cold": med(cold_plain_store),
        "plain_cold_raw": med(cold_plain_raw),
        "cold_raw": med(cold_raw),
        "cold_raw_direct": med(cold_raw_direct),
        "cold_buffered": med(cold_buffered),
        "cold_buffered_lo": min(cold_buffered, default=math.nan),
        "cold_buffered_hi": max(cold_buffered, default=math.nan),
        "cold_small": med(cold_small),
        "cold_small_lo": min(cold_small, default=math.nan),
        "cold_small_hi": max(cold_small, default=math.nan),
        "cold_plain": med(cold_plain),
        "cold_asv": med(cold_ours),
        "cold_asv_lo": min(cold_ours, default=math.nan),
        "cold_asv_hi": max(cold_ours, default=math.nan),
        "tf_first": tf_saves[0],
        "tf_steady": med(tf_saves[1:]),
        "blocked_first": blocked[0],
        "blocked_steady": med(blocked[1:]),
        "cow": med(cow[1:]),
        "cost": med(costs),
        "cost_lo": min(costs),
        "cost_hi": max(costs),
        "memcpy": med(memcpy[1:]),
        "memcpy_next": med([c + n for c, n in zip(memcpy[1:], memcpy_next[1:])]),
        "tf_async": med(tf_async[1:]),
        "staging_mb": checkpointer._staging.nbytes / MB if checkpointer._staging is not None else 0.0,
        "durable": med(durable[1:]),
        "durable_lo": min(durable[1:]),
        "durable_hi": max(durable[1:]),
        "raw": med(raw[1:]),
        "raw_lo": min(raw[1:]),
        "raw_hi": max(raw[1:]),
        "restore_plain": med(plain),
        "restore_asv": med(ours),
    }


_READ_BUFFER = _direct.aligned_empty((8 * MB,), np.uint8)


def _read_files(paths: list[str], direct: bool = False) -> None:
    """Read ``paths`` whole, in 8 MiB pieces, one after the other; ``direct``: with direct
    I/O (``O_DIRECT``, past the page cache), where the filesystem takes it."""
    view = memoryview(_READ_BUFFER)
    for path in paths:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct and _direct.ENABLED else 0))
        try:
            while os.readv(fd, [view]) == len(
                view
            ):  # a short read is the end (a direct read at the end, unaligned, is refused)
                pass
        finally:
            os.close(fd)


def bench_backpressure(size_mb: int, every: int, steps: int, root: Path) -> dict[str, dict[str, float]]:
    """steps/sec and save counts with no checkpointing, back-pressure ("wait") and "skip"."""
    import anyio

    import asupervisor as asv

    out: dict[str, dict[str, float]] = {}
    for mode in ("none", "wait", "skip"):
        ckpt, _ = make_state(size_mb)
        x = tf.Variable(tf.random.uniform([192, 192]))

        @tf.function
        def step() -> None:
            x.assign(tf.tanh(tf.matmul(x, x) * 0.01))  # ~1 ms of CPU work

        logdir = None if mode == "none" else root / f"bp-{mode}"
        sv = asv.Supervisor(
            logdir,
            state=ckpt,
            save_model_secs=0,
            save_model_steps=None if mode == "none" else every,
            checkpoint_when_busy="skip" if mode == "skip" else "wait",
            save_summaries_secs=0,
            handle_signals=False,
        )
        elapsed: list[float] = []

        async def run() -> None:
            async with sv.managed_session() as sess:
                await sess.run(step)  # traced before timing
                t0 = time.perf_counter()
                await sess.run_loop(step, max_steps=steps + 1)
                elapsed.append(time.perf_counter() - t0)

        with capture_logs() as events:
            anyio.run(run)
        c = collections.Counter(str(e.get("event")) for e in events)
        out[mode] = {
            "steps_per_sec": steps / elapsed[0],
            "saved": c.get("checkpoint.saved", 0),
            "waited": c.get("checkpoint.waited", 0),
            "skipped": c.get("checkpoint.skipped", 0),
        }
        if logdir is not None:
            shutil.rmtree(logdir, ignore_errors=True)
    return out


def _in_ms(results: list[tuple[int, dict[str, float]]]) -> Iterator[tuple[int, dict[str, float], dict[str, float]]]:
    """Each table's rows: the state size, its results (seconds) and the same in milliseconds."""
    for size, r in results:
        yield size, r, {k: v * 1000 for k, v in r.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 and 128 MB, 3 repeats")
    parser.add_argument("--sizes", type=int, nargs="*", help="state sizes in MB")
    parser.add_argument("--repeats", type=int, help="repeats per measurement")
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    parser.add_argument("--no-backpressure", action="store_true", help="skip the back-pressure measurement")
    parser.add_argument("--bp-size", type=int, default=64, help="back-pressure: state size in MB (64)")
    parser.add_argument("--bp-every", type=int, default=10, help="back-pressure: save every N steps (10)")
    parser.add_argument("--bp-steps", type=int, default=300, help="back-pressure: steps timed (300)")
    parser.add_argument("--no-staging", action="store_true", help="copy-on-write snapshots, no staging buffers")
    parser.add_argument("--no-direct", action="store_true", help="write data files buffered, not with direct I/O")
    parser.add_argument(
        "--no-direct-restore",
        action="store_true",
        help="restore through TF's restore, not by reading the files into the variables",
    )
    args = parser.parse_args()
    global STAGING
    STAGING = not args.no_staging
    global FAST
    FAST = FastPath(direct_writes=not args.no_direct, own_restore=not args.no_direct_restore)
    sizes = args.sizes or ([16, 128] if args.quick else [16, 128, 512])
    repeats = args.repeats or (3 if args.quick else 7)
    logging.getLogger("asupervisor").propagate = False  # quiet: events are counted, not printed
    root = Path(tempfile.mkdtemp(prefix="asv-bench-", dir=args.dir))
    try:
        print(f"tensorflow {tf.__version__}; medians of {repeats} (steady state excludes the first save); ms")
        header = (
            f"{'MB':>5} | {'tf save':>8} {'(first)':>8} | {'blocked':>8} {'(first)':>8} {'cow':>6} "
            f"{'ratio':>6} {'w/ cow':>6} | {'durable':>8} {'raw':>7} {'ratio':>6} | "
            f"{'restore':>8} {'plain':>7} {'ratio':>6}"
        )
        print(header)
        print("-" * len(header))
        results = []
        for size in sizes:
            r = bench_size(size, repeats, root)
            results.append((size, r))
            ms = {k: v * 1000 for k, v in r.items()}
            print(
                f"{size:>5} | {ms['tf_steady']:8.1f} {ms['tf_first']:8.1f} | {ms['blocked_steady']:8.2f} "
                f"{ms['blocked_first']:8.2f} {ms['cow']:6.1f} {r['blocked_steady'] / r['tf_steady']:6.3f} "
                f"{(r['blocked_steady'] + max(r['cow'], 0)) / r['tf_steady']:6.3f} | {ms['durable']:8.1f} "
                f"{ms['raw']:7.1f} {r['durable'] / r['raw']:6.2f} | {ms['restore_asv']:8.1f} "
                f"{ms['restore_plain']:7.1f} {r['restore_asv'] / r['restore_plain']:6.2f}",
                flush=True,
            )
        print(
            f"\ntraining-thread cost per save (blocked + the next step's copy-on-write), ms\n"
            f"{'MB':>5} | {'asv':>7} {'(range)':>15} {'memcpy':>7} {'ratio':>6} | {'+next':>7} {'ratio':>6} | "
            f"{'tf async':>8} {'ratio':>6} | staging MB"
        )
        for size, r, ms in _in_ms(results):
            print(
                f"{size:>5} | {ms['cost']:7.1f} {ms['cost_lo']:7.1f}-{ms['cost_hi']:<7.1f} {ms['memcpy']:7.1f} "
                f"{r['cost'] / r['memcpy']:6.2f} | {ms['memcpy_next']:7.1f} {r['cost'] / r['memcpy_next']:6.2f} | "
                f"{ms['tf_async']:8.1f} {r['tf_async'] / r['memcpy']:6.2f} | "
                f"{r['staging_mb']:.0f}",
                flush=True,
            )
        print(
            f"\ncold restore (page cache dropped before each), ms; ratios to the raw read\n{'MB':>5} | {'raw read':>8} "
            f"{'direct':>7} {'ratio':>6} | {'plain TF':>8} {'ratio':>6} | {'asv':>7} {'(range)':>15} {'ratio':>6} | "
            f"{'buffered':>8} {'(range)':>15} {'ratio':>6} | {'small pg':>8} {'(range)':>15} {'ratio':>6}"
        )
        for size, r, ms in _in_ms(results):
            print(
                f"{size:>5} | {ms['cold_raw']:8.1f} {ms['cold_raw_direct']:7.1f} {r['cold_raw_direct'] / r['cold_raw']:6.2f} | "
                f"{ms['cold_plain']:8.1f} {r['cold_plain'] / r['cold_raw']:6.2f} | "
                f"{ms['cold_asv']:7.1f} {ms['cold_asv_lo']:7.1f}-{ms['cold_asv_hi']:<7.1f} {r['cold_asv'] / r['cold_raw']:6.2f} | "
                f"{ms['cold_buffered']:8.1f} {ms['cold_buffered_lo']:7.1f}-{ms['cold_buffered_hi']:<7.1f} "
                f"{r['cold_buffered'] / r['cold_raw']:6.2f} | "
                f"{ms['cold_small']:8.1f} {ms['cold_small_lo']:7.1f}-{ms['cold_small_hi']:<7.1f} "
                f"{r['cold_small'] / r['cold_raw']:6.2f}",
                flush=True,
            )
        print(
            f"\ndurable vs raw write + fsync, every steady round (a disk whose speed swings from round to "
            f"round shows in the ranges), ms\n{'MB':>5} | {'durable':>8} {'(range)':>15} | {'raw':>7} "
            f"{'(range)':>15} | {'ratio':>6} {'best/best':>9}"
        )
        for size, r, ms in _in_ms(results):
            print(
                f"{size:>5} | {ms['durable']:8.1f} {ms['durable_lo']:7.1f}-{ms['durable_hi']:<7.1f} | "
                f"{ms['raw']:7.1f} {ms['raw_lo']:7.1f}-{ms['raw_hi']:<7.1f} | {r['durable'] / r['raw']:6.2f} "
                f"{r['durable_lo'] / r['raw_lo']:9.2f}",
                flush=True,
            )
        print(
            "\nthe plain store (checkpoint_store='plain': SaveV2/RestoreV2) beside the fast store (rounds of its own\n"
            "after the fast store's; cost against the same memcpy; cold restore against a raw read of its own files), ms\n"
            f"{'MB':>5} | {'cost':>7} {'plain':>7} {'/memcpy':>7} {'fast':>6} | {'durable':>8} {'plain':>8} "
            f"{'/raw':>6} {'fast':>6} | {'restore':>8} {'plain':>7} {'ratio':>6} | {'cold':>7} {'plain':>7} "
            f"{'/raw rd':>7} {'fast':>6}"
        )
        for size, r, ms in _in_ms(results):
            print(
                f"{size:>5} | {ms['cost']:7.1f} {ms['plain_cost']:7.1f} {r['plain_cost'] / r['memcpy']:7.2f} "
                f"{r['cost'] / r['memcpy']:6.2f} | {ms['durable']:8.1f} {ms['plain_durable']:8.1f} "
                f"{r['plain_durable'] / r['raw']:6.2f} {r['durable'] / r['raw']:6.2f} | {ms['restore_asv']:8.1f} "
                f"{ms['plain_restore']:7.1f} {r['plain_restore'] / r['restore_asv']:6.2f} | {ms['cold_asv']:7.1f} "
                f"{ms['plain_cold']:7.1f} {r['plain_cold'] / r['plain_cold_raw']:7.2f} {r['cold_asv'] / r['cold_raw']:6.2f}",
                flush=True,
            )
        if not args.no_backpressure:
            r2 = bench_backpressure(args.bp_size, args.bp_every, args.bp_steps, root)
            print(
                f"\nback-pressure: {args.bp_size} MB state, a save due every {args.bp_every} steps, "
                f"{args.bp_steps} steps timed"
            )
            for mode, row in r2.items():
                print(
                    f"  {mode:>4}: {row['steps_per_sec']:8.1f} steps/s  saved {row['saved']:.0f}  "
                    f"waited {row['waited']:.0f}  skipped {row['skipped']:.0f}"
                )
            wait, none, skip = (r2[m]["steps_per_sec"] for m in ("wait", "none", "skip"))
            print(f"  ratio wait/none {wait / none:.3f}   wait/skip {wait / skip:.3f}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
