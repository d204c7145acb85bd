"""Time as an injectable dependency, so timers and services can be tested without waiting.

A :class:`Clock` tells the time (``now()``) and waits until a moment (``sleep_until``).
The default, :class:`MonotonicClock`, is the event loop's clock. Tests pass a
:class:`asupervisor.testing.ManualClock` and move time forward by hand. Nothing here may
block the event loop.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import anyio

__all__ = ["Clock", "MonotonicClock", "Ticker", "interval_ticks"]


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


class Ticker:
    """Fixed-rate ticks on a clock, as an async iterator (see :func:`interval_ticks`).

    A plain iterator object rather than an async generator, so that cancelling the loop
    that consumes it leaves nothing to finalise.
    """

    def __init__(self, clock: Clock, interval_secs: float, first_at: float | None = None) -> None:
        if not (interval_secs > 0 and math.isfinite(interval_secs)):
            raise ValueError(f"interval_secs must be a positive number, got {interval_secs!r}")
        self.clock = clock
        self.interval_secs = interval_secs
        self.next_at = clock.now() if first_at is None else first_at

    def __aiter__(self) -> Ticker:
        return self

    async def __anext__(self) -> float:
        """Sleep until the next tick; return the clock's time then."""
        await self.clock.sleep_until(self.next_at)
        now = self.clock.now()
        interval = self.interval_secs
        self.next_at += interval
        if self.next_at <= now:  # fell behind: skip missed ticks, keep the phase
            self.next_at += (math.floor((now - self.next_at) / interval) + 1) * interval
        return now


def interval_ticks(clock: Clock, interval_secs: float, *, first_at: float | None = None) -> Ticker:
    """Yield the clock's time at fixed-rate ticks ``interval_secs`` apart.

    The first tick is at ``first_at`` (default: now). A consumer that falls behind skips
    the ticks it missed instead of bursting through them, like TF1's ``LooperThread``.

    Args:
        clock: the clock to read and sleep on.
        interval_secs: seconds between ticks; must be > 0 and finite.
        first_at: clock time of the first tick.

    Raises:
        ValueError: ``interval_secs`` is not a positive finite number.
    """
    return Ticker(clock, interval_secs, first_at)
