"""Where one session's time goes, counted where it is spent: the engine's half of the
goodput ledger (the ``_goodput`` feature keeps the run's ledger across restarts).

A :class:`TimeAccount` per session, in plain floats:

* productive: each step's call, timed on the step thread (``run_loop``'s ``fn(batch)``
  with its hooks, ``sess.run``'s ``fn``), the steps counted;
* ``data_loading_sync``: ``run_loop`` waiting for ``next(iterator)``;
* ``unproductive_checkpoint_restore_time``: the restore on the step thread (start-up,
  recoveries);
* ``unproductive_checkpoint_save_time``: the step thread held by snapshots and waiting
  for the writer, recorded by the checkpoint feature as it happens;
* ``training_prep``: from the segment's start to the first step, less what the other
  causes counted before it (the restore, a start-up checkpoint's snapshot); the
  segment of the first session in a process starts when the process started (Linux:
  ``/proc/self/stat``; elsewhere when ``asupervisor`` was imported), a later one's when
  its session was entered;
* ``program_startup``: the first step's time above the mean step (tracing, compiling);
* ``preemption_stop``: after a stop signal or a ``preempted:<source>`` notice, the
  stop's wind-down less what the other causes counted of it;
* recorded causes (``hang``, ``divergence_rollback``, ...): see :meth:`record`;
* ``other``: the rest of the segment's wall time.

The step loop adds to the floats directly (two clock reads a step, no lock, no I/O);
other threads go through :meth:`TimeAccount.record` (one lock). Names follow Google's
``ml-goodput-measurement`` (``BadputType``, lowercased) where one fits.

To record badput from a feature, one line: ``ctx.record_badput("hang", secs)`` (any
thread; :meth:`~._abc.SessionContext.record_badput`). ``secs`` is wall time spent
outside completed steps (a stuck step, a rollback's restore): it comes out of ``other``;
``steps=n`` names completed steps whose work is lost (rolled back): their time, at the
mean step time, moves out of productive time into the cause.

This module imports nothing above ``_core`` and never TensorFlow.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._status import _COMPLETED, ReadOnlyDict

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "CAUSES",
    "DATA_LOADING",
    "DIVERGENCE_ROLLBACK",
    "HANG",
    "OTHER",
    "PREEMPTION_STOP",
    "PROGRAM_STARTUP",
    "RECOVERY",
    "RESTORE",
    "SAVE",
    "TRAINING_PREP",
    "WASTED_PROGRESS",
    "Segment",
    "TimeAccount",
    "disrupted",
    "process_start_time",
]

TRAINING_PREP = "training_prep"
PROGRAM_STARTUP = "program_startup"
DATA_LOADING = "data_loading_sync"
SAVE = "unproductive_checkpoint_save_time"
RESTORE = "unproductive_checkpoint_restore_time"
WASTED_PROGRESS = "wasted_progress_from_disruption"
RECOVERY = "infrastructure_recovery_from_disruption"
PREEMPTION_STOP = "preemption_stop"
HANG = "hang"
DIVERGENCE_ROLLBACK = "divergence_rollback"
OTHER = "other"

#: every cause of badput, in the order reports show them (``record`` takes others too)
CAUSES = (
    TRAINING_PREP,
    PROGRAM_STARTUP,
    DATA_LOADING,
    SAVE,
    RESTORE,
    WASTED_PROGRESS,
    RECOVERY,
    PREEMPTION_STOP,
    HANG,
    DIVERGENCE_ROLLBACK,
    OTHER,
)

_IMPORTED_AT = time.time()


def process_start_time() -> float:
    """When this process started (``time.time()`` scale): Linux's ``/proc/self/stat``
    (10 ms resolution), else when this module was imported (with ``asupervisor``)."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        now = time.time()
        ticks = int(stat.rpartition(")")[2].split()[19])  # field 22, starttime, after comm
        started = now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT
    return started if started <= now else _IMPORTED_AT


