"""Every TensorFlow and Keras private name asupervisor uses, in one place.

A leaf (nothing of ours but ``_exceptions``); TensorFlow is imported inside functions
only. Each private name sits behind one small function below, checked where it is used
(a ``getattr`` or an import: cheap; a module once imported is cached by Python), and
each has a fallback when a TensorFlow release removes or renames it: a public-API path
(slower or less informative), or a :class:`~asupervisor.CheckpointError` naming the
TensorFlow version and the missing name. The first time a name is found missing it is
logged (``asupervisor.tf_internals``, a warning), once. :data:`INTERNALS` lists them;
``tests/test_tf_internals.py`` checks that each resolves on the installed TensorFlow and
that each fallback works (:func:`hide` makes a name look missing).

Name (as TF spells it) — fallback when missing:

- ``TrackableSaver._gather_serialized_tensors`` (TF's serialising walk of the object
  graph) — a public ``tf.train.Checkpoint.write`` to a temporary directory, read back
  with ``tf.raw_ops.RestoreV2`` (a disk round trip per snapshot, on the step thread).
- ``TrackableSaver._graph_view`` with ``ObjectGraphView.breadth_first_traversal`` (the
  walk with paths, for the walk cache) — no walk cache: every snapshot walks in full.
- ``ObjectGraphView._breadth_first_traversal`` (objects of the graph) — the public
  ``tf.train.TrackableView(root).descendants()``.
- ``Trackable._trackable_children`` — the public ``tf.train.TrackableView.children``.
- ``saveable_object_util.trackable_has_serialize_to_tensor`` and
  ``Trackable._gather_saveables_for_checkpoint`` (does an object hold values) — "not
  sure": a restore compares the checkpoint with the model key by key (slower).
- ``saveable_object_util.SaveableCompatibilityConverter`` — none recognised: a
  ``tf.distribute`` variable's key is compared by its own object; no walk cache for it.
- ``saveable_object.SaveSpec`` — recognised by its attributes (``tensor``, ``slice_spec``).
- ``Checkpoint._maybe_create_save_counter`` — the public ``Checkpoint.save_counter``.
- ``CheckpointLoadStatus._checkpoint`` (what a restore deferred) — nothing known to be
  deferred: those values are not checked at start-up (TF still restores them).
- ``Trackable._self_unconditional_deferred_dependencies`` and
  ``Optimizer._deferred_slot_restorations`` — a failed restore's deferred values are not
  dropped (logged).
- ``_CheckpointRestoreCoordinator`` (a restore in progress, found in a failed restore's
  traceback) — TF warns "Value in checkpoint could not be found" for each value of a
  failed restore when it is freed.
- ``Trackable._checkpoint_dependencies`` / ``_delete_tracking`` — plain ``delattr``
  (``AutoTrackable.__delattr__`` untracks).
- ``Trackable._serialize_to_tensors`` (a ``tf.data`` iterator's position) — the position
  is tested by a public ``tf.train.Checkpoint(iterator=...).write`` to a temporary
  directory; no walk cache for a state with an iterator.
- ``EagerTensor._numpy`` / ``_datatype_enum`` / ``_shape_tuple`` — the public
  ``numpy()`` (a copy), ``dtype`` and ``shape``.
- ``resource_variable_ops.ResourceVariable`` / ``UninitializedVariable`` and
  ``polymorphic_function.UnliftedInitializerVariable`` (variables read directly) — none:
  every variable is read by TF's own closure (5 ops instead of 2), no walk cache.
- ``BaseResourceVariable._caching_device``, a Keras 3 variable's ``_value``,
  ``distribute.values.DistributedVariable`` / ``MirroredVariable`` and
  ``MirroredVariable._primary`` — the variable is read by TF's own closure.
- ``iterator_ops.OwnedIterator`` — no walk cache for a state with an iterator.
- ``eager.context.context`` (the coordination service) — no cluster-wide stop (logged).
- ``DatasetV2._inputs`` / ``_batch_size`` (a pipeline's description) — the description
  stops at the last stage / omits the batch size.
- Keras 3 ``Model._symbolic_build`` — the model builds at its first step, as Keras does.
- Keras 3 ``keras.src.trainers.data_adapters`` (``ArrayDataAdapter``, ``TFDatasetAdapter``,
  ``array_slicing``: how ``model.fit`` batches arrays) — ``sess.fit`` refuses arrays,
  ``validation_split`` and ``class_weight`` with a ``tf.data.Dataset``, naming the version.
- Keras 3 ``Layer._flatten_layers`` / ``_seed_generators`` — the layers and seed
  generators are found by a walk of the layers' attributes (public ``keras.layers.Layer``,
  ``keras.random.SeedGenerator``).
- ``tensorflow.core.protobuf.tensor_bundle_pb2``, ``tensorflow.core.framework.versions_pb2``,
  ``tensorflow.core.protobuf.trackable_object_graph_pb2``,
  ``tensorflow.python.training.checkpoint_state_pb2`` (file formats) — no fallback: a
  :class:`CheckpointError` naming the TensorFlow version and the module.

TensorFlow's generated op wrappers are not used: ``tf.raw_ops`` is their public face.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ._exceptions import CheckpointError

__all__ = ["INTERNALS", "Internal", "hide", "resolves"]

log = logging.getLogger("asupervisor.tf_internals")

#: the TensorFlow releases this version of asupervisor is tested on (``make test-matrix``)
SUPPORTED = "TensorFlow 2.16 to 2.21"


@dataclass(frozen=True)
class Internal:
    """One private name: ``name`` as TF spells it, ``used_for`` and its ``fallback``."""

    name: str
    used_for: str
    fallback: str
    probe: Callable[[], Any]  # resolves it on the installed TensorFlow/Keras; raises if missing


def _tf() -> Any:
    module = sys.modules.get("tensorflow")
    if module is None:
        import tensorflow

        module = tensorflow
    return module


def _tempdir(prefix: str) -> Any:
    import tempfile  # not at import: ``import asupervisor`` stays light

    return tempfile.TemporaryDirectory(prefix=prefix)


def _version() -> str:
    return str(getattr(sys.modules.get("tensorflow"), "__version__", "(not imported)"))


_hidden: set[str] = set()  # names made to look missing (hide(), for tests)
_noted: set[str] = set()  # names found missing, logged once


def _note(name: str) -> None:
    if name not in _noted:
        _noted.add(name)
        entry = _BY_NAME.get(name)
        log.warning(
            "TensorFlow %s has no %s; asupervisor falls back to: %s",
            _version(),
            name,
            entry.fallback if entry else "(none)",
        )


def _missing(name: str) -> CheckpointError:
    """The error when a name without a fallback is missing."""
    entry = _BY_NAME.get(name)
    what = f" ({entry.used_for})" if entry else ""
    return CheckpointError(
        f"TensorFlow {_version()} has no {name}{what}, which asupervisor needs; asupervisor supports {SUPPORTED}"
    )


def _attr(name: str, obj: Any, attr: str) -> Any:
    """``obj.<attr>`` (the private name ``name``), or ``None`` when ``obj`` has none or the
    name is hidden (noted). Many objects lack it by nature: the callers handle ``None``."""
    if name in _hidden:
        _note(name)
        return None
    return getattr(obj, attr, None)


def _module(name: str) -> Any:
    """The module ``name``, or ``None`` when missing (noted)."""
    if name in _hidden:
        _note(name)
        return None
    module = sys.modules.get(name)
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        return module  # loaded: no import lock needed (one another thread is still loading is not)
    try:
        return importlib.import_module(name)
    except ImportError:
        _note(name)
        return None


def _member(name: str, module: str, attr: str) -> Any:
    """``module.attr`` (the private name ``name``), or ``None`` when missing (noted)."""
    mod = _module(module) if name not in _hidden else None
    value = getattr(mod, attr, None)
    if value is None:
        _note(name)
    return value


@contextlib.contextmanager
def hide(*names: str) -> Iterator[None]:
    """Make ``names`` look missing within the block (what a TF upgrade removing them does)."""
    unknown = [n for n in names if n not in _BY_NAME]
    if unknown:
        raise KeyError(f"not a private name asupervisor uses: {unknown}")
    added = set(names) - _hidden
    _hidden.update(added)
    try:
        yield
    finally:
        _hidden.difference_update(added)
        _noted.difference_update(added)


# ---------------------------------------------------------------------------------------
# the checkpoint's object graph

GATHER = "TrackableSaver._gather_serialized_tensors"
GRAPH_VIEW = "TrackableSaver._graph_view.breadth_first_traversal"
TRAVERSAL = "ObjectGraphView._breadth_first_traversal"
CHILDREN = "Trackable._trackable_children"
HAS_SERIALIZE = "saveable_object_util.trackable_has_serialize_to_tensor"
GATHER_SAVEABLES = "Trackable._gather_saveables_for_checkpoint"
CONVERTER = "saveable_object_util.SaveableCompatibilityConverter"
SAVE_SPEC = "saveable_object.SaveSpec"
SAVE_COUNTER = "Checkpoint._maybe_create_save_counter"
LOAD_STATUS = "CheckpointLoadStatus._checkpoint"
DEFERRED = "Trackable._self_unconditional_deferred_dependencies"
DEFERRED_SLOTS = "Optimizer._deferred_slot_restorations"
COORDINATOR = "checkpoint._CheckpointRestoreCoordinator"
DEPENDENCIES = "Trackable._checkpoint_dependencies"
SERIALIZE = "Trackable._serialize_to_tensors"

_SAVEABLE_UTIL = "tensorflow.python.training.saving.saveable_object_util"


def _saver(checkpoint: Any) -> Any:
    return checkpoint.__dict__.get("_saver") if hasattr(checkpoint, "__dict__") else None


def gather_serialized_tensors(checkpoint: Any) -> tuple[dict[Any, dict[str, Any]], bool, Any]:
    """TF's walk of ``checkpoint``'s object graph: ``({trackable: {key: value}}, whether
    some object has a registered saver, the object-graph proto)``; the proto's tensor sits
    under ``None``.

    Fallback (``TrackableSaver._gather_serialized_tensors`` missing): the public
    ``checkpoint.write`` to a temporary directory, every value read back (public
    ``tf.raw_ops.RestoreV2``), all under ``None`` (no per-object entries).
    """
    gather = _attr(GATHER, _saver(checkpoint), "_gather_serialized_tensors")
    if gather is not None:
        serialized, _, registered, proto = gather(None)
        return serialized, bool(registered), proto
    return {None: _written_values(checkpoint, GATHER)}, False, None


def _written_values(trackable: Any, name: str) -> dict[str, Any]:
    """Every value of ``trackable`` as a public ``tf.train.Checkpoint.write`` saves it."""
    tf = _tf()
    try:
        with _tempdir(prefix="asv-tf-fallback-") as tmp:
            checkpoint = trackable if isinstance(trackable, tf.train.Checkpoint) else tf.train.Checkpoint(obj=trackable)
            path = checkpoint.write(os.path.join(tmp, "ckpt"))
            dtypes = sorted(tf.train.load_checkpoint(path).get_variable_to_dtype_map().items())
            with tf.device("/cpu:0"):  # RestoreV2 reads every kind (an iterator's is a variant)
                tensors = tf.raw_ops.RestoreV2(
                    prefix=path,
                    tensor_names=[key for key, _ in dtypes],
                    shape_and_slices=[""] * len(dtypes),
                    dtypes=[dtype for _, dtype in dtypes],
                )
            return {key: tensor for (key, _), tensor in zip(dtypes, tensors)}
    except AttributeError as exc:  # TF's own write needs what is missing
        raise _missing(name) from exc


def breadth_first_traversal_with_paths(checkpoint: Any) -> tuple[list[Any], dict[Any, Any]] | None:
    """TF's breadth-first walk of ``checkpoint``: ``(objects, {object: path of refs})``;
    ``None`` when missing (fallback: the caller keeps no walk cache)."""
    view = _attr(GRAPH_VIEW, _saver(checkpoint), "_graph_view")
    walk = None if view is None else _attr(GRAPH_VIEW, view, "breadth_first_traversal")
    if walk is None:
        return None
    objects, paths = walk()
    return list(objects), paths


def graph_objects(checkpoint: Any) -> list[Any]:
    """Every object of ``checkpoint``'s graph, root first (TF's breadth-first walk).

    Fallback: the public ``tf.train.TrackableView(checkpoint).descendants()``.
    """
    view = _attr(TRAVERSAL, _saver(checkpoint), "_graph_view")
    walk = None if view is None else _attr(TRAVERSAL, view, "_breadth_first_traversal")
    if walk is not None:
        objects, _ = walk()
        return list(objects)
    return list(_tf().train.TrackableView(checkpoint).descendants())


def trackable_children(obj: Any) -> dict[str, Any]:
    """``{local name: child}`` of a trackable as a checkpoint sees them; raises
    ``AttributeError``/``TypeError`` for anything else.

    Fallback: the public ``tf.train.TrackableView.children(obj)``.
    """
    children = _attr(CHILDREN, obj, "_trackable_children")
    if children is not None:
        return dict(children(save_type="checkpoint"))
    if "tensorflow" not in sys.modules:
        raise AttributeError(f"{type(obj).__name__} is not trackable")
    return dict(_tf().train.TrackableView.children(obj))


def is_trackable(value: object) -> bool:
    """Whether ``value`` is a TF trackable (variables, Keras 3 objects, ``tf.Module``,
    iterators, ...), without importing TensorFlow (none is unless it is imported).

    Fallback: ``tf.train.TrackableView.children(value)`` succeeds (public).
    """
    if CHILDREN not in _hidden and callable(getattr(type(value), "_trackable_children", None)):
        return True
    if "tensorflow" not in sys.modules or isinstance(value, (str, bytes, int, float, bool, type(None))):
        return False
    try:
        _tf().train.TrackableView.children(value)
    except Exception:
        return False
    return True


def holds_own_values(obj: Any) -> bool | None:
    """Whether ``obj`` saves values of its own (TF's test in its walk); ``None``: not
    known (fallback: the caller compares key by key)."""
    has = _member(HAS_SERIALIZE, _SAVEABLE_UTIL, "trackable_has_serialize_to_tensor")
    gather = _attr(GATHER_SAVEABLES, obj, "_gather_saveables_for_checkpoint") if has is not None else None
    if has is None or gather is None:
        return None
    return bool(has(obj) or gather())


def unwrap_converted(obj: Any) -> Any:
    """The object behind TF's ``SaveableCompatibilityConverter`` wrapper (``obj`` itself
    if it is not one). Fallback: ``obj`` (no wrapper recognised)."""
    converter = _member(CONVERTER, _SAVEABLE_UTIL, "SaveableCompatibilityConverter")
    return getattr(obj, "obj", obj) if converter is not None and isinstance(obj, converter) else obj


def converted_object(obj: Any) -> Any:
    """The object ``obj`` wraps when it is exactly a ``SaveableCompatibilityConverter``;
    else ``None`` (and always ``None`` in the fallback)."""
    converter = _member(CONVERTER, _SAVEABLE_UTIL, "SaveableCompatibilityConverter")
    return obj.obj if converter is not None and type(obj) is converter else None


def save_spec_tensor(value: Any) -> Any:
    """The tensor of a legacy ``SaveSpec`` (read now), or ``value`` itself if it is not one.

    Fallback: recognised by its attributes (``tensor`` and ``slice_spec``).
    """
    spec = _member(SAVE_SPEC, "tensorflow.python.training.saving.saveable_object", "SaveSpec")
    if spec is not None:
        return value.tensor if isinstance(value, spec) else value
    if hasattr(value, "slice_spec") and hasattr(type(value), "tensor"):
        return value.tensor
    return value


def create_save_counter(checkpoint: Any) -> Any:
    """``checkpoint.save_counter``, created if it is not yet, for a ``tf.train.Checkpoint``;
    ``None`` for another state. Fallback: the public ``save_counter`` property."""
    create = _attr(SAVE_COUNTER, checkpoint, "_maybe_create_save_counter")
    if create is not None:
        create()
        return checkpoint.save_counter
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(checkpoint, tf.train.Checkpoint):
        try:
            return checkpoint.save_counter  # public; creates it
        except AttributeError as exc:  # TF's own property needs what is missing
            raise _missing(SAVE_COUNTER) from exc
    return None


def maybe_create_save_counter(checkpoint: Any) -> None:
    """Create ``checkpoint.save_counter`` if it has none (as TF's restore does)."""
    create_save_counter(checkpoint)


def restore_coordinator(status: Any) -> tuple[Any, Any] | None:
    """``(object graph proto, matched node ids)`` of a restore's status, or ``None``
    (fallback: nothing known to be deferred)."""
    coordinator = _attr(LOAD_STATUS, status, "_checkpoint")
    graph = getattr(coordinator, "object_graph_proto", None)
    matched = getattr(coordinator, "matched_proto_ids", None)
    return None if graph is None or matched is None else (graph, matched)


def deferred_restorations(obj: Any) -> tuple[Any, Any]:
    """``(obj's deferred dependencies {name: [positions]}, a TF1 optimizer's deferred slot
    restorations)``, each ``None`` when absent (fallback: not dropped)."""
    deps = _attr(DEFERRED, obj, "_self_unconditional_deferred_dependencies")
    slots = _attr(DEFERRED_SLOTS, obj, "_deferred_slot_restorations")
    return deps, slots


def quiet_failed_restore(traceback: TracebackType | None) -> None:
    """Mark the restores that a failed ``tf.train.Checkpoint.restore`` left in the frames
    of ``traceback`` as partial, as ``status.expect_partial()`` does: otherwise TF logs a
    "Value in checkpoint could not be found" warning for each value when they are freed,
    about a restore that failed and was reported already. Fallback: TF's warnings."""
    coordinator: Any = _member(COORDINATOR, _CK, "_CheckpointRestoreCoordinator")
    if coordinator is None:
        return
    while traceback is not None:
        for value in list(traceback.tb_frame.f_locals.values()):
            if isinstance(value, coordinator):
                value.expect_partial = True
        traceback = traceback.tb_next


def untrack(checkpoint: Any, name: str) -> None:
    """Remove attribute ``name`` from ``checkpoint`` and from what it saves.

    Fallback (no ``_checkpoint_dependencies``/``_delete_tracking``): ``delattr`` alone,
    which ``AutoTrackable.__delattr__`` untracks.
    """
    if name in vars(checkpoint):
        delattr(checkpoint, name)
    deps = _attr(DEPENDENCIES, checkpoint, "_checkpoint_dependencies")
    delete = _attr(DEPENDENCIES, checkpoint, "_delete_tracking") if deps is not None else None
    if delete is not None and any(ref.name == name for ref in deps):
        delete(name)


def serialize_iterator(iterator: Any) -> Any:
    """``iterator._serialize_to_tensors`` (a ``tf.data`` iterator's position, one op), or
    ``None`` when missing or not an iterator (the caller's fallback)."""
    return _attr(SERIALIZE, iterator, "_serialize_to_tensors")


def serialize_iterator_public(iterator: Any) -> None:
    """Fallback of :func:`serialize_iterator` to test that a position can be saved: a
    public ``tf.train.Checkpoint(iterator=iterator).write`` to a temporary directory."""
    _note(SERIALIZE)
    tf = _tf()
    with _tempdir(prefix="asv-tf-fallback-") as tmp:
        tf.train.Checkpoint(iterator=iterator).write(os.path.join(tmp, "ckpt"))


def has_serialize(obj: Any) -> bool:
    """Whether ``obj`` saves through ``_serialize_to_tensors`` (fallback: ``False``: no fast path)."""
    return SERIALIZE not in _hidden and hasattr(obj, "_serialize_to_tensors")


# ---------------------------------------------------------------------------------------
# tensors and variables

EAGER_NUMPY = "EagerTensor._numpy"
EAGER_DTYPE = "EagerTensor._datatype_enum"
EAGER_SHAPE = "EagerTensor._shape_tuple"
PLAIN_VARIABLES = "resource_variable_ops.ResourceVariable"
UNINITIALIZED_VARIABLE = "resource_variable_ops.UninitializedVariable"
UNLIFTED_VARIABLE = "polymorphic_function.UnliftedInitializerVariable"
CACHING_DEVICE = "BaseResourceVariable._caching_device"
KERAS_VALUE = "keras.Variable._value"
DISTRIBUTED = "distribute.values.DistributedVariable"
MIRRORED = "distribute.values.MirroredVariable"
PRIMARY = "MirroredVariable._primary"
OWNED_ITERATOR = "iterator_ops.OwnedIterator"
CONTEXT = "eager.context.context"
DATASET_INPUTS = "DatasetV2._inputs"
DATASET_BATCH = "BatchDataset._batch_size"

_EAGER = frozenset({EAGER_NUMPY, EAGER_DTYPE, EAGER_SHAPE})
_RVO = "tensorflow.python.ops.resource_variable_ops"
_VALUES = "tensorflow.python.distribute.values"


def numpy_view(tensor: Any) -> Any:
    """A CPU tensor's own buffer as an array, no copy (``EagerTensor._numpy``).
    Fallback: the public ``tensor.numpy()`` (a copy)."""
    view = _attr(EAGER_NUMPY, tensor, "_numpy")
    return view() if view is not None else tensor.numpy()


def fast_stageable(value: Any, plain_dtypes: frozenset[int] | set[int]) -> bool:
    """Whether ``value`` is a plain-numbered tensor of rank >= 1 on the CPU.

    EagerTensor's own accessors skip building ``DType`` and ``TensorShape`` objects (~2 us
    a variable otherwise). Fallback: the public ``dtype``, ``shape`` and ``numpy``.
    """
    if not _hidden or not _hidden & _EAGER:
        if getattr(value, "_numpy", None) is None:
            return False
        dtype_enum = getattr(value, "_datatype_enum", None)
        shape_tuple = getattr(value, "_shape_tuple", None)
        if dtype_enum is not None and shape_tuple is not None:
            return dtype_enum() in plain_dtypes and len(shape_tuple()) > 0 and "CPU" in value.device
    for name in (EAGER_NUMPY, EAGER_DTYPE, EAGER_SHAPE):
        if name in _hidden:
            _note(name)
    if getattr(value, "numpy", None) is None or not hasattr(value, "device"):
        return False
    try:
        return value.dtype.as_datatype_enum in plain_dtypes and (value.shape.rank or 0) > 0 and "CPU" in value.device
    except Exception:  # a symbolic tensor, or something else
        return False


def plain_variable_types() -> dict[type, bool]:
    """``{variable class: whether it may be uninitialised}`` for the variables a snapshot
    reads directly (2 ops). Fallback: ``{}``: every variable is read by TF's own closure."""
    plain: dict[type, bool] = {}
    rv = _member(PLAIN_VARIABLES, _RVO, "ResourceVariable")
    if rv is None:
        return plain
    plain[rv] = False
    uninit = _member(UNINITIALIZED_VARIABLE, _RVO, "UninitializedVariable")
    if uninit is not None:
        plain[uninit] = True
    unlifted = _member(
        UNLIFTED_VARIABLE,
        "tensorflow.python.eager.polymorphic_function.polymorphic_function",
        "UnliftedInitializerVariable",
    )
    if unlifted is not None:
        plain[unlifted] = True
    return plain


def resource_variable_type() -> Any:
    """TF's ``ResourceVariable`` class (``type(tf.Variable(...))`` eagerly), or ``None``."""
    rv = _member(PLAIN_VARIABLES, _RVO, "ResourceVariable")
    return rv if isinstance(rv, type) else None


def caching_device(variable: Any) -> Any:
    """A variable's caching device. Fallback: ``"unknown"`` (truthy: the variable takes
    TF's own path)."""
    if CACHING_DEVICE in _hidden:
        _note(CACHING_DEVICE)
        return "unknown"
    return getattr(variable, "_caching_device", "unknown")


def keras_inner_variable(obj: Any) -> Any:
    """The backend variable a Keras 3 variable wraps (``_value``), or ``None``
    (fallback: the variable takes TF's own path)."""
    return _attr(KERAS_VALUE, obj, "_value")


def distributed_variable_type() -> Any:
    """``tf.distribute``'s ``DistributedVariable`` class; ``None``: none recognised."""
    return _member(DISTRIBUTED, _VALUES, "DistributedVariable")


def mirrored_primary(obj: Any) -> Any:
    """The primary copy of ``obj`` when it is exactly a ``MirroredVariable``; else ``None``
    (fallback: ``None``, the variable takes TF's own path)."""
    mirrored = _member(MIRRORED, _VALUES, "MirroredVariable")
    if mirrored is None or type(obj) is not mirrored:
        return None
    return _attr(PRIMARY, obj, "_primary")


def owned_iterator_type() -> Any:
    """``tf.data``'s ``OwnedIterator`` class; ``None``: none recognised (no walk cache)."""
    return _member(OWNED_ITERATOR, "tensorflow.python.data.ops.iterator_ops", "OwnedIterator")


def coordination_service_context() -> Any:
    """TensorFlow's eager context when a coordination service runs, else ``None``
    (also the fallback: no cluster-wide stop)."""
    context = _member(CONTEXT, "tensorflow.python.eager.context", "context")
    if context is None:
        return None
    ctx = context()
    return ctx if ctx.coordination_service is not None else None


def dataset_inputs(dataset: Any) -> list[Any] | None:
    """The input datasets of a ``tf.data`` stage; ``None`` when unknown (fallback: a
    pipeline description stops there)."""
    inputs = _attr(DATASET_INPUTS, dataset, "_inputs")
    return None if inputs is None else list(inputs())


def dataset_batch_size(dataset: Any) -> Any:
    """A batching stage's batch size (a tensor), else ``None`` (fallback: not shown)."""
    return _attr(DATASET_BATCH, dataset, "_batch_size")


# ---------------------------------------------------------------------------------------
# Keras 3

KERAS_BUILD = "keras.Model._symbolic_build"
KERAS_LAYERS = "keras.Layer._flatten_layers"
KERAS_SEEDS = "keras.Layer._seed_generators"
KERAS_DATA = "keras.src.trainers.data_adapters"


def keras_symbolic_build(model: Any) -> Any:
    """Keras's own build of a model from a data spec (as ``fit`` does before its first
    step); ``None`` (fallback: the model builds at its first step)."""
    return _attr(KERAS_BUILD, model, "_symbolic_build")


def keras_data_adapters() -> Any:
    """Keras 3's data adapters (``ArrayDataAdapter``, ``TFDatasetAdapter``,
    ``array_slicing``), which turn ``model.fit``'s arrays into batches; ``None``
    (fallback: ``sess.fit`` refuses arrays, naming the Keras version)."""
    return _module(KERAS_DATA)


def keras_seed_generators(model: Any) -> list[Any]:
    """Every ``keras.random.SeedGenerator`` of ``model``'s layers, in Keras's layer order.

    Fallback (``_flatten_layers`` or ``_seed_generators`` missing): a walk of the layers'
    attributes, lists and dicts, collecting public ``keras.random.SeedGenerator`` objects.
    """
    flatten = None if KERAS_LAYERS in _hidden else getattr(model, "_flatten_layers", None)
    if flatten is not None and KERAS_SEEDS not in _hidden:
        return [g for layer in flatten(include_self=True) for g in getattr(layer, "_seed_generators", ())]
    import keras

    if not isinstance(model, keras.layers.Layer):
        return []  # not a Keras model: no seed generators
    _note(KERAS_LAYERS if KERAS_LAYERS in _hidden or flatten is None else KERAS_SEEDS)

    found: list[Any] = []
    seen: set[int] = set()

    def visit(value: Any, depth: int) -> None:
        if id(value) in seen or depth > 50:
            return
        seen.add(id(value))
        if isinstance(value, keras.random.SeedGenerator):
            found.append(value)
        elif isinstance(value, keras.layers.Layer):
            for item in list(vars(value).values()):
                visit(item, depth + 1)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item, depth + 1)
        elif isinstance(value, dict):
            for item in list(value.values()):
                visit(item, depth + 1)

    visit(model, 0)
    return found


