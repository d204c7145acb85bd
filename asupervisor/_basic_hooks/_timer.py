"""``SecondOrStepTimer``: when a periodic hook fires, by steps or by seconds.

The semantics of TF1's ``tf.compat.v1.train.SecondOrStepTimer``, which every stock hook
with ``every_n_steps=`` / ``every_n_secs=`` style arguments shares:

* exactly one of ``every_secs`` and ``every_steps`` is given (both, or neither, is a
  ``ValueError``);
* the timer fires on the first step it is asked about;
* it never fires twice for the same step;
* afterwards it fires once ``every_steps`` steps or ``every_secs`` seconds have passed
  since it last fired.

It is called on the step thread for every step, so the check is cheap: an int compare for
step timers, one clock read and a float compare for time timers, no allocation. The clock
is injectable (an ``asv.Clock`` whose ``now()`` any thread may read; the default is
``time.monotonic``). This module must never import TensorFlow.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

from .._core._clock import Clock

__all__ = ["SecondOrStepTimer", "check_every"]

_NEVER = sys.maxsize


def check_every(name: str, value: object, *, kind: str) -> None:
    """Raise ``ValueError``/``TypeError`` unless ``value`` is ``None`` or a valid period.

    Args:
        name: the argument's name, for the message.
        value: the argument.
        kind: ``"steps"`` (a positive int) or ``"secs"`` (a positive finite number).
    """
    if value is None:
        return
    if kind == "steps":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be a positive int or None, got {value!r}")
        if value <= 0:
            raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")


class SecondOrStepTimer:
    """Fires every ``every_steps`` steps or every ``every_secs`` seconds (exactly one).

    Args:
        every_secs: seconds between firings, or ``None``.
        every_steps: steps between firings, or ``None``.
        clock: the time source for ``every_secs``: a :class:`~asupervisor.Clock` whose
            ``now()`` is read on whatever thread asks (``asupervisor.testing.ManualClock``).

    Raises:
        ValueError: both or neither of ``every_secs`` and ``every_steps`` were given, or
            one is not positive.
    """

    __slots__ = ("_every_secs", "_every_steps", "_last_step", "_last_time", "_next_time", "_now", "next_step")

    def __init__(
        self,
        every_secs: float | None = None,
        every_steps: int | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        if every_secs is None and every_steps is None:
            raise ValueError("give either every_secs or every_steps (neither was given)")
        if every_secs is not None and every_steps is not None:
            raise ValueError(
                f"give either every_secs or every_steps, not both "
                f"(got every_secs={every_secs!r}, every_steps={every_steps!r})"
            )
        check_every("every_secs", every_secs, kind="secs")
        check_every("every_steps", every_steps, kind="steps")
        self._every_secs = None if every_secs is None else float(every_secs)
        self._every_steps = every_steps
        # read every step by a *_secs timer: the C function itself for the default clock
        self._now: Callable[[], float] = time.monotonic if clock is None else clock.now
        self.reset()

    @property
    def every_secs(self) -> float | None:
        """Seconds between firings, or ``None``."""
        return self._every_secs

    @property
    def every_steps(self) -> int | None:
        """Steps between firings, or ``None``."""
        return self._every_steps

    def reset(self) -> None:
        """Forget the last firing: the next step asked about fires."""
        self._last_step: int | None = None
        self._last_time: float | None = None
        #: the lowest step that may fire: callers on a hot path skip the call below it
        #: (``if step >= timer.next_step and timer.should_trigger_for_step(step)``)
        self.next_step = -_NEVER  # fires on the first step
        self._next_time = -math.inf

    def should_trigger_for_step(self, step: int) -> bool:
        """Whether the timer fires at ``step`` (never twice for one step).

        Args:
            step: the step about to be, or just, completed.
        """
        if step < self.next_step or step == self._last_step:
            return False
        if self._every_secs is None:
            return True
        return self._now() >= self._next_time

    def update_last_triggered_step(self, step: int) -> tuple[float | None, int | None]:
        """Record a firing at ``step``.

        Returns:
            ``(seconds, steps)`` since the previous firing, or ``(None, None)`` for the
            first one.
        """
        now = self._now()
        if self._last_step is None or self._last_time is None:
            elapsed: tuple[float | None, int | None] = (None, None)
        else:
            elapsed = (now - self._last_time, step - self._last_step)
        self._last_step = step
        self._last_time = now
        if self._every_steps is not None:
            self.next_step = step + self._every_steps
        else:
            assert self._every_secs is not None
            self.next_step = step + 1
            self._next_time = now + self._every_secs
        return elapsed

    def due(self) -> tuple[int, float]:
        """The earliest step, and time on :attr:`clock`, at which the timer may fire next.

        A step timer may fire from ``due()[0]`` on; a time timer once its clock reaches
        ``due()[1]``. A caller that skips asking :meth:`should_trigger_for_step` while
        ``step < due()[0] and clock() < due()[1]`` misses no firing (the hook runner does
        that, so a hook that is not due costs no call).
        """
        if self._every_secs is None:
            return self.next_step, math.inf
        return _NEVER, self._next_time

    @property
    def clock(self) -> Callable[[], float]:
        """The function the timer reads the time with."""
        return self._now

    def last_triggered_step(self) -> int | None:
        """The step of the last firing, or ``None``."""
        return self._last_step
