"""``SecondOrStepTimer``: TF1's fire-on-first-step, never-twice, steps-or-secs semantics."""

from __future__ import annotations

import pytest

from asupervisor import SecondOrStepTimer


class FakeClock:
    """A clock any thread may read, moved by assignment."""

    def __init__(self) -> None:
        self.t = 100.0

    def now(self) -> float:
        return self.t


def test_both_or_neither_is_a_value_error() -> None:
    """Exactly one of ``every_secs`` and ``every_steps`` must be given."""
    with pytest.raises(ValueError, match="neither"):
        SecondOrStepTimer()
    with pytest.raises(ValueError, match="not both"):
        SecondOrStepTimer(every_secs=1, every_steps=1)
    with pytest.raises(ValueError):
        SecondOrStepTimer(every_steps=0)
    with pytest.raises(ValueError):
        SecondOrStepTimer(every_secs=-1.0)
    with pytest.raises(TypeError):
        SecondOrStepTimer(every_steps=1.5)  # type: ignore[arg-type]


def test_step_timer_fires_first_then_every_n_and_never_twice() -> None:
    """Fires on the first step asked about, then every N steps, never twice for one step."""
    timer = SecondOrStepTimer(every_steps=3)
    fired = []
    for step in [5, 5, 6, 7, 8, 8, 9, 10, 11]:
        if timer.should_trigger_for_step(step):
            fired.append(step)
            timer.update_last_triggered_step(step)
    assert fired == [5, 8, 11]
    assert timer.last_triggered_step() == 11


def test_secs_timer_uses_the_clock_and_reports_elapsed() -> None:
    """A seconds timer fires when the interval has passed; ``update`` returns (secs, steps) since."""
    clock = FakeClock()
    timer = SecondOrStepTimer(every_secs=10, clock=clock)
    assert timer.should_trigger_for_step(1)
    assert timer.update_last_triggered_step(1) == (None, None)
    assert not timer.should_trigger_for_step(2)
    clock.t += 10
    assert not timer.should_trigger_for_step(1)  # never twice for the same step
    assert timer.should_trigger_for_step(4)
    assert timer.update_last_triggered_step(4) == (10.0, 3)
    clock.t += 9.5
    assert not timer.should_trigger_for_step(5)


def test_reset_fires_again() -> None:
    """After ``reset`` the next step fires."""
    timer = SecondOrStepTimer(every_steps=100)
    timer.update_last_triggered_step(3)
    assert not timer.should_trigger_for_step(4)
    timer.reset()
    assert timer.should_trigger_for_step(4)
    assert timer.every_steps == 100 and timer.every_secs is None
