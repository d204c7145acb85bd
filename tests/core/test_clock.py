"""Injectable time: fixed-rate ticks and the manual clock used by tests."""

from __future__ import annotations

import anyio
import pytest

from asupervisor import MonotonicClock
from asupervisor._core._clock import interval_ticks
from asupervisor.testing import ManualClock

pytestmark = pytest.mark.anyio


async def test_ticks_follow_the_clock_not_wall_time() -> None:
    """Ticks every 3600 s arrive as soon as the manual clock is moved, in order."""
    clock = ManualClock(100.0)
    seen: list[float] = []

    async def consume() -> None:
        async for now in interval_ticks(clock, 3600):
            seen.append(now)
            if len(seen) == 3:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        for _ in range(2):
            await clock.wait_for_sleepers(1)
            await anyio.wait_all_tasks_blocked()
            clock.advance(3600)
    assert seen == [100.0, 3700.0, 7300.0]


async def test_first_tick_can_be_delayed() -> None:
    """first_at places the first tick in the future."""
    clock = ManualClock()
    ticks = interval_ticks(clock, 10, first_at=10)
    with anyio.move_on_after(1) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticks.__anext__)
            await anyio.wait_all_tasks_blocked()
            clock.advance(10)
    assert not scope.cancelled_caught
    assert ticks.next_at == 20


async def test_monotonic_clock_is_the_loop_clock() -> None:
    """The default clock reads and sleeps on the event loop's clock."""
    clock = MonotonicClock()
    before = clock.now()
    await clock.sleep_until(before + 0.01)
    assert clock.now() >= before + 0.01


def test_bad_intervals_are_rejected() -> None:
    """A zero, negative or infinite interval is a ValueError naming the value."""
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="interval_secs"):
            interval_ticks(ManualClock(), bad)


def test_manual_clock_never_goes_back() -> None:
    """advance() with a negative amount is refused."""
    with pytest.raises(ValueError, match="backwards"):
        ManualClock().advance(-1)
