"""Cheap hand-off of results from a plain thread back to the event loop.

A :class:`LoopHandle` is captured on the event loop thread; from any other thread it
schedules a callable on that loop without blocking (asyncio's ``call_soon_threadsafe``,
trio's ``TrioToken.run_sync_soon``, anyio's generic path for other backends). A
:class:`Waiter` is a one-shot result slot filled by a thread and awaited by a task.

This is the hot path of ``await sess.run(step)``: one queue put to wake the thread, one
wake-up of the loop to resume the task; no per-call thread pool machinery. Nothing here
may block the event loop.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, cast

import anyio
import anyio.lowlevel

from .._logging import get_logger

__all__ = ["LoopHandle", "Waiter", "waits_bounded_by"]

T = TypeVar("T")

log = get_logger(__name__)


def _unbounded() -> float:
    return math.inf


#: when (``anyio.current_time()``'s clock, asked at the cancellation) every
#: :meth:`Waiter.wait`'s grace ends at the latest in this context: a stop's phase
#: (:func:`waits_bounded_by`)
_BOUND: contextvars.ContextVar[Callable[[], float]] = contextvars.ContextVar("asv_wait_bound", default=_unbounded)


@contextlib.contextmanager
def waits_bounded_by(deadline: Callable[[], float]) -> Iterator[None]:
    """Within: a :meth:`Waiter.wait` cancelled waits for its work in flight until
    ``deadline()`` at most (asked when it is cancelled), whatever grace it was given. A
    stop's phase is bounded by its deadline (a cancel scope's), but a wait it cancels
    would otherwise go on, shielded, for the work it started: a step thread stuck in the
    data's ``next()`` would hold the stop until the data came."""
    outer = _BOUND.get()
    token = _BOUND.set(lambda: min(deadline(), outer()))
    try:
        yield
    finally:
        _BOUND.reset(token)


class LoopHandle:
    """The running event loop, reachable from other threads.

    Must be created on the event loop thread (inside ``anyio.run``).
    """

    __slots__ = ("_new_event", "_new_future", "backend", "call_soon", "thread_id")

    def __init__(self) -> None:
        token = anyio.lowlevel.current_token()
        self.thread_id = threading.get_ident()
        native = token.native_token
        name = token.backend_class.__module__.rsplit("_", 1)[-1]
        self.backend = name
        self.call_soon: Callable[[Callable[[], object]], None]
        if name == "asyncio":
            import asyncio

            self.call_soon = native.call_soon_threadsafe  # type: ignore[attr-defined]
            self._new_event: Callable[[], Any] = asyncio.Event
            # A bare future saves the Event's indirection on the hot path of sess.run.
            self._new_future: Callable[[], Any] | None = native.create_future  # type: ignore[attr-defined]
        elif name == "trio":
            import trio

            self.call_soon = native.run_sync_soon  # type: ignore[attr-defined]
            self._new_event = trio.Event
            self._new_future = None
        else:  # pragma: no cover - a future anyio backend
            backend = token.backend_class

            def call_soon(fn: Callable[[], object]) -> None:
                backend.run_sync_soon(fn, (), native)

            self.call_soon = call_soon
            self._new_event = anyio.Event
            self._new_future = None

    def in_loop_thread(self) -> bool:
        """Whether the caller runs on the event loop's thread."""
        return threading.get_ident() == self.thread_id

    def call_from_any_thread(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` now if on the loop thread, else schedule it on the loop."""
        if threading.get_ident() == self.thread_id:
            fn()
        else:
            self.call_soon(fn)

    def call_if_running(self, fn: Callable[[], object]) -> bool:
        """:meth:`call_from_any_thread`, except that a loop that has finished is not an
        error: ``fn`` is then dropped and ``False`` returned (a late stop request)."""
        if threading.get_ident() == self.thread_id:
            fn()
            return True
        try:
            self.call_soon(fn)
        except RuntimeError:  # asyncio: "Event loop is closed"; trio: RunFinishedError
            return False
        return True

    def waiter(self) -> Waiter[Any]:
        """A new one-shot result slot bound to this loop (call on the loop thread)."""
        return Waiter(self)


class Waiter(Generic[T]):
    """A result (or exception) produced by some thread and awaited on the event loop.

    On asyncio the wait is a bare future, created per wait (a cancelled future cannot be
    awaited again); elsewhere a native event. Either way the producing thread only sets
    plain attributes and schedules :meth:`_notify` on the loop.
    """

    __slots__ = ("_done", "_error", "_event", "_future", "_loop", "_value")

    def __init__(self, loop: LoopHandle) -> None:
        self._loop = loop
        self._event = None if loop._new_future is not None else loop._new_event()
        self._future: Any = None
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        """Whether a result or an error has been set."""
        return self._done

    def _notify(self) -> None:
        # On the loop thread, after _done was set.
        if self._event is not None:
            self._event.set()
        elif self._future is not None and not self._future.done():
            self._future.set_result(None)

    def set_result(self, value: T) -> None:
        """Fill the slot with a value; callable from any thread, once. If the loop has
        finished (a thread abandoned past its stop grace), nobody waits: nothing to wake."""
        self._value = value
        self._done = True
        self._loop.call_if_running(self._notify)

    def set_error(self, error: BaseException) -> None:
        """Fill the slot with an exception; callable from any thread, once (a finished
        loop: as :meth:`set_result`)."""
        self._error = error
        self._done = True
        self._loop.call_if_running(self._notify)

    def outcome(self) -> T:
        """The value, or raise the error (only once :attr:`done`)."""
        if self._error is not None:
            error, self._error = self._error, None
            try:
                raise error
            finally:
                del error
        return cast("T", self._value)

    async def _wait_once(self) -> None:
        if self._event is not None:
            await self._event.wait()
            return
        if self._done:  # the notification may still be on its way; the value is here
            return
        self._future = self._loop._new_future()  # type: ignore[misc]
        await self._future

    async def wait_cancellable(self) -> T:
        """Wait for the outcome; a cancellation ends the wait at once (the work goes on)."""
        await self._wait_once()
        return self.outcome()

    async def wait(
        self, on_cancel: Callable[[], object] | None = None, *, grace_secs: float | Callable[[], float] = math.inf
    ) -> T:
        """Wait for the outcome; work in flight is not abandoned lightly.

        If the waiting task is cancelled, ``on_cancel`` is called (to ask the worker to
        wind down), the wait goes on, shielded, until the worker is done or
        ``grace_secs`` pass (then ``thread.overrun`` is logged and the work is left to
        finish on its own), and then the cancellation propagates. An error the worker
        raises meanwhile must be recorded by the worker itself; it is not re-raised here.
        ``grace_secs`` may be a callable, asked at the cancellation (a stop notice's
        deadline may have come nearer since the wait began); within
        :func:`waits_bounded_by` (a stop's phase) it ends by that deadline at the latest.
        """
        try:
            await self._wait_once()
        except anyio.get_cancelled_exc_class():
            if on_cancel is not None:
                on_cancel()
            grace = grace_secs() if callable(grace_secs) else grace_secs
            bound = _BOUND.get()() - anyio.current_time()
            with anyio.move_on_after(max(0.0, min(grace, bound)), shield=True) as scope:
                await self._wait_once()
            if scope.cancelled_caught and grace <= bound:  # (a stop's phase says its own overrun)
                log.error("thread.overrun", waited_secs=grace)
            raise
        return self.outcome()
