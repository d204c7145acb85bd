"""``SessionManager``: restore-or-init and waiting for a chief's checkpoint (TF1 parity).

TF1's ``tf.compat.v1.train.SessionManager`` made a session ready: restore a checkpoint or
run the init op, run the local init op, check readiness; a non-chief worker waited for
the chief's first checkpoint. This is the same contract for TF2 state (a
``tf.train.Checkpoint`` or a dict of trackables), with ``async`` methods:

* ``prepare_session``: restore (optionally waiting for a checkpoint) or ``init_fn``;
* ``recover_session``: restore if possible; returns whether the state is restored and ready;
* ``wait_for_session``: wait until a checkpoint can be restored, up to a deadline.

Every wait ends at once on a stop signal caught by ``asv.catch_stop_signals()`` or a
``Supervisor`` made earlier (the signal is left for the next session, which stops as it
starts): it raises :class:`~asupervisor.StopRequestedError`, nothing restored.

Restoring is the runtime's own code (:func:`asupervisor._checkpoint.store.restore_latest`: the
newest good checkpoint, falling back past corrupt ones; a different model is a
``CheckpointError``). TensorFlow and file work run on a dedicated thread started for the
call and joined before it returns, never on the event loop; waits are on an injectable
clock, so tests of "wait 30 s between checks" take no time.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from . import _config, _tf_internals
from ._checkpoint.store import names, restore_latest, restore_path
from ._core._clock import Clock, MonotonicClock
from ._core._handoff import LoopHandle
from ._core._signals import pending_stop_signal, wait_stop_signal
from ._core._threads import DedicatedThread
from ._exceptions import CheckpointError, DeadlineExceededError, StopRequestedError
from ._logging import describe, get_logger
from ._tf import is_recoverable, tf

__all__ = ["SessionManager"]

log = get_logger(__name__)

_Call = Callable[..., Any]


def _check_wait(name: str, value: object, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a number of seconds {'> 0' if positive else '>= 0'}, got {value!r}")


def _check_dir(name: str, value: object) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path or None, got {value!r}")
    return Path(value)


def _not_ready(fn: Callable[[], Iterable[str]] | None) -> list[str]:
    return [] if fn is None else [str(name) for name in (fn() or ())]


class SessionManager:
    """Restores or initialises training state, and waits for checkpoints.

    Args:
        state: a ``tf.train.Checkpoint`` or a dict of trackables (models, optimizers,
            variables, ``tf.random.Generator``s).
        local_init_fn: called after every restore or init (no arguments).
        ready_fn: returns the names of what is not ready; empty means ready.
        ready_for_local_init_fn: like ``ready_fn``, checked before ``local_init_fn``.
        recovery_wait_secs: seconds between checks while waiting for a checkpoint (> 0).
        clock: the time source of the waits (tests pass ``asupervisor.testing.ManualClock``).

    Raises:
        TypeError: ``state`` is not a checkpoint or dict, or a function is not callable.
        ValueError: ``recovery_wait_secs`` is not a positive number, or
            ``ready_for_local_init_fn`` is given without ``local_init_fn`` (as TF's
            ``ready_for_local_init_op`` without ``local_init_op``).
    """

    def __init__(
        self,
        *,
        state: Any,
        local_init_fn: Callable[[], Any] | None = None,
        ready_fn: Callable[[], Iterable[str]] | None = None,
        ready_for_local_init_fn: Callable[[], Iterable[str]] | None = None,
        recovery_wait_secs: float = 30,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(state, dict) and not _tf_internals.is_trackable(state):
            raise TypeError(f"state must be a tf.train.Checkpoint or a dict of trackables, got {type(state).__name__}")
        _config.check_state_values(state)  # a value TF would accept and silently not save
        for name, fn in (
            ("local_init_fn", local_init_fn),
            ("ready_fn", ready_fn),
            ("ready_for_local_init_fn", ready_for_local_init_fn),
        ):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable or None, got {fn!r}")
        if ready_for_local_init_fn is not None and local_init_fn is None:
            raise ValueError(
                "ready_for_local_init_fn was given without local_init_fn: it checks whether "
                "local_init_fn may run, so pass a local_init_fn too (or drop ready_for_local_init_fn)"
            )
        _check_wait("recovery_wait_secs", recovery_wait_secs, positive=True)
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(f"clock must have now() and sleep_until(), got {clock!r}")
        self.state = state
        self.local_init_fn = local_init_fn
        self.ready_fn = ready_fn
        self.ready_for_local_init_fn = ready_for_local_init_fn
        self.recovery_wait_secs = float(recovery_wait_secs)
        self.clock: Clock = clock or MonotonicClock()
        self._checkpoint: Any = None

    # -- on the worker thread ------------------------------------------------------

    def _ckpt(self) -> Any:
        if self._checkpoint is None:
            state = self.state
            self._checkpoint = tf().train.Checkpoint(**state) if isinstance(state, dict) else state
        return self._checkpoint

    def _restore(self, checkpoint_dir: Path | None, path: str | None) -> str | None:
        if path is not None:
            reason = names.missing_files(Path(path))
            if reason is None:
                try:
                    restore_path(self._ckpt(), path)
                except CheckpointError:
                    raise
                except (tf().errors.OpError, IndexError, ValueError, OSError) as exc:
                    if is_recoverable(exc):  # transient (a flaky filesystem): not this checkpoint's fault
                        raise
                    reason = describe(exc)
                else:
                    return path
            raise CheckpointError(f"checkpoint_filename_with_path {path!r} cannot be restored: {reason}")
        if checkpoint_dir is None:
            return None
        return restore_latest(self._ckpt(), checkpoint_dir)

    def _local_init(self, *, raise_if_not_ready: bool) -> bool:
        pending = _not_ready(self.ready_for_local_init_fn)
        if pending:
            msg = f"the model is not ready for local_init_fn: {', '.join(pending)}"
            if raise_if_not_ready:
                raise RuntimeError(msg)
            log.info("session_manager.not_ready_for_local_init", not_ready=pending)
            return False
        if self.local_init_fn is not None:
            self.local_init_fn()
        pending = _not_ready(self.ready_fn)
        if pending:
            if raise_if_not_ready:
                raise RuntimeError(f"the model is not ready: {', '.join(pending)}")
            log.info("session_manager.not_ready", not_ready=pending)
            return False
        return True

    def _local_init_only(self) -> None:
        """``local_init_fn`` when nothing was restored (``recover_session``): gated by
        ``ready_for_local_init_fn``, with no ``ready_fn`` check (nothing was restored)."""
        pending = _not_ready(self.ready_for_local_init_fn)
        if pending:
            log.info("session_manager.not_ready_for_local_init", not_ready=pending)
        elif self.local_init_fn is not None:
            self.local_init_fn()

    # -- on the event loop -----------------------------------------------------------

    @asynccontextmanager
    async def _worker(self) -> AsyncIterator[_Call]:
        thread = DedicatedThread("asv-session-manager", LoopHandle())
        thread.start()
        try:
            yield thread.call
        finally:
            await thread.aclose()

    async def _sleep_until(self, until: float, checkpoint_dir: Path) -> None:
        """Sleep on the clock until ``until``, unless a stop signal comes first (then
        :class:`StopRequestedError`; also when one came before the wait)."""
        name = pending_stop_signal()
        if name is None:
            got: list[str] = []
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    got.append(await wait_stop_signal())
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                await self.clock.sleep_until(until)
                tg.cancel_scope.cancel()
            name = got[0] if got else None
        if name is not None:
            log.warning("session_manager.stopped", signal=name, checkpoint_dir=str(checkpoint_dir))
            raise StopRequestedError(
                f"{name} came while waiting for a checkpoint in {str(checkpoint_dir)!r}: the wait "
                "ended, nothing was restored; exit with this error's exit_status so the job runs again",
                signal=name,
            )

    async def _restore_waiting(
        self, call: _Call, checkpoint_dir: Path | None, path: str | None, wait: bool, max_wait_secs: float
    ) -> bool:
        deadline = self.clock.now() + max_wait_secs
        while True:
            restored = await call(self._restore, checkpoint_dir, path)
            if restored is not None:
                log.info("session.restored", path=restored)
                return True
            now = self.clock.now()
            if not wait or checkpoint_dir is None or now >= deadline:
                return False
            log.info("session_manager.waiting_for_checkpoint", checkpoint_dir=str(checkpoint_dir))
            await self._sleep_until(min(deadline, now + self.recovery_wait_secs), checkpoint_dir)

    def _check_args(
        self, checkpoint_dir: object, checkpoint_filename_with_path: object, max_wait_secs: object
    ) -> tuple[Path | None, str | None]:
        if checkpoint_dir is not None and checkpoint_filename_with_path is not None:
            raise ValueError(
                "give checkpoint_dir or checkpoint_filename_with_path, not both "
                f"(got {checkpoint_dir!r} and {checkpoint_filename_with_path!r})"
            )
        _check_wait("max_wait_secs", max_wait_secs)
        path = _check_dir("checkpoint_filename_with_path", checkpoint_filename_with_path)
        return _check_dir("checkpoint_dir", checkpoint_dir), None if path is None else str(path)

    async def prepare_session(
        self,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        *,
        checkpoint_filename_with_path: str | os.PathLike[str] | None = None,
        wait_for_checkpoint: bool = False,
        max_wait_secs: float = 7200,
        init_fn: Callable[[], Any] | None = None,
    ) -> Any:
        """Restore the newest good checkpoint, or initialise; then local init and checks.

        Args:
            checkpoint_dir: the directory to restore the latest checkpoint from.
            checkpoint_filename_with_path: one checkpoint prefix to restore instead.
            wait_for_checkpoint: wait (checking every ``recovery_wait_secs``) for a
                checkpoint to appear in ``checkpoint_dir``, up to ``max_wait_secs``, before
                initialising instead.
            max_wait_secs: the longest wait for a checkpoint.
            init_fn: called when nothing was restored.

        Returns:
            The state given to the constructor, restored or initialised.

        Raises:
            ValueError: both ``checkpoint_dir`` and ``checkpoint_filename_with_path``.
            RuntimeError: nothing was restored and there is nothing to initialise with
                (no ``init_fn``, no ``local_init_fn``), or the model is not ready.
            CheckpointError: the checkpoint belongs to a different model.
            StopRequestedError: a stop signal came while waiting for a checkpoint.
        """
        ckpt_dir, path = self._check_args(checkpoint_dir, checkpoint_filename_with_path, max_wait_secs)
        if init_fn is not None and not callable(init_fn):
            raise TypeError(f"init_fn must be callable or None, got {init_fn!r}")
        async with self._worker() as call:
            restored = await self._restore_waiting(call, ckpt_dir, path, wait_for_checkpoint, max_wait_secs)
            if not restored:
                if init_fn is None and self.local_init_fn is None:
                    where = f" from {str(ckpt_dir)!r}" if ckpt_dir is not None else ""
                    raise RuntimeError(
                        f"no checkpoint was restored{where} and there is nothing to initialise "
                        "the model with: give init_fn (or local_init_fn), or a checkpoint"
                    )
                if init_fn is not None:
                    await call(init_fn)
            await call(self._local_init, raise_if_not_ready=True)
        return self.state

    async def recover_session(
        self,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        *,
        checkpoint_filename_with_path: str | os.PathLike[str] | None = None,
        wait_for_checkpoint: bool = False,
        max_wait_secs: float = 7200,
    ) -> bool:
        """Restore a checkpoint if there is one (never initialise).

        ``local_init_fn`` runs exactly once whether or not a checkpoint was restored (as
        TF's ``recover_session`` runs ``local_init_op``), unless ``ready_for_local_init_fn``
        reports something not ready; ``ready_fn`` is checked only after a restore.

        Returns:
            Whether a checkpoint was restored and the model is then ready (after
            ``local_init_fn``).

        Raises:
            ValueError: both ``checkpoint_dir`` and ``checkpoint_filename_with_path``.
            CheckpointError: the checkpoint belongs to a different model.
            StopRequestedError: a stop signal came while waiting for a checkpoint.
        """
        ckpt_dir, path = self._check_args(checkpoint_dir, checkpoint_filename_with_path, max_wait_secs)
        async with self._worker() as call:
            return await self._recover(call, ckpt_dir, path, wait_for_checkpoint, max_wait_secs, always_local_init=True)

    async def _recover(
        self,
        call: _Call,
        ckpt_dir: Path | None,
        path: str | None,
        wait: bool,
        max_wait_secs: float,
        *,
        always_local_init: bool = False,
    ) -> bool:
        restored = await self._restore_waiting(call, ckpt_dir, path, wait, max_wait_secs)
        if not restored:
            if always_local_init:
                await call(self._local_init_only)
            return False
        return bool(await call(self._local_init, raise_if_not_ready=False))

    async def wait_for_session(self, checkpoint_dir: str | os.PathLike[str], *, max_wait_secs: float = math.inf) -> Any:
        """Wait until a checkpoint in ``checkpoint_dir`` is restored and the model is ready.

        A non-chief worker calls this to start from the chief's first checkpoint. It
        checks every ``recovery_wait_secs``.

        Returns:
            The restored state.

        Raises:
            DeadlineExceededError: ``max_wait_secs`` passed first (also a ``TimeoutError``).
            CheckpointError: the checkpoint belongs to a different model.
            StopRequestedError: a stop signal came first (``asv.catch_stop_signals()``
                or a ``Supervisor`` made catches them); its ``exit_status`` is the
                process's (143 after SIGTERM).
        """
        ckpt_dir = _check_dir("checkpoint_dir", checkpoint_dir)
        if ckpt_dir is None:
            raise ValueError("wait_for_session() needs a checkpoint_dir")
        _check_wait("max_wait_secs", max_wait_secs)
        deadline = self.clock.now() + max_wait_secs
        async with self._worker() as call:
            while True:
                if await self._recover(call, ckpt_dir, None, False, 0):
                    return self.state
                now = self.clock.now()
                if now >= deadline:
                    raise DeadlineExceededError(
                        f"no checkpoint in {str(ckpt_dir)!r} could be restored into a ready model "
                        f"within {max_wait_secs} s; is the chief running and saving there?"
                    )
                log.info("session_manager.waiting_for_session", checkpoint_dir=str(ckpt_dir))
                await self._sleep_until(min(deadline, now + self.recovery_wait_secs), ckpt_dir)
