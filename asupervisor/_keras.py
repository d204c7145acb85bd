"""The Keras front door: ``await sess.fit(model, x, y, epochs=..., ...)`` with ``model.fit``'s arguments.

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

The data becomes batches as ``model.fit`` makes them (:class:`_Inputs`): arrays through
Keras's own ``ArrayDataAdapter`` pipeline (whose position is checkpointed), a
``PyDataset`` or a list resumed at the batch index (:class:`_Batches`), a generator for
``steps_per_epoch`` batches a pass. The callbacks' state (stock callbacks' attributes, or
a callback's ``get_state()``) is written, as JSON, into a string variable of the
checkpoint before each snapshot (:meth:`KerasPart.before_snapshot`) and given back to the
session's first ``fit`` with epochs to run, after ``on_train_begin``.
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np

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
    x: Any = None,
    y: Any = None,
    *,
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
    part: KerasPart | None = None,
) -> dict[str, list[float]]:
    """See :meth:`asupervisor.Session.fit` (``sess``: the session handle; the engine
    behind it, ``sess._rt``, is what this front door drives; ``part``: the session's
    :class:`KerasPart`, which saves the callbacks' state with each checkpoint)."""
    callbacks = list(callbacks or ())
    _check_arguments(model, x, epochs, validation_freq, callbacks)
    _check_keras_arguments(
        x,
        y,
        sample_weight,
        batch_size,
        verbose,
        validation_split,
        validation_data,
        shuffle,
        class_weight,
        initial_epoch,
        steps_per_epoch,
        validation_steps,
        validation_batch_size,
    )
    if save_each_epoch is not None and not isinstance(save_each_epoch, bool):
        raise ValueError(f"save_each_epoch must be None, True or False, got {save_each_epoch!r}")
    rt = sess._rt
    inputs = _Inputs(
        x,
        y,
        sample_weight,
        batch_size,
        shuffle,
        class_weight,
        steps_per_epoch,
        validation_split,
        validation_data,
        validation_batch_size,
        validation_steps,
    )
    await rt.step_thread.call(inputs.prepare, rt)  # TensorFlow work: off the event loop
    keras_callbacks = _callback_list(model, callbacks, epochs, verbose, inputs.num_batches)
    history: dict[str, list[float]] = {}
    trainer = _Trainer(rt, model, inputs, validation_freq, keras_callbacks, history, save_each_epoch, epochs)
    if part is not None:
        part.trainer = trainer
    await rt.step_thread.call(trainer.begin, part)
    rt.fit_continues = True  # its epochs done, fit returns: a second fit, the code after it run
    try:
        await sess.run_loop(
            trainer.step,
            data=inputs.train,
            epochs=epochs,
            on_epoch_end=trainer.epoch_end,
            checkpoint_iterator=checkpoint_iterator,
        )
    finally:
        rt.fit_continues = False
        with anyio.CancelScope(shield=True):  # the session may be stopping: this is short
            await rt.step_thread.call(trainer.end)
    return history


class KerasPart(SessionPart):
    """Offers :func:`fit` to the session (``SessionAttribute.keras_fit``), so that
    ``Session.fit`` reaches this front door without the engine importing it; before each
    snapshot, writes the callbacks' state of the last ``fit`` into the checkpoint."""

    name = "keras"

    def __init__(self) -> None:
        self.trainer: _Trainer | None = None
        #: whether the callbacks' checkpointed state is still to be given back
        self.restore_pending = True
        #: the callbacks' state (JSON) in the checkpoint, made at the first fit
        self.states: Any = None

    def extra_attributes(self, ctx: SessionContext) -> Mapping[Any, Callable[[], Any]]:
        """``SessionAttribute.keras_fit``: :func:`fit`."""
        return {SessionAttribute.keras_fit: lambda: functools.partial(fit, part=self)}

    def before_snapshot(self) -> None:
        """On the step thread: the callbacks' state now, for the snapshot to come."""
        trainer = self.trainer
        if trainer is not None and self.states is not None and trainer.stateful:
            self.states.assign(trainer.encode_states())


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
        raise ValueError(
            "fit() needs data: x (arrays, with y) or a tf.data.Dataset / keras.utils.PyDataset of (x, y) batches"
        )
    for callback in callbacks:
        if type(callback).__name__ == "BackupAndRestore":
            raise ValueError(
                "fit() callbacks: remove BackupAndRestore; the supervisor checkpoints the model, the "
                "optimizer, the epoch and the data position itself and resumes exactly"
            )


def _positive(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")


def _check_keras_arguments(
    x: Any,
    y: Any,
    sample_weight: Any,
    batch_size: Any,
    verbose: Any,
    validation_split: Any,
    validation_data: Any,
    shuffle: Any,
    class_weight: Any,
    initial_epoch: Any,
    steps_per_epoch: Any,
    validation_steps: Any,
    validation_batch_size: Any,
) -> None:
    """``model.fit``'s own arguments: what ``fit`` cannot take, refused naming it and what to do."""
    for name, value in (
        ("batch_size", batch_size),
        ("steps_per_epoch", steps_per_epoch),
        ("validation_steps", validation_steps),
        ("validation_batch_size", validation_batch_size),
    ):
        _positive(name, value)
    if verbose not in ("auto", 0, 1, 2):
        raise ValueError(f'verbose must be "auto", 0, 1 or 2 (as model.fit takes), got {verbose!r}')
    if shuffle not in (True, False, "batch"):
        raise ValueError(f'shuffle must be True, False or "batch", got {shuffle!r}')
    if (
        isinstance(validation_split, bool)
        or not isinstance(validation_split, (int, float))
        or not 0.0 <= validation_split < 1.0
    ):
        raise ValueError(f"validation_split must be a float in [0, 1), got {validation_split!r}")
    if initial_epoch not in (None, 0):
        raise ValueError(
            f"fit() takes no initial_epoch (got {initial_epoch!r}): the supervisor resumes at the epoch and "
            "the batch its checkpoint reached; epochs= is absolute. Drop initial_epoch"
        )
    if class_weight is not None and not isinstance(class_weight, Mapping):
        raise ValueError(f"class_weight must be a dict {{class index: weight}}, got {class_weight!r}")
    arrays = _are_arrays(x, y)
    if not arrays and (y is not None or sample_weight is not None):
        which = "y" if y is not None else "sample_weight"
        raise ValueError(
            f"fit(): {which} is given with x of type {type(x).__name__}, which yields whole batches; "
            f"return {which} from the batches, or pass x as arrays"
        )
    if validation_split and not arrays:
        raise ValueError(
            f"validation_split={validation_split!r} splits arrays only (x is {type(x).__name__}); "
            "pass validation_data= instead"
        )
    if steps_per_epoch is not None and not _is_generator(x):
        raise ValueError(
            f"steps_per_epoch={steps_per_epoch!r} is taken with a generator only: an epoch is one pass over "
            "the arrays or the dataset (use dataset.take(n) for shorter epochs)"
        )
    if _is_generator(x) and steps_per_epoch is None:
        raise ValueError(
            "fit(): x is a generator, which ends after one pass: pass steps_per_epoch=, or use a "
            "keras.utils.PyDataset or a tf.data.Dataset (which resume exactly)"
        )
    if class_weight is not None and not arrays and not _is_tf_dataset(x):
        raise ValueError(
            f"class_weight is taken with arrays or a tf.data.Dataset; x is {type(x).__name__}: "
            "return sample weights from its batches instead"
        )
    if isinstance(validation_data, tuple) and not 2 <= len(validation_data) <= 3:
        raise ValueError(
            f"validation_data must be (x_val, y_val) or (x_val, y_val, sample_weight), "
            f"got a tuple of {len(validation_data)}"
        )


def _is_tf_dataset(x: Any) -> bool:
    return isinstance(x, tf().data.Dataset)


def _is_generator(x: Any) -> bool:
    """An iterator (a generator): it ends after one pass."""
    return hasattr(x, "__next__") and not _is_tf_dataset(x)


def _are_arrays(x: Any, y: Any) -> bool:
    """Whether ``x`` (with ``y``) are arrays ``model.fit`` batches itself: numpy arrays,
    tensors, or dicts/lists of them. A list with ``y=None`` is a list of batches."""

    def one(v: Any) -> bool:
        return isinstance(v, np.ndarray) or tf().is_tensor(v) or type(v).__module__.startswith("pandas")

    def tree(v: Any) -> bool:
        if isinstance(v, Mapping):
            return bool(v) and all(tree(e) for e in v.values())
        if isinstance(v, (list, tuple)):
            return bool(v) and all(tree(e) for e in v)
        return one(v)

    if isinstance(x, (list, tuple)) and y is None:
        return False
    return tree(x) and (y is None or tree(y))


def _callback_list(model: Any, callbacks: list[Any], epochs: int, verbose: Any, steps: int | None) -> Any:
    """Keras's ``CallbackList`` over ``callbacks``, with Keras's progress bar when
    ``verbose`` asks for one (no ``History``: ``fit`` returns the history)."""
    import keras

    return keras.callbacks.CallbackList(
        callbacks, add_history=False, add_progbar=verbose != 0, verbose=verbose, epochs=epochs, steps=steps, model=model
    )


class _Inputs:
    """``fit``'s data, turned into what ``run_loop`` iterates as ``model.fit`` turns it
    into batches: arrays through Keras's ``ArrayDataAdapter`` (its ``tf.data`` pipeline:
    the same batches and shuffle order, its position checkpointed), a ``tf.data.Dataset``
    as it is, a ``PyDataset``, a list of batches or another re-iterable as :class:`_Batches`
    (resumed at the batch index), a generator for ``steps_per_epoch`` batches a pass."""

    def __init__(
        self,
        x: Any,
        y: Any,
        sample_weight: Any,
        batch_size: int | None,
        shuffle: bool | str,
        class_weight: Mapping[int, float] | None,
        steps_per_epoch: int | None,
        validation_split: float,
        validation_data: Any,
        validation_batch_size: int | None,
        validation_steps: int | None,
    ) -> None:
        self.args: tuple[Any, ...] = (x, y, sample_weight, batch_size, shuffle, class_weight, steps_per_epoch)
        self.validation_split = validation_split
        self.validation_data = validation_data
        self.validation_batch_size = validation_batch_size or batch_size
        self.validation_steps = validation_steps
        self.train: Any = None
        self.num_batches: int | None = None
        #: (x, y, sample_weight) for ``model.evaluate``, or ``None``: no validation
        self.validation: tuple[Any, Any, Any] | None = None

    def prepare(self, rt: Any) -> None:
        """On the step thread: the training data and the validation data."""
        import keras

        x, y, sample_weight, batch_size, shuffle, class_weight, steps_per_epoch = self.args
        self.args = ()  # the arrays are held by the pipeline only
        validation_data, self.validation_data = self.validation_data, None
        if _are_arrays(x, y):
            adapters = _tf_internals.keras_data_adapters()
            if adapters is None:
                raise ValueError(
                    f"fit() batches arrays with Keras 3's data adapters, which keras {keras.__version__} lacks: "
                    "pass a tf.data.Dataset of (x, y) batches"
                )
            if self.validation_split and validation_data is None:
                (x, y, sample_weight), validation_data = adapters.array_slicing.train_validation_split(
                    (x, y, sample_weight), validation_split=self.validation_split
                )
            adapter = adapters.ArrayDataAdapter(
                x, y, sample_weight=sample_weight, class_weight=class_weight, shuffle=shuffle, batch_size=batch_size
            )
            self.train, self.num_batches = adapter.get_tf_dataset(), adapter.num_batches
        elif _is_tf_dataset(x):
            if class_weight is not None:
                adapters = _tf_internals.keras_data_adapters()
                if adapters is None:
                    raise ValueError(
                        f"class_weight needs Keras 3's data adapters, which keras {keras.__version__} lacks: "
                        "add the weights to the dataset's batches as (x, y, sample_weight)"
                    )
                x = adapters.TFDatasetAdapter(x, class_weight=class_weight).get_tf_dataset()
            self.train = x
            n = int(x.cardinality())
            self.num_batches = n if n > 0 else None
        elif _is_generator(x):
            self.train = _Generated(rt, x, int(steps_per_epoch or 0))
            self.num_batches = steps_per_epoch
        else:
            if not _reiterable(x):
                raise TypeError(
                    f"fit() x must be arrays, a tf.data.Dataset, a keras.utils.PyDataset, a list of batches "
                    f"or a generator, got {type(x).__name__}: {x!r}"
                )
            self.train = _Batches(rt, x, shuffle=bool(shuffle) and isinstance(x, keras.utils.PyDataset))
            self.num_batches = self.train.num_batches
        if validation_data is not None:
            if isinstance(validation_data, (tuple, list)) and not _batches_list(validation_data):
                self.validation = keras.utils.unpack_x_y_sample_weight(tuple(validation_data))
            else:
                self.validation = (validation_data, None, None)


def _reiterable(x: Any) -> bool:
    return hasattr(x, "__iter__") or (hasattr(x, "__getitem__") and hasattr(x, "__len__"))


def _batches_list(value: Any) -> bool:
    """A list of ``(x, y)`` batches (not a ``(x_val, y_val)`` pair of arrays)."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, tuple) for v in value)


class _Batches:
    """A re-iterable over a ``PyDataset``, a list of batches, a ``Sequence`` or another
    re-iterable, which starts each pass at the batch the epoch has reached (a resumed
    run goes on at the batch after the checkpoint's, not at batch 0). A ``PyDataset``
    with ``shuffle`` takes its batches in an order drawn from a seed kept with the
    callbacks' state and the epoch (the same order after a resume); its
    ``on_epoch_begin``/``on_epoch_end`` are called as Keras calls them."""

    def __init__(self, rt: Any, data: Any, *, shuffle: bool) -> None:
        self.rt = rt
        self.data = data
        self.num_batches = self._length()
        self.indexed = hasattr(data, "__getitem__") and self.num_batches is not None
        self.shuffle = shuffle and self.indexed
        self.seed = random.getrandbits(31)  # a resumed run's is the checkpointed one
        self.py_dataset = callable(getattr(data, "on_epoch_end", None))
        self._open = False

    def _length(self) -> int | None:
        n = getattr(self.data, "num_batches", None)
        if n is None and hasattr(self.data, "__len__"):
            n = len(self.data)
        return n

    def __iter__(self) -> Iterator[Any]:
        return self._pass()

    def _pass(self) -> Iterator[Any]:
        # A generator: this body runs at the first next(), once the pass has begun.
        counter = self.rt.epoch_counter
        start = self.rt.step - counter.first_step
        if start:
            log.info("fit.batches_resumed", epoch=counter.epoch, batch=start)
        if self.py_dataset and not self._open:
            self.data.on_epoch_begin()
            self._open = True
        if self.indexed:
            n = int(self.num_batches or 0)
            order: Any = range(n)
            if self.shuffle:
                order = np.random.default_rng([self.seed, counter.epoch]).permutation(n).tolist()
            for i in itertools.islice(order, start, None):
                yield _standardize(self.data[i])
        else:
            yield from (_standardize(b) for b in itertools.islice(iter(self.data), start, None))
        self.epoch_end()

    def epoch_end(self) -> None:
        """The ``PyDataset``'s ``on_epoch_end``, once per pass begun."""
        if self.py_dataset and self._open:
            self._open = False
            self.data.on_epoch_end()


class _Generated:
    """A generator as ``model.fit`` takes it: ``steps_per_epoch`` batches a pass, all
    from the one generator. It cannot be rewound: a resumed run starts it from its
    beginning (logged ``fit.generator_restarted``, a warning), not at the batch reached."""

    def __init__(self, rt: Any, generator: Iterator[Any], steps: int) -> None:
        self.rt = rt
        self.generator = generator
        self.steps = steps
        self.num_batches = steps
        self._first = True

    def __iter__(self) -> Iterator[Any]:
        return self._pass()

    def _pass(self) -> Iterator[Any]:
        counter = self.rt.epoch_counter
        done = self.rt.step - counter.first_step
        first, self._first = self._first, False
        if first and self.rt.step:  # a resumed run (or a later fit): the generator from its start
            log.warning(
                "fit.generator_restarted",
                step=self.rt.step,
                epoch=counter.epoch,
                hint="a generator cannot be rewound: a resumed run starts it again from its first batch; "
                "a keras.utils.PyDataset or a tf.data.Dataset resumes at the batch reached",
            )
        for batch in itertools.islice(self.generator, max(self.steps - done, 0)):
            yield _standardize(batch)


def _standardize(batch: Any) -> Any:
    """A batch as ``train_step`` takes it: a tuple ``(x, y[, sample_weight])``."""
    return tuple(batch) if isinstance(batch, list) else batch


# -- the callbacks' state, saved with each checkpoint ------------------------------------

#: the state of Keras's stock callbacks: {class name: attributes}
_STOCK_STATE: dict[str, tuple[str, ...]] = {
    "EarlyStopping": ("wait", "stopped_epoch", "best", "best_epoch", "best_weights"),
    "ReduceLROnPlateau": ("best", "wait", "cooldown_counter"),
    "ModelCheckpoint": ("best", "_current_epoch", "_batches_seen_since_last_saving", "_last_batch_seen"),
    "LearningRateScheduler": (),  # its learning rate is the optimizer's, checkpointed
    "TerminateOnNaN": (),
}


def _own_state(callback: Any) -> bool:
    return callable(getattr(callback, "get_state", None)) and callable(getattr(callback, "set_state", None))


def _stock(callback: Any) -> tuple[str, ...] | None:
    """The attributes of a stock Keras callback's state; ``None`` for another callback."""
    for cls in type(callback).__mro__:
        if cls.__name__ in _STOCK_STATE and cls.__module__.startswith("keras"):
            return _STOCK_STATE[cls.__name__]
    return None


def _stateful(callback: Any) -> bool:
    """Whether ``callback`` takes part in the checkpoint: a stock one, or one defining
    ``get_state()`` and ``set_state(state)``."""
    return _own_state(callback) or _stock(callback) is not None


def _get_state(callback: Any) -> Any:
    if _own_state(callback):
        return callback.get_state()
    return {name: getattr(callback, name, None) for name in _stock(callback) or ()}


def _set_state(callback: Any, state: Any) -> None:
    if _own_state(callback):
        callback.set_state(state)
        return
    for name, value in state.items():
        setattr(callback, name, value)


def _to_json(value: Any) -> Any:
    """``json.dumps``'s ``default``: numpy scalars and arrays (``best_weights``)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        data = base64.b64encode(np.ascontiguousarray(value).tobytes()).decode()
        return {"__ndarray__": data, "dtype": str(value.dtype), "shape": list(value.shape)}
    if tf().is_tensor(value):
        return _to_json(np.asarray(value))
    raise TypeError(f"a callback's state must be JSON-able (numbers, strings, lists, dicts, arrays), got {value!r}")


def _from_json(value: dict[str, Any]) -> Any:
    if "__ndarray__" in value:
        array = np.frombuffer(base64.b64decode(value["__ndarray__"]), dtype=value["dtype"])
        return array.reshape(value["shape"]).copy()
    return value


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
        inputs: _Inputs,
        validation_freq: int,
        callbacks: Any,
        history: dict[str, list[float]],
        save_each_epoch: bool | None = None,
        epochs: int = 0,
    ) -> None:
        self.rt = rt
        self.epochs = epochs
        self.model = model
        self.inputs = inputs
        self.validation_freq = validation_freq
        self.callbacks = callbacks
        self.history = history
        self.save_each_epoch = save_each_epoch
        self.step: Callable[[Any], Any] = self._train
        self._train_fn: Callable[[Any], Any] | None = None
        self._writers: dict[str, Any] = {}
        self._logs: dict[str, float] = {}
        self._stateful = [(i, c) for i, c in enumerate(callbacks.callbacks) if _stateful(c)]
        batches = inputs.train
        self._seeded = batches if isinstance(batches, _Batches) and batches.shuffle else None
        #: whether a snapshot records the callbacks' state (or the data's seed)
        self.stateful = bool(self._stateful) or self._seeded is not None
        self._begun = -1  # the epoch whose on_epoch_begin the stateful callbacks had

    # -- step thread ---------------------------------------------------------------

    def begin(self, part: KerasPart | None) -> None:
        """Before the first step: check the model is checkpointed, build it and its
        optimizer (so a restored checkpoint's values land in them now, not inside a
        traced function), reset the metrics at the start of an epoch, start callbacks
        and give them back their checkpointed state."""
        rt, model = self.rt, self.model
        if rt.state is not None and not _in_state(rt.state, model):
            raise ValueError(
                f"fit(): the model {model.name!r} is not in the supervisor's state, so it would be neither "
                "saved nor restored; pass state={'model': model} to the Supervisor"
            )
        _build(model, self.inputs.train)
        states = _attach_keras_state(rt.state, model, part)
        fn = model.train_step
        if not model.run_eagerly:
            fn = tf().function(fn, reduce_retracing=True, jit_compile=bool(model.jit_compile))
        self._train_fn = fn
        counter = rt.epoch_counter
        counter.attach(rt.state, rt.step, consume=False)  # run_loop's attach begins a new pass if need be
        if rt.step == counter.first_step:  # at an epoch's start: the metrics count from here
            model.reset_metrics()
        model.stop_training = False
        if any(_overrides_batch(c) for c in self.callbacks.callbacks):
            self.step = self._train_with_batch_callbacks
        self.callbacks.on_train_begin()
        begun = -1
        if part is None or (part.restore_pending and counter.epoch < self.epochs):
            # the session's first fit with epochs to run: its callbacks go on from the
            # checkpoint (a later fit's are reset by on_train_begin, as model.fit's are)
            begun = self._restore_states(states)
            if part is not None:
                part.restore_pending = False
        if counter.epoch >= self.epochs:  # its epochs were done (a resumed run): no epoch begins
            return
        for index, callback in enumerate(self.callbacks.callbacks):
            if begun == counter.epoch and any(i == index for i, _ in self._stateful):
                continue  # its on_epoch_begin ran before the checkpoint: its effect is restored
            callback.on_epoch_begin(counter.epoch, {})
        self._begun = counter.epoch

    def encode_states(self) -> str:
        """The callbacks' state (and the data's shuffle seed) as JSON, for a checkpoint."""
        record: dict[str, Any] = {
            "begun": self._begun,
            "callbacks": {f"{i}:{type(c).__name__}": _get_state(c) for i, c in self._stateful},
        }
        if self._seeded is not None:
            record["seed"] = self._seeded.seed
        return json.dumps(record, default=_to_json)

    def _restore_states(self, states: Any) -> int:
        """The callbacks' checkpointed state given back (after their ``on_train_begin``,
        which resets it); the epoch whose ``on_epoch_begin`` they had had (-1: none)."""
        text = states.numpy().decode() if states is not None else ""
        if not text:
            return -1
        record = json.loads(text, object_hook=_from_json)
        if self._seeded is not None and "seed" in record:
            self._seeded.seed = int(record["seed"])
        saved = record.get("callbacks", {})
        for i, callback in self._stateful:
            key = f"{i}:{type(callback).__name__}"
            if key in saved:
                _set_state(callback, saved[key])
            else:
                log.warning("fit.callback_state_missing", callback=key)
        return int(record.get("begun", -1))

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
        rt, model, inputs = self.rt, self.model, self.inputs
        logs = float_entries(model.get_metrics_result() or {})
        validated = inputs.validation is not None and (epoch + 1) % self.validation_freq == 0
        if validated:
            val_x, val_y, val_w = inputs.validation  # type: ignore[misc]
            stopper = _stop_evaluating(rt)  # a stop ends the validation after the batch in flight
            stopper.set_model(model)
            self.callbacks.callbacks.append(stopper)
            try:
                val = model.evaluate(
                    x=val_x,
                    y=val_y,
                    sample_weight=val_w,
                    batch_size=inputs.validation_batch_size,
                    steps=inputs.validation_steps,
                    callbacks=self.callbacks,
                    return_dict=True,
                )
            finally:
                self.callbacks.callbacks.remove(stopper)
            if rt.control.stopping:  # cut short by a stop: no val_* metrics of part of the data
                log.info("fit.validation_stopped", epoch=epoch + 1, step=rt.step, reason=rt.control.reason)
                validated = False
            else:
                logs.update({f"val_{name}": value for name, value in float_entries(val or {}).items()})
        rt.epoch_logs = (rt.step, dict(logs))
        for callback in self.callbacks.callbacks:  # one dict: ReduceLROnPlateau adds learning_rate
            callback.on_epoch_end(epoch, logs)
        logs = float_entries(logs)
        for name, value in logs.items():
            self.history.setdefault(name, []).append(value)
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
        if not rt.control.stopping and (counter.epochs is None or counter.epoch < counter.epochs):
            self.callbacks.on_epoch_begin(counter.epoch)
            self._begun = counter.epoch

    def end(self) -> None:
        """After the loop (whatever ended it): ``on_train_end`` and the writers closed."""
        try:
            if isinstance(self.inputs.train, _Batches):
                self.inputs.train.epoch_end()
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
    if spec is None and isinstance(data, _Batches) and data.indexed and data.num_batches:
        tf_ = tf()
        spec = tf_.nest.map_structure(
            lambda v: tf_.TensorSpec((None, *np.shape(v)[1:]), tf_.as_dtype(np.asarray(v).dtype)),
            _standardize(data.data[0]),
        )
    build = _tf_internals.keras_symbolic_build(model)
    if spec is not None and build is not None:
        try:
            build(data_batch=spec)
        except Exception as exc:
            log.debug("fit.build_deferred", error=describe(exc))
    optimizer = model.optimizer
    if not getattr(optimizer, "built", True) and model.built:
        optimizer.build(model.trainable_variables)


def _attach_keras_state(state: Any, model: Any, part: KerasPart | None = None) -> Any:
    """Make part of ``state`` what a TF checkpoint of a Keras 3 model leaves out and an
    exact resume needs: the layers' random seed generators (``Dropout``'s, ...), the
    metrics' variables (the running means of an epoch in progress) and the callbacks'
    state (a string variable the ``part`` fills before each snapshot). A checkpoint
    restored earlier gives them their saved values now (a deferred restore). Returns
    the callbacks' state variable (``None`` without a state or a part)."""
    if state is None:
        return None
    if getattr(state, KERAS_ATTR, None) is not None:
        return part.states if part is not None else None
    rng: dict[str, Any] = {}
    for generator in _tf_internals.keras_seed_generators(model):
        rng[str(len(rng))] = _backend_variable(generator.state)
    metrics = {
        str(i): _backend_variable(v)
        for i, v in enumerate(v for m in getattr(model, "metrics", ()) for v in m.variables)
    }
    held: dict[str, Any] = {name: values for name, values in (("rng", rng), ("metrics", metrics)) if values}
    if part is not None:
        if part.states is None:
            tf_ = tf()
            part.states = tf_.Variable(b"", dtype=tf_.string, trainable=False, name="asv_keras_callbacks")
        held["callbacks"] = part.states
    if held:
        setattr(state, KERAS_ATTR, held)
    return part.states if part is not None else None


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
