"""The notice window: a stop notice with a deadline is used to train on, then saved before it.

A notice (a stop signal, a ``preempted:<source>`` request such as GCE's) may come with a
deadline ``D``: the moment the machine goes (``StopOptions(deadline_secs=...)`` per
source, or the request's own ``deadline_secs``). The rule, with ``save`` the measured
time of one checkpoint (the mean of its ``blocked``, ``write`` and ``commit`` phases in
``status().save_seconds``; before any save is measured it is taken to be
:data:`UNMEASURED_SAVE_SECS`) and ``reserve = 1.2 x save + WIND_DOWN_SECS + EXIT_SECS`` (the final save,
the stop's own wind-down, and ``EXIT_SECS`` for the process's exit)::

    time to spare  <=>  D - now > reserve + one step

Without time to spare the session stops at once, as without a deadline. With it, at the
next step boundary a checkpoint is taken at once (in the background, as a timed save),
training goes on, and the session stops at the last step ``S`` whose projected end is
before ``D - reserve``: ``S = step + floor((D - reserve - now) / step_secs)``. On a single
worker the projection is made again at every boundary of the window with the step
time measured there (the slower of the last step and the window's mean), so a step that
slows down stops the training earlier, never later. In a multi-worker training the
leader of the cluster's agreed stop (:mod:`.._checkpoint.policy._cluster_stop`)
publishes ``S`` as computed here, and every worker stops there.

Whatever the step thread is doing (a first ``tf.function`` trace, a validation, a wait
for the first batch), a *last call* on the event loop requests the stop at
``D - reserve - max(one step, LAST_CALL_SLACK_SECS)`` if the training has not stopped by
then (while the window's steps go on, their own projection decides, and the last call
waits until ``D - reserve``); from then on every
wait of the stop is bounded by the time left before ``D`` (:meth:`NoticeWindow.time_left`),
so the process ends before the deadline even when the step thread cannot come back.

This module must never block the event loop nor touch model state off the step thread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import anyio

from .._logging import describe, get_logger
from ._abc import SessionAttribute, SessionPart
from ._goodput import SAVE

if TYPE_CHECKING:
    from ._abc import SessionContext
    from ._engine import Engine
    from ._status import Histogram

__all__ = [
    "EXIT_SECS",
    "SAVE_MARGIN",
    "UNMEASURED_SAVE_SECS",
    "WIND_DOWN_SECS",
    "NoticeWindow",
    "deadline_for",
    "reserve_secs",
    "save_estimate",
    "stop_step",
]

log = get_logger(__name__)

#: the final save is planned to take this many times its measured time
SAVE_MARGIN = 1.2
#: what a save is taken to cost before one was measured (so a window opens only with a
#: deadline more than ~37 s away)
UNMEASURED_SAVE_SECS = 30.0
#: the stop's own wind-down after the final save (closing the parts, joining threads):
#: the engine's bound on it
WIND_DOWN_SECS = 1.0
#: the process's own exit after the session (TensorFlow's teardown takes about a second)
EXIT_SECS = 1.0
#: the least time the last call leaves for the step thread to come back to a boundary
#: (a validation batch, ``fit``'s epoch end) before the final save's reserve
LAST_CALL_SLACK_SECS = 0.5
#: the checkpoint phases whose sum is one save's time (an upload comes after the commit)
_SAVE_PHASES = ("blocked", "write", "commit")


def source_of(reason: str) -> str:
    """The source a notice's deadline is looked up by: ``signal:SIGUSR1`` -> ``SIGUSR1``,
    ``preempted:gce`` -> ``gce``."""
    return reason.split(":", 1)[1] if ":" in reason else reason


def deadline_for(setting: float | Mapping[str, float] | None, reason: str) -> float | None:
    """The seconds from a notice to its deadline, by ``StopOptions.deadline_secs``."""
    if setting is None:
        return None
    if isinstance(setting, Mapping):
        secs = setting.get(source_of(reason))
        return None if secs is None else float(secs)
    return float(setting)


def save_estimate(save_seconds: Mapping[str, Histogram]) -> float | None:
    """One save's time from ``status().save_seconds``: the sum of its phases' means, or
    ``None`` before a save was measured."""
    total = 0.0
    measured = False
    for phase in _SAVE_PHASES:
        histogram = save_seconds.get(phase)
        if histogram is not None and histogram.count:
            total += histogram.sum / histogram.count
            measured = True
    return total if measured else None


def reserve_secs(save_secs: float | None) -> float:
    """The time kept before a deadline for the final save and the wind-down."""
    save = UNMEASURED_SAVE_SECS if save_secs is None else save_secs
    return SAVE_MARGIN * save + WIND_DOWN_SECS + EXIT_SECS


def stop_step(step: int, now: float, deadline: float, step_secs: float, save_secs: float | None) -> int | None:
    """The last step whose projected end leaves the reserve before ``deadline``, when at
    least one more step fits (``None``: no time to spare, stop now).

    Args:
        step: the steps completed now.
        now: the time now, on the clock ``deadline`` is on.
        deadline: when the machine goes.
        step_secs: one step's time (``0`` when not known yet: one step is then assumed to fit).
        save_secs: one save's time, ``None`` before one was measured.
    """
    spare = deadline - reserve_secs(save_secs) - now
    if spare <= step_secs or spare <= 0:
        return None
    if step_secs <= 0:
        return step + 1
    return step + int(spare // step_secs)


class NoticeWindow(SessionPart):
    """The notice window of one session (see the module docstring).

    Args:
        rt: the engine.
        setting: ``StopOptions.deadline_secs``.
    """

    name = "notice-window"

    def __init__(self, rt: Engine, setting: float | Mapping[str, float] | None) -> None:
        self._rt = rt
        self.setting = setting
        self.deadline = math.inf  # on time.monotonic() (any thread reads it; asyncio's
        # thread-safe callbacks have no anyio clock)
        self.reason: str | None = None
        self.last_call_at = math.inf
        self.agreed = False  # a cluster's agreed stop owns the stop step
        self.target: float = math.inf  # the planned stop step
        self._stepping = False  # the per-step re-projection runs
        self._last: float | None = None  # when the last boundary in the window passed
        self._window_secs = 0.0
        self._window_steps = 0
        self._replanned: anyio.Event | None = None  # set when the last call moves
        self._backstop_at = math.inf  # the last call's latest moment, while steps go on

    @property
    def open(self) -> bool:
        """Whether a window is open (a notice with time to spare came)."""
        return self.reason is not None

    async def _last_call_timer(self) -> None:
        """In the session's task group once a window opens: the last call, at
        :attr:`last_call_at` (moved earlier by a nearer notice)."""
        while True:
            self._replanned = anyio.Event()
            with anyio.move_on_after(max(0.0, self.last_call_at - time.monotonic())):
                await self._replanned.wait()
                continue
            if self.last_call():
                return

    def time_left(self) -> float:
        """Seconds until the notice's deadline (``math.inf`` without one); on the loop."""
        if not math.isfinite(self.deadline):
            return math.inf
        return max(0.0, self.deadline - time.monotonic())

    def _save_secs(self) -> float | None:
        return save_estimate(self._rt.status().save_seconds)

    def _hold_per_save(self) -> float:
        """How long one save held the step thread, on average (0 before one)."""
        histogram = self._rt.status().save_seconds.get("blocked")
        return histogram.sum / histogram.count if histogram is not None and histogram.count else 0.0

    def _step_secs(self) -> float:
        """One step's time: the slower of the window's last step and its mean; before the
        window measured one, the session's mean (its first step, a trace, left out)."""
        if self._window_steps:
            return max(self._last_step, self._window_secs / self._window_steps)
        times = self._rt.time_account
        n = times.steps
        if n >= 2 and times.first_step_secs is not None:
            return (times.productive - times.first_step_secs + times.input_wait) / (n - 1)
        return 0.0  # one step, its trace included, or none: measured in the window

    _last_step = 0.0

    # -- on the loop -----------------------------------------------------------------

    def notice(self, reason: str, deadline_secs: float | None) -> bool:
        """A notice (``signal:<NAME>``, ``preempted:<source>``): whether a window opens
        (or an open one was re-planned); ``False``: the caller stops as without a deadline."""
        rt = self._rt
        if deadline_secs is None:
            deadline_secs = deadline_for(self.setting, reason)
        if deadline_secs is None or rt.control.stopping or not rt.running:
            return False  # no deadline, stopping already, or still starting: stop now
        now = time.monotonic()
        deadline = min(self.deadline, now + deadline_secs)
        save = self._save_secs()
        step_secs = self._step_secs()
        if stop_step(rt.global_step, now, deadline, step_secs, save) is None:
            log.warning(
                "notice.no_time",
                reason=reason,
                deadline_secs=round(deadline - now, 3),
                save_secs=None if save is None else round(save, 4),
                reserve_secs=round(reserve_secs(save), 3),
                action="save and stop now",
            )
            if self.open:  # a later, nearer notice: the stop comes now
                rt.control.request_stop(reason=self.reason)
                return True
            return False  # saved and stopped as without a deadline (its grace unchanged)
        first = not self.open
        self.deadline = deadline
        self.last_call_at = deadline - reserve_secs(save) - max(step_secs, LAST_CALL_SLACK_SECS)
        self._backstop_at = deadline - reserve_secs(save)
        if first:
            self.reason = reason
            self.agreed = rt.parts.take_signal(rt, reason)
        if self.agreed:  # the cluster's agreed step ends before the backstop; a last call
            # before it would stop this worker alone, its final save out of step with the others
            self.last_call_at = self._backstop_at
        if first:
            rt.step_thread.submit_at_boundary_nowait(self._begin)
            rt.start_soon(self._last_call_timer)
        elif self._replanned is not None:
            self._replanned.set()
        log.warning(
            "notice.window",
            reason=self.reason,
            deadline_secs=round(deadline - now, 3),
            save_secs=None if save is None else round(save, 4),
            step_secs=round(step_secs, 4),
            agreed=self.agreed,
        )
        return True

    def _stepping_now(self) -> bool:
        """Whether the window's steps go on: a boundary passed within two steps' time."""
        last = self._last
        if not self._stepping or last is None:
            return False
        return time.monotonic() - last < 2 * self._step_secs() + 0.05

    def last_call(self) -> bool:
        """On the loop, at the last call: stop now if the training has not stopped;
        ``False``: steps go on, the last call moves to the backstop."""
        rt = self._rt
        if rt.control.stopping:
            return True
        if self.last_call_at < self._backstop_at and self._stepping_now():
            self.last_call_at = self._backstop_at
            return False
        if self.agreed:  # stopping alone would break the cluster: this worker's final save is a
            # collective the others, still stepping, are not in (they failed: exit 75 and an error)
            log.warning(
                "notice.last_call",
                reason=self.reason,
                step=rt.global_step,
                secs_left=round(self.time_left(), 3),
                action="the cluster's agreed step ends the training, even past the deadline",
            )
            return True
        log.warning("notice.last_call", reason=self.reason, step=rt.global_step, secs_left=round(self.time_left(), 3))
        rt.control.request_stop(reason=self.reason)
        return True

    # -- on the step thread ----------------------------------------------------------

    def _begin(self) -> None:
        """The first boundary after the notice: a checkpoint now, then the stop step
        planned (a boundary job: must not raise)."""
        rt = self._rt
        try:
            if not self.agreed and not rt.control.stopping:  # stopping: the final save is the one
                checkpoints = rt.extra(SessionAttribute.checkpoints, None)
                step = None if checkpoints is None else checkpoints.save_in_background("notice")
                log.info("notice.saved_now", step=rt.global_step, saved=step is not None)
                self._stepping = True
                self._last = time.monotonic()
                self._project(self._last)
                rt.rearm()
        except Exception as exc:  # a failed save now must not lose the final one
            log.error("notice.save_failed", error=describe(exc))
            rt.control.request_stop(reason=self.reason)

    def planned_stop_step(self) -> int:
        """On the step thread: the step a cluster's agreed stop is at: the last step that
        fits the deadline when a window is open, else the next one."""
        rt = self._rt
        step = rt.global_step
        if not self.open:
            return step + 1
        # Agreed once, never re-planned: the saves the window will hold every worker's
        # step thread for count too (the save at once, and the periodic ones at the
        # session's rate so far), which a lone training's projection measures as it goes.
        times = self._rt.time_account
        held = times.recorded(SAVE) / times.steps if times.steps else 0.0
        left = self.deadline - time.monotonic() - self._hold_per_save()
        step_secs, save_secs = self._step_secs() + held, self._save_secs()
        planned = stop_step(step, 0.0, left, step_secs, save_secs)
        log.info(
            "notice.stop_step",
            step=step,
            stop_step=planned or step + 1,
            step_secs=round(step_secs, 4),
            save_secs=None if save_secs is None else round(save_secs, 4),
        )
        return planned or step + 1

    def _project(self, now: float) -> None:
        """Stop now if one more step would end past the reserve before the deadline."""
        rt = self._rt
        step = rt.global_step
        save_secs = self._save_secs()
        planned = stop_step(step, now, self.deadline, self._step_secs(), save_secs)
        if planned is None:
            said = {} if save_secs is None else {"save_secs": round(save_secs, 4)}  # (what the reserve was)
            log.info("notice.stopping", step=step, secs_left=round(self.deadline - now, 3), **said)
            self._stepping = False
            rt.control.request_stop(reason=self.reason)
            return
        if planned != self.target:
            self.target = planned
            log.info("notice.stop_step", step=step, stop_step=planned)

    def next_trigger(self, step: int) -> float:
        """Every step while the window's projection runs."""
        return step + 1 if self._stepping else math.inf

    def on_step(self, ctx: SessionContext) -> None:
        """A boundary in the window: the step measured, the stop projected again."""
        now = time.monotonic()
        if self._last is not None:
            took = now - self._last
            self._last_step = took
            self._window_secs += took
            self._window_steps += 1
        self._last = now
        if self._stepping:
            self._project(now)
