"""The kernel-heavy part of a background save, run at the OS's idle priority.

Copying a checkpoint's bytes into the page cache (``write(2)``) and freeing a retired
checkpoint's pages (``unlink(2)``) is kernel work. On a machine with few cores it holds a
core in stretches that a kernel built without full preemption (most distributions' and
cloud VMs' default) does not interrupt, so an event loop beside the training wakes late:
measured with ``bench/embed_latency.py`` (a 32 MiB state saved every 50 steps, 2 cores),
a 1 ms ticker's p99 lateness was 3.3 ms with the writer at normal priority, 1.8 ms with
this module.

:class:`IdleIO` hands that work to one thread whose scheduling policy is ``SCHED_IDLE``
(Linux): it gets a core only when no other thread of the machine wants one, and the
event loop, the step thread and TensorFlow's threads preempt it at once. Data are written
in :data:`CHUNK_BYTES` pieces with ``pwrite`` at their offsets, so the writer thread
(normal priority) can take the pieces that are left at any time.

A thread cannot leave ``SCHED_IDLE`` without privileges, so nothing waits on the idle
thread alone: the caller waits for it and, when it has made no progress for
:data:`STARVED_SECS` (other work saturates every CPU of the machine), does the rest
itself, and all the work of the next :data:`STARVED_HOLD_SECS` too (a unit the idle
thread is in cannot be taken over: the first starved job waits for one). On
other systems, or where the policy cannot be set, :class:`IdleIO` runs everything in
the caller.

Plain file work for the checkpoint writer thread; never the event loop.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...._logging import describe, get_logger

__all__ = ["CHUNK_BYTES", "STARVED_SECS", "IdleIO", "pwrite_all"]

log = get_logger(__name__)

T = TypeVar("T")

#: One ``write(2)`` at most: the kernel's non-preemptible stretch, and the unit either
#: thread takes.
CHUNK_BYTES = 1 << 20

#: How long the idle thread may make no progress before the caller takes over.
STARVED_SECS = 0.25

#: After the idle thread starved, the work is done in the caller for this long: a unit the
#: thread is in cannot be taken over (a retired checkpoint's ``unlink``, a sync), and a
#: machine whose CPUs other work saturates (a ``tf.data`` pipeline, another training) kept
#: a 64 MB save waiting on one for 1.5-5 s where the caller alone took 0.1 s.
STARVED_HOLD_SECS = 30.0

_POLL_SECS = 0.05  # the caller's wait between progress checks (and abandon checks)


def pwrite_all(fd: int, data: Any, offset: int) -> None:
    """Write all of ``data`` (a buffer) at ``offset`` of ``fd``, whatever ``pwrite`` writes per call."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def lower_to_idle_priority() -> bool:
    """Give the calling thread the ``SCHED_IDLE`` policy (Linux); whether it now has it.

    One way: without ``CAP_SYS_NICE`` a thread cannot go back to normal priority, so only
    a thread dedicated to idle work may call this.
    """
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None or not sys.platform.startswith("linux"):
        return False
    try:
        os.sched_setscheduler(threading.get_native_id(), policy, os.sched_param(0))
    except OSError as exc:  # a seccomp profile may refuse it: normal priority, still correct
        log.debug("checkpoint.idle_priority_unavailable", error=describe(exc))
        return False
    return True


class _Job:
    """Units of work either thread may take, in order; done when every taken unit ended."""

    def __init__(self, units: Sequence[Callable[[], Any]]) -> None:
        self.units = units
        self.taken = 0
        self.finished = 0
        self.results: list[Any] = [None] * len(units)
        self.error: BaseException | None = None
        self.cancelled = False
        self.progress_at = time.monotonic()
        self.by_caller = 0
        self.cond = threading.Condition()

    def run_one(self, *, caller: bool) -> bool:
        """Take the next unit and run it; ``False`` when none is left to take."""
        with self.cond:
            if self.cancelled or self.error is not None or self.taken >= len(self.units):
                return False
            index = self.taken
            self.taken += 1
        try:
            result = self.units[index]()
        except BaseException as exc:  # handed to the caller, which raises it
            with self.cond:
                if self.error is None:
                    self.error = exc
                self.finished += 1
                self.cond.notify_all()
            if not isinstance(exc, Exception):
                raise
            return False
        with self.cond:
            self.results[index] = result
            self.finished += 1
            self.by_caller += caller
            self.progress_at = time.monotonic()
            self.cond.notify_all()
        return True

    def run_all(self) -> None:
        """On the idle thread: take units until none is left."""
        while self.run_one(caller=False):
            pass

    def settled(self) -> bool:
        """Every unit taken so far has ended and nothing more will be taken (call holding ``cond``)."""
        stopped = self.cancelled or self.error is not None or self.taken >= len(self.units)
        return stopped and self.finished == self.taken


