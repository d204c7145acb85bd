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
A transient error raised by that restore itself is one more attempt under the same
policy: it never makes the checkpoint count as corrupt.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import anyio

from .._logging import describe, get_logger
from .._tf import is_recoverable
from ._services import FailureWindow, RestartPolicy

if TYPE_CHECKING:
    from ._clock import Clock
    from ._runtime import Runtime

__all__ = ["recover", "recovery_policy", "retry_transient"]

T = TypeVar("T")

log = get_logger(__name__)


def recovery_policy(recovery_wait_secs: float) -> RestartPolicy:
    """How often a session may recover from aborted/unavailable steps.

    Three recoveries within ten minutes (TF1 retried forever; we do not), the first after
    ``min(1 s, recovery_wait_secs)``, doubling up to ``recovery_wait_secs``.
    """
    return RestartPolicy(
        max_restarts=3,
        window_secs=600.0,
        backoff_secs=min(1.0, recovery_wait_secs),
        max_backoff_secs=recovery_wait_secs,
    )


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


async def retry_transient(
    call: Callable[[], Awaitable[T]],
    failures: FailureWindow,
    clock: Clock,
    *,
    event: str,
    gave_up: str | None = None,
) -> T:
    """Await ``call()`` until it returns; each ``AbortedError``/``UnavailableError`` it
    raises is one more attempt of ``failures``' policy, logged ``event`` (attempt,
    backoff), then retried after the backoff on ``clock``. Past the policy, or for any
    other error, the error propagates as itself (logged ``gave_up`` if given)."""
    while True:
        try:
            return await call()
        except Exception as exc:
            if not is_recoverable(exc):
                raise
            now = clock.now()
            attempt = failures.record(now)
            if attempt > failures.policy.max_restarts:
                if gave_up is not None:
                    log.error(gave_up, error=describe(exc), retries=attempt - 1)
                raise
            backoff = failures.policy.backoff_for(attempt)
            log.warning(event, error=describe(exc), attempt=attempt, backoff_secs=backoff)
            if backoff > 0:
                await clock.sleep_until(now + backoff)


async def recover(rt: Runtime, failures: FailureWindow, exc: BaseException) -> bool:
    """On the event loop: restore and return ``True`` to retry, or ``False`` to propagate."""
    clock = rt.clock
    now = clock.now()
    attempt = failures.record(now)
    if rt.checkpointer is None or attempt > failures.policy.max_restarts:
        log.error(
            "session.recovery_gave_up",
            error=describe(exc),
            retries=attempt - 1,
            why="no checkpoint directory" if rt.checkpointer is None else "retry limit reached",
        )
        return False
    backoff = failures.policy.backoff_for(attempt)
    log.warning("session.recovering", error=describe(exc), attempt=attempt, backoff_secs=backoff)

    async def restore() -> str | None:
        if rt.saver is not None:
            await rt.saver.drain()  # a checkpoint being written is the one to restore
        path: str | None = await rt.step_thread.call(_restore_for_recovery, rt)
        return path

    try:
        if backoff > 0:
            await clock.sleep_until(now + backoff)
        # a transient error of the restore itself is another attempt of the same policy
        # (never a reason to call the checkpoint corrupt)
        path = await retry_transient(restore, failures, clock, event="session.recovering")
    except anyio.get_cancelled_exc_class():
        rt.control.state_suspect = True  # stopped before the state was restored
        raise
    if path is None:
        log.error("session.recovery_gave_up", error=describe(exc), why="no checkpoint to restore")
        return False
    log.info("session.recovered", step=rt.step, path=path)
    return True
