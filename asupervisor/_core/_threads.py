"""A dedicated worker thread with a FIFO job queue and step-boundary jobs.

The supervisor owns one :class:`DedicatedThread` as its *step thread*: every call that
touches model state (steps, restore, init, checkpoint snapshots, user calls) runs there,
in order, so state is only ever read or written by one thread. Sync looped services get
a dedicated thread of their own too, so that every thread the library starts is joined
when the session ends (a shared pool would keep idle threads alive).

Two kinds of jobs:

* ordinary jobs (:meth:`DedicatedThread.submit`) run in FIFO order;
* *boundary* jobs (:meth:`DedicatedThread.submit_at_boundary`) run as soon as the thread
  is between two units of work: before the next ordinary job, or between two steps of a
  running ``run_loop`` (which calls :meth:`run_boundary_jobs` at every step boundary).

This module must never call into TensorFlow itself, and never block the event loop.
"""

from __future__ import annotations

import collections
import gc
import queue
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import anyio

from .._exceptions import EndOfData
from .._logging import get_logger
from ._handoff import LoopHandle, Waiter

__all__ = ["DedicatedThread", "ThreadClosedError", "current_frames"]

log = get_logger(__name__)

_STOP = object()
_WAKE = object()


def current_frames() -> dict[int, FrameType]:
    """``sys._current_frames()``, with the garbage collector held off during the call.

    On CPython 3.10, and 3.11 and 3.12 releases before the fix of gh-106883 (3.11.7
    here), a collection that starts inside the call (it makes the threads' frame
    objects) and frees a ``threading.local`` (TensorFlow's graphs hold some) takes the
    interpreter's thread-list lock the call already holds: the caller waits forever
    holding the GIL, and the whole process with it (seen: the watchdog's poll froze a
    Keras training in the suite). The collector is turned back on only if it was on."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if was_enabled:
            gc.enable()


class ThreadClosedError(RuntimeError):
    """Work was submitted to a dedicated thread that has been closed."""


class _Job:
    __slots__ = ("args", "fn", "kwargs", "last", "waiter")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        waiter: Waiter[Any] | None,
        *,
        last: bool = False,
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.waiter = waiter
        self.last = last  # runs even on a thread given up on (DedicatedThread.submit_last)

    def run(self) -> None:
        if self.waiter is None:  # submit_nowait: fn reports its own errors
            self.fn(*self.args, **self.kwargs)
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except StopIteration as exc:  # cannot travel through a coroutine (PEP 479)
            end = EndOfData("end of data")
            end.__cause__ = exc
            self.waiter.set_error(end)
        except BaseException as exc:  # handed to the awaiting task, which re-raises it
            self.waiter.set_error(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self.waiter.set_result(result)


class DedicatedThread:
    """One named thread that runs submitted callables in order.

    Create and use it from the event loop thread; the jobs run on the dedicated thread.
    """

    def __init__(self, name: str, loop: LoopHandle) -> None:
        self.name = name
        self._loop = loop
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._boundary: collections.deque[_Job] = collections.deque()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._closed = False
        #: given up on at the stop (:meth:`aclose_within`): what was queued behind the job
        #: it is stuck in is dropped, but for :meth:`submit_last`'s (a final save must not
        #: be written once the session has ended, maybe by the logdir's next owner)
        self._abandoned = False
        self._exited: Waiter[None] = loop.waiter()
        #: a job runs now (read from any thread: a stop past its deadline does not wait
        #: for a step thread still busy)
        self.busy = False

    @property
    def ident(self) -> int | None:
        """The thread's identifier once started."""
        return self._thread.ident

    @property
    def has_boundary_jobs(self) -> bool:
        """Cheap check for work waiting at the next step boundary."""
        return bool(self._boundary)

    def is_alive(self) -> bool:
        """Whether the thread is running."""
        return self._thread.is_alive()

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Waiter[Any]:
        """Queue ``fn(*args, **kwargs)`` behind earlier jobs; returns its waiter."""
        if self._closed:
            raise ThreadClosedError(f"thread {self.name!r} is closed")
        waiter = self._loop.waiter()
        self._jobs.put(_Job(fn, args, kwargs, waiter))
        return waiter

    def submit_last(self, fn: Callable[..., Any], /, *args: Any) -> Waiter[Any]:
        """:meth:`submit` for a thread's last job, one that must run even if the stop
        gives up on the thread (it is stuck in the data's ``next()``): what it holds let
        go (the logdir's lock), whenever the thread is free again."""
        if self._closed:
            raise ThreadClosedError(f"thread {self.name!r} is closed")
        waiter = self._loop.waiter()
        self._jobs.put(_Job(fn, args, {}, waiter, last=True))
        return waiter

    def submit_to(self, waiter: Waiter[Any], fn: Callable[..., Any], /, *args: Any) -> None:
        """From any thread: queue ``fn(*args)``, its outcome going to ``waiter`` (made on
        the loop beforehand, :meth:`LoopHandle.waiter`): a hand-off from another thread
        whose result a task awaits, with no trip through the event loop."""
        if self._closed:
            raise ThreadClosedError(f"thread {self.name!r} is closed")
        self._jobs.put(_Job(fn, args, {}, waiter))

    def submit_nowait(self, fn: Callable[..., Any], /, *args: Any) -> None:
        """Queue ``fn(*args)`` with no waiter: nothing wakes the event loop when it is done.

        For fire-and-report work queued often from the step thread (a hand-off that
        wakes the event loop costs the step thread ~0.2 ms on a busy 2-core machine).
        ``fn`` must handle its own errors: it must not raise.
        """
        if self._closed:
            raise ThreadClosedError(f"thread {self.name!r} is closed")
        self._jobs.put(_Job(fn, args, {}, None))

    def submit_at_boundary(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Waiter[Any]:
        """Run ``fn`` at the next step boundary, ahead of queued ordinary jobs."""
        if self._closed:
            raise ThreadClosedError(f"thread {self.name!r} is closed")
        waiter = self._loop.waiter()
        self._boundary.append(_Job(fn, args, kwargs, waiter))
        self._jobs.put(_WAKE)  # an idle thread wakes up for it
        return waiter

    def submit_at_boundary_nowait(self, fn: Callable[..., Any], /, *args: Any) -> None:
        """From any thread: run ``fn(*args)`` at the next step boundary, with no waiter.
        ``fn`` must handle its own errors: it must not raise."""
        if self._closed:
            raise ThreadClosedError(f"thread {self.name!r} is closed")
        self._boundary.append(_Job(fn, args, {}, None))
        self._jobs.put(_WAKE)

    async def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on the thread and return its result; see :meth:`Waiter.wait`."""
        return await self.submit(fn, *args, **kwargs).wait()

    def run_boundary_jobs(self) -> None:
        """Run the waiting boundary jobs now (call only on this thread)."""
        boundary = self._boundary
        while boundary and not self._abandoned:
            boundary.popleft().run()

    def _main(self) -> None:
        jobs = self._jobs
        try:
            while True:
                job = jobs.get()
                if self._boundary and not self._abandoned:
                    self.run_boundary_jobs()
                if job is _STOP:
                    break
                if self._abandoned and job is not _WAKE and not job.last:
                    continue  # given up on: only what lets go still runs
                if job is not _WAKE:
                    self.busy = True
                    try:
                        job.run()
                    finally:
                        self.busy = False
        finally:
            self._exited.set_result(None)

    def request_close(self) -> None:
        """Tell the thread to stop once its queued work is done, without waiting for it
        (:meth:`aclose` waits); no new work is taken after this."""
        if not self._closed:
            self._closed = True
            if self._thread.is_alive():
                self._jobs.put(_STOP)

    async def aclose(self) -> None:
        """Finish queued work, stop the thread and join it (without blocking the loop)."""
        self.request_close()
        if self._thread.ident is None:
            return
        await self._exited.wait_cancellable()
        # The thread has signalled its last act; join() only waits for its teardown.
        self._thread.join()

    async def aclose_within(self, secs: float) -> bool:
        """:meth:`aclose`, giving up after ``secs``; returns whether the thread ended."""
        if self._thread.ident is not None and not self._thread.is_alive():
            self._closed = True  # already ended: nothing to wait for, whatever ``secs``
            self._thread.join()
            return True
        with anyio.move_on_after(secs, shield=True):
            await self.aclose()
            return True
        self._abandoned = True
        log.warning("thread.abandoned", thread=self.name, waited_secs=secs)
        return False
