"""Reusing TensorFlow's object-graph walk from one snapshot to the next.

Every snapshot needs to know what the checkpoint holds: TF finds out with its
serialising walk (``Checkpoint._saver._gather_serialized_tensors``), which lists every
object, names it, looks for optimizer slot variables, builds the object-graph proto and
asks every object for its tensors. That walk is pure Python and is most of what a
snapshot costs the step thread: ~0.35 ms for a handful of variables, ~10 ms for a
20-layer Keras model with its optimizer, against ~0.03 ms and ~1.3 ms for the plain
breadth-first traversal of the same objects.

So after a full walk, :class:`WalkCache` keeps what it found — the traversal (objects and
their paths), each checkpoint key with the variable it reads, and the object-graph proto
tensor — and the next snapshot only repeats the traversal: if it yields the very same
objects under the same paths, the checkpoint holds the same keys, and the variables are
read directly. Anything else (an object added, removed, replaced or renamed) means a full
walk, which is then remembered instead. A walk is only reused when the whole checkpoint
is plain variables, ``tf.data`` iterators (whose position is serialised again, as TF's
walk does) and the proto: other objects that compute their own tensors (legacy
saveables, ...) and slot variables of TF1-style optimizers (found by ``get_slot_names``,
not by the traversal) always take the full walk; a checkpoint with a variable not yet
initialised is walked until it is. Variables made under a ``tf.distribute`` strategy
(Keras ones, and ``tf.Variable``s, which TF's walk wraps in a
``SaveableCompatibilityConverter``) are remembered too: a mirrored one is read through
its primary copy like a plain variable, any other (SyncOnRead) as TF's walk reads it.

A remembered walk of many variables also gets a **batched read**: traced functions
reading every variable of the walk (the same two ops per variable as
``_snapshot._variable_reader``), one call per :data:`BATCH_CHUNK` variables. Read one
by one, each variable costs two eager op dispatches, ~13-30 us on the machines
measured: ~15-30 ms of step loop per save for a model of a thousand variables (weights
and optimizer slots), against ~2 ms for the functions. A function call costs ~0.1 ms itself, so walks of fewer than
:data:`BATCH_MIN_VARIABLES` variables keep reading them one by one. Tracing the function
takes ~1 s for a thousand variables, and its first call as long again (TF instantiates
the function then), so neither is done on the step thread: :meth:`WalkCache.prepare`
traces the read on the checkpoint writer's thread after a save and runs it once there,
in functions of at most :data:`BATCH_CHUNK` variables (~0.3-0.4 s each, a stop looked
for between them), and snapshots use them from then on while the walk holds.

:meth:`WalkCache.read` and :meth:`WalkCache.learn` run on the step thread,
:meth:`WalkCache.prepare` on the writer thread. Never imports TensorFlow at module import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ... import _tf
from ... import _tf_internals as internals
from ..._logging import describe, get_logger
from . import _graph

__all__ = ["BATCH_MIN_VARIABLES", "WalkCache", "initialized", "plain_variable", "saved_variable"]

log = get_logger(__name__)

BATCH_MIN_VARIABLES = 16  # from this many variables on, a walk's reads are batched (traced functions)
BATCH_CHUNK = 256  # variables per batched function: traced and first run in ~0.3-0.4 s (superlinear beyond)

_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"

# what a remembered walk reads for each key
_GRAPH = "graph"  # the object-graph proto, a constant
_VARIABLE = "variable"  # a variable, read directly (saved_variable)
_ITERATOR = "iterator"  # a tf.data iterator's position, serialised again
_DISTRIBUTED = "distributed"  # another tf.distribute variable (SyncOnRead: a collective read), read as TF's walk does


_PLAIN: dict[type, bool] = {}  # variable class -> whether it may be uninitialised (filled at first use)


def _plain_types() -> dict[type, bool]:
    if not _PLAIN:
        _PLAIN.update(internals.plain_variable_types())  # {} without them: TF's own reads
    return _PLAIN


def plain_variable(obj: Any) -> Any:
    """The ``ResourceVariable`` that ``obj`` saves, when it is a plain one; else ``None``.

    ``obj`` is a ``tf.Variable`` or a Keras 3 variable wrapping one (its
    ``_serialize_to_tensors`` delegates to it). Plain means a ``ResourceVariable``, or one
    created inside a ``tf.function`` (``UnliftedInitializerVariable``: every optimizer
    slot a Keras optimizer makes in its first traced step) or restored lazily
    (``UninitializedVariable``), which read the same way once initialised: check with
    :func:`initialized` before reading those. Other subclasses (distributed, ...) and
    variables with a caching device take TF's own path.
    """
    types = _PLAIN or _plain_types()
    if type(obj) not in types:
        inner = internals.keras_inner_variable(obj)
        if type(inner) not in types or not internals.has_serialize(obj):
            return None
        obj = inner
    if internals.caching_device(obj) is not None:
        return None
    return obj


def initialized(variable: Any) -> bool:
    """Whether a :func:`plain_variable` holds a value (TF's walk skips it otherwise). A
    ``ResourceVariable`` made eagerly always does; the others are asked (one op)."""
    return not _PLAIN.get(type(variable), True) or bool(variable.is_initialized())


def _distributed(obj: Any) -> Any:
    """The ``tf.distribute`` variable ``obj`` is, or that a Keras 3 variable ``obj`` wraps
    (TF's walk is handed that variable itself as the value to save); else ``None``."""
    distributed = internals.distributed_variable_type()
    if distributed is None:
        return None
    if isinstance(obj, distributed):
        return obj
    inner = internals.keras_inner_variable(obj)
    return inner if isinstance(inner, distributed) and internals.has_serialize(obj) else None


def _converted(obj: Any) -> Any:
    """The ``tf.distribute`` variable behind ``obj`` when ``obj`` is the wrapper TF's walk
    makes for a ``tf.Variable`` created under a strategy (``SaveableCompatibilityConverter``:
    its tensors are those of the variable's legacy saveable); else ``None``."""
    inner = internals.converted_object(obj)
    distributed = internals.distributed_variable_type()
    return inner if inner is not None and distributed is not None and isinstance(inner, distributed) else None


def saved_variable(obj: Any) -> Any:
    """The variable a snapshot reads directly (two ops, or batched) for ``obj``; ``None``
    if ``obj`` must be read another way.

    A :func:`plain_variable`, or, for a ``MirroredVariable`` (a ``tf.Variable`` or the value
    of a Keras variable made under a ``tf.distribute`` strategy), its primary copy: TF's
    own save reads the copy on the current device or the primary
    (``strategy.extended.read_var``), and every copy holds the same value between steps.
    """
    variable = plain_variable(obj)
    if variable is not None:
        return variable
    primary = internals.mirrored_primary(_distributed(obj))
    return None if primary is None else plain_variable(primary)


_ITERATOR_KEY = "/.ATTRIBUTES/ITERATOR_STATE"
_VARIABLE_KEY = "/.ATTRIBUTES/VARIABLE_VALUE"


def _owned_iterator(obj: Any) -> Any:
    """The ``tf.data`` iterator TF's walk saves through ``obj`` (its legacy-name wrapper), or ``None``.

    TF saves an ``OwnedIterator`` under ``<path>/.ATTRIBUTES/ITERATOR_STATE``, the value
    being its own ``_serialize_to_tensors()["_STATE"]`` (a ``SerializeIterator`` op, read
    at the walk); a snapshot from the remembered walk runs that op again.
    """
    owned = internals.owned_iterator_type()
    inner = getattr(obj, "obj", None)
    return inner if owned is not None and type(inner) is owned and internals.has_serialize(inner) else None


def _has_slots(obj: Any) -> bool:
    """Whether TF's walk asks ``obj`` for slot variables (its own test, in ``checkpoint/util.py``)."""
    return isinstance(obj, _tf.tf().compat.v1.train.Optimizer) or "get_slot_names" in dir(obj)


@dataclass
class _Walk:
    objects: list[Any]  # the traversal, compared by identity
    paths: list[tuple[str, ...]]
    keys: list[str]  # checkpoint keys, in the walk's order
    owners: list[Any]  # per key: the variable or iterator it reads, or None for the proto
    kinds: list[str]  # per key: _GRAPH, _VARIABLE, _ITERATOR or _DISTRIBUTED
    graph: Any  # the object-graph proto tensor (a constant)
    variable_owners: list[Any]  # the owners of kind _VARIABLE, in order
    variables: list[Any]  # the ResourceVariable each of them saved at the walk (saved_variable)
    distributed: list[Any]  # per key: the distributed variable of a _DISTRIBUTED owner, else None
    batch: Callable[[], list[Any]] | None = None  # reads all of them in one call (prepare)
    batch_tried: bool = False  # prepare() was done for this walk


def _batch_reader(variables: list[Any]) -> Callable[[], list[Any]]:
    """A traced function reading every one of ``variables`` as the snapshot reads one:
    copy-on-read switched off (the read shares the variable's buffer, the next update
    copies), then the value, on the variable's device."""
    ops = _tf.tf().raw_ops

    def read_all() -> list[Any]:
        values = []
        for variable in variables:
            ops.DisableCopyOnRead(resource=variable.handle)
            values.append(ops.ReadVariableOp(resource=variable.handle, dtype=variable.dtype))
        return values

    concrete: Callable[[], list[Any]] = _tf.tf().function(read_all, autograph=False).get_concrete_function()
    return concrete


def _chained(readers: list[Callable[[], list[Any]]]) -> Callable[[], list[Any]]:
    """One read of every variable: ``readers``' values, in order."""

    def read_all() -> list[Any]:
        return [value for reader in readers for value in reader()]

    return read_all


class WalkCache:
    """The last full walk of one checkpoint, reused while its object graph is unchanged.

    Attributes:
        hits: snapshots taken without a full walk (for tests and benchmarks).
        batched: snapshots whose variables were read by a batched read.
    """

    def __init__(self) -> None:
        self._walk: _Walk | None = None
        self.hits = 0
        self.batched = 0

    def clear(self) -> None:
        """Forget the remembered walk (and the objects it holds: a session's end)."""
        self._walk = None

    def read(
        self, checkpoint: Any, read: Callable[[Any], Any], stage: Callable[[Any], Any] | None = None
    ) -> tuple[list[str], list[Any]] | None:
        """Keys and values of a snapshot from the remembered walk, or ``None`` if it is stale.

        Args:
            checkpoint: the ``tf.train.Checkpoint`` walked before.
            read: reads a ``ResourceVariable`` as the snapshot does.
            stage: applied to each variable's value once read (``None``: kept as read).
        """
        walk = self._walk
        if walk is None:
            return None
        traversal = _graph.traversal(checkpoint)
        if traversal is None:
            return None
        objects, paths = traversal
        if len(objects) != len(walk.objects) or paths != walk.paths:
            return None
        for a, b in zip(objects, walk.objects):
            if a is not b:
                return None
        variables = walk.variables
        for owner, variable in zip(walk.variable_owners, variables):
            if saved_variable(owner) is not variable:  # e.g. a Keras variable given a new one
                return None
        for owner, distributed in zip(walk.owners, walk.distributed):
            if distributed is not None and _distributed(owner) is not distributed:
                return None
        values = self._batched(walk)
        if values is None:
            values = [read(variable) for variable in variables]
        if stage is not None:
            values = [stage(value) for value in values]
        tensors = []
        next_value = iter(values).__next__
        for owner, kind, distributed in zip(walk.owners, walk.kinds, walk.distributed):
            if kind == _VARIABLE:
                tensors.append(next_value())
            elif kind == _GRAPH:
                tensors.append(walk.graph)
            elif kind == _ITERATOR:
                serialize = internals.serialize_iterator(owner)
                if serialize is None:
                    return None
                tensors.append(serialize()["_STATE"])  # its position now
            else:  # in key order, as TF's walk: the same collectives, in the same order, on every worker
                tensors.append(_tf.tf().convert_to_tensor(distributed))
        self.hits += 1
        return list(walk.keys), tensors

    def _batched(self, walk: _Walk) -> list[Any] | None:
        """Every variable of ``walk`` read by its batched read; ``None`` without one (or
        if it failed: logged once, the walk reads one by one from then on)."""
        batch = walk.batch
        if batch is None:
            return None
        try:
            values = batch()
        except Exception as exc:  # the reads one by one raise what is really wrong, if anything
            walk.batch = None
            log.warning("checkpoint.batched_read_failed", variables=len(walk.variables), error=describe(exc))
            return None
        self.batched += 1
        return values

    def prepare(self, stopping: Callable[[], bool] | None = None) -> bool:
        """Off the step thread (the writer's, after a save): make the batched read of the
        remembered walk, if it has :data:`BATCH_MIN_VARIABLES` variables or more and has
        none yet. ``True`` if one was made.

        Each function of up to :data:`BATCH_CHUNK` variables is traced and called once
        here (the first call instantiates it: as long as the trace, and on the step thread
        otherwise); the values it reads are dropped at once. ``stopping()`` is asked before
        each function: once the session is stopping there is no next save to make cheaper.
        """
        walk = self._walk
        if walk is None or walk.batch_tried or len(walk.variables) < BATCH_MIN_VARIABLES:
            return False
        walk.batch_tried = True
        readers = []
        try:
            for start in range(0, len(walk.variables), BATCH_CHUNK):
                if stopping is not None and stopping():
                    return False
                reader = _batch_reader(walk.variables[start : start + BATCH_CHUNK])
                reader()
                readers.append(reader)
        except Exception as exc:  # an optimisation: the snapshots read one by one
            log.warning("checkpoint.batched_read_failed", variables=len(walk.variables), error=describe(exc))
            return False
        walk.batch = readers[0] if len(readers) == 1 else _chained(readers)
        return True

    def learn(self, checkpoint: Any, serialized: dict[Any, dict[str, Any]]) -> None:
        """Remember a full walk (``{object: {key: value}}``), if it is one that can be reused."""
        self._walk = None
        keys: list[str] = []
        owners: list[Any] = []
        kinds: list[str] = []
        distributed: list[Any] = []
        graph = None
        for obj, tensor_dict in serialized.items():
            for key, value in tensor_dict.items():
                single = len(tensor_dict) == 1 and not isinstance(value, dict)
                owner, found, kind = obj, None, _VARIABLE
                if key == _GRAPH_KEY:
                    graph, owner, kind = value, None, _GRAPH
                elif single and saved_variable(obj) is not None:
                    pass
                elif single and _owned_iterator(obj) is not None and key.endswith(_ITERATOR_KEY):
                    owner, kind = _owned_iterator(obj), _ITERATOR
                elif single and value is not None and value is _distributed(obj):
                    found, kind = value, _DISTRIBUTED
                elif single and key.endswith(_VARIABLE_KEY) and _converted(obj) is not None:
                    owner = _converted(obj)  # a tf.Variable made under a strategy: read as a Keras one's
                    if saved_variable(owner) is None:
                        found, kind = owner, _DISTRIBUTED
                else:
                    return  # an object computing other tensors, or slices: walk every time
                keys.append(key)
                owners.append(owner)
                kinds.append(kind)
                distributed.append(found)
        traversal = _graph.traversal(checkpoint) if graph is not None else None
        if traversal is None:
            return
        objects, paths = traversal
        if any(_has_slots(obj) for obj in objects):
            return
        variable_owners = [o for o, kind in zip(owners, kinds) if kind == _VARIABLE]
        variables = [saved_variable(o) for o in variable_owners]
        if not all(initialized(v) for v in variables):
            return  # not saved yet: walk until it is (a variable never becomes uninitialised again)
        self._walk = _Walk(objects, paths, keys, owners, kinds, graph, variable_owners, variables, distributed)
