"""Queue runners: sources, backpressure, end of data, errors, stops and statistics."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest
from _timing import scaled

import asupervisor as asv

pytestmark = pytest.mark.timeout(60)


def make_sv(*queue_runners: asv.QueueRunner, **kwargs: Any) -> asv.Supervisor:
    """A supervisor with no signal handling, no timers, and these queue runners."""
    kwargs.setdefault("handle_signals", False)
    kwargs.setdefault("save_summaries_secs", 0)
    kwargs.setdefault("stop_grace_secs", 20)
    return asv.Supervisor(queue_runners=queue_runners, **kwargs)


class LoopEvent:
    """An ``anyio.Event`` that another thread (a producer, the step thread) can set."""

    def __init__(self) -> None:
        self.event = anyio.Event()
        self._token = anyio.lowlevel.current_token()

    def set_from_thread(self) -> None:
        anyio.from_thread.run_sync(self.event.set, token=self._token)

    async def wait(self) -> None:
        await self.event.wait()


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Wait, on the loop, until a condition another thread makes true holds."""
    with anyio.fail_after(scaled(20)):
        while not predicate():
            await anyio.sleep(0.001)


def wait_until_in_thread(predicate: Callable[[], bool]) -> None:
    """Wait, on a plain thread (the step thread), until a condition holds."""
    deadline = time.monotonic() + scaled(20)
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def check_stats(qr: asv.QueueRunner, produced: int, consumed: int) -> asv.QueueStatistics:
    """Assert the counts of a finished queue and that its size never exceeded its capacity."""
    stats = qr.statistics()
    assert stats.produced == produced
    assert stats.consumed == consumed
    assert stats.max_size <= stats.capacity  # memory stayed bounded
    return stats


# -- construction -----------------------------------------------------------------


def test_invalid_arguments_are_rejected() -> None:
    """Capacity and threads must be ints >= 1, names non-empty, sources iterable or callable."""
    with pytest.raises(ValueError, match="capacity"):
        asv.QueueRunner([1], capacity=0)
    with pytest.raises(ValueError, match="threads"):
        asv.QueueRunner([1], threads=0)
    with pytest.raises(ValueError, match="name"):
        asv.QueueRunner([1], name="")
    with pytest.raises(TypeError, match="source"):
        asv.QueueRunner(42)
    sv = make_sv()
    with pytest.raises(TypeError, match="QueueRunner"):
        sv.add_queue_runner([1, 2])  # type: ignore[arg-type]
    sv.add_queue_runner(asv.QueueRunner([1], name="same"))
    with pytest.raises(ValueError, match="already registered"):
        sv.add_queue_runner(asv.QueueRunner([2], name="same"))


def test_statistics_before_a_session_are_empty() -> None:
    """A queue runner that never ran reports an empty queue of its capacity."""
    qr = asv.QueueRunner([1, 2], capacity=5)
    assert qr.statistics() == asv.QueueStatistics(
        size=0, capacity=5, produced=0, consumed=0, consumer_wait_secs=0.0, fraction_full=0.0, max_size=0
    )
    with pytest.raises(RuntimeError, match="not been started"):
        qr.get()


def test_import_does_not_import_tensorflow() -> None:
    """Queue runners keep ``import asupervisor`` free of TensorFlow."""
    code = "import sys, asupervisor; assert 'tensorflow' not in sys.modules; asupervisor.QueueRunner"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_names_are_exported_and_sorted() -> None:
    """``QueueRunner`` and ``QueueStatistics`` are public and ``__all__`` stays sorted."""
    assert "QueueRunner" in asv.__all__ and "QueueStatistics" in asv.__all__
    assert asv.__all__ == sorted(asv.__all__)


# -- sync sources -----------------------------------------------------------------


