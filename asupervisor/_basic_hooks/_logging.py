"""``LoggingTensorHook``: log named values of the step's result every N steps or seconds."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._core._abc import context_of
from .._core._clock import Clock
from .._core._hooks import NEVER, Gate, SessionRunContext, SessionRunHook, SessionRunValues
from .._logging import get_logger

if TYPE_CHECKING:
    from .._core._abc import SessionContext
    from .._core._session import Session
from ._common import _hook_timer, _lookup, _to_python

__all__ = ["LoggingTensorHook"]

log = get_logger(__name__)


class LoggingTensorHook(SessionRunHook):
    """Logs named entries of the step's result every N steps or secs, and/or at the end.

    Args:
        keys: names in the mapping the step returns; a sequence of keys, or a mapping
            of log name -> key.
        every_n_iter: log every this many steps of the session, counted from its first
            step (TF1 counted the hook's calls: one per step).
        every_n_secs: log every this many seconds.
        at_end: also log the last step's values at the end.
        formatter: ``formatter(values) -> str``; the line is logged as ``message=``.
        clock: the time source, a :class:`~asupervisor.Clock` whose ``now()`` any thread may read
            (``asupervisor.testing.ManualClock``); ``time.monotonic`` by default.

    Raises:
        ValueError: no timing given without ``at_end``, or both were given.
    """

    def __init__(
        self,
        keys: Sequence[str] | Mapping[str, str],
        every_n_iter: int | None = None,
        every_n_secs: float | None = None,
        at_end: bool = False,
        formatter: Callable[[dict[str, Any]], str] | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        if isinstance(keys, str):
            keys = [keys]
        names = dict(keys) if isinstance(keys, Mapping) else {k: k for k in keys}
        if not names or not all(isinstance(k, str) for k in (*names, *names.values())):
            raise ValueError(f"keys must be a non-empty sequence (or mapping) of strings, got {keys!r}")
        self._names = names
        self._only_at_end = at_end and every_n_iter is None and every_n_secs is None
        self._timer = (
            None
            if self._only_at_end
            else _hook_timer("every_n_secs", every_n_secs, "every_n_iter", every_n_iter, clock)
        )
        self._at_end = at_end
        self._formatter = formatter
        self._first = 0  # the global step of this session's first step: its iteration 0
        self._ctx: SessionContext | None = None

    def begin(self) -> None:
        """Reset the timer."""
        if self._timer is not None:
            self._timer.reset()

    def after_create_session(self, session: Session) -> None:
        """Keep the session (``at_end`` reads its last output); count iterations from here."""
        self._ctx = context_of(session)
        self._first = session.global_step + 1

    def _asv_gate(self) -> Gate:
        if self._timer is None:
            return NEVER, math.inf, None
        step, at = self._timer.due()  # the timer counts iterations: global step - _first
        return step + self._first, at, self._timer.clock

    def _log(self, results: Any, step: int, secs: float | None) -> None:
        values = {name: _to_python(_lookup(results, key, "LoggingTensorHook")) for name, key in self._names.items()}
        if self._formatter is not None:
            log.info("tensors.logged", global_step=step, message=self._formatter(values))
        elif secs is None:
            log.info("tensors.logged", global_step=step, **values)
        else:
            log.info("tensors.logged", global_step=step, secs=round(secs, 3), **values)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Log when the timer fires (reads the values only then)."""
        timer = self._timer
        if timer is not None:
            it = run_values.global_step - self._first  # this session's steps before this one
            if it >= timer.next_step and timer.should_trigger_for_step(it):
                secs, _ = timer.update_last_triggered_step(it)
                self._log(run_values.results, run_values.global_step, secs)

    def end(self, session: Session) -> None:
        """With ``at_end``, log the last step's values."""
        if self._at_end and self._ctx is not None and self._ctx.last_output is not None:
            self._log(self._ctx.last_output, session.global_step, None)
