"""Time as an injectable dependency, so timers and services can be tested without waiting.

A :class:`Clock` tells the time (``now()``) and waits until a moment (``sleep_until``).
The default, :class:`MonotonicClock`, is the event loop's clock. Tests pass a
:class:`asupervisor.testing.ManualClock` and move time forward by hand. Nothing here may
block the event loop.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

import anyio

__all__ = ["Clock", "MonotonicClock", "interval_ticks"]


@runtime_checkable
class Clock(Protocol):
    """What services need of time: read it, and wait until a moment."""

    def now(self) -> float:
        """Seconds on a monotonic scale (only differences mean anything)."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Return once ``now() >= deadline``; cancellable."""
        ...


class MonotonicClock:
    """The running event loop's clock (``anyio.current_time``)."""

    def now(self) -> float:
        """Seconds on the event loop's monotonic clock."""
        return anyio.current_time()

    async def sleep_until(self, deadline: float) -> None:
        """Sleep on the event loop until ``deadline``."""
        await anyio.sleep_until(deadline)


async def interval_ticks(
    clock: Clock, interval_secs: float, *, first_at: float | None = None
) -> AsyncIterator[float]:
    """Yield the clock's time at fixed-rate ticks ``interval_secs`` apart.

    The first tick is at ``first_at`` (default: now). A consumer that falls behind skips
    the ticks it missed instead of bursting through them, like TF1's ``LooperThread``.

    Args:
        clock: the clock to read and sleep on.
        interval_secs: seconds between ticks; must be > 0 and finite.
        first_at: clock time of the first tick.
    """
    if not (interval_secs > 0 and math.isfinite(interval_secs)):
        raise ValueError(f"interval_secs must be a positive number, got {interval_secs!r}")
    nxt = clock.now() if first_at is None else first_at
    while True:
        await clock.sleep_until(nxt)
        now = clock.now()
        yield now
        nxt += interval_secs
        if nxt <= now:  # fell behind: skip missed ticks, keep the phase
            missed = math.floor((now - nxt) / interval_secs) + 1
            nxt += missed * interval_secs