@pytest.mark.anyio
async def test_sync_generator_feeds_run_loop_in_order(no_new_threads: None) -> None:
    """A generator's items reach the steps once each, in order; its end is a clean stop."""
    qr = asv.QueueRunner((i for i in range(500)), capacity=8)
    sv = make_sv(qr)
    seen: list[int] = []
    async with sv.managed_session() as sess:
        steps = await sess.run_loop(seen.append, data=qr)
    assert seen == list(range(500))
    assert steps == 500 and sv.global_step == 500  # no step past the end of the data
    assert sess.stop_reason == "end_of_data"
    check_stats(qr, 500, 500)
    assert sv.status().services[qr.service.name] in ("finished", "stopped")


@pytest.mark.anyio
async def test_fast_producer_slow_consumer_is_bounded(no_new_threads: None) -> None:
    """A producer faster than the step fills the queue to capacity, then waits for room."""
    capacity = 4
    qr = asv.QueueRunner(lambda: iter(range(60)), capacity=capacity)
    sv = make_sv(qr)
    seen: list[int] = []

    def step(item: int) -> None:
        if item == 0:  # hold the first step until the producer waits on a full queue
            wait_until_in_thread(lambda: qr._queue is not None and qr._queue._space_wanted > 0)
        seen.append(item)

    async with sv.managed_session() as sess:
        await sess.run_loop(step, data=qr)
    assert seen == list(range(60))
    stats = check_stats(qr, 60, 60)
    assert stats.max_size == capacity  # it was full, and never more


@pytest.mark.anyio
async def test_several_threads_share_a_generator(no_new_threads: None) -> None:
    """With threads > 1 a shared generator is pulled under a lock: nothing lost or doubled."""
    qr = asv.QueueRunner((i for i in range(2000)), capacity=16, threads=3)
    sv = make_sv(qr)
    seen: list[int] = []
    async with sv.managed_session() as sess:
        await sess.run_loop(seen.append, data=qr)
    assert sorted(seen) == list(range(2000))
    check_stats(qr, 2000, 2000)


@pytest.mark.anyio
async def test_factory_gives_each_producer_its_own_iterator(no_new_threads: None) -> None:
    """A factory source is called once per producer; the end comes when all are done."""
    calls = []
    lock = threading.Lock()

    def shard() -> Iterator[tuple[int, int]]:
        with lock:
            k = len(calls)
            calls.append(threading.current_thread().name)
        return ((k, i) for i in range(300))

    qr = asv.QueueRunner(shard, capacity=8, threads=3, name="shards")
    sv = make_sv(qr)
    seen: list[tuple[int, int]] = []
    async with sv.managed_session() as sess:
        await sess.run_loop(seen.append, data=qr)
    assert len(set(calls)) == 3  # one call on each producer thread
    assert sorted(seen) == [(k, i) for k in range(3) for i in range(300)]
    check_stats(qr, 900, 900)


@pytest.mark.anyio
async def test_get_in_step_fn_ends_with_out_of_range(no_new_threads: None) -> None:
    """``qr.get()`` on the step thread drains the queue, then raises OutOfRangeError (a clean stop)."""
    import tensorflow as tf

    qr = asv.QueueRunner(range(10), capacity=3)
    sv = make_sv(qr)
    seen: list[int] = []
    errors: list[BaseException] = []

    def step_fn(ctx: asv.StepContext) -> None:
        while True:
            try:
                item = qr.get()
            except tf.errors.OutOfRangeError as exc:
                errors.append(exc)
                raise
            ctx.run_with_hooks(seen.append, item)

    async with sv.managed_session() as sess:
        await sess.run_step_fn(step_fn)
        pytest.fail("the end of the data should end the session body")  # pragma: no cover
    assert seen == list(range(10)) and sv.global_step == 10
    assert sess.stop_reason == "end_of_data" and len(errors) == 1
    check_stats(qr, 10, 10)