_process_segment_taken = False
_segment_lock = threading.Lock()


def _segment_start() -> float:
    """The first session of a process starts its segment at the process's start; later
    ones when they are entered (the time between sessions of one process is not the run's)."""
    global _process_segment_taken
    with _segment_lock:
        first, _process_segment_taken = not _process_segment_taken, True
    return process_start_time() if first else time.time()


def disrupted(reason: str | None) -> bool:
    """Whether a segment that ended with stop ``reason`` (``None``: it never wrote its end,
    killed) was cut short: the time until the next segment starts is then badput
    (``infrastructure_recovery_from_disruption``). A completed training or a person's
    stop (Ctrl-C, an application's cancellation) is not: that time is no one's."""
    if reason is None:
        return True
    return not (reason in _COMPLETED or reason in ("cancelled", "signal:SIGINT"))


def _preempted(reason: str | None) -> bool:
    return reason is not None and reason != "signal:SIGINT" and reason.startswith(("signal:", "preempted:"))


@dataclass(frozen=True)
class Segment:
    """One segment's (one session's) accounting at a moment (``TimeAccount.segment``).

    Attributes:
        started_at: when the segment started (``time.time()``).
        now: the moment (``time.time()``).
        start_step: the global step it started from (restored or 0).
        steps: steps completed in it (less those recorded lost).
        productive_secs: its productive time.
        badput: its badput by cause, seconds (``other`` included).
    """

    started_at: float
    now: float
    start_step: int
    steps: int
    productive_secs: float
    badput: Mapping[str, float] = field(default_factory=ReadOnlyDict)

    @property
    def wall_secs(self) -> float:
        """The segment's wall time so far."""
        return max(0.0, self.now - self.started_at)


