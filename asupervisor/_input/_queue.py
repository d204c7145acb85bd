"""The bounded hand-off queue behind a ``QueueRunner``: producers in, the step thread out.

One consumer (the step thread) and any number of producers (dedicated threads, or tasks
on the event loop). The queue never holds more than ``capacity`` items: a producer on a
thread waits on a condition when it is full; a producer task on the event loop puts
without blocking when there is room and otherwise awaits a "space" event that the
consumer sets through the loop (``LoopHandle.call_from_any_thread``). The consumer waits
on a condition when it is empty (no spinning, no event-loop involvement).

The consumer's fast path takes no lock: ``deque.popleft()`` is atomic, and the consumer
only touches the lock to wake producers once the queue has drained to its low-water mark
(half the capacity), so a fast producer refills in bursts instead of one item per wake.
Correctness of that lock-free path rests on one ordering rule: a producer announces that
it waits (``_space_wanted``) *before* it checks whether the queue is full, under the
lock; the consumer pops *before* it reads ``_space_wanted`` and notifies under the lock.

The consumer stops waiting when the queue is empty and: every producer finished (end of
data), the queue was closed (session ending or a producer failed), the session is
stopping, or, for an iterator that ``interrupt()`` released, its ``run_loop`` was halted.
This module must never block the event loop for longer than a lock hand-over, and never
import TensorFlow.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from .._core._handoff import LoopHandle
    from .._core._stop import StopControl

__all__ = ["END", "BoundedQueue", "PutResult"]

#: what :meth:`BoundedQueue.wait_get` returns when no item will come
END: Any = object()


class PutResult:
    """Outcomes of :meth:`BoundedQueue.try_put` (plain ints, compared by value)."""

    PUT = 0
    FULL = 1
    CLOSED = 2


class BoundedQueue:
    """A FIFO of at most ``capacity`` items between producers and one consumer.

    Args:
        capacity: the most items held at once (>= 1).
        producers: how many producers must call :meth:`producer_done` for end of data.
        control: the session's stop control; a stopping session releases the consumer.
        loop: the event loop, to wake an async producer waiting for space.
    """

    def __init__(self, capacity: int, producers: int, control: StopControl, loop: LoopHandle) -> None:
        self.capacity = capacity
        self.low_water = (capacity - 1) // 2
        self._items: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._control = control
        self._loop = loop
        self._space_wanted = 0  # producers waiting for room (threads and async tasks)
        self._space_events: list[anyio.Event] = []
        self._consumer_waiting = False
        self._interrupted = False
        self._active = producers
        self.ended = producers == 0  # every producer finished: end of data
        self.closed = False  # no more puts: the session is ending or a producer failed
        self.produced = 0
        self.max_size = 0
        self.wait_secs = 0.0

    def __len__(self) -> int:
        return len(self._items)

    # -- producers --------------------------------------------------------------------

    def put(self, item: Any) -> bool:
        """From a producer thread: add ``item``, waiting while full; ``False`` if closed."""
        items = self._items
        with self._lock:
            if len(items) >= self.capacity and not self.closed:
                self._space_wanted += 1  # announce first, then check (see module docs)
                try:
                    while len(items) >= self.capacity and not self.closed:
                        self._not_full.wait()
                finally:
                    self._space_wanted -= 1
            if self.closed:
                return False
            self._append_locked(item)
        return True

    def try_put(self, item: Any) -> int:
        """From the event loop: add ``item`` if there is room, never waiting.

        Returns:
            A :class:`PutResult` value.
        """
        items = self._items
        with self._lock:
            if self.closed:
                return PutResult.CLOSED
            if len(items) >= self.capacity:
                return PutResult.FULL
            self._append_locked(item)
        return PutResult.PUT

    def _append_locked(self, item: Any) -> None:
        # Under the lock: add, count, and wake a consumer waiting on an empty queue.
        items = self._items
        items.append(item)
        self.produced += 1
        if len(items) > self.max_size:
            self.max_size = len(items)
        if self._consumer_waiting:
            self._not_empty.notify()

    async def wait_space(self) -> None:
        """On the event loop: return once the queue has room again or is closed."""
        event = anyio.Event()
        with self._lock:
            self._space_wanted += 1
            if len(self._items) < self.capacity or self.closed:
                self._space_wanted -= 1
                return
            self._space_events.append(event)
        try:
            await event.wait()
        finally:
            with self._lock:
                if event in self._space_events:  # cancelled before being woken
                    self._space_events.remove(event)
                    self._space_wanted -= 1

    def producer_done(self) -> None:
        """A producer reached the end of its source; the last one ends the data."""
        with self._lock:
            self._active -= 1
            if self._active <= 0:
                self.ended = True
                self._not_empty.notify_all()

    def close(self) -> None:
        """No more items: producers are released and refused, the consumer drains.

        Callable from any thread, any number of times.
        """
        with self._lock:
            self.closed = True
            self._not_full.notify_all()
            self._not_empty.notify_all()
            events, self._space_events = self._space_events, []
            self._space_wanted -= len(events)
        for event in events:
            self._loop.call_from_any_thread(event.set)

    # -- the consumer -----------------------------------------------------------------

    def notify_space(self) -> None:
        """Consumer side: wake waiting producers if the queue drained to low water."""
        with self._lock:
            if len(self._items) > self.low_water:
                return
            self._not_full.notify_all()
            events, self._space_events = self._space_events, []
            self._space_wanted -= len(events)
        for event in events:
            self._loop.call_soon(event.set)

    def wait_get(self, interruptible: bool) -> Any:
        """The consumer's slow path: wait for an item; :data:`END` if none will come.

        Args:
            interruptible: whether :meth:`interrupt` ends the wait (a ``run_loop``
                iterator does; an explicit ``get()`` inside a step does not).
        """
        items = self._items
        control = self._control
        if self._loop.in_loop_thread() and not (self.ended or self.closed or control.stopping):
            raise RuntimeError(
                "waiting for a queue runner's input would block the event loop; consume it "
                "on the step thread (sess.run_loop(fn, data=qr), or qr.get() inside a step)"
            )
        start = time.perf_counter()
        with self._lock:
            self._consumer_waiting = True
            try:
                while not items:
                    if self.ended or self.closed or control.stopping:
                        return END
                    if interruptible and self._interrupted:
                        self._interrupted = False
                        return END
                    self._not_empty.wait()
                item = items.popleft()
            finally:
                self._consumer_waiting = False
                self.wait_secs += time.perf_counter() - start
            wake = self._space_wanted and len(items) <= self.low_water
        if wake:
            self.notify_space()
        return item

    def interrupt(self) -> None:
        """Release a waiting ``run_loop`` iterator (the loop was halted or is stopping)."""
        with self._lock:
            self._interrupted = True
            self._not_empty.notify_all()

    def clear_interrupt(self) -> None:
        """Forget an interrupt meant for an earlier ``run_loop`` (a new one starts)."""
        self._interrupted = False
