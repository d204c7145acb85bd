"""What a step's error means: end of data, recovery, or a suspect state — and the one
retry helper.

:class:`StepErrors` holds the semantics, for ``sess.run``, ``run_loop`` and
``run_step_fn`` alike. On the step thread, :meth:`StepErrors.note` files an error the
moment a step raises it: the end of the data is a clean stop; ``AbortedError`` /
``UnavailableError`` mark the session as recovering (when a part can restore); any other
error is kept (never lost), the state marked suspect (no final checkpoint of a
half-updated state) and the stop flag raised. In a multi-worker training an error that
says a peer is gone stops the session with ``peer_lost:<task>`` instead of recovering. On the event loop, the awaiting task then
calls :meth:`StepErrors.recover` (restore and retry?) and, if not,
:meth:`StepErrors.step_failed` (stop).

Recovery. TF1's ``MonitoredSession`` recreated the session and retried forever. Here a step that
raises one of these errors makes the session restore the latest checkpoint (on the step
thread) and go on, at most :attr:`RecoveryPolicy.max_retries` times within
:attr:`RecoveryPolicy.window_secs`, waiting a backoff first; past that the error
propagates as itself. The step thread marks the session as recovering (no snapshot is
taken of a half-done step) and does not record the error; :func:`recover`, on the event
loop, decides, waits and restores. Without a checkpoint to restore the error propagates.

The backoff starts at ``min(1, recovery_wait_secs)`` seconds and doubles up to
``recovery_wait_secs`` (the Supervisor setting), on the supervisor's injectable clock.
A transient error raised by that restore itself is one more attempt under the same
policy: it never makes the checkpoint count as corrupt. :func:`retry_transient` is that
retry loop, also used for start-up's restore-or-init.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import anyio

from .._cluster import lost_peers
from .._logging import describe, get_logger
from .._tf import is_end_of_data, is_recoverable, is_tf_error
from ._abc import SessionAttribute
from ._services import FailureWindow, RestartPolicy
from ._status import EXIT_PEER_LOST

if TYPE_CHECKING:
    from ._clock import Clock
    from ._engine import Engine

__all__ = ["StepErrors", "recovery_policy", "retry_transient"]

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


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


class StepErrors:
    """The step-error semantics of one session (see the module docstring)."""

    def __init__(self, rt: Engine) -> None:
        self._rt = rt
        self._failures = FailureWindow(recovery_policy(rt.config.recovery_wait_secs))
        #: a step raised AbortedError/UnavailableError: the awaiting task will recover()
        self.recovering = False
        #: a lost peer's error, the task and the step, for :meth:`note_peer_lost`
        self.peer_lost: tuple[BaseException, str, int] | None = None

    def note(self, exc: BaseException, *, recoverable: bool = True) -> None:
        """On the step thread: a step raised ``exc`` (see the module docstring)."""
        if is_end_of_data(exc):  # the data ran out: a clean stop (TF1 calls hook.end too)
            return
        rt = self._rt
        control = rt.control
        if self._peer_lost(exc):
            return
        if recoverable and rt.parts.can_restore and is_recoverable(exc) and not control.stopping:
            self.recovering = True  # the awaiting task calls recover(): restore and retry, or give up
            return
        control.state_suspect = True
        control.record_error(exc)

    def _peer_lost(self, exc: BaseException) -> bool:
        """On the step thread: whether ``exc`` says a peer of this multi-worker training is
        gone. If so the session stops with ``peer_lost:<task>`` (no recovery: TensorFlow
        aborts every collective of this process after a peer's loss, so only a restart of
        the whole job helps, from the last checkpoint), and ``exc`` gets a note naming the
        lost task and the last committed step."""
        rt = self._rt
        if not rt.multi_worker or rt.cluster is None or not is_tf_error(exc):
            return False
        peers = lost_peers(str(exc), rt.cluster)
        if peers is None:
            return False
        checkpoints = rt.extra(SessionAttribute.checkpoints, None)
        last = None if checkpoints is None else checkpoints.last
        who = ", ".join(peers) if peers else "a peer"
        rt.control.state_suspect = True  # a final checkpoint would need the lost peer
        rt.control.record_error(exc, reason=f"peer_lost:{','.join(peers)}" if peers else "peer_lost")
        log.error("cluster.peer_lost", lost=who, step=rt.step, last_checkpoint_step=None if last is None else last.step)
        self.peer_lost = (exc, who, rt.step)  # noted at the stop's end: a write in flight may commit yet
        return True

    def note_peer_lost(self) -> None:
        """At the stop's end, once the writes in flight settled: the lost peer's error gets
        a note naming the lost task and the checkpoint a restarted job resumes from."""
        if self.peer_lost is None:
            return
        exc, who, step = self.peer_lost
        self.peer_lost = None
        rt = self._rt
        checkpoints = rt.extra(SessionAttribute.checkpoints, None)
        last = None if checkpoints is None else checkpoints.last
        if last is not None:
            saved = f"step {last.step} ({last.path})"
        else:
            saved = "none" if rt.is_chief else "the chief's latest (this task commits none)"
        _add_note(
            exc,
            f"asupervisor: lost {who} of the cluster at step {step}; the last committed checkpoint: {saved}. "
            f"Restart every task of the job to resume from it (exit status {EXIT_PEER_LOST}).",
        )

    def step_fn_failed(self, exc: BaseException) -> None:
        """On the step thread: a ``run_step_fn`` step function raised ``exc`` itself.

        The same as a step raising it: the state is suspect and the error kept, or, for
        ``AbortedError``/``UnavailableError``, the session recovers; end of data stays
        a clean stop.
        """
        if is_end_of_data(exc):
            return  # step_failed() stops cleanly (or not, if a swallowed error left us recovering)
        # A recoverable error that step_fn caught and replaced with this one is not
        # recovered from: this error decides.
        self.recovering = False
        self.note(exc)

    async def recover(self, exc: BaseException) -> bool:
        """On the loop: after a step error, restore and return whether to retry the step."""
        if not self.recovering:
            return False
        try:
            retry = await self._recover(exc)
        except Exception as err:
            _add_note(exc, f"asupervisor: recovery failed: {describe(err)}")
            retry = False
        if not retry:
            self.recovering = False
            self.note(exc, recoverable=False)
        return retry

    def step_failed(self, exc: BaseException) -> bool:
        """On the loop: a step raised ``exc``; stop. Returns whether it was end of data."""
        control = self._rt.control
        if self.recovering:  # a caller that does not recover: the error stops the session
            self.recovering = False
            control.state_suspect = True
        if is_end_of_data(exc):
            control.request_stop(reason="end_of_data")
            return True
        control.request_stop(exc)
        return False

    def _restore(self) -> str | None:
        """On the step thread: restore the latest checkpoint and the step count."""
        rt = self._rt
        t0 = time.perf_counter()
        try:
            path = rt.parts.restore(rt, recovering=True)
        finally:
            rt.times.restore += time.perf_counter() - t0
        if path is not None:
            self.recovering = False
            rt.parts.arm(rt.step)
        return path

    async def restore_latest(self) -> str | None:
        """On the loop: restore the latest checkpoint (a recovery, a divergence rollback);
        its path, or ``None`` when there is none.

        A checkpoint being written is let finish first (it is the one to restore). A
        transient error of the restore itself is another attempt of the recovery policy
        (never a reason to call the checkpoint corrupt). Cancelled before the state is
        back, the state is suspect (no final checkpoint of it).
        """
        rt = self._rt

        async def restore() -> str | None:
            await rt.parts.settle(rt)
            path: str | None = await rt.step_thread.call(self._restore)
            return path

        try:
            return await retry_transient(restore, self._failures, rt.clock, event="session.recovering")
        except anyio.get_cancelled_exc_class():
            rt.control.state_suspect = True
            raise

    async def _recover(self, exc: BaseException) -> bool:
        rt = self._rt
        failures = self._failures
        clock = rt.clock
        now = clock.now()
        attempt = failures.record(now)
        if attempt > failures.policy.max_restarts:
            log.error("session.recovery_gave_up", error=describe(exc), retries=attempt - 1, why="retry limit reached")
            return False
        backoff = failures.policy.backoff_for(attempt)
        log.warning("session.recovering", error=describe(exc), attempt=attempt, backoff_secs=backoff)
        if backoff > 0:
            try:
                await clock.sleep_until(now + backoff)
            except anyio.get_cancelled_exc_class():
                rt.control.state_suspect = True  # stopped before the state was restored
                raise
        path = await self.restore_latest()
        if path is None:
            log.error("session.recovery_gave_up", error=describe(exc), why="no checkpoint to restore")
            return False
        log.info("session.recovered", step=rt.step, path=path)
        return True