class TimeAccount:
    """Where one session's time went (see the module docstring).

    Args:
        started_at: the segment's start (``time.time()``); ``None``: the process's start
            for the first session of a process, else now.
        clock: the wall clock (``time.time``), injectable for tests.
        perf: the step thread's interval clock (``time.perf_counter``), injectable.
    """

    def __init__(
        self,
        started_at: float | None = None,
        *,
        clock: Callable[[], float] = time.time,
        perf: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.clock = clock
        self.perf = perf
        self.started_at = _segment_start() if started_at is None else started_at
        self._epoch_minus_perf = clock() - perf()
        self.start_step = 0
        # written by the step thread only (read anywhere: a float read is atomic)
        self.productive = 0.0  # every completed step's time, the first included
        self.steps = 0
        self.first_step_secs: float | None = None
        self.input_wait = 0.0
        self.restore = 0.0
        self.first_step_at: float | None = None  # perf
        self.prep: float | None = None  # training_prep, fixed at the first step
        # written under the lock (any thread)
        self._lock = threading.Lock()
        self._recorded: dict[str, float] = {}
        self._lost_secs = 0.0  # productive time recorded lost (steps rolled back)
        self._lost_steps = 0
        self._stop_at: float | None = None  # perf, when the stop was requested
        self._measured_at_stop = 0.0

    # -- the step thread -----------------------------------------------------------

    def begin_steps(self) -> None:
        """On the step thread, before a step loop or a step: the first fixes ``training_prep``."""
        if self.first_step_at is None:
            now = self.perf()
            self.first_step_at = now
            with self._lock:
                measured = self._measured()
            self.prep = max(0.0, self._epoch(now) - self.started_at - measured)

    def step_done(self, secs: float) -> None:
        """On the step thread: one step of ``secs`` completed (``sess.run``'s way)."""
        if self.steps == 0:
            self.first_step_secs = secs
        self.productive += secs
        self.steps += 1

    # -- any thread ----------------------------------------------------------------

    def record(self, cause: str, secs: float = 0.0, *, steps: int = 0) -> None:
        """Any thread: count badput of ``cause`` (see the module docstring).

        Raises:
            ValueError: ``cause`` is not a lowercase name, ``secs`` is negative or not
                finite, or ``steps`` is negative (the message names the value).
        """
        if not (isinstance(cause, str) and cause and cause.replace("_", "a").isalnum() and cause.islower()):
            raise ValueError(f"a badput cause is a lowercase name such as 'hang', got {cause!r}")
        if cause == OTHER:
            raise ValueError(f"badput cause {cause!r} is what nothing else counted; it cannot be recorded")
        if not (isinstance(secs, (int, float)) and math.isfinite(secs) and secs >= 0):
            raise ValueError(f"badput secs must be a finite number >= 0, got {secs!r}")
        if not (isinstance(steps, int) and steps >= 0):
            raise ValueError(f"badput steps must be an int >= 0, got {steps!r}")
        with self._lock:
            moved = steps * self._mean_step_secs()
            self._recorded[cause] = self._recorded.get(cause, 0.0) + secs + moved
            self._lost_secs += moved
            self._lost_steps += steps

    def recorded(self, cause: str) -> float:
        """Any thread: the badput of ``cause`` recorded so far, in seconds."""
        with self._lock:
            return self._recorded.get(cause, 0.0)

    def mark_stop(self) -> None:
        """Any thread, when a stop is requested (the first request counts)."""
        now = self.perf()
        with self._lock:
            if self._stop_at is None:
                self._stop_at = now
                self._measured_at_stop = self._measured()

    def segment(self, stop_reason: str | None = None) -> Segment:
        """The segment's accounting now; ``stop_reason`` (the session's, once stopping)
        makes the stop's wind-down ``preemption_stop`` for a signal or a notice."""
        perf_now = self.perf()
        now = self._epoch(perf_now)
        with self._lock:
            badput = dict(self._recorded)
            lost, lost_steps = self._lost_secs, self._lost_steps
            measured = self._measured()
            stop_at, at_stop = self._stop_at, self._measured_at_stop
        prep = self.prep
        if prep is None:  # no step yet: all of it is preparation, but what is counted elsewhere
            prep = max(0.0, now - self.started_at - measured)
        badput[TRAINING_PREP] = prep
        startup = self._startup_excess()
        badput[PROGRAM_STARTUP] = startup
        badput[DATA_LOADING] = self.input_wait
        badput[RESTORE] = self.restore
        if stop_at is not None and _preempted(stop_reason):
            badput[PREEMPTION_STOP] = max(0.0, (perf_now - stop_at) - (measured - at_stop))
        productive = max(0.0, self.productive - startup - lost)
        wall = max(0.0, now - self.started_at)
        badput[OTHER] = max(0.0, wall - productive - sum(badput.values()))
        return Segment(
            started_at=self.started_at,
            now=now,
            start_step=self.start_step,
            steps=max(0, self.steps - lost_steps),
            productive_secs=productive,
            badput=ReadOnlyDict({k: v for k, v in badput.items() if v > 0}),
        )

    # -- helpers -------------------------------------------------------------------

    def _epoch(self, perf_time: float) -> float:
        return self._epoch_minus_perf + perf_time

    def _startup_excess(self) -> float:
        """The first step's time above the mean of the others (0 with fewer than two)."""
        first, n = self.first_step_secs, self.steps
        if first is None or n < 2:
            return 0.0
        return max(0.0, first - (self.productive - first) / (n - 1))

    def _mean_step_secs(self) -> float:
        n = self.steps - self._lost_steps
        if n <= 0:
            return 0.0
        return max(0.0, self.productive - self._startup_excess() - self._lost_secs) / n

    def _measured(self) -> float:
        """Everything counted so far but ``training_prep`` (the first step's start, the
        stop's wind-down)."""
        recorded = sum(self._recorded.values()) - self._lost_secs  # lost steps: already in productive
        return self.productive + self.input_wait + self.restore + recorded
