"""RAM tier benchmark: work lost per SIGKILL, training overhead, time to the first
resumed step, with ``CheckpointOptions(ram_tier=True)`` (``/dev/shm``).

Run from the repository root::

    .venv/bin/python bench/ram_tier.py                  # 128 MB state, 8 kills
    .venv/bin/python bench/ram_tier.py --mb 64 --kills 4 --secs 10

The training state is ``--mb`` MB of float32 ``tf.Variable`` s (8 MB each); each step
adds to every variable (the whole state changes, as an optimizer step does) and does a
192x192 matmul. Disk saves are ``save_model_secs=600`` apart (the start-up save only, in
these windows); RAM saves as the overhead budget allows (``ram_save_secs="auto"``).

1. **Work lost per SIGKILL**: a child trains and prints each completed step with its
   wall time; the parent SIGKILLs it at a random moment (uniform in 4-8 s after its
   first step), then starts it again: it prints the step it resumed at. Work lost =
   the kill's time - the time that step was completed (what the restart must redo).
   Goal: mean <= 1.0 s, worst <= 2.5 s. The same without the RAM tier, for scale (the
   disk saves only at the start here: it loses everything).
2. **Training overhead**: steps/sec over ``--secs`` with the RAM tier on vs off,
   alternating, in the same process (each a fresh ``Supervisor`` on a fresh logdir),
   after ``WARM_SECS`` of warm-up (the steady state: the tier's slots touched once).
   Goal: on / off >= 0.98.
3. **Time to the first resumed step** after a SIGKILL (process start to the session,
   restored from RAM, and to the first step done, its ``tf.function`` traced) over a
   bare child started right after it: python, ``import tensorflow`` and a raw read of
   the checkpoint's files. Goal: <= 1.1x. And over a bare training's first step (the
   same, plus what any restart of this model pays: its variables made and assigned the
   values read, its step traced): what the supervisor adds.

``--ram-secs 1.0`` sets ``ram_save_secs`` (default ``auto``). Prints medians and ranges;
about 5 minutes on 2 cores with the defaults.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RAM_SECS = ["auto"]  # --ram-secs: the RAM tier's ram_save_secs
#: the rate's warm-up, both modes: the tier's first saves each touch a new slot's memory
#: once (3 x the state, ~0.4 ms per MiB here), a cost of the session's start, not of its
#: training (0.15 s in a 10 s window is 1.5 %)
WARM_SECS = 6.0

CHILD = r"""
import os, sys, time
t_start = float(sys.argv[4])
import anyio, tensorflow as tf
import asupervisor as asv
mb, logdir, ram = int(sys.argv[1]), sys.argv[2], sys.argv[3]
variables = [tf.Variable(tf.zeros([2 << 20])) for _ in range(max(1, mb // 8))]
x = tf.random.normal([192, 192])
ram_tier = False if ram == "-" else ram
ram_secs = "auto" if sys.argv[5] == "auto" else float(sys.argv[5])

@tf.function
def step():
    for v in variables:
        v.assign_add(tf.fill(v.shape, 1.0))
    return tf.reduce_sum(tf.matmul(x, x))

sv = asv.Supervisor(logdir, state={"v": variables}, save_summaries_secs=0, handle_signals=False,
                    checkpoint=asv.CheckpointOptions(save_secs=600, ram_tier=ram_tier, ram_save_secs=ram_secs))

async def main():
    async with sv.managed_session() as sess:
        print(f"entered {sv.global_step} {time.time() - t_start:.4f}", flush=True)
        first = [True]
        def one():
            step()
            now = time.time()
            if first[0]:
                first[0] = False
                print(f"resumed {sv.global_step} {now - t_start:.4f}", flush=True)
            print(f"step {sv.global_step + 1} {now:.4f}", flush=True)
        await sess.run_loop(one)

anyio.run(main)
"""

BARE = r"""
import sys, time
t_start = float(sys.argv[2])
import tensorflow as tf
total = 0
for p in sorted(__import__("glob").glob(sys.argv[1] + "*")):
    with open(p, "rb") as f:
        while chunk := f.read(8 << 20):
            total += len(chunk)
print(f"read {total} {time.time() - t_start:.4f}", flush=True)
"""


BARE_TRAINING = r"""
import sys, time
t_start = float(sys.argv[3])
import numpy as np, tensorflow as tf
mb = int(sys.argv[2])
variables = [tf.Variable(tf.zeros([2 << 20])) for _ in range(max(1, mb // 8))]
x = tf.random.normal([192, 192])

@tf.function
def step():
    for v in variables:
        v.assign_add(tf.fill(v.shape, 1.0))
    return tf.reduce_sum(tf.matmul(x, x))

raw = np.fromfile(sys.argv[1] + ".data-00000-of-00001", dtype=np.float32)
for i, v in enumerate(variables):
    v.assign(raw[i * (2 << 20) : (i + 1) * (2 << 20)])
step()
print(f"first {time.time() - t_start:.4f}", flush=True)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}


def _child(mb: int, logdir: Path, ram: str) -> subprocess.Popen[str]:
    """The training child, started now (it reports times from this moment)."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(mb), str(logdir), ram, f"{time.time():.4f}", RAM_SECS[0]],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(),
    )


def _resumed_step(mb: int, logdir: Path, ram: str) -> tuple[int, float, float]:
    """Start once more until its first step; (the step it resumed at, secs to the session
    (restored), secs to its first step)."""
    proc = _child(mb, logdir, ram)
    assert proc.stdout is not None
    entered = proc.stdout.readline().split()
    first = proc.stdout.readline().split()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    return int(entered[1]), float(entered[2]), float(first[2])


def lost_per_kill(
    mb: int, kills: int, ram: str, rng: random.Random
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Work lost per kill, and the time to the restored session and to the first resumed
    step over a bare start measured beside each, and to the first step over a bare
    training's, over ``kills`` kills."""
    first_bare_training: list[float] = []
    lost: list[float] = []
    entered: list[float] = []
    first: list[float] = []
    with tempfile.TemporaryDirectory(prefix="asv-bench-ram-") as tmp:
        logdir = Path(tmp) / "run"
        for _ in range(kills):
            steps: dict[int, float] = {}
            proc = _child(mb, logdir, ram)
            assert proc.stdout is not None
            kill_at = None
            for line in proc.stdout:
                kind, a, b = line.split()
                if kind != "step":
                    continue
                steps[int(a)] = float(b)
                if kill_at is None:
                    kill_at = float(b) + rng.uniform(4.0, 8.0)
                if float(b) >= kill_at:
                    break
            t_kill = time.time()
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
            resumed, to_session, to_step = _resumed_step(mb, logdir, ram)
            bare, training = bare_start(mb)  # beside each restart: the machine's mood of the moment
            entered.append(to_session / bare)
            first.append(to_step / bare)
            first_bare_training.append(to_step / training)
            # the time the resumed step was completed (before this process's first: its first)
            done = steps.get(resumed, steps[min(steps)])
            lost.append(t_kill - done)
    return lost, entered, first, first_bare_training


def bare_start(mb: int) -> tuple[float, float]:
    """Seconds to (python + ``import tensorflow`` + a raw read of an ``mb`` MB checkpoint's
    files), and to a bare training's first step (the same, its variables made and
    assigned the values read, its step traced and run: what any restart pays)."""
    with tempfile.TemporaryDirectory(prefix="asv-bench-bare-") as tmp:
        prefix = Path(tmp) / "model.ckpt-1"
        Path(f"{prefix}.data-00000-of-00001").write_bytes(os.urandom(mb << 20))
        times = []
        for script, args in ((BARE, [str(prefix)]), (BARE_TRAINING, [str(prefix), str(mb)])):
            out = subprocess.run(
                [sys.executable, "-c", script, *args, f"{time.time():.4f}"],
                capture_output=True,
                text=True,
                env=_env(),
                check=True,
            )
            times.append(float(out.stdout.split()[-1]))
        return times[0], times[1]


def overhead(mb: int, secs: float, rounds: int) -> tuple[list[float], list[float]]:
    """Steps/sec with the RAM tier off and on, alternating; the two lists."""
    import anyio
    import tensorflow as tf

    import asupervisor as asv

    variables = [tf.Variable(tf.zeros([2 << 20])) for _ in range(max(1, mb // 8))]
    x = tf.random.normal([192, 192])

    @tf.function
    def step() -> tf.Tensor:
        for v in variables:
            v.assign_add(tf.fill(v.shape, 1.0))
        return tf.reduce_sum(tf.matmul(x, x))

    rates: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(rounds):
        for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
            with tempfile.TemporaryDirectory(prefix="asv-bench-ram-") as tmp:
                sv = asv.Supervisor(
                    Path(tmp) / "run",
                    state={"v": variables},
                    save_summaries_secs=0,
                    handle_signals=False,
                    checkpoint=asv.CheckpointOptions(
                        save_secs=600,
                        ram_tier=mode == "on",
                        ram_save_secs=RAM_SECS[0] if RAM_SECS[0] == "auto" else float(RAM_SECS[0]),
                    ),
                )
                window: list[float] = []

                async def main(sv: asv.Supervisor = sv, window: list[float] = window) -> None:
                    mark: list[float] = []

                    def one() -> None:  # WARM_SECS of warm-up, then the window
                        step()
                        n = sv.global_step + 1
                        if n == 1:
                            mark.extend((time.perf_counter(), -1.0))
                        elif mark and mark[1] < 0 and time.perf_counter() - mark[0] >= WARM_SECS:
                            mark[:] = [time.perf_counter(), n]
                        elif mark and mark[1] >= 0 and time.perf_counter() - mark[0] >= secs:
                            window.append((n - mark[1]) / (time.perf_counter() - mark[0]))
                            sv.request_stop()

                    async with sv.managed_session() as sess:
                        await sess.run_loop(one)

                anyio.run(main)
                assert window, f"the session stopped early: {sv.status().stop_reason}"
                rates[mode].append(window[0])
            print(f"  round {r + 1} {mode}: {rates[mode][-1]:.2f} steps/s", flush=True)
    return rates["off"], rates["on"]


def _fmt(xs: list[float]) -> str:
    xs = [x for x in xs if x == x]
    return f"median {statistics.median(xs):.3f} (range {min(xs):.3f}-{max(xs):.3f}, n={len(xs)})" if xs else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=128)
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--secs", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ram-secs", default="auto", help="the RAM tier's ram_save_secs (default: auto)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["kill", "disk", "overhead"])
    args = parser.parse_args()
    RAM_SECS[0] = args.ram_secs
    sys.path.insert(0, str(HERE))
    from _common import machine

    print(f"RAM tier, {args.mb} MB state: {machine()}", flush=True)
    rng = random.Random(args.seed)
    if "kill" not in args.skip:
        lost, entered, first, first_training = lost_per_kill(args.mb, args.kills, "/dev/shm", rng)
        print(
            f"work lost per SIGKILL, RAM tier on: mean {statistics.fmean(lost):.3f} s, {_fmt(lost)}, worst {max(lost):.3f} s"
        )
        print(f"session restored from RAM / bare start (python + TF + raw read): {_fmt(entered)}")
        print(f"first resumed step / bare start: {_fmt(first)}")
        print(f"first resumed step / a bare training's first step (+ variables, trace): {_fmt(first_training)}")
    if "disk" not in args.skip:
        lost, _, _, _ = lost_per_kill(args.mb, max(2, args.kills // 4), "-", rng)
        print(f"work lost per SIGKILL, RAM tier off (disk every 600 s): {_fmt(lost)} s")
    if "overhead" not in args.skip:
        off, on = overhead(args.mb, args.secs, args.rounds)
        ratios = [b / a for a, b in zip(off, on)]
        print(f"training rate off: {_fmt(off)} steps/s; on: {_fmt(on)} steps/s")
        print(f"  ratio on / off: {_fmt(ratios)}")


if __name__ == "__main__":
    main()
