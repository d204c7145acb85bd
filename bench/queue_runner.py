"""Benchmark: hand-off rate through a ``QueueRunner`` vs. ``queue.Queue`` between two threads.

Part 1 moves small items (ints) from a sync producer to a consumer that calls a trivial
step on each:

* ``queue.Queue``: a plain producer thread ``put``s into a ``queue.Queue(maxsize=capacity)``
  and a plain consumer thread ``get``s and calls the step (the reference);
* ``QueueRunner``: the producer thread is the queue runner's, the consumer is the step
  thread running ``sess.run_loop(step, data=qr)`` (the whole supervisor path: stop and
  halt checks, step counting).

Both run in the same process, alternately, ``--repeats`` times; medians are printed and
their ratio (goal: >= 0.8x).

Part 2 runs a step slower than the producer (``--step-us`` microseconds outside the GIL,
standing in for a TensorFlow step) and prints the consumer's wait time from
``qr.statistics()``: a fed step loop should not wait on input.

Run: ``python bench/queue_runner.py [--items N] [--repeats R] [--capacity C] [--backend B]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

import asupervisor as asv


def step(item: int) -> None:
    """The trivial step: does nothing with the item."""


def queue_queue_rate(items: int, capacity: int) -> float:
    """Items per second through ``queue.Queue`` between two plain threads."""
    q: queue.Queue[int | None] = queue.Queue(maxsize=capacity)

    def produce() -> None:
        put = q.put
        for i in range(items):
            put(i)
        put(None)

    def consume() -> None:
        get = q.get
        while (item := get()) is not None:
            step(item)

    producer = threading.Thread(target=produce)
    consumer = threading.Thread(target=consume)
    start = time.perf_counter()
    consumer.start()
    producer.start()
    consumer.join()
    elapsed = time.perf_counter() - start
    producer.join()
    return items / elapsed


def make_supervisor(qr: asv.QueueRunner) -> asv.Supervisor:
    return asv.Supervisor(queue_runners=[qr], handle_signals=False, save_summaries_secs=0)


async def queue_runner_rate(items: int, capacity: int) -> float:
    """Items per second through a ``QueueRunner`` into ``run_loop`` on the step thread."""
    qr = asv.QueueRunner(lambda: iter(range(items)), capacity=capacity, name="bench")
    async with make_supervisor(qr).managed_session() as sess:
        start = time.perf_counter()
        steps = await sess.run_loop(step, data=qr)
        elapsed = time.perf_counter() - start
    assert steps == items, (steps, items)
    return items / elapsed


async def fed_step_loop(items: int, capacity: int, step_us: float) -> asv.QueueStatistics:
    """A step slower than the producer: how long did the step loop wait for input?"""
    secs = step_us / 1e6

    def slow_step(item: int) -> None:
        time.sleep(secs)  # a TF step runs its kernels outside the GIL

    qr = asv.QueueRunner(lambda: iter(range(items)), capacity=capacity, name="fed")
    async with make_supervisor(qr).managed_session() as sess:
        start = time.perf_counter()
        await sess.run_loop(slow_step, data=qr)
        elapsed = time.perf_counter() - start
    stats = qr.statistics()
    print(
        f"fed run_loop: {items} steps of {step_us:g} us in {elapsed:.3f} s; consumer waited "
        f"{stats.consumer_wait_secs * 1e3:.3f} ms ({stats.consumer_wait_secs / elapsed:.2%} of the run), "
        f"max queue size {stats.max_size}/{stats.capacity}"
    )
    return stats


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("asupervisor").setLevel(logging.ERROR)  # quiet
    await queue_runner_rate(1000, args.capacity)  # warm up: TensorFlow import, first session
    base: list[float] = []
    ours: list[float] = []
    for _ in range(args.repeats):
        base.append(queue_queue_rate(args.items, args.capacity))
        ours.append(await queue_runner_rate(args.items, args.capacity))
    b, o = statistics.median(base), statistics.median(ours)
    print(f"items={args.items} capacity={args.capacity} repeats={args.repeats} backend={args.backend}")
    print(f"queue.Queue, two threads : {b:12,.0f} items/s (median; {min(base):,.0f}..{max(base):,.0f})")
    print(f"QueueRunner -> run_loop  : {o:12,.0f} items/s (median; {min(ours):,.0f}..{max(ours):,.0f})")
    print(f"ratio                    : {o / b:.2f}x (goal >= 0.8x)")
    await fed_step_loop(args.fed_items, args.capacity, args.step_us)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--capacity", type=int, default=64)
    parser.add_argument("--fed-items", type=int, default=2_000)
    parser.add_argument("--step-us", type=float, default=200.0)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    arguments = parser.parse_args()
    anyio.run(main, arguments, backend=arguments.backend)
