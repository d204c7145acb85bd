"""The Keras front door: ``await sess.fit(model, data, epochs=..., validation_data=...)``.

A front door, not part of the engine: :class:`KerasPart` (added to every session by
:mod:`._assembly`) offers :func:`fit` as the session's ``SessionAttribute.keras_fit``,
which ``Session.fit`` calls; the engine never imports this module.

A compiled Keras model is trained with its own ``train_step`` (wrapped in a
``tf.function`` as ``model.fit`` wraps it: ``jit_compile`` and ``run_eagerly`` as compiled)
inside the session's ``run_loop(..., epochs=)``, so everything the supervisor promises
holds: the epoch and the position in it are checkpointed with the model, the optimizer
and the data iterator (exact resume mid-epoch), preemption saves, a clean stop, the
session embedded in an application. Per epoch, on the step thread (:mod:`._core._epochs`'s
``on_epoch_end``): the epoch's metrics read, ``model.evaluate`` on the validation data
(its compiled ``test_step``; a stop ends it after the batch in flight, and its partial
metrics are not logged), Keras callbacks' ``on_epoch_end`` (``EarlyStopping`` and
``ReduceLROnPlateau`` work as with ``fit``), TensorBoard scalars ``epoch_<metric>`` in the
runs ``train/`` and ``validation/`` (the chief only, as Keras's ``TensorBoard`` callback
writes them), a log line ``fit.epoch``, the metrics reset, and (after a validation, by
default) a checkpoint carrying the epoch's metrics (``val_loss``, ... for
:class:`~asupervisor.KeepBest` and ``export(best=)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from . import _tf_internals
from ._core._abc import SessionAttribute, SessionContext, SessionPart
from ._core._epochs import KERAS_ATTR
from ._core._outputs import float_entries
from ._logging import describe, get_logger
from ._tf import tf

__all__ = ["KerasPart", "fit"]

log = get_logger(__name__)

#: Keras callback methods called per batch: a callback overriding one is called each step
_BATCH_METHODS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


async def fit(
    sess: Any,
    model: Any,
    data: Iterable[Any],
    *,
    epochs: int,
    validation_data: Iterable[Any] | None = None,
    validation_freq: int = 1,
    callbacks: Sequence[Any] = (),
    save_each_epoch: bool | None = None,
) -> dict[str, list[float]]:
    """See :meth:`asupervisor.Session.fit` (``sess``: the session handle; the engine
    behind it, ``sess._rt``, is what this front door drives)."""
    _check_arguments(model, data, epochs, validation_freq, callbacks)
    if save_each_epoch is not None and not isinstance(save_each_epoch, bool):
        raise ValueError(f"save_each_epoch must be None, True or False, got {save_each_epoch!r}")
    rt = sess._rt
    keras_callbacks = _callback_list(model, callbacks, epochs)
    history: dict[str, list[float]] = {}
    trainer = _Trainer(rt, model, validation_data, validation_freq, keras_callbacks, history, save_each_epoch)
    await rt.step_thread.call(trainer.begin, data)
    try:
        await sess.run_loop(trainer.step, data=data, epochs=epochs, on_epoch_end=trainer.epoch_end)
    finally:
        with anyio.CancelScope(shield=True):  # the session may be stopping: this is short
            await rt.step_thread.call(trainer.end)
    return history


class KerasPart(SessionPart):
    """Offers :func:`fit` to the session (``SessionAttribute.keras_fit``), so that
    ``Session.fit`` reaches this front door without the engine importing it."""

    name = "keras"

    def extra_attributes(self, ctx: SessionContext) -> Mapping[Any, Callable[[], Any]]:
        """``SessionAttribute.keras_fit``: :func:`fit`."""
        return {SessionAttribute.keras_fit: lambda: fit}


def _check_arguments(model: Any, data: Any, epochs: Any, validation_freq: Any, callbacks: Any) -> None:
    """Bad arguments, refused before anything runs, each naming the bad value."""
    if not callable(getattr(model, "train_step", None)) or not callable(getattr(model, "test_step", None)):
        raise TypeError(f"fit() trains a Keras model (with train_step and test_step), got {model!r}")
    if not getattr(model, "compiled", True) or getattr(model, "optimizer", None) is None:
        raise ValueError(
            f"fit() needs a compiled model: call model.compile(optimizer=..., loss=...) first ({model.name!r})"
        )
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an int >= 0, got {epochs!r}")
    if isinstance(validation_freq, bool) or not isinstance(validation_freq, int) or validation_freq < 1:
        raise ValueError(f"validation_freq must be an int >= 1, got {validation_freq!r}")
    if data is None:
        raise ValueError("fit() needs data: a tf.data.Dataset of (x, y) batches")
    for callback in callbacks:
        if type(callback).__name__ == "BackupAndRestore":
            raise ValueError(
                "fit() callbacks: remove BackupAndRestore; the supervisor checkpoints the model, the "
                "optimizer, the epoch and the data position itself and resumes exactly"
            )


def _callback_list(model: Any, callbacks: Sequence[Any], epochs: int) -> Any:
    """Keras's ``CallbackList`` over ``callbacks`` (no history, no progress bar), or
    ``None`` when there are none."""
    if not callbacks:
        return None
    import keras

    return keras.callbacks.CallbackList(list(callbacks), model=model, epochs=epochs, verbose=0)


def _in_state(state: Any, model: Any) -> bool:
    """Whether ``model`` is part of what the supervisor checkpoints."""
    try:
        return any(obj is model for obj in tf().train.TrackableView(state).descendants())
    except Exception:  # another TF: do not refuse what may work
        return True


class _Trainer:
    """``fit``'s pieces that run on the step thread."""

    def __init__(
        self,
        rt: Any,
        model: Any,
        validation_data: Iterable[Any] | None,
        validation_freq: int,
        callbacks: Any,
        history: dict[str, list[float]],
        save_each_epoch: bool | None = None,
    ) -> None:
        self.rt = rt
        self.model = model
        self.validation_data = validation_data
        self.validation_freq = validation_freq
        self.callbacks = callbacks
        self.history = history
        self.save_each_epoch = save_each_epoch
        self.step: Callable[[Any], Any] = self._train
        self._train_fn: Callable[[Any], Any] | None = None
        self._writers: dict[str, Any] = {}
        self._logs: dict[str, float] = {}

    # -- step thread ---------------------------------------------------------------

    def begin(self, data: Any) -> None:
        """Before the first step: check the model is checkpointed, build it and its
        optimizer (so a restored checkpoint's values land in them now, not inside a
        traced function), reset the metrics at the start of an epoch, start callbacks."""
        rt, model = self.rt, self.model
        if rt.state is not None and not _in_state(rt.state, model):
            raise ValueError(
                f"fit(): the model {model.name!r} is not in the supervisor's state, so it would be neither "
                "saved nor restored; pass state={'model': model} to the Supervisor"
            )
        _build(model, data)
        _attach_keras_state(rt.state, model)
        fn = model.train_step
        if not model.run_eagerly:
            fn = tf().function(fn, reduce_retracing=True, jit_compile=bool(model.jit_compile))
        self._train_fn = fn
        counter = rt.epoch_counter
        counter.attach(rt.state, rt.step, consume=False)  # run_loop's attach begins a new pass if need be
        if rt.step == counter.first_step:  # at an epoch's start: the metrics count from here
            model.reset_metrics()
        if self.callbacks is not None:
            if any(_overrides_batch(c) for c in self.callbacks.callbacks):
                self.step = self._train_with_batch_callbacks
            self.callbacks.on_train_begin()
            self.callbacks.on_epoch_begin(counter.epoch)

    def _train(self, batch: Any) -> Any:
        return self._train_fn(batch)  # type: ignore[misc]

    def _train_with_batch_callbacks(self, batch: Any) -> Any:
        index = self.rt.step - self.rt.epoch_counter.first_step
        self.callbacks.on_train_batch_begin(index)
        logs = self._train_fn(batch)  # type: ignore[misc]
        self.callbacks.on_train_batch_end(index, logs)
        return logs

    def epoch_end(self, epoch: int) -> None:
        """After each epoch: metrics, validation, callbacks, summaries, a log line, the
        metrics reset, and a checkpoint carrying the epoch's logs."""
        rt, model = self.rt, self.model
        logs = float_entries(model.get_metrics_result() or {})
        validated = self.validation_data is not None and (epoch + 1) % self.validation_freq == 0
        if validated:
            val = model.evaluate(self.validation_data, verbose=0, return_dict=True, callbacks=[_stop_evaluating(rt)])
            if rt.control.stopping:  # cut short by a stop: no val_* metrics of part of the data
                log.info("fit.validation_stopped", epoch=epoch + 1, step=rt.step, reason=rt.control.reason)
                validated = False
            else:
                logs.update({f"val_{name}": value for name, value in float_entries(val or {}).items()})
        rt.epoch_logs = (rt.step, dict(logs))
        for name, value in logs.items():
            self.history.setdefault(name, []).append(value)
        if self.callbacks is not None:
            self.callbacks.on_epoch_end(epoch, logs)
        self._summaries(epoch, logs)
        log.info("fit.epoch", epoch=epoch + 1, step=rt.step, **{k: round(v, 6) for k, v in logs.items()})
        self._logs = logs
        model.reset_metrics()
        if getattr(model, "stop_training", False):  # EarlyStopping, or the user's callback
            rt.request_stop(reason="stop_training")
        checkpoints = rt.extra(SessionAttribute.checkpoints, None)
        if checkpoints is not None and (self.save_each_epoch or (self.save_each_epoch is None and validated)):
            checkpoints.save_in_background("epoch")
        counter = rt.epoch_counter
        if (
            self.callbacks is not None
            and not rt.control.stopping
            and (counter.epochs is None or counter.epoch < counter.epochs)
        ):
            self.callbacks.on_epoch_begin(counter.epoch)

    def end(self) -> None:
        """After the loop (whatever ended it): ``on_train_end`` and the writers closed."""
        try:
            if self.callbacks is not None:
                self.callbacks.on_train_end(self._logs)
        finally:
            for writer in self._writers.values():
                try:
                    writer.close()
                except Exception as exc:  # summaries never fail training
                    log.warning("fit.summary_failed", error=describe(exc))
            self._writers.clear()

    def _summaries(self, epoch: int, logs: dict[str, float]) -> None:
        """``epoch_<metric>`` at step ``epoch`` in ``train/`` and ``validation/`` (the
        chief's logdir only), as Keras's ``TensorBoard`` callback writes them."""
        rt = self.rt
        if rt.logdir is None or not rt.is_chief:
            return
        try:
            tf_ = tf()
            for run, prefix in (("train", ""), ("validation", "val_")):
                values = {
                    name[len(prefix) :]: value
                    for name, value in logs.items()
                    if name.startswith(prefix) and (prefix or not name.startswith("val_"))
                }
                if not values:
                    continue
                writer = self._writers.get(run)
                if writer is None:
                    writer = self._writers[run] = tf_.summary.create_file_writer(str(Path(rt.logdir) / run))
                with writer.as_default():
                    for name, value in values.items():
                        tf_.summary.scalar(f"epoch_{name}", value, step=epoch)
                writer.flush()
        except Exception as exc:  # summaries never fail training
            log.warning("fit.summary_failed", error=describe(exc))


