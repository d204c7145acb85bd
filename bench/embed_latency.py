"""Event-loop responsiveness while training runs beside an application, against a bare thread.

A 1 ms ticker task on the event loop measures its lateness (when it woke minus when it
asked to) while an MLP (784-256-256-10, batch 64) trains:

* **bare**: the steps run on a plain ``threading.Thread`` (no supervisor, no checkpoints);
* **raw I/O**: the same bare thread, plus a plain thread that writes the same bytes a
  checkpoint holds (the 32 MiB variable and the model's variables) to a file, fsyncs it
  and deletes the one before, every ``--every`` steps: what the disk alone costs on this
  machine, with no supervisor;
* **asupervisor**: ``sess.run_loop`` with a 32 MiB extra variable in the state and a
  checkpoint every ``--every`` steps (50: several a second; 500: about one a second).

Reported per contender: ticker lateness p50/p99/max (ms) and the training rate; then the
ratios asupervisor / bare and asupervisor / raw I/O.

With ``--status`` (asyncio: uvicorn), the same training runs inside ``examples/web_app.py``
served by a real uvicorn on 127.0.0.1 while an httpx client in the same process asks
``GET /status`` in a loop; reported: the requests' p50/p99 latency, against the same app
whose training runs on a bare thread (no supervisor, no checkpoints). Goal (issue 12): p99 <= 2 ms and <= 1.5x bare at both
cadences, training rate >= 0.9x bare at 50 steps per save. Repetitions alternate the
contenders; figures are medians over them. Run:
``.venv/bin/python bench/embed_latency.py [--backend asyncio|trio] [--every 50 500] [--reps 3]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
from _common import machine, median, mlp_step

import asupervisor as asv


async def _ticker(lateness: list[float], done: threading.Event | anyio.Event) -> None:
    while not done.is_set():
        due = time.perf_counter() + 0.001
        await anyio.sleep(0.001)
        lateness.append(max(0.0, time.perf_counter() - due))


#: the checkpoint store of the measured sessions (``--no-direct``: direct writes off)
STORE: Any = None


def _stats(lateness: list[float]) -> tuple[float, float, float]:
    xs = sorted(lateness)
    if not xs:
        return (0.0, 0.0, 0.0)
    return (xs[len(xs) // 2] * 1e3, xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e3, xs[-1] * 1e3)


def _raw_writer(state: Any, due: threading.Semaphore, done: threading.Event, directory: str) -> None:
    """Until ``done``: at each ``due`` release, write the state's bytes to a new file,
    fsync it and delete the previous one (what a checkpoint asks of the disk)."""
    import numpy as np
    import tensorflow as tf

    extra = np.zeros(8 << 20, np.float32)
    previous: str | None = None
    n = 0
    while True:
        due.acquire()
        if done.is_set():
            break
        path = f"{directory}/raw-{n}"
        with open(path, "wb") as f:
            f.write(extra.data)
            for v in tf.nest.flatten([state["model"].variables, state["optimizer"].variables]):
                f.write(np.ascontiguousarray(v.numpy()).data)
            f.flush()
            os.fsync(f.fileno())
        if previous is not None:
            os.unlink(previous)
        previous, n = path, n + 1


async def bare(
    step: Any, steps: int, every: int | None = None, state: Any = None
) -> tuple[tuple[float, float, float], float]:
    """Train on a plain thread; with ``every``, a plain writer thread writes and fsyncs the
    state's bytes every ``every`` steps (a write still in flight is not waited for)."""
    lateness: list[float] = []
    done = threading.Event()
    rate: list[float] = []
    due = threading.Semaphore(0)

    def train() -> None:
        t0 = time.perf_counter()
        for i in range(1, steps + 1):
            step()
            if every is not None and i % every == 0:
                due.release()
        rate.append(steps / (time.perf_counter() - t0))
        done.set()
        due.release()

    with tempfile.TemporaryDirectory() as directory:
        writer = threading.Thread(target=_raw_writer, args=(state, due, done, directory)) if every else None
        thread = threading.Thread(target=train)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_ticker, lateness, done)
            if writer is not None:
                writer.start()
            thread.start()
            while not done.is_set():
                await anyio.sleep(0.01)
        thread.join()
        if writer is not None:
            writer.join()
    return _stats(lateness), rate[0]


async def supervised(step: Any, state: Any, steps: int, every: int) -> tuple[tuple[float, float, float], float]:
    import tensorflow as tf

    lateness: list[float] = []
    done = anyio.Event()
    extra = tf.Variable(tf.zeros([8 << 20]))  # 32 MiB
    with tempfile.TemporaryDirectory() as logdir:
        sv = asv.Supervisor(
            logdir,
            state={**state, "extra": extra},
            save_model_secs=0,
            save_model_steps=every,
            save_summaries_secs=0,
            handle_signals=False,
            checkpoint_store=STORE,
        )
        async with sv.managed_session() as sess:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_ticker, lateness, done)
                t0 = time.perf_counter()
                await sess.run_loop(step, max_steps=sess.global_step + steps)
                rate = steps / (time.perf_counter() - t0)
                done.set()
    return _stats(lateness), rate


