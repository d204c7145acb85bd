"""``QueueRunner``: an input service that fills a bounded queue beside the step loop.

The structured-concurrency version of TF1's ``tf.train.QueueRunner``. Registered with a
supervisor, a queue runner is one service of the session: it starts producers when the
session starts, and they are cancelled and their threads joined when it stops. The step
thread consumes, either with ``sess.run_loop(fn, data=qr)`` (``iter(qr)`` is a blocking
iterator) or with ``qr.get()`` inside a step.

Sources and where they are pulled:

* a sync iterable, generator or ``tf.data.Dataset``: ``iter()`` and ``next()`` run on
  dedicated producer threads (never on the event loop, never in anyio's worker pool,
  whose idle threads would outlive the session);
* an async iterable: a task on the event loop;
* a zero-argument callable returning one of those (an ``async def`` generator function
  for async): called once per producer, so each producer pulls its own iterator.

With ``threads > 1`` several producers pull in parallel and the order of items is not
preserved. Producers that share one iterator take turns calling ``next()`` under a lock
(a Python generator cannot run on two threads at once); give a factory to let each
producer pull its own iterator (e.g. one shard each) truly in parallel.

End of data follows TF's ``OutOfRangeError`` semantics: when every producer has reached
the end of its source, the consumer drains what is queued, then ``iter(qr)`` raises
``StopIteration`` and ``qr.get()`` raises ``tf.errors.OutOfRangeError``, which the engine
treats as a clean stop. A producer's exception stops the session and comes out of
``managed_session()`` as itself; the consumer is released (it sees end of data), it never
re-raises the producer's error (so the final checkpoint is still taken).

This module must not import TensorFlow at import time, and never blocks the event loop.
"""

from __future__ import annotations

import inspect
import itertools
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from .._core._abc import SessionPart
from .._core._services import EngineContext, Service, ServiceContext, engine_context
from .._core._status import QueueStatistics
from .._logging import describe, get_logger
from .._tf import is_end_of_data, tf
from ._queue import END, BoundedQueue, PutResult

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from .._core._threads import DedicatedThread

__all__ = ["QueueRunner", "QueueStatistics"]

log = get_logger(__name__)

_names = itertools.count()


