"""``MonitoredTrainingSession``: TF1's front door, on the same engine as ``Supervisor``.

It builds the hook list the way TF1's ``tf.compat.v1.train.MonitoredTrainingSession``
does and runs a :class:`~asupervisor.Supervisor` session with it:

* chief: ``chief_only_hooks``, then ``StepCounterHook(every_n_steps=log_step_count_steps)``
  and ``SummarySaverHook`` (when ``checkpoint_dir`` is set), then
  ``CheckpointSaverHook`` (when ``checkpoint_dir`` is set and saving is on), then
  ``hooks``;
* non-chief: ``hooks`` only (no checkpoint or summary hooks).

Checkpoints every ``save_checkpoint_secs`` (600) unless ``save_checkpoint_steps`` is
given; summaries every ``save_summaries_steps`` (100) unless ``save_summaries_secs`` is
given. The supervisor's own timed checkpoint and summary services are off: the hooks do
that work, as in TF1. This module must not import TensorFlow.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import _overrides as overrides
from ._basic_hooks._checkpoint import CheckpointSaverHook
from ._basic_hooks._step_counter import StepCounterHook
from ._basic_hooks._summary import SummarySaverHook
from ._core._hooks import SessionRunHook
from ._options import CheckpointOptions
from ._supervisor import Supervisor

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from ._core._clock import Clock
    from ._core._session import Session

__all__ = ["MonitoredTrainingSession"]


def _positive_or_none(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be a number >= 0 or None, got {value!r}")
    return value if value > 0 else None


class MonitoredTrainingSession:
    """An async context manager yielding a session with TF1's default hooks.

    ``async with asv.MonitoredTrainingSession(ckpt_dir, state=ckpt) as sess:`` then
    ``while not sess.should_stop(): await sess.run(train_step)``. The session has ``run``,
    ``run_loop``, ``run_step_fn``, ``should_stop`` and ``request_stop``.

    Args:
        checkpoint_dir: restores from and (on the chief) saves checkpoints and
            summaries to this directory; ``None`` for neither.
        state: a ``tf.train.Checkpoint`` or a dict of trackables.
        hooks: hooks for every worker.
        chief_only_hooks: hooks run on the chief only.
        is_chief: whether this process is the chief.
        save_checkpoint_secs: seconds between checkpoints (600); ignored when
            ``save_checkpoint_steps`` is given; ``None`` or 0 turns timed saves off.
        save_checkpoint_steps: steps between checkpoints.
        save_summaries_steps: steps between summaries (100); ignored when
            ``save_summaries_secs`` is given.
        save_summaries_secs: seconds between summaries.
        log_step_count_steps: steps between ``global_step/sec`` measurements (100).
        max_wait_secs: how long a non-chief waits for the chief's first checkpoint. A
            stop signal ends the wait: the session then stops as it starts, without a
            step (``stop_reason`` ``signal:SIGTERM``, ``asv.exit_code`` 143).
        stop_grace_period_secs: the longest a stop may take.
        **supervisor_kwargs: passed on to :class:`~asupervisor.Supervisor` (for example
            ``init_fn``, ``global_step``, ``handle_signals``, ``clock``).

    Raises:
        ValueError: a setting is out of range.
    """

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        *,
        state: Any = None,
        hooks: Sequence[SessionRunHook] = (),
        chief_only_hooks: Sequence[SessionRunHook] = (),
        is_chief: bool = True,
        save_checkpoint_secs: float | None = 600,
        save_checkpoint_steps: int | None = None,
        save_summaries_steps: int | None = 100,
        save_summaries_secs: float | None = None,
        log_step_count_steps: int | None = 100,
        max_wait_secs: float = 7200,
        stop_grace_period_secs: float = 120,
        **supervisor_kwargs: Any,
    ) -> None:
        for name in ("save_model_secs", "save_summaries_secs", "logdir", "hooks", "is_chief", "stop_grace_secs"):
            if name in supervisor_kwargs:
                raise TypeError(f"MonitoredTrainingSession sets {name} itself; use its own arguments")
        checkpoint_dir = overrides.logdir(checkpoint_dir)  # ASUPERVISOR_LOGDIR (docs/cli.md)
        save_checkpoint_secs = _positive_or_none("save_checkpoint_secs", save_checkpoint_secs)
        save_summaries_secs = _positive_or_none("save_summaries_secs", save_summaries_secs)
        if save_checkpoint_steps is not None and save_checkpoint_steps > 0:
            save_checkpoint_secs = None  # TF1: steps given, the default seconds no longer apply
        if save_summaries_secs is not None:
            save_summaries_steps = None  # TF1: seconds given, the default steps no longer apply
        if max_wait_secs is None or max_wait_secs < 0:
            raise ValueError(f"max_wait_secs must be a number >= 0, got {max_wait_secs!r}")
        clock = supervisor_kwargs.get("clock")
        hook_clock = clock if clock is not None and not _is_loop_clock(clock) else None
        all_hooks: list[SessionRunHook] = []
        if is_chief:
            all_hooks.extend(chief_only_hooks)
            if checkpoint_dir is not None:
                if log_step_count_steps is not None and log_step_count_steps > 0:
                    all_hooks.append(StepCounterHook(every_n_steps=log_step_count_steps, clock=hook_clock))
                if (save_summaries_steps or 0) > 0 or save_summaries_secs is not None:
                    all_hooks.append(
                        SummarySaverHook(
                            save_steps=save_summaries_steps or None, save_secs=save_summaries_secs, clock=hook_clock
                        )
                    )
                if save_checkpoint_secs is not None or (save_checkpoint_steps or 0) > 0:
                    all_hooks.append(
                        CheckpointSaverHook(
                            os.fspath(checkpoint_dir),
                            save_secs=save_checkpoint_secs,
                            save_steps=save_checkpoint_steps or None,
                            checkpoint_basename=_basename(supervisor_kwargs),
                            clock=hook_clock,
                        )
                    )
        all_hooks.extend(hooks)
        self.hooks: tuple[SessionRunHook, ...] = tuple(all_hooks)
        self.max_wait_secs = max_wait_secs
        self.supervisor = Supervisor(
            checkpoint_dir,
            state=state,
            is_chief=is_chief,
            save_model_secs=0,
            save_summaries_secs=0,
            stop_grace_secs=stop_grace_period_secs,
            hooks=self.hooks,
            **supervisor_kwargs,
        )
        if self.supervisor.config.multi_worker and checkpoint_dir is not None:
            assert self.supervisor.config.cluster is not None
            raise ValueError(
                f"MonitoredTrainingSession with a checkpoint_dir cannot run multi-worker training "
                f"(TF_CONFIG names {self.supervisor.config.cluster.num_workers} workers): its "
                "chief-only CheckpointSaverHook would save without the other workers, which must "
                "take part in every save; use asv.Supervisor(logdir, save_model_steps=...) instead"
            )
        self._runtime: AbstractAsyncContextManager[Session] | None = None

    async def __aenter__(self) -> Session:
        config = self.supervisor.config
        if not config.is_chief and config.logdir is not None:
            # TF1's worker session creator: a non-chief starts from the chief's first
            # checkpoint, waiting at most max_wait_secs (DeadlineExceededError after).
            from ._exceptions import StopRequestedError
            from ._session_manager import SessionManager

            manager = SessionManager(
                state=config.state if config.state is not None else {},
                recovery_wait_secs=config.recovery_wait_secs,
                clock=config.clock,
            )
            try:
                await manager.wait_for_session(config.logdir, max_wait_secs=self.max_wait_secs)
            except StopRequestedError:
                if not config.handle_signals:
                    raise
                # the signal stays caught: the session below stops as it starts (no step,
                # stop_reason signal:<NAME>, asv.exit_code 143 after SIGTERM)
        runtime = self._runtime = self.supervisor.managed_session()
        return await runtime.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._runtime is not None
        return bool(await self._runtime.__aexit__(exc_type, exc, tb))


def _basename(supervisor_kwargs: Mapping[str, Any]) -> str:
    """The checkpoint basename the supervisor will have: ``checkpoint_basename=``, or the
    ``basename`` of ``checkpoint=asv.CheckpointOptions(...)`` (a disagreement between the
    two is the ``Supervisor``'s ``ValueError``)."""
    flat = supervisor_kwargs.get("checkpoint_basename", "model.ckpt")
    options = supervisor_kwargs.get("checkpoint")
    if flat == "model.ckpt" and isinstance(options, CheckpointOptions):
        return options.basename
    return str(flat)


def _is_loop_clock(clock: Clock) -> bool:
    """Whether ``clock`` may only be read on the event loop (hooks need another one)."""
    from ._core._clock import MonotonicClock

    return isinstance(clock, MonotonicClock)