def _status_trainer(step: Any, state: Any, logdir: str, every: int, bare_steps: int | None) -> tuple[Any, Any]:
    """``examples/web_app.py``'s Trainer with the bench's MLP, 32 MiB state and cadence; with
    ``bare_steps`` it trains that many steps on a plain thread instead."""
    import tensorflow as tf

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import web_app

    class BenchTrainer(web_app.Trainer):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            self.sv = asv.Supervisor(
                logdir,
                state={**state, "extra": tf.Variable(tf.zeros([8 << 20]))},
                save_model_secs=0,
                save_model_steps=every,
                save_summaries_secs=0,
                checkpoint_store=STORE,
            )
            self.fail_at = None
            self.error = None
            self.finished = None

        def step(self) -> Any:
            return step()

        async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            if bare_steps is None:
                await super().run(task_status=task_status)
                return
            self.finished = anyio.Event()
            task_status.started()
            try:
                await anyio.to_thread.run_sync(lambda: [step() for _ in range(bare_steps)])
            finally:
                self.finished.set()

    trainer = BenchTrainer()
    return web_app.create_app(logdir, trainer=trainer), trainer


async def status_latency(step: Any, state: Any, steps: int, every: int, *, bare: bool) -> tuple[float, float, float]:
    """``GET /status`` latency (p50, p99, max in ms) through the example app while it trains."""
    import socket

    import httpx
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    latencies: list[float] = []
    with tempfile.TemporaryDirectory() as logdir:
        app, trainer = _status_trainer(step, state, logdir, every, steps if bare else None)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            while not server.started:
                await anyio.sleep(0.01)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                while True:
                    t0 = time.perf_counter()
                    body = (await client.get("/status")).json()
                    latencies.append(time.perf_counter() - t0)
                    done = trainer.finished.is_set() if bare else body["global_step"] >= steps
                    if done:
                        break
                    await anyio.sleep(0.005)
            server.should_exit = True
    return _stats(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--every", type=int, nargs="+", default=[50, 500])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--status", action="store_true", help="GET /status latency through examples/web_app.py")
    parser.add_argument("--no-direct", action="store_true", help="asupervisor writes its data files buffered")
    args = parser.parse_args()
    global STORE
    if args.no_direct:
        from asupervisor._checkpoint.store import FastPath

        STORE = FastPath(direct_writes=False)
    step, state = mlp_step()
    for _ in range(50):
        step()  # trace and warm up
    print(f"embed latency: {machine()}, backend {args.backend}")
    if args.status:
        if args.backend != "asyncio":
            parser.error("--status needs --backend asyncio (uvicorn runs on asyncio)")
        for every in args.every:
            got: dict[str, list[tuple[float, float, float]]] = {"bare thread": [], "asupervisor": []}
            for _ in range(args.reps):
                for name in got:
                    got[name].append(
                        anyio.run(
                            functools.partial(status_latency, bare=name == "bare thread"),
                            step,
                            state,
                            args.steps,
                            every,
                        )
                    )
            for name, runs in got.items():
                print(
                    f"  every {every:4d} steps  {name:11s} GET /status p50 {median([r[0] for r in runs]):.2f} ms  "
                    f"p99 {median([r[1] for r in runs]):.2f} ms  max {median([r[2] for r in runs]):.1f} ms"
                )
        return
    for every in args.every:
        rows: dict[str, list[tuple[tuple[float, float, float], float]]] = {"bare": [], "raw I/O": [], "asupervisor": []}
        for _ in range(args.reps):
            rows["bare"].append(anyio.run(bare, step, args.steps, backend=args.backend))
            rows["raw I/O"].append(anyio.run(bare, step, args.steps, every, state, backend=args.backend))
            rows["asupervisor"].append(anyio.run(supervised, step, state, args.steps, every, backend=args.backend))
        summary = {}
        for name, runs in rows.items():
            p50 = median([r[0][0] for r in runs])
            p99 = median([r[0][1] for r in runs])
            mx = median([r[0][2] for r in runs])
            rate = median([r[1] for r in runs])
            summary[name] = (p50, p99, mx, rate)
            print(
                f"  every {every:4d} steps  {name:11s} ticker lateness p50 {p50:.2f} ms  p99 {p99:.2f} ms  "
                f"max {mx:.1f} ms   training {rate:.0f} steps/s"
            )
        b, r, a = summary["bare"], summary["raw I/O"], summary["asupervisor"]
        print(
            f"  every {every:4d} steps  ratios: p99 {a[1] / max(b[1], 1e-9):.2f}x bare, "
            f"training rate {a[3] / b[3]:.2f}x bare   (goal: p99 <= 2 ms and <= 1.5x, rate >= 0.9x at 50)"
        )
        print(
            f"  every {every:4d} steps  the disk alone: raw I/O p99 {r[1] / max(b[1], 1e-9):.2f}x bare, rate "
            f"{r[3] / b[3]:.2f}x bare; asupervisor / raw I/O: p99 {a[1] / max(r[1], 1e-9):.2f}x, rate {a[3] / r[3]:.2f}x"
        )


if __name__ == "__main__":
    main()
