"""``CheckpointSaverHook`` and its listeners: checkpoints every N steps or seconds.

Checkpoints are written through the session's checkpoint part
(``SessionAttribute.checkpoints``: the same commit protocol and retention); this module
never imports the checkpoint feature.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._core._abc import SessionAttribute, context_of
from .._core._clock import Clock
from .._core._hooks import Gate, SessionRunContext, SessionRunHook, SessionRunValues
from .._logging import get_logger

if TYPE_CHECKING:
    from .._core._abc import SessionContext
    from .._core._session import Session
from ._common import _hook_timer, _timer_gate

__all__ = ["CheckpointSaverHook", "CheckpointSaverListener"]

log = get_logger(__name__)


class CheckpointSaverListener:
    """Called around the saves of :class:`CheckpointSaverHook`; override what you need.

    All methods run on the step thread, with the state at a step boundary.
    """

    def begin(self) -> None:
        """Called once, in the hook's ``begin``."""

    def before_save(self, session: Session, global_step_value: int) -> None:
        """Called before each checkpoint is written."""

    def after_save(self, session: Session, global_step_value: int) -> bool | None:
        """Called after each checkpoint is written; return ``True`` to stop training."""
        return None

    def end(self, session: Session, global_step_value: int) -> None:
        """Called at the end of a clean session, after the last checkpoint."""


class CheckpointSaverHook(SessionRunHook):
    """Saves a checkpoint every N steps or secs, at the start, and at a clean end.

    Saves run on the step thread at a step boundary through the session's checkpoint
    writer (the checkpoint part's ``save_on_step_thread``), so they are consistent.

    Args:
        checkpoint_dir: where checkpoints go.
        save_secs: seconds between checkpoints.
        save_steps: steps between checkpoints.
        checkpoint_basename: files are ``<checkpoint_dir>/<basename>-<step>.*``.
        listeners: :class:`CheckpointSaverListener` objects.
        clock: the time source, a :class:`~asupervisor.Clock` whose ``now()`` any thread may read
            (``asupervisor.testing.ManualClock``); ``time.monotonic`` by default.

    Raises:
        ValueError: both or neither of ``save_secs`` and ``save_steps`` were given.
    """

    def __init__(
        self,
        checkpoint_dir: str,
        save_secs: float | None = None,
        save_steps: int | None = None,
        checkpoint_basename: str = "model.ckpt",
        listeners: Sequence[CheckpointSaverListener] | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        import os

        if not isinstance(checkpoint_dir, (str, os.PathLike)):
            raise TypeError(f"checkpoint_dir must be a path, got {checkpoint_dir!r}")
        self._timer = _hook_timer("save_secs", save_secs, "save_steps", save_steps, clock)
        self._dir = os.fspath(checkpoint_dir)
        self._basename = checkpoint_basename
        self._listeners = tuple(listeners or ())
        self._ctx: SessionContext | None = None
        self.last_saved_path: str | None = None

    def begin(self) -> None:
        """Reset the timer; call the listeners' ``begin``."""
        self._timer.reset()
        for listener in self._listeners:
            listener.begin()

    def after_create_session(self, session: Session) -> None:
        """Save the state the session starts from (TF1 does the same).

        Raises:
            ValueError: in multi-worker training, where every worker must take part in
                every save at the same steps (the checkpoint service does that; this hook
                runs on one worker only).
        """
        self._ctx = context_of(session)
        cluster = self._ctx.cluster
        if self._ctx.multi_worker and cluster is not None:
            raise ValueError(
                f"CheckpointSaverHook cannot save in multi-worker training (TF_CONFIG names "
                f"{cluster.num_workers} workers): every worker must take part in every save "
                "at the same steps; use Supervisor(logdir, save_model_steps=...) instead"
            )
        step = session.global_step
        self._timer.update_last_triggered_step(step)
        if self._save(session, step):
            self._ctx.control.request_stop(reason="hook")

    def _asv_gate(self) -> Gate:
        return _timer_gate(self._timer)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Save when the timer fires."""
        step = run_values.global_step
        timer = self._timer
        if step >= timer.next_step and timer.should_trigger_for_step(step):
            timer.update_last_triggered_step(step)
            if self._save(run_context.session, step):
                run_context.request_stop()

    def end(self, session: Session) -> None:
        """Save the last step unless it was just saved; call the listeners' ``end``."""
        step = session.global_step
        if step != self._timer.last_triggered_step() and not context_of(session).control.state_suspect:
            self._save(session, step)
        for listener in self._listeners:
            listener.end(session, step)

    def _save(self, session: Session, step: int) -> bool:
        """Save at ``step``; returns whether a listener asked to stop."""
        ctx = context_of(session)
        for listener in self._listeners:
            listener.before_save(session, step)
        started = time.monotonic()
        self.last_saved_path = ctx.extra(SessionAttribute.checkpoints).save_on_step_thread(self._dir, self._basename)
        log.info(
            "checkpoint_hook.saved",
            global_step=step,
            path=self.last_saved_path,
            secs=round(time.monotonic() - started, 3),
        )
        stop = False
        for listener in self._listeners:
            if listener.after_save(session, step):
                log.info("checkpoint_hook.stop_requested", listener=type(listener).__name__)
                stop = True
        return stop