class IdleIO:
    """Runs plain file work on one idle-priority thread, with the caller as the fallback.

    Args:
        submit: queues a callable on the thread to lower (the session's
            ``asv-checkpoint-io`` thread); ``None`` runs everything in the caller.
        starved_secs: no progress for this long and the caller takes over.
    """

    def __init__(
        self, submit: Callable[[Callable[[], None]], None] | None, *, starved_secs: float = STARVED_SECS
    ) -> None:
        self._submit = submit
        self.starved_secs = starved_secs
        self._lowered = False
        self.caller_units = 0  # units the caller ran itself (starved or closed thread)
        self._starved_until = 0.0  # the idle thread starved: until then, the caller does it all

    def _lower_once(self) -> None:
        if not self._lowered:
            self._lowered = True
            if not lower_to_idle_priority():
                log.debug("checkpoint.io_at_normal_priority")

    def write(
        self, fd: int, data: Any, offset: int, check: Callable[[], None] | None = None, chunk: int = CHUNK_BYTES
    ) -> None:
        """Write the buffer ``data`` at ``offset`` of ``fd`` in pieces of ``chunk`` bytes.

        ``check`` is called between waits and may raise (an abandoned save); no piece is
        written after this returns or raises, so the caller may close ``fd``.
        """
        view = memoryview(data).cast("B")
        units = [
            functools.partial(pwrite_all, fd, view[start : start + chunk], offset + start)
            for start in range(0, len(view), chunk)
        ]
        self._run(_Job(units), check)

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the idle thread (or here, if it does not start it in time); its result."""
        job = _Job([fn])
        self._run(job, None)
        return job.results[0]  # type: ignore[no-any-return]

    def _run(self, job: _Job, check: Callable[[], None] | None) -> None:
        submitted = False
        if job.units and self._submit is not None and time.monotonic() >= self._starved_until:
            try:
                self._submit(self._on_thread(job))
                submitted = True
            except RuntimeError:  # the thread is closed (the session is ending): do it here
                pass
        try:
            if self._wait(job, check, helping=not submitted):
                self._starved_until = time.monotonic() + STARVED_HOLD_SECS
                log.debug("checkpoint.io_starved_hold", secs=STARVED_HOLD_SECS)
        finally:
            with job.cond:  # nothing more is taken; wait out a unit the idle thread is in
                job.cancelled = True
                while not job.settled():
                    job.cond.wait()
            self.caller_units += job.by_caller
        if job.error is not None:
            raise job.error

    def _on_thread(self, job: _Job) -> Callable[[], None]:
        def work() -> None:
            self._lower_once()
            job.run_all()

        return work

    def _wait(self, job: _Job, check: Callable[[], None] | None, *, helping: bool) -> bool:
        """Until every unit ended: wait for the idle thread; take units when it starves
        (or from the start, ``helping``). Whether it starved."""
        starved = False
        while True:
            if check is not None:
                check()
            if helping:
                if not job.run_one(caller=True):
                    break
                continue
            with job.cond:
                if job.settled():
                    break
                idle = time.monotonic() - job.progress_at
                if idle < self.starved_secs:
                    job.cond.wait(min(_POLL_SECS, self.starved_secs - idle))
                    continue
            helping = starved = True  # starved: the rest is done here, at normal priority
            log.debug("checkpoint.io_starved", secs=round(idle, 3))
        with job.cond:
            while not job.settled():
                job.cond.wait()
        return starved
