"""The stop state of a session: one cancel scope, a flag the step thread can read, the cause.

``should_stop()`` is the supervisor's cancel scope: a stop request cancels the scope
around the session body, so whatever the body awaits ends. Because the step thread must
see a stop at the next step boundary without waiting for the event loop, a plain boolean
mirrors the request; it is set first, from whatever thread asked, and the scope is then
cancelled on the loop thread.

The first stop reason wins; every error that caused or accompanied the stop is kept, the
first being the one ``managed_session()`` raises. This module must never block.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from .._logging import describe, get_logger

if TYPE_CHECKING:
    from ._handoff import LoopHandle

__all__ = ["Deadline", "StopControl"]

log = get_logger(__name__)


def error_reason(exc: BaseException) -> str:
    """The stop reason recorded for an error: its own (``LeaseLostError``: ``lease_lost``),
    else ``error:<TypeName>``."""
    own = getattr(exc, "stop_reason", None)
    return own if isinstance(own, str) else f"error:{type(exc).__name__}"


class StopControl:
    """Thread-safe stop requests for one session, backed by its cancel scope."""

    def __init__(self, loop: LoopHandle, on_stop: Callable[[], None] | None = None) -> None:
        self.stopping = False  # read by the step loop at every boundary
        self.reason: str | None = None
        self.errors: list[BaseException] = []
        self.state_suspect = False  # a step or hook raised: state may be half-updated
        #: every worker of the cluster stops at this same step (an agreed preemption)
        self.agreed = False
        self.scope: anyio.CancelScope | None = None
        #: when the first stop was requested (``time.monotonic()``): its grace starts then
        self.requested_at: float | None = None
        self._loop = loop
        self._lock = threading.Lock()
        #: called, from the requesting thread, at every stop request (wakes blocked waits)
        self._on_stop = on_stop

    def should_stop(self) -> bool:
        """Whether a stop was requested (the session scope is, or is being, cancelled).

        Only :meth:`request_stop` cancels the scope, and it raises the flag first, so
        the flag is the answer, readable from any thread (trio's ``cancel_called`` is
        not: it reads the loop's clock).
        """
        return self.stopping

    def request_stop(
        self, exc: BaseException | None = None, *, reason: str | None = None, agreed: bool = False
    ) -> None:
        """Ask the session to stop; callable from any thread, any number of times.

        Idempotent, like TF1's ``Coordinator.request_stop``: after the session (or its
        event loop) has ended it does nothing, and it never raises.

        Args:
            exc: the error that caused the stop; ``managed_session()`` raises the first.
            reason: why, for ``stop_reason`` and logs; derived from ``exc`` by default.
            agreed: every worker of the cluster stops at this step (the first stop
                request decides; in multi-worker training the final checkpoint is then
                taken).
        """
        with self._lock:
            if exc is not None and not any(e is exc for e in self.errors):
                self.errors.append(exc)
            if self.reason is None:
                self.reason = reason or (error_reason(exc) if exc is not None else "requested")
                self.agreed = agreed
            first = not self.stopping
            self.stopping = True
            if first:
                self.requested_at = time.monotonic()
        if self._on_stop is not None:
            self._on_stop()
        self._loop.call_if_running(self._cancel_scope)  # a finished loop: nothing left to cancel
        if first:
            log.info("session.stop_requested", reason=self.reason)

    def record_error(self, exc: BaseException, *, reason: str | None = None) -> None:
        """From any thread: keep ``exc`` as a stop cause and raise the stop flag.

        Unlike :meth:`request_stop` it leaves the scope alone: the task that will raise
        ``exc`` itself cancels it (so the body sees the error, not a cancellation).
        """
        with self._lock:
            if not any(e is exc for e in self.errors):
                self.errors.append(exc)
            if self.reason is None:
                self.reason = reason or error_reason(exc)
            self.stopping = True

    def _cancel_scope(self) -> None:
        if self.scope is not None:
            self.scope.cancel()

    def record_secondary(self, exc: BaseException, *, where: str) -> None:
        """Keep an error raised while stopping; it is logged and attached as a note."""
        log.error("session.secondary_error", where=where, error=describe(exc))
        with self._lock:
            if not any(e is exc for e in self.errors):
                self.errors.append(exc)


class Deadline:
    """The one deadline of a stop, on the loop's clock: ``grace_secs`` after it began.

    Every phase of a shutdown runs under what is left of it (:meth:`remaining`), so
    phases share one grace period instead of each getting all of it.
    """

    __slots__ = ("at", "grace_secs")

    def __init__(self, grace_secs: float, *, began_at: float | None = None) -> None:
        self.grace_secs = grace_secs
        began = anyio.current_time() if began_at is None else began_at
        self.at = began + grace_secs if math.isfinite(grace_secs) else math.inf

    @property
    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return anyio.current_time() >= self.at

    def remaining(self) -> float:
        """Seconds left (0 once passed; ``math.inf`` for an infinite grace)."""
        return max(0.0, self.at - anyio.current_time())

    def extended_by(self, secs: float) -> Deadline:
        """A deadline ``secs`` after this one (the wind-down after the grace), however
        late it is now: what overran the grace is taken out of the wind-down."""
        later = Deadline(self.grace_secs)
        later.at = self.at + secs
        return later