class QueueRunner:
    """Feeds a bounded queue from a source, as a service of each managed session.

    Register it with ``Supervisor(queue_runners=[qr])`` or ``sv.add_queue_runner(qr)``;
    consume it on the step thread with ``sess.run_loop(fn, data=qr)`` or ``qr.get()``.
    Each session starts with an empty queue; items still queued when a session stops
    are dropped. A shared iterator (a generator, say) carries on where it stopped in a
    later session; a factory source starts afresh.

    Args:
        source: a sync iterable, a ``tf.data.Dataset``, an async iterable, or a
            zero-argument callable returning one (called once per producer).
        capacity: the most items queued at once; a full queue makes producers wait.
        threads: producers pulling in parallel (threads for sync sources, tasks for
            async ones). With more than one, the order of items is not preserved.
        name: the queue's name in ``status().queues``, summaries
            (``queue/<name>/fraction_full``) and logs; the service is
            ``queue_runner:<name>``. Defaults to ``queue``, ``queue_1``, ...

    Attributes:
        source: the source, as given.
        capacity: the most items queued at once.
        threads: the number of producers.
        name: the queue's name.
        service: the :class:`~asupervisor.Service` that runs the producers
            (``queue_runner:<name>`` in ``status().services``).

    Raises:
        TypeError: ``source`` is not iterable, async iterable or callable.
        ValueError: ``capacity`` or ``threads`` is below 1, or ``name`` is empty.
    """

    def __init__(self, source: Any, *, capacity: int = 64, threads: int = 1, name: str | None = None) -> None:
        for field, value in (("capacity", capacity), ("threads", threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be an int >= 1, got {value!r}")
        if name is None:
            n = next(_names)
            name = "queue" if n == 0 else f"queue_{n}"
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if hasattr(source, "__aiter__"):
            self._is_async, self._factory = True, False
        elif hasattr(source, "__iter__"):
            self._is_async, self._factory = False, False
        elif inspect.isasyncgenfunction(source):
            self._is_async, self._factory = True, True
        elif callable(source):
            self._is_async, self._factory = False, True
        else:
            raise TypeError(
                "source must be an iterable, a tf.data.Dataset, an async iterable, or a "
                f"zero-argument callable returning one; got {type(source).__name__}"
            )
        self.source = source
        self.capacity = capacity
        self.threads = threads
        self.name = name
        self._queue: BoundedQueue | None = None
        self._service = _QueueRunnerService(self)

    def __repr__(self) -> str:
        return f"QueueRunner(name={self.name!r}, capacity={self.capacity}, threads={self.threads})"

    @property
    def service(self) -> Service:
        """The :class:`~asupervisor.Service` that runs the producers (``queue_runner:<name>``)."""
        return self._service

    # -- the consumer (step thread) ---------------------------------------------------

    def get(self) -> Any:
        """Take the next item, waiting while the queue is empty (call on the step thread).

        A step in flight is not interrupted: the wait ends with an item, the end of the
        data, or a stop of the session.

        Raises:
            tf.errors.OutOfRangeError: every producer finished and the queue is drained,
                or the session is stopping (both end the session cleanly).
            RuntimeError: the queue runner is not part of a started session, or the
                queue is empty and the caller is the event loop (which must not block).
        """
        q = self._queue
        if q is None:
            raise RuntimeError(f"{self!r} has not been started: register it with a Supervisor")
        try:
            item = q._items.popleft()
        except IndexError:
            item = q.wait_get(False)
            if item is END:
                message = f"queue {self.name!r} is closed and empty"
                raise tf().errors.OutOfRangeError(None, None, message) from None
            return item
        if q._space_wanted and len(q._items) <= q.low_water:
            q.notify_space()
        return item

    def __iter__(self) -> _QueueIterator:
        """A blocking iterator over the queue, for ``run_loop`` on the step thread.

        It ends (``StopIteration``) at the end of the data, when the session stops, or
        when the ``run_loop`` consuming it is halted (its caller was cancelled).
        """
        q = self._queue
        if q is None:
            raise RuntimeError(f"{self!r} has not been started: register it with a Supervisor")
        q.clear_interrupt()
        return _QueueIterator(q)

    def statistics(self) -> QueueStatistics:
        """A snapshot of the queue of the current (or last) session."""
        q = self._queue
        if q is None:
            return QueueStatistics(
                size=0,
                capacity=self.capacity,
                produced=0,
                consumed=0,
                consumer_wait_secs=0.0,
                fraction_full=0.0,
                max_size=0,
            )
        produced = q.produced
        size = len(q)
        return QueueStatistics(
            size=size,
            capacity=self.capacity,
            produced=produced,
            consumed=produced - size,  # only the consumer removes items
            consumer_wait_secs=q.wait_secs,
            fraction_full=size / self.capacity,
            max_size=q.max_size,
        )

    def _scalars(self) -> dict[str, float]:
        q = self._queue
        return {f"queue/{self.name}/fraction_full": 0.0 if q is None else len(q) / self.capacity}


class _QueueIterator:
    """``iter(qr)``: the step thread's blocking iterator over one session's queue."""

    __slots__ = ("_items", "_popleft", "_q")

    def __init__(self, q: BoundedQueue) -> None:
        self._q = q
        self._items = q._items
        self._popleft = q._items.popleft

    def __iter__(self) -> _QueueIterator:
        return self

    def __next__(self) -> Any:
        try:
            item = self._popleft()
        except IndexError:
            item = self._q.wait_get(True)
            if item is END:
                raise StopIteration from None
            return item
        q = self._q
        if q._space_wanted and len(self._items) <= q.low_water:
            q.notify_space()
        return item


class _QueueRunnerService(Service, SessionPart):
    """The service that runs one queue runner's producers for a session; as a session
    part it releases the step thread's wait for input at a stop and reports the queue's
    statistics and ``fraction_full`` scalar."""

    def __init__(self, qr: QueueRunner) -> None:
        self.qr = qr
        self.name = f"queue_runner:{qr.name}"
        self._running: BoundedQueue | None = None  # this session's queue, once started

    def wake(self) -> None:
        """Any thread, at a stop or a halted ``run_loop``: release the consumer's wait."""
        q = self._running
        if q is not None:
            q.interrupt()

    def scalars(self) -> Mapping[str, float]:
        """``queue/<name>/fraction_full`` once the queue runs."""
        return {} if self._running is None else self.qr._scalars()

    def queues(self) -> Mapping[str, QueueStatistics]:
        """This queue's statistics once it runs."""
        return {} if self._running is None else {self.qr.name: self.qr.statistics()}

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Start the producers, report ready, and wait for them to finish."""
        await self._run(engine_context(ctx), task_status)

    async def _run(self, ctx: EngineContext, task_status: TaskStatus[None]) -> None:
        qr = self.qr
        if qr._queue is not None and not qr._queue.closed:
            raise RuntimeError(f"{qr!r} is already running in another session; a queue runner serves one at a time")
        q = BoundedQueue(qr.capacity, qr.threads, ctx.control, ctx.loop)
        qr._queue = q
        self._running = q
        log.info("queue_runner.started", queue=qr.name, capacity=qr.capacity, threads=qr.threads)
        try:
            if qr._is_async:
                await self._run_async(ctx, q, task_status)
            else:
                await self._run_threads(ctx, q, task_status)
        finally:
            q.close()
        stats = qr.statistics()
        log.info("queue_runner.finished", queue=qr.name, produced=stats.produced)

    # -- sync sources: producer threads ----------------------------------------------

    async def _run_threads(self, ctx: EngineContext, q: BoundedQueue, task_status: TaskStatus[None]) -> None:
        qr = self.qr
        threads: list[DedicatedThread] = []
        try:
            for i in range(qr.threads):
                threads.append(ctx.new_thread(f"asv-{self.name}-{i}"))
            shared = None
            if not qr._factory:  # one iterator for all, made on a producer thread (TF ops)
                shared = await threads[0].call(iter, qr.source)
            lock = threading.Lock() if shared is not None and qr.threads > 1 else None
            waiters = [t.submit(self._produce, ctx, q, shared, lock) for t in threads]
            task_status.started()
            ctx.set_service_state(self.name, "running")
            first: Exception | None = None
            for waiter in waiters:
                try:
                    await waiter.wait(q.close, grace_secs=ctx.stop_grace_secs)
                except Exception as exc:
                    first = first or exc
            if first is not None:
                raise first
        finally:
            q.close()  # releases producers blocked on a full queue
            for thread in threads:
                await thread.aclose_within(ctx.stop_grace_secs)

    def _produce(self, ctx: EngineContext, q: BoundedQueue, shared: Any, lock: threading.Lock | None) -> None:
        """On a producer thread: pull items and put them until the end, an error or close."""
        put = q.put
        try:
            it = shared
            if it is None:
                made = self.qr.source()
                if hasattr(made, "__aiter__") and not hasattr(made, "__iter__"):
                    raise TypeError(
                        "a QueueRunner factory returned an async iterable: pass the async "
                        "iterable itself, or make the factory an `async def` generator function"
                    )
                it = iter(made)
            if lock is None:
                for item in it:
                    if not put(item):
                        return
            else:
                while True:
                    with lock:
                        item = next(it, END)
                    if item is END:
                        break
                    if not put(item):
                        return
        except Exception as exc:
            if not is_end_of_data(exc):  # a source may end with OutOfRangeError too
                self._failed(ctx, q, exc)
                raise
        q.producer_done()

    def _failed(self, ctx: EngineContext, q: BoundedQueue, exc: Exception) -> None:
        # Record the cause before the consumer is released, so the session's stop
        # reason is this error and not the end of data the consumer then sees.
        log.error("queue_runner.producer_failed", service=self.name, queue=self.qr.name, error=describe(exc))
        ctx.control.request_stop(exc, reason=f"service:{self.name}")
        # The stop may cancel this service before the error reaches supervise(): record
        # the state here, or status() would say "stopped" for a failed runner.
        ctx.loop.call_from_any_thread(lambda: ctx.set_service_state(self.name, "failed"))
        q.close()

    # -- async sources: producer tasks -------------------------------------------------

    async def _run_async(self, ctx: EngineContext, q: BoundedQueue, task_status: TaskStatus[None]) -> None:
        qr = self.qr
        shared = None if qr._factory else qr.source.__aiter__()
        lock = anyio.Lock() if shared is not None and qr.threads > 1 else None
        errors: list[Exception] = []
        task_status.started()
        ctx.set_service_state(self.name, "running")
        if qr.threads == 1:
            await self._pump(ctx, q, shared, lock, errors)
        else:
            async with anyio.create_task_group() as tg:
                for _ in range(qr.threads):
                    tg.start_soon(self._pump, ctx, q, shared, lock, errors)
        if errors:
            raise errors[0]

    async def _pump(
        self,
        ctx: EngineContext,
        q: BoundedQueue,
        shared: Any,
        lock: anyio.Lock | None,
        errors: list[Exception],
    ) -> None:
        """On the event loop: pull an async iterator and put without blocking the loop."""
        own = None  # an iterator this producer made (from a factory): closed at the end
        try:
            if shared is None:
                ait = own = self.qr.source().__aiter__()
            else:
                ait = shared
            while True:
                try:
                    if lock is None:
                        item = await ait.__anext__()
                    else:
                        async with lock:
                            item = await ait.__anext__()
                except StopAsyncIteration:
                    break
                while True:
                    result = q.try_put(item)
                    if result == PutResult.PUT:
                        break
                    if result == PutResult.CLOSED:
                        return
                    await q.wait_space()
        except Exception as exc:
            if not is_end_of_data(exc):
                self._failed(ctx, q, exc)
                errors.append(exc)
                return
        finally:
            aclose = getattr(own, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
        q.producer_done()