@pytest.mark.anyio
async def test_sync_producer_error_propagates(no_new_threads: None) -> None:
    """A producer raising ValueError after N items stops the session with that ValueError."""

    def source() -> Iterator[int]:
        yield from range(7)
        raise ValueError("bad record")

    qr = asv.QueueRunner(source(), capacity=4, name="bad")
    sv = make_sv(qr)
    seen: list[int] = []
    with pytest.raises(ValueError, match="bad record"):
        async with sv.managed_session() as sess:
            await sess.run_loop(seen.append, data=qr)
    assert sess.stop_reason == "service:queue_runner:bad"
    assert seen == list(range(len(seen))) and len(seen) <= 7
    assert sv.status().services["queue_runner:bad"] == "failed"


@pytest.mark.anyio
async def test_producer_blocked_on_full_queue_is_released_on_stop(no_new_threads: None) -> None:
    """An endless producer waiting on a full queue is released and joined when the session stops."""
    capacity = 2
    token = anyio.lowlevel.current_token()
    blocked = anyio.Event()

    def endless() -> Iterator[int]:
        i = 0
        while True:
            if i == capacity:  # the queue is full: the next put waits
                anyio.from_thread.run_sync(blocked.set, token=token)
            yield i
            i += 1

    qr = asv.QueueRunner(endless, capacity=capacity)
    sv = make_sv(qr)
    with anyio.fail_after(scaled(20)):
        async with sv.managed_session():
            await blocked.wait()
            await wait_until(lambda: qr._queue is not None and qr._queue._space_wanted == 1)
    assert sv.status().stop_reason == "completed"
    check_stats(qr, capacity, 0)


# -- async sources ----------------------------------------------------------------


@pytest.mark.anyio
async def test_slow_async_producer_fast_consumer(no_new_threads: None) -> None:
    """A slow async producer and a fast consumer: every item once, in order, stop at the end."""

    async def slow() -> AsyncIterator[int]:
        for i in range(100):
            await anyio.sleep(0.0005 if i % 10 == 0 else 0)
            yield i

    qr = asv.QueueRunner(slow(), capacity=4)
    sv = make_sv(qr)
    seen: list[int] = []
    async with sv.managed_session() as sess:
        steps = await sess.run_loop(seen.append, data=qr)
    assert seen == list(range(100)) and steps == 100 and sv.global_step == 100
    assert sess.stop_reason == "end_of_data"
    check_stats(qr, 100, 100)


@pytest.mark.anyio
async def test_fast_async_producer_slow_consumer(no_new_threads: None) -> None:
    """A fast async producer waits for room without blocking the loop; nothing lost, bounded."""
    capacity = 4

    async def fast() -> AsyncIterator[int]:
        for i in range(80):
            yield i

    qr = asv.QueueRunner(fast, capacity=capacity)
    sv = make_sv(qr)
    seen: list[int] = []
    ticks = 0

    def step(item: int) -> None:
        if item == 0:  # hold the first step until the producer waits on a full queue...
            wait_until_in_thread(lambda: qr._queue is not None and qr._queue._space_wanted > 0)
            before = ticks  # ...and the event loop keeps running meanwhile
            wait_until_in_thread(lambda: ticks >= before + 10)
        seen.append(item)

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0.001)

    async with sv.managed_session() as sess:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await sess.run_loop(step, data=qr)
            tg.cancel_scope.cancel()
    assert seen == list(range(80)) and sess.stop_reason == "end_of_data"
    stats = check_stats(qr, 80, 80)
    assert stats.max_size == capacity


@pytest.mark.anyio
async def test_async_producer_error_propagates(no_new_threads: None) -> None:
    """An async producer raising ValueError after N items surfaces ValueError from the session."""

    async def source() -> AsyncIterator[int]:
        for i in range(5):
            yield i
        raise ValueError("feed broke")

    qr = asv.QueueRunner(source, capacity=2, name="feed")
    sv = make_sv(qr)
    seen: list[int] = []
    with pytest.raises(ValueError, match="feed broke"):
        async with sv.managed_session() as sess:
            await sess.run_loop(seen.append, data=qr)
    assert seen == list(range(len(seen))) and len(seen) <= 5
    assert sess.stop_reason == "service:queue_runner:feed"


