"""Recovery from ``tf.errors.AbortedError`` / ``UnavailableError`` raised by a step.

TF1's ``MonitoredSession`` recreated the session and retried forever. Here a step that
raises one of these errors makes the session restore the latest checkpoint (on the step
thread) and go on, at most :attr:`RecoveryPolicy.max_retries` times within
:attr:`RecoveryPolicy.window_secs`, waiting a backoff first; past that the error
propagates as itself. The step thread marks the session as recovering (no snapshot is
taken of a half-done step) and does not record the error; :func:`recover`, on the event
loop, decides, waits and restores. Without a checkpoint to restore the error propagates.

The backoff starts at ``min(1, recovery_wait_secs)`` seconds and doubles up to
``recovery_wait_secs`` (the Supervisor setting), on the supervisor's injectable clock.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import structlog

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["RecoveryPolicy", "recover"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class RecoveryPolicy:
    """How often a session may recover from aborted/unavailable steps.

    Attributes:
        max_retries: recoveries allowed within ``window_secs``; one more failure propagates.
        window_secs: the sliding window recoveries are counted in.
        backoff_secs: wait before the first retry; doubles per further failure in the window.
        max_backoff_secs: the longest wait.
    """

    max_retries: int = 3
    window_secs: float = 600.0
    backoff_secs: float = 1.0
    max_backoff_secs: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {self.max_retries!r}")
        for name in ("window_secs", "backoff_secs", "max_backoff_secs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    @classmethod
    def from_recovery_wait(cls, recovery_wait_secs: float) -> RecoveryPolicy:
        """The default policy for a supervisor's ``recovery_wait_secs``."""
        return cls(backoff_secs=min(1.0, recovery_wait_secs), max_backoff_secs=recovery_wait_secs)


class RecoveryState:
    """The recoveries of one session."""

    def __init__(self, policy: RecoveryPolicy) -> None:
        self.policy = policy
        self.failures: collections.deque[float] = collections.deque()


def _restore_for_recovery(rt: Runtime) -> str | None:
    """On the step thread: restore the latest checkpoint and the step count."""
    assert rt.checkpointer is not None
    path = rt.checkpointer.restore(strict=False)
    if path is not None:
        rt.step = int(rt.global_step_var.numpy())
        rt.recovering = False
        if rt.saver is not None:
            rt.saver.arm()
    return path


async def recover(rt: Runtime, state: RecoveryState, exc: BaseException) -> bool:
    """On the event loop: restore and return ``True`` to retry, or ``False`` to propagate."""
    policy = state.policy
    clock = rt.clock
    now = clock.now()
    failures = state.failures
    while failures and failures[0] < now - policy.window_secs:
        failures.popleft()
    if rt.checkpointer is None or len(failures) >= policy.max_retries:
        log.error(
            "session.recovery_gave_up",
            error=repr(exc),
            retries=len(failures),
            why="no checkpoint directory" if rt.checkpointer is None else "retry limit reached",
        )
        return False
    failures.append(now)
    backoff = min(policy.max_backoff_secs, policy.backoff_secs * 2 ** (len(failures) - 1))
    log.warning("session.recovering", error=repr(exc), attempt=len(failures), backoff_secs=backoff)
    try:
        if backoff > 0:
            await clock.sleep_until(now + backoff)
        if rt.saver is not None:
            await rt.saver.drain()  # a checkpoint being written is the one to restore
        path = await rt.step_thread.call(_restore_for_recovery, rt)
    except anyio.get_cancelled_exc_class():
        rt.control.state_suspect = True  # stopped before the state was restored
        raise
    if path is None:
        log.error("session.recovery_gave_up", error=repr(exc), why="no checkpoint to restore")
        return False
    log.info("session.recovered", step=rt.step, path=path)
    return True
