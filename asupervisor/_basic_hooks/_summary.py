"""``SummarySaverHook``: write the step's scalars to the session's event file."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._core._abc import SessionAttribute, context_of
from .._core._clock import Clock
from .._core._hooks import NEVER, Gate, SessionRunContext, SessionRunHook, SessionRunValues
from .._core._outputs import scalar_entries
from .._logging import get_logger

if TYPE_CHECKING:
    from .._core._abc import SummarySink
    from .._core._session import Session
from ._common import _hook_timer, _timer_gate

__all__ = ["SummarySaverHook"]

log = get_logger(__name__)


class SummarySaverHook(SessionRunHook):
    """Writes the scalar entries of the step's result every N steps or secs.

    Writes go to the session's event file (the chief's ``logdir``); elsewhere the hook
    does nothing. Values are handed over as tensors and read on the summary thread.

    Args:
        save_steps: steps between summaries.
        save_secs: seconds between summaries.
        keys: only these names of the step's result (default: every scalar entry).
        clock: the time source, a :class:`~asupervisor.Clock` whose ``now()`` any thread may read
            (``asupervisor.testing.ManualClock``); ``time.monotonic`` by default.

    Raises:
        ValueError: both or neither of ``save_steps`` and ``save_secs`` were given.
    """

    def __init__(
        self,
        save_steps: int | None = None,
        save_secs: float | None = None,
        *,
        keys: Sequence[str] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._timer = _hook_timer("save_secs", save_secs, "save_steps", save_steps, clock)
        self._keys = None if keys is None else tuple(keys)
        self._writer: SummarySink | None = None

    def begin(self) -> None:
        """Reset the timer."""
        self._timer.reset()

    def after_create_session(self, session: Session) -> None:
        """Find the session's summary writer."""
        self._writer = context_of(session).extra(SessionAttribute.summary_writer, None)
        if self._writer is None:
            log.debug("summary_saver_hook.inactive", reason="no summary writer (no logdir, or not the chief)")

    def _asv_gate(self) -> Gate:
        return _timer_gate(self._timer) if self._writer is not None else (NEVER, math.inf, None)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Queue the step's scalars when the timer fires."""
        writer = self._writer
        step = run_values.global_step
        timer = self._timer
        if step >= timer.next_step and writer is not None and timer.should_trigger_for_step(step):
            timer.update_last_triggered_step(step)
            scalars = scalar_entries(run_values.results)
            if self._keys is not None:
                scalars = {k: v for k, v in scalars.items() if k in self._keys}
            if scalars:
                writer.post(step, scalars)