@pytest.mark.anyio
@pytest.mark.parametrize("consumer", ["run_loop", "get"])
async def test_consumer_waiting_on_empty_queue_is_released_on_stop(consumer: str, no_new_threads: None) -> None:
    """A step waiting for input that never comes (in run_loop's iterator, or in
    ``qr.get()`` inside a step) ends when a stop is requested."""

    async def one_then_nothing() -> AsyncIterator[int]:
        yield 0
        await anyio.Event().wait()  # never set: cancelled at session end
        yield 1  # pragma: no cover

    qr = asv.QueueRunner(one_then_nothing, capacity=2)
    sv = make_sv(qr)

    async def stop_when_waiting() -> None:
        await wait_until(lambda: qr._queue is not None and qr._queue._consumer_waiting)
        sv.request_stop()

    def get_twice() -> None:
        qr.get()
        qr.get()

    with anyio.fail_after(scaled(20)):
        async with sv.managed_session() as sess:
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_when_waiting)
                if consumer == "run_loop":
                    await sess.run_loop(lambda item: None, data=qr)
                else:
                    await sess.run(get_twice)
    assert sess.stop_reason == "requested"
    # run_loop counted the step that consumed item 0; the get() step never finished
    assert sv.global_step == (1 if consumer == "run_loop" else 0)


@pytest.mark.anyio
async def test_halted_run_loop_releases_the_consumer_and_keeps_items(no_new_threads: None) -> None:
    """Cancelling a ``run_loop`` that waits for input ends it; the next loop gets the rest."""
    gate = anyio.Event()

    async def two_batches() -> AsyncIterator[int]:
        for i in range(3):
            yield i
        await gate.wait()
        for i in range(3, 6):
            yield i

    qr = asv.QueueRunner(two_batches, capacity=8)
    sv = make_sv(qr)
    seen: list[int] = []
    async with sv.managed_session() as sess:
        with anyio.CancelScope() as scope:

            async def cancel_when_waiting() -> None:
                await wait_until(lambda: qr._queue is not None and qr._queue._consumer_waiting and len(seen) == 3)
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_when_waiting)
                await sess.run_loop(seen.append, data=qr)
        assert scope.cancelled_caught and not sess.should_stop()
        gate.set()
        await sess.run_loop(seen.append, data=qr)
    assert seen == list(range(6)) and sess.stop_reason == "end_of_data"


# -- tf.data ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_dataset_source_on_producer_threads(no_new_threads: None) -> None:
    """A tf.data.Dataset is iterated on producer threads; every element arrives once."""
    import tensorflow as tf

    ds = tf.data.Dataset.range(200).batch(4)
    qr = asv.QueueRunner(ds, capacity=6, threads=2, name="ds")
    sv = make_sv(qr)
    seen: list[int] = []
    step_thread: list[str] = []

    def step(batch: Any) -> None:
        step_thread.append(threading.current_thread().name)
        seen.extend(int(x) for x in batch.numpy())

    async with sv.managed_session() as sess:
        steps = await sess.run_loop(step, data=qr)
    assert sorted(seen) == list(range(200)) and steps == 50
    assert set(step_thread) == {"asv-step"}
    assert sess.stop_reason == "end_of_data"
    check_stats(qr, 50, 50)


# -- status and summaries -----------------------------------------------------------


