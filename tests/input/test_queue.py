"""The bounded hand-off queue: bound, wake-ups, end, close, interrupt (plain threads)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from _timing import scaled

from asupervisor._core._handoff import LoopHandle
from asupervisor._input._queue import END, BoundedQueue, PutResult


class FakeControl:
    """Stands in for the session's StopControl."""

    stopping = False


class FakeLoop:
    """Stands in for LoopHandle when no event loop is involved."""

    def in_loop_thread(self) -> bool:
        return False

    def call_soon(self, fn: Callable[[], object]) -> None:
        fn()

    call_from_any_thread = call_soon


def make_queue(capacity: int, producers: int = 1) -> tuple[BoundedQueue, FakeControl]:
    control = FakeControl()
    return BoundedQueue(capacity, producers, control, FakeLoop()), control  # type: ignore[arg-type]


def consume(q: BoundedQueue, out: list[Any], interruptible: bool = False) -> None:
    """The consumer's loop, as ``iter(qr)`` does it: fast path, then the slow path."""
    items = q._items
    while True:
        try:
            item = items.popleft()
        except IndexError:
            item = q.wait_get(interruptible)
            if item is END:
                return
        else:
            if q._space_wanted and len(items) <= q.low_water:
                q.notify_space()
        out.append(item)


@pytest.mark.parametrize("capacity", [1, 2, 7])
def test_many_producers_one_consumer_lose_nothing_and_stay_bounded(capacity: int) -> None:
    """Four producers and the lock-free consumer: every item once, size never above capacity."""
    q, _ = make_queue(capacity, producers=4)
    out: list[Any] = []

    def produce(k: int) -> None:
        for i in range(2000):
            assert q.put((k, i))
        q.producer_done()

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    consumer = threading.Thread(target=consume, args=(q, out))
    consumer.start()
    for t in threads:
        t.start()
    for t in [*threads, consumer]:
        t.join(scaled(30))
        assert not t.is_alive(), "a lost wake-up left a thread waiting"
    assert sorted(out) == [(k, i) for k in range(4) for i in range(2000)]
    for k in range(4):  # each producer's items keep their order
        assert [i for kk, i in out if kk == k] == list(range(2000))
    assert q.max_size <= capacity and q.produced == 8000


def test_close_releases_a_producer_waiting_on_a_full_queue() -> None:
    """A producer blocked on a full queue returns False once the queue is closed."""
    q, _ = make_queue(1)
    assert q.put(0)
    results: list[bool] = []
    producer = threading.Thread(target=lambda: results.append(q.put(1)))
    producer.start()
    while not q._space_wanted:  # the producer announced that it waits
        threading.Event().wait(0.001)
    q.close()
    producer.join(scaled(10))
    assert results == [False] and len(q) == 1
    assert q.try_put(2) == PutResult.CLOSED


def test_consumer_drains_before_the_end_and_stops_on_stop() -> None:
    """End of data comes after the queued items; a stop releases an empty wait."""
    q, control = make_queue(4)
    for i in range(3):
        q.put(i)
    q.producer_done()
    out: list[Any] = []
    consume(q, out)
    assert out == [0, 1, 2]

    q, control = make_queue(4)
    waiter = threading.Thread(target=lambda: out.append(q.wait_get(False)))
    waiter.start()
    while not q._consumer_waiting:
        threading.Event().wait(0.001)
    control.stopping = True
    q.interrupt()  # what the stop request's waker does
    waiter.join(scaled(10))
    assert out[-1] is END


def test_interrupt_releases_only_an_interruptible_wait() -> None:
    """``interrupt()`` ends an iterator's wait; a ``get()`` inside a step keeps waiting."""
    q, _ = make_queue(4)
    got: list[Any] = []
    step_get = threading.Thread(target=lambda: got.append(q.wait_get(False)))
    step_get.start()
    while not q._consumer_waiting:
        threading.Event().wait(0.001)
    q.interrupt()
    step_get.join(0.05)
    assert step_get.is_alive()  # not released by an interrupt
    q.put("item")
    step_get.join(scaled(10))
    assert got == ["item"]
    q.clear_interrupt()
    q.interrupt()
    assert q.wait_get(True) is END  # a pending interrupt ends the next iterator wait
    q.put("next")
    assert q.wait_get(True) == "next"  # ...once


@pytest.mark.anyio
async def test_async_producer_waits_for_space_without_blocking_the_loop() -> None:
    """``try_put`` reports FULL; ``wait_space`` returns once the consumer drained to low water."""
    q = BoundedQueue(4, 1, FakeControl(), LoopHandle())  # type: ignore[arg-type]
    for i in range(4):
        assert q.try_put(i) == PutResult.PUT
    assert q.try_put(4) == PutResult.FULL
    drained = threading.Event()

    def drain() -> None:
        out: list[Any] = []
        for _ in range(3):
            out.append(q._items.popleft())
            if q._space_wanted and len(q._items) <= q.low_water:
                q.notify_space()
        assert out == [0, 1, 2]
        drained.set()

    consumer = threading.Thread(target=drain)
    with anyio.fail_after(scaled(10)):
        async with anyio.create_task_group() as tg:

            async def start_consumer() -> None:
                while not q._space_wanted:
                    await anyio.sleep(0.001)
                consumer.start()

            tg.start_soon(start_consumer)
            await q.wait_space()
    consumer.join(scaled(10))
    assert drained.is_set() and q.try_put(4) == PutResult.PUT and q.max_size == 4