# ---------------------------------------------------------------------------------------
# protocol buffers (file formats): no fallback

TENSOR_BUNDLE_PB2 = "tensorflow.core.protobuf.tensor_bundle_pb2"
VERSIONS_PB2 = "tensorflow.core.framework.versions_pb2"
OBJECT_GRAPH_PB2 = "tensorflow.core.protobuf.trackable_object_graph_pb2"
CHECKPOINT_STATE_PB2 = "tensorflow.python.training.checkpoint_state_pb2"


def proto_module(name: str) -> Any:
    """One of TF's protocol-buffer modules (a file format). No fallback: a
    :class:`CheckpointError` naming the TensorFlow version and the module."""
    module = _module(name)
    if module is None:
        raise _missing(name)
    return module


# ---------------------------------------------------------------------------------------
# the registry


def _probe_attr(module: str, path: str) -> Callable[[], Any]:
    def probe() -> Any:
        obj: Any = importlib.import_module(module)
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj

    return probe


def _probe_instance(make: Callable[[], Any], path: str) -> Callable[[], Any]:
    def probe() -> Any:
        obj = make()
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj

    return probe


def _probe_has(make: Callable[[], Any], attr: str) -> Callable[[], Any]:
    """A probe for an instance attribute that may be ``None``."""

    def probe() -> Any:
        obj = make()
        if not hasattr(obj, attr):
            raise AttributeError(f"{type(obj).__name__} has no {attr}")
        return getattr(obj, attr)

    return probe


