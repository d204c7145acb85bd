"""``StepCounterHook``: steps per second, logged and written as ``global_step/sec``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core._abc import SessionAttribute, context_of
from .._core._clock import Clock
from .._core._hooks import Gate, SessionRunContext, SessionRunHook, SessionRunValues
from .._logging import get_logger

if TYPE_CHECKING:
    from .._core._abc import SummarySink
    from .._core._session import Session
from ._common import _hook_timer, _timer_gate

__all__ = ["StepCounterHook"]

log = get_logger(__name__)


class StepCounterHook(SessionRunHook):
    """Measures steps per second and writes ``global_step/sec`` every N steps or secs.

    The rate is logged (``step_counter_hook.rate``) and, on the chief with a ``logdir``,
    written to the event file.

    Args:
        every_n_steps: steps between measurements (TF1's default, 100).
        every_n_secs: seconds between measurements; pass ``every_n_steps=None`` with it.
        clock: the time source, a :class:`~asupervisor.Clock` whose ``now()`` any thread may read
            (``asupervisor.testing.ManualClock``); ``time.monotonic`` by default.

    Raises:
        ValueError: both or neither of ``every_n_steps`` and ``every_n_secs`` were given.
    """

    steps_per_sec: float | None = None
    """The last measured rate, ``None`` before the first measurement."""

    def __init__(
        self,
        every_n_steps: int | None = 100,
        every_n_secs: float | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._timer = _hook_timer("every_n_secs", every_n_secs, "every_n_steps", every_n_steps, clock)
        self._writer: SummarySink | None = None
        self.steps_per_sec: float | None = None

    def begin(self) -> None:
        """Start a new measurement."""
        self._timer.reset()

    def after_create_session(self, session: Session) -> None:
        """Find the session's summary writer (none on a worker or without logdir)."""
        self._writer = context_of(session).extra(SessionAttribute.summary_writer, None)

    def _asv_gate(self) -> Gate:
        return _timer_gate(self._timer)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Measure and report the rate when the timer fires."""
        step = run_values.global_step
        timer = self._timer
        if step >= timer.next_step and timer.should_trigger_for_step(step):
            secs, steps = timer.update_last_triggered_step(step)
            if secs and steps is not None and secs > 0:
                rate = steps / secs
                self.steps_per_sec = rate
                log.info("step_counter_hook.rate", global_step=step, steps_per_sec=round(rate, 3))
                if self._writer is not None:
                    self._writer.post(step, {"global_step/sec": rate})
