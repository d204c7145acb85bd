"""``StopAtStepHook``: stop at a given global step."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .._core._abc import context_of
from .._core._hooks import Gate, SessionRunContext, SessionRunHook, SessionRunValues

if TYPE_CHECKING:
    from .._core._session import Session

__all__ = ["StopAtStepHook"]


class StopAtStepHook(SessionRunHook):
    """Requests a stop once the global step reaches a given step.

    Args:
        num_steps: steps to run from the step the session started at (the restored
            step, read in ``after_create_session``).
        last_step: the global step to stop at.

    Raises:
        ValueError: both or neither of ``num_steps`` and ``last_step`` were given.
    """

    def __init__(self, num_steps: int | None = None, last_step: int | None = None) -> None:
        if (num_steps is None) == (last_step is None):
            raise ValueError("give exactly one of num_steps and last_step")
        for name, value in (("num_steps", num_steps), ("last_step", last_step)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self._num_steps = num_steps
        self._given_last_step = last_step
        self._last_step = last_step if last_step is not None else 0

    @property
    def last_step(self) -> int | None:
        """The step this hook stops at (known once the session is created)."""
        return self._last_step

    def begin(self) -> None:
        """Reset ``last_step`` for a new session (``num_steps`` counts from its start)."""
        self._last_step = self._given_last_step if self._given_last_step is not None else 0

    def after_create_session(self, session: Session) -> None:
        """Work out the last step; stop before the first step if it is already reached."""
        if self._num_steps is not None:
            self._last_step = session.global_step + self._num_steps
        if session.global_step >= self._last_step:
            context_of(session).control.request_stop(reason="hook")

    def _asv_gate(self) -> Gate:
        return self._last_step, math.inf, None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Request a stop once the step just completed is the last one."""
        if run_values.global_step >= self._last_step:
            run_context.request_stop()