@pytest.mark.anyio
async def test_statistics_in_status_and_scalar_sources(no_new_threads: None) -> None:
    """``status().queues`` and the summary scalars report each queue while it runs."""
    capacity = 4
    token = anyio.lowlevel.current_token()
    full = anyio.Event()

    def source() -> Iterator[int]:
        for i in range(20):
            if i == capacity:
                anyio.from_thread.run_sync(full.set, token=token)
            yield i

    qr = asv.QueueRunner(source, capacity=capacity, name="feed")
    sv = make_sv(qr)
    async with sv.managed_session() as sess:
        await full.wait()
        await wait_until(lambda: qr.statistics().size == capacity)
        stats = sv.status().queues["feed"]
        assert isinstance(stats, asv.QueueStatistics)
        assert stats.size == capacity and stats.fraction_full == 1.0 and stats.consumed == 0
        rt = sv._runtime
        assert rt is not None
        scalars: dict[str, float] = {}
        for source_fn in rt.scalar_sources():
            scalars.update(source_fn())
        assert scalars["queue/feed/fraction_full"] == 1.0
        await sess.run_loop(lambda item: None, data=qr)
    stats = sv.status().queues["feed"]
    assert isinstance(stats, asv.QueueStatistics)
    assert stats.produced == stats.consumed == 20 and stats.fraction_full == 0.0


@pytest.mark.anyio
async def test_get_refuses_to_block_the_event_loop(no_new_threads: None) -> None:
    """``qr.get()`` called on the event loop with nothing queued raises instead of blocking."""
    gate = threading.Event()

    def held() -> Iterator[int]:
        gate.wait(scaled(20))
        return iter(())

    qr = asv.QueueRunner(held, capacity=2)
    sv = make_sv(qr)
    async with sv.managed_session():
        with pytest.raises(RuntimeError, match="block the event loop"):
            qr.get()
        gate.set()


@pytest.mark.anyio
async def test_each_session_starts_with_a_fresh_queue(no_new_threads: None) -> None:
    """A factory source starts afresh in every session; statistics are per session."""
    qr = asv.QueueRunner(lambda: iter(range(5)), capacity=2, name="again")
    sv = make_sv(qr)
    for _ in range(2):
        seen: list[int] = []
        async with sv.managed_session() as sess:
            await sess.run_loop(seen.append, data=qr)
        assert seen == list(range(5)) and sess.stop_reason == "end_of_data"
        check_stats(qr, 5, 5)


@pytest.mark.anyio
async def test_async_producers_share_an_async_generator(no_new_threads: None) -> None:
    """Several async producer tasks take turns on one async generator: nothing lost or doubled."""

    async def numbers() -> AsyncIterator[int]:
        for i in range(300):
            if i % 7 == 0:
                await anyio.lowlevel.checkpoint()
            yield i

    gen = numbers()
    qr = asv.QueueRunner(gen, capacity=5, threads=3, name="shared_async")
    sv = make_sv(qr)
    seen: list[int] = []
    async with sv.managed_session() as sess:
        await sess.run_loop(seen.append, data=qr)
    await gen.aclose()
    assert sorted(seen) == list(range(300)) and sess.stop_reason == "end_of_data"
    check_stats(qr, 300, 300)


@pytest.mark.anyio
async def test_a_queue_runner_serves_one_session_at_a_time(no_new_threads: None) -> None:
    """Registering one queue runner with two supervisors that run at once fails the second."""
    qr = asv.QueueRunner(lambda: iter(range(3)), capacity=1, name="single")
    first, second = make_sv(qr), make_sv(qr)
    async with first.managed_session():
        with pytest.raises(RuntimeError, match="already running"):
            async with second.managed_session():
                pass  # pragma: no cover


@pytest.mark.anyio
async def test_factory_returning_an_async_iterable_is_a_clear_error(no_new_threads: None) -> None:
    """A sync factory that returns an async iterable stops the session with a TypeError saying why."""

    async def records() -> AsyncIterator[int]:
        yield 1

    made: list[AsyncIterator[int]] = []

    def factory() -> AsyncIterator[int]:
        made.append(records())
        return made[-1]

    qr = asv.QueueRunner(factory, name="wrong")
    sv = make_sv(qr)
    with pytest.raises(TypeError, match="async def"):
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda item: None, data=qr)
    for gen in made:
        await gen.aclose()