def _build(model: Any, data: Any) -> None:
    """Build ``model``, its compiled metrics and loss, and its optimizer's variables from
    ``data``'s element spec, as ``model.fit`` does before its first step; best effort
    (a model that cannot be built so builds on its first step)."""
    spec = getattr(data, "element_spec", None)
    build = _tf_internals.keras_symbolic_build(model)
    if spec is not None and build is not None:
        try:
            build(data_batch=spec)
        except Exception as exc:
            log.debug("fit.build_deferred", error=describe(exc))
    optimizer = model.optimizer
    if not getattr(optimizer, "built", True) and model.built:
        optimizer.build(model.trainable_variables)


def _attach_keras_state(state: Any, model: Any) -> None:
    """Make part of ``state`` what a TF checkpoint of a Keras 3 model leaves out and an
    exact resume needs: the layers' random seed generators (``Dropout``'s, ...) and the
    metrics' variables (the running means of an epoch in progress). A checkpoint
    restored earlier gives them their saved values now (a deferred restore)."""
    if state is None or getattr(state, KERAS_ATTR, None) is not None:
        return
    rng: dict[str, Any] = {}
    for generator in _tf_internals.keras_seed_generators(model):
        rng[str(len(rng))] = _backend_variable(generator.state)
    metrics = {
        str(i): _backend_variable(v)
        for i, v in enumerate(v for m in getattr(model, "metrics", ()) for v in m.variables)
    }
    held = {name: values for name, values in (("rng", rng), ("metrics", metrics)) if values}
    if held:
        setattr(state, KERAS_ATTR, held)


def _backend_variable(variable: Any) -> Any:
    """The ``tf.Variable`` behind a Keras 3 variable (itself for a TF one)."""
    return getattr(variable, "value", variable) if not isinstance(variable, tf().Variable) else variable


def _stop_evaluating(rt: Any) -> Any:
    """A Keras callback ending ``model.evaluate`` after the batch in which the session
    was asked to stop (a notice must not wait for a whole validation)."""
    import keras

    class StopEvaluating(keras.callbacks.Callback):  # type: ignore[misc]
        def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
            if rt.control.stopping:
                self.model.stop_evaluating = True

    return StopEvaluating()


def _overrides_batch(callback: Any) -> bool:
    import keras

    base = keras.callbacks.Callback
    return any(getattr(type(callback), name, None) is not getattr(base, name, None) for name in _BATCH_METHODS)
