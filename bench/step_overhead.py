"""Step-loop overhead of asupervisor, against baselines run in the same process.

(a) ``sess.run_loop`` with the standard services on, vs a bare Python loop calling the
    same ``@tf.function`` step: a tiny step (one scalar ``assign_add``) and an MLP step
    (784-256-256-10, batch 64). Goal: <= 1.05x tiny, <= 1.02x MLP.
(b) the overhead of one ``await sess.run(step)`` over calling ``step()`` directly, next to
    the overhead of ``await anyio.to_thread.run_sync(step)``. Goal: ours <= 0.5x anyio's.
    Beside them, in the same rounds, the **floor**: the least a hand-off to another
    thread and back can cost on this event loop, a thread blocked on a ``SimpleQueue``
    running the step and waking the loop with its own thread-safe call (asyncio:
    ``call_soon_threadsafe`` on a bare future; trio: ``run_sync_soon`` setting an
    ``Event``), no cancellation, no error handling, no ordering with other work.

Repetitions alternate between the contenders so that a noisy neighbour hurts both; the
figures are medians. Run: ``.venv/bin/python bench/step_overhead.py [--quick]``.
"""

from __future__ import annotations

import argparse
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
from _common import machine, median, mlp_step, tiny_step

import asupervisor as asv


def bare_loop(step: Any, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n


async def supervised_loop(step: Any, state: Any, n: int, logdir: str) -> float:
    sv = asv.Supervisor(logdir, state=state, handle_signals=True)
    async with sv.managed_session() as sess:
        t0 = time.perf_counter()
        await sess.run_loop(step, max_steps=sess.global_step + n)
        return (time.perf_counter() - t0) / n


async def loop_ratio(name: str, make: Any, n: int, reps: int, logdir: str) -> float:
    step, state = make()
    state = state if isinstance(state, dict) else {"v": state}
    for _ in range(3):  # trace the function, warm up caches
        step()
    bare, ours = [], []
    for _ in range(reps):
        bare.append(bare_loop(step, n))
        ours.append(await supervised_loop(step, state, n, logdir))
    b, o = median(bare), median(ours)
    print(f"  {name:5s} step: bare {b * 1e6:8.1f} us/step   run_loop {o * 1e6:8.1f} us/step   ratio {o / b:.3f}x")
    return o / b


class MinimalHandoff:
    """The floor of a thread hand-off on the running event loop (see the module docstring)."""

    def __init__(self) -> None:
        import sniffio

        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._backend = sniffio.current_async_library()
        if self._backend == "trio":
            import trio

            self._token = trio.lowlevel.current_trio_token()
        else:
            import asyncio

            self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._work, name="bench-floor")
        self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            fn, done = job
            done(fn())

    async def call(self, fn: Any) -> Any:
        if self._backend == "trio":
            import trio

            event, box = trio.Event(), []

            def done(result: Any) -> None:
                box.append(result)
                self._token.run_sync_soon(event.set)

            self._queue.put((fn, done))
            await event.wait()
            return box[0]
        future = self._loop.create_future()
        self._queue.put((fn, lambda result: self._loop.call_soon_threadsafe(future.set_result, result)))
        return await future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


async def call_overheads(n: int, reps: int) -> float:
    step, _ = tiny_step()
    for _ in range(3):
        step()
    sv = asv.Supervisor(None, handle_signals=False, save_summaries_secs=0)
    direct, ours, theirs, floor = [], [], [], []
    minimal = MinimalHandoff()
    async with sv.managed_session() as sess:
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                await minimal.call(step)
            floor.append((time.perf_counter() - t0) / n)
            direct.append(bare_loop(step, n))
            t0 = time.perf_counter()
            for _ in range(n):
                await sess.run(step)
            ours.append((time.perf_counter() - t0) / n)
            t0 = time.perf_counter()
            for _ in range(n):
                await anyio.to_thread.run_sync(step)
            theirs.append((time.perf_counter() - t0) / n)
    minimal.close()
    d, o, t, f = median(direct), median(ours), median(theirs), median(floor)
    print(
        f"  direct {d * 1e6:7.1f} us   sess.run {o * 1e6:7.1f} us (+{(o - d) * 1e6:.1f})   "
        f"to_thread.run_sync {t * 1e6:7.1f} us (+{(t - d) * 1e6:.1f})   "
        f"floor {f * 1e6:7.1f} us (+{(f - d) * 1e6:.1f})\n"
        f"  overhead ratio: sess.run / to_thread {(o - d) / (t - d):.2f}x   floor / to_thread {(f - d) / (t - d):.2f}x   "
        f"sess.run / floor {(o - d) / (f - d):.2f}x"
    )
    return (o - d) / (t - d)


async def main(quick: bool, backend: str) -> None:
    reps = 5 if quick else 11
    with tempfile.TemporaryDirectory() as logdir:
        print(f"[{backend}] (a) run_loop with standard services vs a bare loop (median of {reps})")
        await loop_ratio("tiny", tiny_step, 2000 if quick else 10000, reps, f"{logdir}/tiny")
        await loop_ratio("mlp", mlp_step, 200 if quick else 1000, reps, f"{logdir}/mlp")
    print(f"[{backend}] (b) per-call overhead of await sess.run(step) vs anyio.to_thread.run_sync")
    await call_overheads(500 if quick else 2000, reps)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repetitions")
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    args = parser.parse_args()
    asv.configure_logging(level="warning")
    print(machine())
    for backend in ["asyncio", "trio"] if args.backend == "both" else [args.backend]:
        anyio.run(main, args.quick, backend, backend=backend)