def _checkpoint() -> Any:
    tf = _tf()
    return tf.train.Checkpoint(v=tf.Variable(1.0))


def _checkpoint_status() -> Any:
    """A restore's status (of a checkpoint written to a temporary directory)."""
    with _tempdir(prefix="asv-tf-probe-") as tmp:
        path = _checkpoint().write(os.path.join(tmp, "ckpt"))
        return _checkpoint().read(path)


def _eager() -> Any:
    return _tf().constant([1.0])


_CK = "tensorflow.python.checkpoint.checkpoint"
_BASE = "tensorflow.python.trackable.base"

INTERNALS: tuple[Internal, ...] = (
    Internal(
        GATHER,
        "a snapshot's walk of the object graph",
        "public Checkpoint.write to a temporary directory, read back",
        _probe_attr(_CK, "TrackableSaver._gather_serialized_tensors"),
    ),
    Internal(
        GRAPH_VIEW,
        "the walk cache's traversal with paths",
        "no walk cache (every snapshot walks in full)",
        _probe_instance(_checkpoint, "_saver._graph_view.breadth_first_traversal"),
    ),
    Internal(
        TRAVERSAL,
        "the objects of the graph (restore checks)",
        "public tf.train.TrackableView(root).descendants()",
        _probe_instance(_checkpoint, "_saver._graph_view._breadth_first_traversal"),
    ),
    Internal(
        CHILDREN,
        "a trackable's children (restore matching, state checks)",
        "public tf.train.TrackableView.children",
        _probe_attr(_BASE, "Trackable._trackable_children"),
    ),
    Internal(
        HAS_SERIALIZE,
        "whether an object holds values (restore check)",
        "not sure: compare key by key",
        _probe_attr(_SAVEABLE_UTIL, "trackable_has_serialize_to_tensor"),
    ),
    Internal(
        GATHER_SAVEABLES,
        "whether an object holds legacy saveables (restore check)",
        "not sure: compare key by key",
        _probe_attr(_BASE, "Trackable._gather_saveables_for_checkpoint"),
    ),
    Internal(
        CONVERTER,
        "a tf.distribute variable wrapped by TF's walk",
        "not recognised: its own key, no walk cache",
        _probe_attr(_SAVEABLE_UTIL, "SaveableCompatibilityConverter"),
    ),
    Internal(
        SAVE_SPEC,
        "legacy saveables' values",
        "recognised by its attributes",
        _probe_attr("tensorflow.python.training.saving.saveable_object", "SaveSpec"),
    ),
    Internal(
        SAVE_COUNTER,
        "a checkpoint's save_counter",
        "public Checkpoint.save_counter",
        _probe_attr(_CK, "Checkpoint._maybe_create_save_counter"),
    ),
    Internal(
        LOAD_STATUS,
        "the values a restore deferred",
        "nothing known to be deferred",
        _probe_has(_checkpoint_status, "_checkpoint"),
    ),
    Internal(
        DEFERRED,
        "dropping a failed restore's deferred values",
        "not dropped (logged)",
        _probe_instance(_checkpoint, "_self_unconditional_deferred_dependencies"),
    ),
    Internal(
        DEFERRED_SLOTS,
        "dropping a failed restore's deferred slots (TF1 optimizers)",
        "not dropped",
        _probe_instance(lambda: _tf().compat.v1.train.GradientDescentOptimizer(0.1), "_deferred_slot_restorations"),
    ),
    Internal(
        COORDINATOR,
        "silencing TF's warnings about a failed restore's values",
        "TF's warnings",
        _probe_attr(_CK, "_CheckpointRestoreCoordinator.expect_partial"),
    ),
    Internal(
        DEPENDENCIES,
        "untracking an attribute of the checkpoint",
        "plain delattr",
        _probe_attr(_BASE, "Trackable._checkpoint_dependencies"),
    ),
    Internal(
        SERIALIZE,
        "a tf.data iterator's position",
        "public Checkpoint.write test; no walk cache",
        _probe_attr(_BASE, "Trackable._serialize_to_tensors"),
    ),
    Internal(
        EAGER_NUMPY, "staging a CPU tensor without a copy", "public numpy() (a copy)", _probe_instance(_eager, "_numpy")
    ),
    Internal(EAGER_DTYPE, "a tensor's dtype, fast", "public dtype", _probe_instance(_eager, "_datatype_enum")),
    Internal(EAGER_SHAPE, "a tensor's shape, fast", "public shape", _probe_instance(_eager, "_shape_tuple")),
    Internal(
        PLAIN_VARIABLES,
        "variables read directly (2 ops)",
        "TF's own closure (5 ops), no walk cache",
        _probe_attr(_RVO, "ResourceVariable"),
    ),
    Internal(
        UNINITIALIZED_VARIABLE,
        "lazily restored variables read directly",
        "TF's own closure",
        _probe_attr(_RVO, "UninitializedVariable"),
    ),
    Internal(
        UNLIFTED_VARIABLE,
        "variables made in a tf.function read directly",
        "TF's own closure",
        _probe_attr("tensorflow.python.eager.polymorphic_function.polymorphic_function", "UnliftedInitializerVariable"),
    ),
    Internal(
        CACHING_DEVICE,
        "variables with a caching device",
        "TF's own closure",
        _probe_has(lambda: _tf().Variable(1.0), "_caching_device"),
    ),
    Internal(
        KERAS_VALUE,
        "the TF variable a Keras 3 variable wraps",
        "TF's own closure",
        _probe_instance(lambda: importlib.import_module("keras").Variable(1.0), "_value"),
    ),
    Internal(DISTRIBUTED, "tf.distribute variables", "TF's own walk", _probe_attr(_VALUES, "DistributedVariable")),
    Internal(
        MIRRORED, "mirrored variables read by their primary", "TF's own walk", _probe_attr(_VALUES, "MirroredVariable")
    ),
    Internal(
        PRIMARY,
        "a mirrored variable's primary copy",
        "TF's own walk",
        _probe_attr(_VALUES, "DistributedValues._primary"),
    ),
    Internal(
        OWNED_ITERATOR,
        "tf.data iterators in the walk cache",
        "no walk cache with an iterator",
        _probe_attr("tensorflow.python.data.ops.iterator_ops", "OwnedIterator"),
    ),
    Internal(
        CONTEXT,
        "the cluster's coordination service",
        "no cluster-wide stop (logged)",
        _probe_attr("tensorflow.python.eager.context", "context"),
    ),
    Internal(
        DATASET_INPUTS,
        "describing a tf.data pipeline",
        "the description stops there",
        _probe_attr("tensorflow.python.data.ops.dataset_ops", "DatasetV2._inputs"),
    ),
    Internal(
        DATASET_BATCH,
        "describing a tf.data pipeline's batch size",
        "batch size not shown",
        _probe_instance(lambda: _tf().data.Dataset.range(4).batch(2), "_batch_size"),
    ),
    Internal(
        KERAS_BUILD,
        "building a Keras model before fit's first step",
        "built at the first step",
        _probe_attr("keras", "Model._symbolic_build"),
    ),
    Internal(
        KERAS_LAYERS,
        "a Keras model's layers (seed generators)",
        "a walk of the layers' attributes",
        _probe_attr("keras", "Layer._flatten_layers"),
    ),
    Internal(
        KERAS_SEEDS,
        "a Keras layer's seed generators",
        "a walk of the layers' attributes",
        _probe_instance(lambda: importlib.import_module("keras").layers.Dropout(0.5), "_seed_generators"),
    ),
    Internal(
        KERAS_DATA,
        "fit's arrays batched as model.fit batches them",
        "arrays refused by fit, naming the Keras version",
        _probe_attr(KERAS_DATA, "array_slicing.train_validation_split"),
    ),
    Internal(
        TENSOR_BUNDLE_PB2,
        "the checkpoint file format (fast store)",
        "none: CheckpointError naming the TF version",
        _probe_attr(TENSOR_BUNDLE_PB2, "BundleEntryProto"),
    ),
    Internal(
        VERSIONS_PB2,
        "the checkpoint file format (fast store)",
        "none: CheckpointError naming the TF version",
        _probe_attr(VERSIONS_PB2, "VersionDef"),
    ),
    Internal(
        OBJECT_GRAPH_PB2,
        "a checkpoint's object graph",
        "none: CheckpointError naming the TF version",
        _probe_attr(OBJECT_GRAPH_PB2, "TrackableObjectGraph"),
    ),
    Internal(
        CHECKPOINT_STATE_PB2,
        "the 'checkpoint' state file",
        "none: CheckpointError naming the TF version",
        _probe_attr(CHECKPOINT_STATE_PB2, "CheckpointState"),
    ),
)

_BY_NAME: dict[str, Internal] = {entry.name: entry for entry in INTERNALS}


def resolves(name: str) -> bool:
    """Whether the private ``name`` exists on the installed TensorFlow/Keras."""
    try:
        _BY_NAME[name].probe()
    except (AttributeError, ImportError):
        return False
    return True
