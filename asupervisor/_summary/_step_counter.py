"""The step-counter service: logs ``global_step/sec`` every ``save_summaries_secs``.

It reads the supervisor's Python step count (no device sync, no TensorFlow call) on the
event loop at each tick and reports the rate since the previous tick: as the log event
``step_counter.rate`` and to the listeners the supervisor gives it (status, summaries).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .._core._clock import interval_ticks
from .._core._services import Service
from .._logging import get_logger

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from .._core._services import ServiceContext

__all__ = ["StepCounterService"]

log = get_logger(__name__)


class StepCounterService(Service):
    """Measures steps per second over each interval.

    Args:
        interval_secs: seconds between measurements.
        on_rate: called on the event loop with ``(global_step, steps_per_sec)``.
    """

    name = "step_counter"

    def __init__(self, interval_secs: float, on_rate: Callable[[int, float], None] | None = None) -> None:
        self.interval_secs = interval_secs
        self.on_rate = on_rate

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Tick every ``interval_secs``; the first tick only sets the baseline."""
        last_step = ctx.global_step
        last_time = ctx.clock.now()
        task_status.started()
        ctx.set_service_state(self.name, "running")
        ticks = interval_ticks(ctx.clock, self.interval_secs, first_at=last_time + self.interval_secs)
        async for now in ticks:
            step = ctx.global_step
            elapsed = now - last_time
            if elapsed > 0:
                rate = (step - last_step) / elapsed
                log.info("step_counter.rate", global_step=step, steps_per_sec=round(rate, 3))
                if self.on_rate is not None:
                    self.on_rate(step, rate)
            last_step, last_time = step, now
