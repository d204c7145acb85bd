"""The session yielded by ``Supervisor.managed_session()``: how the body runs steps.

Every method that runs user code sends it to the supervisor's step thread and awaits the
result there, so the event loop stays free. ``run_loop`` runs the whole loop on the step
thread (one hand-off per call, not per step). Stopping is cancellation: once a stop is
requested, the body's next ``await`` is cancelled, and a step in flight still finishes.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .._logging import get_logger
from ._abc import SessionAttribute
from ._divergence import DivergenceWatch, Rollback
from ._goodput import DIVERGENCE_ROLLBACK
from ._steps import Halt

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["Session", "StepContext"]

log = get_logger(__name__)


class StepContext:
    """What ``run_step_fn``'s ``step_fn`` receives (MonitoredSession parity).

    It is used on the step thread, inside ``step_fn``.
    """

    __slots__ = ("_rt", "_step_error", "_stop")

    _rt: Engine
    _stop: bool
    #: the last error ``run_with_hooks`` raised (already handled as a step error)
    _step_error: BaseException | None

    def __init__(self) -> None:
        raise TypeError("a StepContext is handed to run_step_fn's step_fn inside managed_session()")

    @classmethod
    def _for(cls, runtime: Engine) -> StepContext:
        """The engine's constructor (the engine's type stays out of the public signature)."""
        ctx = object.__new__(cls)
        ctx._rt = runtime
        ctx._stop = False
        ctx._step_error = None
        return ctx

    @property
    def session(self) -> Session:
        """The session this step belongs to."""
        session: Session = self._rt.session
        return session

    @property
    def global_step(self) -> int:
        """Steps completed so far."""
        return self._rt.step

    def run_with_hooks(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` as one step: hooks around it, the step counted; returns its result."""
        try:
            return self._rt.steps.run_one(fn, args, kwargs)
        except Exception as exc:
            self._step_error = exc
            raise

    def run_without_hooks(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` on the step thread with no hooks and without counting a step."""
        return fn(*args, **kwargs)

    def request_stop(self) -> None:
        """Stop the session once ``step_fn`` returns."""
        self._stop = True

    def _call(self, step_fn: Callable[[StepContext], Any]) -> Any:
        # On the step thread. step_fn is a step: an error it raises itself (not one that
        # run_with_hooks raised and already handled) is a step error too.
        try:
            return step_fn(self)
        except Exception as exc:
            if exc is not self._step_error:
                self._rt.errors.step_fn_failed(exc)
            raise


class Session:
    """Runs steps for the body of ``async with sv.managed_session() as sess``."""

    _rt: Engine

    def __init__(self) -> None:
        raise TypeError("a Session comes from Supervisor.managed_session(): async with sv.managed_session() as sess")

    @classmethod
    def _for(cls, runtime: Engine) -> Session:
        """The engine's constructor (the engine's type stays out of the public signature)."""
        session = object.__new__(cls)
        session._rt = runtime
        return session

    @property
    def global_step(self) -> int:
        """Steps completed so far, restored ones included (a Python int, no device sync)."""
        return self._rt.step

    @property
    def stop_reason(self) -> str | None:
        """Why the session stopped or is stopping (``None`` while it runs).

        One of ``requested``, ``max_steps``, ``end_of_data``, ``hook``, ``cancelled``,
        ``completed``, ``signal:<NAME>``, ``service:<name>``, ``error:<TypeName>``.
        """
        return self._rt.control.reason

    def should_stop(self) -> bool:
        """Whether a stop was requested; any thread may ask."""
        return self._rt.control.should_stop()

    def request_stop(self, exc: BaseException | None = None) -> None:
        """Stop the session at the next step boundary; any thread may call it.

        Args:
            exc: an error to raise out of ``managed_session()`` (the first one wins).
        """
        self._rt.control.request_stop(exc)

    async def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as one step on the step thread, hooks around it.

        Returns:
            What ``fn`` returned.

        Raises:
            TypeError: ``fn`` is not callable (before anything runs; the session goes on).
            RuntimeError: the session has stopped.
            Exception: whatever ``fn`` or a hook raised (the session stops too).
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        rt = self._rt
        while True:  # once more after each successful recovery
            if rt.control.stopping or rt.closed:  # inline: this is the per-call hot path
                await self._check_running()
            waiter = rt.step_thread.submit(rt.steps.run_one, fn, args, kwargs)
            try:
                return await waiter.wait(grace_secs=rt.stop_wait_secs)
            except Exception as exc:
                if await self._recovered(exc):  # restored the latest checkpoint: run the step again
                    continue
                raise

    async def run_loop(
        self,
        fn: Callable[..., Any],
        data: Iterable[Any] | None = None,
        *,
        max_steps: int | None = None,
        checkpoint_iterator: bool | None = None,
        epochs: int | None = None,
        on_epoch_end: Callable[[int], Any] | None = None,
        on_divergence: Rollback | None = None,
    ) -> int:
        """Run steps on the step thread until a stop, ``max_steps``, ``epochs`` or the end
        of ``data``.

        Args:
            fn: the step; called as ``fn(batch)`` for each item of ``data``, else ``fn()``.
            data: an iterable (a ``tf.data.Dataset``, a generator, a queue runner, ...);
                it is iterated on the step thread. Its end is a clean stop.
            max_steps: stop once the *global* step reaches this (absolute, so a resumed
                run stops at the same step); reaching it is a clean stop.
            checkpoint_iterator: whether the position of a ``tf.data.Dataset``'s iterator
                goes into checkpoints. ``None`` (auto): yes when TensorFlow can serialise
                it; a pipeline it cannot (``from_generator``, ``py_function``, stateful
                ops in ``map``) is found before the first step, logged once
                (``checkpoint.iterator_skipped reason=...``) and left out, so a resumed
                run restarts the data. ``True``: required; such a pipeline (or ``data``
                that is not a ``tf.data.Dataset``) is a :class:`~asupervisor.CheckpointError`
                before the first step. ``False``: never; a resumed run restarts the data.
            epochs: run this many passes over ``data`` (absolute, like ``max_steps``: a
                resumed run goes on mid-epoch and stops after the same pass); each pass is
                a new iterator (a ``tf.data`` shuffle reshuffles). The epoch and the
                position within it are checkpointed and shown as ``status().epoch``.
                Completing them is a clean stop (``stop_reason`` ``"epochs"``).
            on_epoch_end: called as ``on_epoch_end(epoch)`` on the step thread after each
                pass (``epoch``: its 0-based index, as Keras counts), before the next one
                and before any checkpoint of the step: the place for validation, per-epoch
                logs or a learning-rate change. What it raises stops the session, as a
                step's error does; ``sess.request_stop()`` from it ends the loop there.
            on_divergence: an :class:`~asupervisor.Rollback`: a non-finite loss (or a
                spike) restores the newest checkpoint, skips the data window that led
                there and trains on, at most ``max_retries`` times; each rollback is
                logged ``divergence.rollback`` and counted in ``status().rollbacks``.
                ``data`` must be a ``tf.data.Dataset`` whose position is checkpointed
                (``checkpoint_iterator`` may not be ``False``), in a Supervisor with a
                logdir.

        Returns:
            The number of steps this call ran, whatever ended it at a step boundary (a
            stop requested from any thread, a hook or a signal, ``max_steps``, the end
            of ``data``), over all its legs when aborted steps were recovered (steps
            redone after a restore count again). After a stop the body's next ``await``
            is cancelled.

        Raises:
            TypeError: ``fn`` is not callable or ``data`` is not iterable.
            ValueError: a bad ``max_steps``, ``checkpoint_iterator`` or ``epochs``, or
                ``epochs`` without ``data``.
            TypeError: with ``epochs``, ``data`` that is an iterator (it ends after one
                pass) or an ``on_epoch_end`` that is not callable; an ``on_divergence``
                that is not a ``Rollback``.
            ValueError: ``on_divergence`` without ``data``, with ``epochs``, with
                ``checkpoint_iterator=False``, without a logdir, or in multi-worker
                training.
            NanLossDuringTrainingError, DivergenceError: a divergence past
                ``on_divergence``'s ``max_retries``, or with no checkpoint to go back to.
        """
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 0):
            raise ValueError(f"max_steps must be an int >= 0 or None, got {max_steps!r}")
        if checkpoint_iterator is not None and not isinstance(checkpoint_iterator, bool):
            raise ValueError(f"checkpoint_iterator must be None, True or False, got {checkpoint_iterator!r}")
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        if data is not None and not _iterable(data):
            raise TypeError(
                f"data must be an iterable (a tf.data.Dataset, a generator, a queue runner, ...) "
                f"or None, got {type(data).__name__}: {data!r}"
            )
        _check_epochs(epochs, data, on_epoch_end)
        rt = self._rt
        watch: DivergenceWatch | None = None
        if on_divergence is not None:
            _check_rollback(on_divergence, data, epochs, checkpoint_iterator, rt)
            watch = DivergenceWatch(on_divergence, rt.rollbacks)
            checkpoint_iterator = True  # a rollback needs the data's position in checkpoints
        total = 0  # steps run by the legs before recoveries and rollbacks
        cancelled = anyio.get_cancelled_exc_class()
        while True:  # a new leg after each successful recovery, from the restored step
            await self._check_running()
            halt = Halt(rt.wake_step_thread)
            waiter = rt.step_thread.submit(
                rt.steps.run_loop, fn, data, max_steps, halt, checkpoint_iterator, epochs, on_epoch_end, watch
            )
            steps: int
            reason: str | None
            try:
                steps, reason = await waiter.wait(halt.set, grace_secs=rt.stop_wait_secs)
            except cancelled:
                # The loop ended at a step boundary while this task was being cancelled.
                # A stop of the session (from any thread, a hook, a signal) returns the
                # count: the session scope stays cancelled, so the body's next await ends
                # it. Another scope's cancellation (one around this call) propagates.
                if not (rt.control.stopping and waiter.done and halt.finished):
                    raise
                if watch is not None and watch.found is not None:
                    rt.control.state_suspect = True  # stopping: not rolled back, and not saved
                return total + halt.steps_run
            except Exception as exc:
                if await self._recovered(exc):  # restored the latest checkpoint: go on from there
                    total += halt.steps_run
                    continue
                raise
            if watch is not None and watch.found is not None:
                total += steps
                if await self._rolled_back(watch):  # restored the last good checkpoint: go on
                    continue
                return total  # a stop came first: the session ends without saving the state
            break
        rt.completed_reason = None
        if reason == "epochs" and rt.fit_continues:
            rt.completed_reason = reason  # fit returns; a body ending now stopped for its epochs
        elif reason is not None:
            rt.control.request_stop(reason=reason)
        elif rt.control.stopping and rt.control.scope is not None:
            # Ended by a stop whose cancellation may still be on its way from another
            # thread: cancel the scope now, so the body's next await ends the session.
            rt.control.scope.cancel()
        return total + steps

    async def fit(
        self,
        model: Any,
        x: Any = None,
        y: Any = None,
        *,
        data: Any = None,
        batch_size: int | None = None,
        epochs: int,
        verbose: str | int = "auto",
        callbacks: Sequence[Any] | None = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool | str = True,
        class_weight: Mapping[int, float] | None = None,
        sample_weight: Any = None,
        initial_epoch: int | None = None,
        steps_per_epoch: int | None = None,
        validation_steps: int | None = None,
        validation_batch_size: int | None = None,
        validation_freq: int = 1,
        save_each_epoch: bool | None = None,
        checkpoint_iterator: bool | None = None,
    ) -> dict[str, list[float]]:
        """Train a compiled Keras model as ``model.fit`` does, with what the supervisor
        promises (exact resume mid-epoch, preemption saves, a clean stop).

        Takes ``model.fit``'s arguments with their meanings: arrays (numpy, tensors,
        dicts/lists of them) batched and shuffled by Keras's own adapter (the same
        batches), a ``tf.data.Dataset``, a ``keras.utils.PyDataset`` or a list of
        batches, or a generator with ``steps_per_epoch``. Uses the model's compiled
        ``train_step`` (in a ``tf.function``) and ``test_step`` (``model.evaluate``);
        writes ``epoch_<metric>`` scalars to the runs ``train/`` and ``validation/``,
        logs ``fit.epoch``, and saves a checkpoint at the end of each validated epoch
        carrying its metrics (for :class:`~asupervisor.KeepBest`). The model must be in
        the supervisor's state (``state={"model": model}``). The position in the epoch
        is checkpointed (a ``PyDataset``'s or a list's batch index, the arrays'
        pipeline); a generator restarts from its beginning on a resume (a warning).

        Args:
            model: a compiled ``keras.Model``.
            data: the training data by its name in ``fit(model, data, *, epochs)``: the
                same as ``x`` (give one of them).
            x, y, batch_size, verbose, validation_split, validation_data, shuffle,
                class_weight, sample_weight, steps_per_epoch (a generator's only),
                validation_steps, validation_batch_size, validation_freq: as
                ``model.fit``'s.
            epochs: the number of epochs, absolute: a resumed run, or a second ``fit``
                in the session, goes on from the epoch and the step reached.
            callbacks: Keras callbacks, called at Keras's moments (per batch only when
                one overrides a batch method). The state of ``EarlyStopping``,
                ``ReduceLROnPlateau``, ``ModelCheckpoint``, ``LearningRateScheduler``,
                ``TerminateOnNaN`` and of any callback defining ``get_state()`` (JSON-able)
                and ``set_state(state)`` is saved with each checkpoint and restored.
                ``model.stop_training`` stops the session (``"stop_training"``).
            initial_epoch: refused unless 0: the supervisor resumes by itself.
            save_each_epoch: a checkpoint at every epoch's end (``True``), only at the
                supervisor's cadence (``False``), or after each validated epoch (``None``).
            checkpoint_iterator: as ``run_loop``'s (``False``: a resume restarts the data).

        Returns:
            The metrics of each epoch this call ran, as Keras's ``History.history``.
            Its epochs done, ``fit`` returns and the session goes on (a body that ends
            then stops with ``stop_reason`` ``"epochs"``).

        Raises:
            TypeError: ``model`` is not a Keras model, or ``x`` is of no kind it takes.
            ValueError: the model is not compiled or not in the supervisor's state, or
                an argument it cannot take (named, with what to do instead).
        """
        fit = self._rt.extra(SessionAttribute.keras_fit, None)
        if fit is None:
            raise RuntimeError("fit() needs the Keras front door: sessions of asv.Supervisor have it")
        if data is not None:
            if x is not None:
                raise TypeError("fit() takes the training data as x or as data, not both")
            x = data
        return await fit(
            self,
            model,
            x,
            y,
            batch_size=batch_size,
            epochs=epochs,
            verbose=verbose,
            callbacks=callbacks,
            validation_split=validation_split,
            validation_data=validation_data,
            shuffle=shuffle,
            class_weight=class_weight,
            sample_weight=sample_weight,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch,
            validation_steps=validation_steps,
            validation_batch_size=validation_batch_size,
            validation_freq=validation_freq,
            save_each_epoch=save_each_epoch,
            checkpoint_iterator=checkpoint_iterator,
        )

    async def run_step_fn(self, step_fn: Callable[[StepContext], Any]) -> Any:
        """Call ``step_fn(step_context)`` on the step thread (MonitoredSession parity).

        ``step_context.run_with_hooks(fn, *args)`` runs one counted step with hooks;
        ``step_context.request_stop()`` stops the session after ``step_fn`` returns.

        ``step_fn`` counts as a step: an error it raises, inside ``run_with_hooks`` or
        not, stops the session without a final checkpoint; end of data is a clean stop;
        ``AbortedError``/``UnavailableError`` restore the latest checkpoint and call
        ``step_fn`` again (bounded, as for :meth:`run`).

        Returns:
            What ``step_fn`` returned.

        Raises:
            TypeError: ``step_fn`` is not callable.
            ValueError: ``step_fn`` cannot be called with the one ``step_context``
                argument (checked before anything runs, as TF's ``run_step_fn`` does).
        """
        if step_fn is not self._checked_step_fn:
            _check_step_fn(step_fn)
            self._checked_step_fn = step_fn
        rt = self._rt
        while True:  # once more after each successful recovery
            await self._check_running()
            ctx = StepContext._for(rt)
            waiter = rt.step_thread.submit(ctx._call, step_fn)
            try:
                result = await waiter.wait(grace_secs=rt.stop_wait_secs)
            except Exception as exc:
                if await self._recovered(exc):  # restored the latest checkpoint: call step_fn again
                    continue
                raise
            break
        if ctx._stop:
            rt.control.request_stop(reason="requested")
        return result

    _checked_step_fn: Any = None  # the last step_fn whose signature was checked

    async def _rolled_back(self, watch: DivergenceWatch) -> bool:
        """A leg ended at the divergence ``watch.found``: restore the newest checkpoint
        (never a diverged state's: :mod:`._divergence`), set the window to skip and
        return ``True``; ``False`` when the session is stopping anyway (the state is then
        not saved). Past ``max_retries``, or without a checkpoint older than the bad step,
        the divergence's error stops the session and is raised."""
        rt = self._rt
        control = rt.control
        found = watch.found
        assert found is not None
        rollback = watch.rollback
        if control.stopping:
            control.state_suspect = True
            log.warning("divergence.detected", step=found.step, kind=found.kind, loss=found.value, action="stop")
            return False
        why = None
        if watch.retries >= rollback.max_retries:
            why = f"max_retries={rollback.max_retries} rollbacks done"
        else:
            restoring = rt.times.restore  # the restore counts as a restore in the ledger
            path = await rt.errors.restore_latest()
            if path is None:
                why = "no checkpoint to roll back to"
            elif rt.step >= found.step:  # never: each checkpoint is older than the steps it did not judge
                why = f"the newest checkpoint (step {rt.step}) is not older than the diverged step"
        if why is not None:
            error = found.error(rollback)
            _add_note(error, f"asupervisor: not rolled back: {why}.")
            log.error("divergence.gave_up", step=found.step, kind=found.kind, loss=found.value, why=why)
            control.state_suspect = True
            control.request_stop(error)
            raise error
        restored = rt.step
        window = found.step - restored
        skipped = window if rollback.skip_steps is None else min(rollback.skip_steps, window)
        await rt.step_thread.call(watch.rolled_back, restored, found.step - skipped, skipped)
        counts = rt.rollbacks
        counts.count += 1
        counts.steps_undone += window
        secs = time.monotonic() - found.at
        counts.secs += secs
        # the ledger: the rest of the rollback's time, and the steps it undid
        rt.record_badput(DIVERGENCE_ROLLBACK, max(0.0, secs - (rt.times.restore - restoring)), steps=window)
        log.warning(
            "divergence.rollback",
            step=found.step,
            kind=found.kind,
            loss=found.value,
            restored_step=restored,
            skipped=skipped,
            retry=watch.retries,
            secs=round(secs, 4),
        )
        return True

    async def _recovered(self, exc: Exception) -> bool:
        """A step raised ``exc``: whether the latest checkpoint was restored so the step
        may run again (:mod:`._step_errors`); if not, the session stops (at once for the
        end of the data) and the caller raises ``exc``."""
        errors = self._rt.errors
        if await errors.recover(exc):
            return True
        if errors.step_failed(exc):
            await self._check_running()  # end of data: the session stops right here
        return False

    async def _check_running(self) -> None:
        # A stopped session has a cancelled scope: this checkpoint ends the body here.
        # While running, nothing to do: the wait that follows is itself a checkpoint.
        control = self._rt.control
        if not (control.stopping or self._rt.closed):
            return
        if control.scope is not None:
            control.scope.cancel()  # a request from another thread may still be in flight
        await anyio.lowlevel.checkpoint_if_cancelled()
        raise RuntimeError(f"the session has stopped (reason={control.reason!r}); no more steps can run in it")


def _iterable(data: object) -> bool:
    """Whether ``iter(data)`` can work, without calling it (that is the step thread's job)."""
    return isinstance(data, Iterable) or hasattr(type(data), "__getitem__")


def _check_step_fn(step_fn: Callable[..., Any]) -> None:
    """A ``ValueError`` unless ``step_fn`` takes exactly one argument, ``step_context``."""
    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable, got {step_fn!r}")
    try:
        signature = inspect.signature(step_fn)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: let it run
        return
    try:
        signature.bind(None)
    except TypeError as exc:
        raise ValueError(
            f"step_fn={step_fn!r} must take one argument, step_context (or self and step_context "
            f"for a method), to be called as step_fn(step_context); its signature is {signature} ({exc})"
        ) from None


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


def _check_rollback(rollback: Any, data: Any, epochs: Any, checkpoint_iterator: Any, rt: Engine) -> None:
    """``run_loop``'s ``on_divergence``, checked before anything runs."""
    if not isinstance(rollback, Rollback):
        raise TypeError(f"on_divergence must be an asv.Rollback(...) or None, got {rollback!r}")
    if data is None:
        raise ValueError("on_divergence=Rollback(...) needs data: it skips the batches that led to a divergence")
    if epochs is not None:
        raise ValueError(f"on_divergence=Rollback(...) does not work with epochs={epochs!r} yet")
    if checkpoint_iterator is False:
        raise ValueError(
            "on_divergence=Rollback(...) needs the data's position in checkpoints, not checkpoint_iterator=False"
        )
    if rt.multi_worker:
        raise ValueError("on_divergence=Rollback(...) is not available in multi-worker training")
    if not rt.parts.can_restore:
        raise ValueError("on_divergence=Rollback(...) needs checkpoints to go back to: a Supervisor with a logdir")


def _check_epochs(epochs: Any, data: Any, on_epoch_end: Any) -> None:
    """``run_loop``'s ``epochs`` and ``on_epoch_end``, checked before anything runs."""
    if epochs is None:
        if on_epoch_end is not None:
            raise ValueError("on_epoch_end needs epochs=N: without epochs, run_loop has no epoch boundaries")
        return
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an int >= 0 or None, got {epochs!r}")
    if data is None:
        raise ValueError("epochs needs data: an epoch is one pass over data")
    if isinstance(data, Iterator):
        raise TypeError(
            f"epochs needs data that can be iterated again (a tf.data.Dataset, a list, ...); "
            f"a {type(data).__name__} is an iterator, which ends after one pass"
        )
    if on_epoch_end is not None and not callable(on_epoch_end):
        raise TypeError(f"on_epoch_end must be callable, got {on_epoch_end!r}")
