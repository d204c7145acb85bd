"""``status().metrics``: the step output's scalars, sampled by the step loop itself.

A host read of a step's output (``float(loss)``) waits for the device, so it is never
done per step. :class:`MetricsSampler` is a part whose trigger comes about once a second
of training: it asks to run again after as many steps as the last second took (the first
step, then the second, then at the measured rate), so ``status()`` shows values at most
about a second old, read on the step thread at a step boundary, and costs the step loop
nothing between two samples (the trigger compare is there for every part anyway).
``run_loop`` samples once more when it returns, so a status read after it shows its last
step's values.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ._abc import SessionContext, SessionPart

__all__ = ["SAMPLE_EVERY_SECS", "MetricsSampler"]

#: about how often the step loop samples its output's scalars
SAMPLE_EVERY_SECS = 1.0


class MetricsSampler(SessionPart):
    """Samples the step output's scalars about every :data:`SAMPLE_EVERY_SECS`.

    Args:
        sample: on the step thread: read the last step's scalars into the status.
        clock: monotonic seconds (tests pass their own).
    """

    name = "metrics"

    def __init__(self, sample: Callable[[], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.sample = sample
        self.clock = clock
        self._every = 1  # steps between two samples
        self._last: tuple[float, int] | None = None  # (time, step) of the last sample

    def next_trigger(self, step: int) -> float:
        """``every`` steps after ``step``."""
        return float(step + self._every)

    def on_step(self, ctx: SessionContext) -> None:
        """Sample, and aim the next sample about a second of steps later."""
        now, step = self.clock(), ctx.global_step
        if self._last is not None and now > self._last[0] and step > self._last[1]:
            rate = (step - self._last[1]) / (now - self._last[0])
            self._every = max(1, int(rate * SAMPLE_EVERY_SECS))
        self._last = (now, step)
        self.sample()
