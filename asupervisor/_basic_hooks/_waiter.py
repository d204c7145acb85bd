"""``GlobalStepWaiterHook``: hold a worker's steps until the global step reaches a value."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._core._abc import context_of
from .._core._hooks import NEVER, Gate, SessionRunContext, SessionRunHook
from .._logging import get_logger
from ._timer import check_every

if TYPE_CHECKING:
    from .._core._session import Session

__all__ = ["GlobalStepWaiterHook"]

log = get_logger(__name__)


class GlobalStepWaiterHook(SessionRunHook):
    """Delays the first step until the global step reaches ``wait_until_step``.

    TF1 used it to start non-chief workers after the chief had made progress.

    Args:
        wait_until_step: the global step to wait for (<= 0: no wait).
        global_step_fn: reads the current global step (on the step thread); by default
            the session's ``global_step`` variable (a shared variable in
            parameter-server training) or its step count, whichever is larger.
        poll_secs: seconds between reads.
        sleep: how to wait between reads (tests pass a fake).
    """

    def __init__(
        self,
        wait_until_step: int,
        *,
        global_step_fn: Callable[[], int] | None = None,
        poll_secs: float = 0.5,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        if isinstance(wait_until_step, bool) or not isinstance(wait_until_step, int):
            raise TypeError(f"wait_until_step must be an int, got {wait_until_step!r}")
        check_every("poll_secs", poll_secs, kind="secs")
        self._wait_until = wait_until_step
        self._fn = global_step_fn
        self._poll = poll_secs
        self._sleep = sleep
        self._started = False

    def begin(self) -> None:
        """Wait again in a new session."""
        self._started = self._wait_until <= 0

    def _read(self, session: Session) -> int:
        if self._fn is not None:
            return int(self._fn())
        var = context_of(session).global_step_var
        return max(session.global_step, int(var.numpy()) if var is not None else 0)

    def _asv_gate(self) -> Gate:
        return (NEVER if self._started else -NEVER), math.inf, None

    def before_run(self, run_context: SessionRunContext) -> None:
        """Block (on the step thread) until the global step is reached or a stop comes."""
        if self._started:
            return
        session = run_context.session
        control = context_of(session).control
        logged = -math.inf
        while not control.stopping:
            current = self._read(session)
            if current >= self._wait_until:
                self._started = True
                return
            if current - logged >= 1000 or logged == -math.inf:
                log.info("global_step_waiter.waiting", global_step=current, wait_until_step=self._wait_until)
                logged = current
            self._sleep(self._poll)
