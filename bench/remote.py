"""Remote tier benchmark: a URL logdir (``s3://``) against moto's S3 server on 127.0.0.1.

Run from the repository root::

    .venv/bin/python bench/remote.py                  # 256 MB checkpoint, 32 MB training state, 3 rounds
    .venv/bin/python bench/remote.py --mb 64 --rounds 5

It starts moto's S3 server itself (a child process on 127.0.0.1, as ``tests/remote/servers.py``
does for the tests) and measures, each against a baseline timed in the same process, the
contenders alternating round by round (the order reversed every other round), medians and
ranges over the rounds; each ratio's range is that of the per-round ratios:

1. **training rate**, remote tier on vs off: the same loop (``--train-mb`` MB of float32
   ``tf.Variable`` s, 8 MB each, only checkpointed, beside a step of ~1 ms of compute: a
   192x192 matmul) through ``sess.run_loop`` into a local logdir (``local``) vs into
   ``s3://bench/...`` with ``local_dir=`` a local working directory and ``upload_every=1``
   (``s3``), steps/sec over ``--secs`` seconds or so in which ``--saves`` checkpoints are
   due (``save_model_steps`` from the bare step rate measured first; ``max_to_keep=2``).
   The window leaves out the start and the stop (final checkpoint, final upload).
   A third contender, ``local+put``: the local training with a plain thread that uploads
   each new local checkpoint with s3fs's ``fs.put_file`` as the upload service would
   (newest only, polled every 0.2 s): what uploading the same bytes costs the training
   by itself. Beside the rates: checkpoints saved and uploaded inside the window, the
   uploads' MB/s, and the CPU seconds this process and the moto server used in the window
   (on a 2-core machine the server's CPU is taken from the training; a real store's is
   not). Goal: ``s3 / local`` >= 0.98. The training state is small (32 MB) so that several
   uploads finish inside a short window at loopback moto's speed (30-80 MB/s here).
2. **upload**: ``RemoteTier.upload(prefix, step, committed_at)`` of a committed local
   checkpoint of ``--mb`` MB (each file's CRC32C and its upload, the commit marker, the
   state object, retention) vs s3fs's ``fs.put_file`` of the same files to other keys on
   the same file system (multipart: 50 MiB parts, up to 10 at a time), and ``put_file``
   one part at a time (``max_concurrency=1``: what concurrency buys here).
   The files are in the page cache for each. Beside the MB/s, the CPU seconds of this
   process and of the moto server per upload. Goal: ``upload`` >= 0.9x ``put_file``'s MB/s.
3. **fresh-machine restore** of that checkpoint: a ``Supervisor`` start with an empty
   ``local_dir`` (``managed_session()`` entered until the session is yielded: the remote
   proved, its lease taken, the newest checkpoint downloaded, verified against its
   marker, committed locally and restored) vs a raw fresh-machine download: a new s3fs
   client, ``fs.get_file`` of the same files into a directory, then
   ``tf.train.Checkpoint(...).restore(path)``. Goal: <= 1.2x. Beside it, where the
   start's time goes (from its log events), and apart from both timings what a new
   client's first request costs and what an fsync of the downloaded files costs (the
   start commits the download durably; the raw download does not).

Last, it checks that no thread of asupervisor's (``asv-*``) is left running. About 2.5
minutes on 2 cores with the defaults.

``--per-conn-mbps X`` sends everything through ``tests/remote/servers.py``'s
``FaultProxy``, which limits each connection's uploads to X MB/s (as one TCP stream to a
distant store is limited), downloads unlimited: where concurrency matters::

    .venv/bin/python bench/remote.py --skip train restore --per-conn-mbps 25 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "remote"))  # servers: moto's S3 server

import anyio
import tensorflow as tf
from _common import machine
from servers import S3_ENV, FaultProxy, Server, make_bucket, moto_server

import asupervisor as asv
from asupervisor._checkpoint.policy._policies import keep_policy_for
from asupervisor._checkpoint.store import _names, _state_file
from asupervisor._checkpoint.store.remote._io import RemoteFS
from asupervisor._checkpoint.store.remote._tier import RemoteTier
from asupervisor.testing import capture_logs

MB = 1 << 20
BUCKET = "bench"


def make_state(size_mb: int) -> tuple[dict[str, Any], Callable[[], Any]]:
    """``size_mb`` MB of float32 variables (8 MB each) and a step of ~1 ms of compute on
    a small variable of its own (the big ones are only checkpointed)."""
    per_var = min(size_mb, 8) * MB // 4
    count = max(1, size_mb // 8)
    variables = [tf.Variable(tf.random.uniform([per_var]), name=f"v{i}") for i in range(count)]
    x = tf.Variable(tf.random.uniform([192, 192]), name="x")

    @tf.function
    def step() -> None:
        x.assign(tf.tanh(tf.matmul(x, x) * 0.01))

    step()  # traced
    return {"vars": variables, "x": x}, step


def cpu_secs(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    """``median (min-max)``."""
    if not xs:
        return "-"
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


# -- 1. training rate, remote tier on vs off ---------------------------------------------


class RawUploader:
    """The ``local+put`` contender's uploads: a plain thread that puts the local logdir's
    newest committed checkpoint with ``fs.put_file`` (the newest only, polled every 0.2 s)."""

    def __init__(self, logdir: Path, fs: Any, root: str) -> None:
        self.logdir, self.fs, self.root = logdir, fs, root
        self.done: list[tuple[int, float, float]] = []  # (bytes, secs, perf_counter at its end) per upload
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-put", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sent = None
        while not self._stop.wait(0.2):
            state = _state_file.read_state(self.logdir)
            if state is None or state.latest is None or state.latest == sent:
                continue
            files = _names.checkpoint_files(self.logdir / state.latest)
            t0 = time.perf_counter()
            try:
                size = 0
                for f in files:
                    self.fs.put_file(str(f), f"{self.root}/{f.name}")
                    size += f.stat().st_size
            except FileNotFoundError:
                continue  # retired meanwhile: a newer one follows
            self.done.append((size, time.perf_counter() - t0, time.perf_counter()))
            sent = state.latest

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def train_round(
    mode: str,
    r: int,
    state: dict[str, Any],
    step: Callable[[], Any],
    steps: int,
    every: int,
    root: Path,
    server: Server,
    fs: Any,
) -> dict[str, float]:
    """One training of ``mode`` (``local``, ``s3``, ``local+put``): steps/sec over ``steps``
    steps, saves every ``every``."""
    local = root / f"train-{mode}-{r}"
    logdir: str | Path = local
    kwargs: dict[str, Any] = {}
    if mode == "s3":
        logdir = f"s3://{BUCKET}/train-{r}"
        kwargs = {"local_dir": local, "upload_every": 1}
    sv = asv.Supervisor(
        logdir,
        state=state,
        save_model_secs=0,
        save_model_steps=every,
        save_summaries_secs=0,
        max_to_keep=2,
        handle_signals=False,
        **kwargs,
    )
    out: dict[str, float] = {}

    async def run() -> None:
        async with sv.managed_session() as sess:
            await sess.run(step)
            first = sess.global_step
            mark = len(events)
            raw = RawUploader(local, fs, f"{BUCKET}/raw-train-{r}") if mode == "local+put" else None
            cpu0, moto0 = time.process_time(), cpu_secs(server.proc.pid)
            t0 = time.perf_counter()
            await sess.run_loop(step, max_steps=first + steps)
            elapsed = time.perf_counter() - t0
            out["cpu"] = time.process_time() - cpu0
            out["moto_cpu"] = cpu_secs(server.proc.pid) - moto0
            out["rate"] = steps / elapsed
            window = events[mark:]
            out["saved"] = sum(e.get("event") == "checkpoint.saved" for e in window)
            done = [(int(e["bytes"]), float(e["secs"])) for e in window if e.get("event") == "remote.uploaded"]
            out["failed"] = sum(e.get("event") == "remote.upload_failed" for e in window)
            if raw is not None:
                raw.stop()  # after the window: an upload in flight finishes first, and is not counted
                done = [(b, s) for b, s, end in raw.done if end <= t0 + elapsed]
            out["uploaded"] = len(done)
            if done:
                out["upload_mb_s"] = sum(b for b, _ in done) / MB / sum(s for _, s in done)

    with capture_logs() as events:
        anyio.run(run)
    shutil.rmtree(local, ignore_errors=True)
    return out


def bench_training(size_mb: int, rounds: int, secs: float, saves: int, root: Path, server: Server) -> dict[str, Any]:
    state, step = make_state(size_mb)
    rates = []
    for _ in range(3):  # the bare step rate, for the window's step count
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.5:
            step()
            n += 1
        rates.append(n / (time.perf_counter() - t0))
    rate = statistics.median(rates)
    steps = max(saves * 10, int(rate * secs))
    every = max(1, steps // saves)
    modes = ["local", "s3", "local+put"]
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    io = RemoteFS(f"s3://{BUCKET}/raw-train")
    try:
        for r in range(rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                gc.collect()
                results[mode].append(train_round(mode, r, state, step, steps, every, root, server, io.fs))
        io.fs.rm(f"{BUCKET}/raw-train-*", recursive=True)
    finally:
        io.close()
    return {"rate": rate, "steps": steps, "every": every, **results}


# -- 2. upload vs put_file -----------------------------------------------------------------


def write_checkpoint(state: dict[str, Any], step: Callable[[], Any], logdir: Path) -> tuple[Path, int]:
    """A committed local checkpoint of ``state`` written by a Supervisor (its final
    checkpoint, after one step): its prefix and step."""
    sv = asv.Supervisor(
        logdir, state=state, save_model_secs=0, save_model_steps=1 << 30, save_summaries_secs=0, handle_signals=False
    )

    async def run() -> None:
        async with sv.managed_session() as sess:
            await sess.run_loop(step, max_steps=sess.global_step + 1)

    anyio.run(run)
    latest = tf.train.latest_checkpoint(str(logdir))
    assert latest is not None
    return Path(latest), int(latest.rsplit("-", 1)[1])


def bench_upload(prefix: Path, step_no: int, rounds: int, url: str, server: Server) -> dict[str, Any]:
    files = _names.checkpoint_files(prefix)
    size = sum(f.stat().st_size for f in files)
    tier = RemoteTier(url, prefix.parent, basename="model.ckpt", keep_policy=keep_policy_for(2, None), owner=True)
    tier.open()
    assert tier.io is not None
    fs = tier.io.fs  # the raw fsspec file system (the baseline's)
    raw_root = f"{BUCKET}/raw-put"
    modes = ["upload", "put_file", "put_file_1"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    moto: dict[str, list[float]] = {m: [] for m in modes}
    try:
        tier.upload(prefix, step_no, time.time())  # one of each first, not timed: connections, first objects
        for f in files:
            fs.put_file(str(f), f"{raw_root}/{f.name}")
        for r in range(rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                for f in files:  # in the page cache for every contender alike
                    f.read_bytes()
                gc.collect()
                cpu0, moto0 = time.process_time(), cpu_secs(server.proc.pid)
                t0 = time.perf_counter()
                if mode == "upload":
                    assert tier.upload(prefix, step_no, time.time()) is not None
                else:
                    kw = {"max_concurrency": 1} if mode == "put_file_1" else {}
                    for f in files:
                        fs.put_file(str(f), f"{raw_root}/{mode}/{f.name}", **kw)
                times[mode].append(time.perf_counter() - t0)
                cpu[mode].append(time.process_time() - cpu0)
                moto[mode].append(cpu_secs(server.proc.pid) - moto0)
        fs.rm(raw_root, recursive=True)
    finally:
        tier.close()  # the lease released: the restores below take it
    return {"bytes": size, "files": len(files), "cpu": cpu, "moto": moto, **times}


# -- 3. fresh-machine restore vs a raw download + restore --------------------------------


def bench_restore(state: dict[str, Any], prefix_name: str, rounds: int, url: str, root: Path) -> dict[str, Any]:
    io = RemoteFS(url)
    try:
        names = sorted(
            n
            for n in (p.rsplit("/", 1)[1] for p in io.fs.ls(io.root, detail=False))
            if n.startswith(prefix_name + ".") and not n.endswith(".asv-commit")
        )
    finally:
        io.close()
    gs = tf.Variable(0, dtype=tf.int64, name="global_step")
    raw_ckpt = tf.train.Checkpoint(**state, global_step=gs)  # the Supervisor's: the state and its global step
    keys = ("start", "raw", "raw_get", "connect", "fsync", "download", "restore", "resumed")
    times: dict[str, list[float]] = {k: [] for k in keys}

    def raw_round(r: int, timed: bool = True) -> None:
        target = root / f"raw-{r}"
        target.mkdir()
        t0 = time.perf_counter()
        fresh = RemoteFS(url)  # a fresh machine's client
        try:
            for name in names:
                fs_path = fresh.path(name)
                fresh.fs.get_file(fs_path, str(target / name))
            t1 = time.perf_counter()
            raw_ckpt.restore(str(target / prefix_name)).assert_consumed()
            t2 = time.perf_counter()
        finally:
            fresh.close()
        if timed:
            times["raw"].append(t2 - t0)
            times["raw_get"].append(t1 - t0)
            t0 = time.perf_counter()  # what making the downloaded files durable costs, apart (the start does it)
            for name in names:
                fd = os.open(target / name, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            times["fsync"].append(time.perf_counter() - t0)
            other = RemoteFS(url)  # what a new client's first request costs (a small object), apart
            try:
                t0 = time.perf_counter()
                other.fs.cat_file(other.path(names[-1]), start=0, end=1)
                times["connect"].append(time.perf_counter() - t0)
            finally:
                other.close()
        shutil.rmtree(target)

    def start_round(r: int) -> None:
        local = root / f"fresh-{r}"
        sv = asv.Supervisor(
            url, local_dir=local, state=state, save_model_secs=0, save_summaries_secs=0, handle_signals=False
        )

        async def run() -> None:
            t0 = time.perf_counter()
            async with sv.managed_session() as sess:
                times["start"].append(time.perf_counter() - t0)
                times["resumed"].append(sess.global_step)

        with capture_logs() as events:
            anyio.run(run)
        for e in events:
            if e.get("event") == "remote.downloaded":
                times["download"].append(float(e["secs"]))
            elif e.get("event") == "checkpoint.restored":
                times["restore"].append(float(e["secs"]))
        shutil.rmtree(local)

    raw_round(-1, timed=False)  # not timed: TF's restore traced once, the first objects read
    for r in range(rounds):
        for fn in (start_round, raw_round) if r % 2 == 0 else (raw_round, start_round):
            gc.collect()
            fn(r)
    return {"names": names, **times}


# -- the run -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=256, help="upload and restore: the checkpoint's size in MB (256)")
    parser.add_argument("--train-mb", type=int, default=32, help="training: the state's size in MB (32)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each measurement (3)")
    parser.add_argument("--secs", type=float, default=5.0, help="training: the timed window, about (5 s)")
    parser.add_argument("--saves", type=int, default=4, help="training: checkpoints due in the window (4)")
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    parser.add_argument(
        "--per-conn-mbps",
        type=float,
        help="send through a proxy that limits each connection's uploads to this many MB/s (a real link's "
        "per-stream limit; downloads are not limited); off by default",
    )
    parser.add_argument("--skip", choices=("train", "upload", "restore"), nargs="*", default=[], help="parts left out")
    args = parser.parse_args()
    logging.getLogger("asupervisor").propagate = False  # quiet: events are counted, not printed
    os.environ.update(S3_ENV)
    root = Path(tempfile.mkdtemp(prefix="asv-bench-remote-", dir=args.dir))
    started = time.perf_counter()
    print(machine())
    print(
        f"moto {_version('moto')} S3 server on 127.0.0.1 (a child process), s3fs {_version('s3fs')}; "
        f"{args.rounds} rounds; median (range)"
    )
    server = moto_server()
    os.environ["AWS_ENDPOINT_URL"] = server.endpoint
    proxy = None
    if args.per_conn_mbps:
        proxy = FaultProxy(server.port)
        proxy.throttle(args.per_conn_mbps * MB)
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
        print(f"through a proxy limiting each connection's uploads to {args.per_conn_mbps:g} MB/s")
    rows: list[tuple[str, ...]] = []
    try:
        make_bucket(server.endpoint, BUCKET)
        if "train" not in args.skip:
            _report_training(
                bench_training(args.train_mb, args.rounds, args.secs, args.saves, root, server), args, rows
            )
        if "upload" not in args.skip or "restore" not in args.skip:
            state, step = make_state(args.mb)
            prefix, step_no = write_checkpoint(state, step, root / "made")
            url = f"s3://{BUCKET}/run"
            _report_upload(bench_upload(prefix, step_no, args.rounds, url, server), rows)  # restore needs it uploaded
            if "restore" not in args.skip:
                _report_restore(bench_restore(state, prefix.name, args.rounds, url, root), prefix.name, rows)
        if proxy is not None:
            _close_proxy(proxy)
            proxy = None
        left = [t.name for t in threading.enumerate() if t.name.startswith("asv-") and t.is_alive()]
        others = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.name not in left]
        print(
            f"\nthreads of asupervisor left running: {', '.join(left) or 'none'} (others: {', '.join(others) or 'none'})"
        )
        header = ("measure", "asupervisor", "baseline", "ratio", "goal")
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        print()
        for i, row in enumerate([header, *rows]):
            print(" | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
            if i == 0:
                print("-+-".join("-" * w for w in widths))
        print(f"\n({time.perf_counter() - started:.0f} s in all)")
    finally:
        if proxy is not None:
            _close_proxy(proxy)
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _close_proxy(proxy: FaultProxy) -> None:
    """Close the proxy and end its accepting thread (a listening socket's close alone does
    not wake the ``accept()`` blocked on it, on Linux; its shutdown does)."""
    with contextlib.suppress(OSError):
        proxy._sock.shutdown(socket.SHUT_RDWR)
    proxy.close()


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def _report_training(t: dict[str, Any], args: argparse.Namespace, rows: list[tuple[str, ...]]) -> None:
    print(
        f"\n1. training: {args.train_mb} MB state, a ~1 ms step (bare {t['rate']:.0f} steps/s), {t['steps']} steps "
        f"timed, save_model_steps={t['every']}, max_to_keep=2"
    )
    print(f"   {'':9} {'steps/s':>18} {'saved':>5} {'uploaded':>8} {'MB/s up':>15} {'cpu s':>15} {'moto cpu s':>15}")
    for mode in ("local", "s3", "local+put"):
        res = t[mode]
        print(
            f"   {mode:9} {spread([r['rate'] for r in res], '{:.0f}'):>18} "
            f"{statistics.median([r['saved'] for r in res]):5.0f} {statistics.median([r['uploaded'] for r in res]):8.0f} "
            f"{spread([r['upload_mb_s'] for r in res if 'upload_mb_s' in r], '{:.0f}'):>15} "
            f"{spread([r['cpu'] for r in res], '{:.1f}'):>15} {spread([r['moto_cpu'] for r in res], '{:.1f}'):>15}"
        )
    failed = sum(r["failed"] for r in t["s3"])
    if failed:
        print(f"   !! {failed:.0f} uploads failed inside the windows")
    loc, s3, put = t["local"], t["s3"], t["local+put"]
    rate = lambda res: spread([r["rate"] for r in res], "{:.0f}") + " st/s"  # noqa: E731
    rows.append(
        (
            "training rate, s3 / local",
            rate(s3),
            rate(loc),
            spread([a["rate"] / b["rate"] for a, b in zip(s3, loc)], "{:.3f}"),
            ">= 0.98",
        )
    )
    rows.append(
        (
            "training rate, s3 / local+put",
            rate(s3),
            rate(put),
            spread([a["rate"] / b["rate"] for a, b in zip(s3, put)], "{:.3f}"),
            "",
        )
    )
    rows.append(
        (
            "training rate, local+put / local",
            rate(put),
            rate(loc),
            spread([a["rate"] / b["rate"] for a, b in zip(put, loc)], "{:.3f}"),
            "",
        )
    )


def _report_upload(u: dict[str, Any], rows: list[tuple[str, ...]]) -> None:
    mbs = u["bytes"] / MB
    print(f"\n2. upload of a committed checkpoint: {mbs:.0f} MB in {u['files']} files")
    print(f"   {'':10} {'MB/s':>14} {'secs':>18} {'cpu s':>18} {'moto cpu s':>18}")
    for mode in ("upload", "put_file", "put_file_1"):
        print(
            f"   {mode:10} {spread([mbs / s for s in u[mode]], '{:.0f}'):>14} {spread(u[mode]):>18} "
            f"{spread(u['cpu'][mode]):>18} {spread(u['moto'][mode]):>18}"
        )
    speed = lambda mode: spread([mbs / s for s in u[mode]], "{:.0f}") + " MB/s"  # noqa: E731
    rows.append(
        (
            "upload MB/s / put_file's",
            speed("upload"),
            speed("put_file"),
            spread([p / up for up, p in zip(u["upload"], u["put_file"])], "{:.3f}"),
            ">= 0.9",
        )
    )
    rows.append(
        (
            "upload MB/s / put_file's, 1 part at a time",
            speed("upload"),
            speed("put_file_1"),
            spread([p / up for up, p in zip(u["upload"], u["put_file_1"])], "{:.3f}"),
            "",
        )
    )


def _report_restore(res: dict[str, Any], name: str, rows: list[tuple[str, ...]]) -> None:
    print(f"\n3. fresh-machine restore of {name} ({len(res['names'])} files), secs")
    print(f"   Supervisor start, empty local_dir   {spread(res['start'])}   resumed at step {res['resumed']}")
    rest = [s - d - r for s, d, r in zip(res["start"], res["download"], res["restore"])]
    print(
        f"     its download (get, verify, fsync, commit) {spread(res['download'])}, restore {spread(res['restore'])}, "
        f"the rest (client, probe, lease, listing, session) {spread(rest)}"
    )
    print(f"   new client + get_file + restore     {spread(res['raw'])}   of which get_file {spread(res['raw_get'])}")
    print(
        f"   apart: a new client's first request {spread(res['connect'])}, an fsync of the downloaded files {spread(res['fsync'])}"
    )
    rows.append(
        (
            "fresh-machine start / get + restore",
            spread(res["start"]) + " s",
            spread(res["raw"]) + " s",
            spread([s / r for s, r in zip(res["start"], res["raw"])], "{:.3f}"),
            "<= 1.2",
        )
    )


if __name__ == "__main__":
    main()
