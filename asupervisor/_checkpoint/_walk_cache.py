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
saveables, ...), slot variables of TF1-style optimizers (found by ``get_slot_names``,
not by the traversal), uninitialised or distributed variables always take the full walk.

Runs on the step thread only. Never imports TensorFlow at module import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["WalkCache", "plain_variable"]

_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def plain_variable(obj: Any) -> Any:
    """The ``ResourceVariable`` that ``obj`` saves, when it is a plain one; else ``None``.

    ``obj`` is a ``tf.Variable`` or a Keras 3 variable wrapping one (its
    ``_serialize_to_tensors`` delegates to it). Subclasses (distributed, uninitialised,
    ...) and variables with a caching device take TF's own path.
    """
    from tensorflow.python.ops.resource_variable_ops import ResourceVariable

    if type(obj) is not ResourceVariable:
        inner = getattr(obj, "_value", None)
        if type(inner) is not ResourceVariable or not hasattr(obj, "_serialize_to_tensors"):
            return None
        obj = inner
    if getattr(obj, "_caching_device", None) is not None:
        return None
    return obj


_ITERATOR_KEY = "/.ATTRIBUTES/ITERATOR_STATE"


def _owned_iterator(obj: Any) -> Any:
    """The ``tf.data`` iterator TF's walk saves through ``obj`` (its legacy-name wrapper), or ``None``.

    TF saves an ``OwnedIterator`` under ``<path>/.ATTRIBUTES/ITERATOR_STATE``, the value
    being its own ``_serialize_to_tensors()["_STATE"]`` (a ``SerializeIterator`` op, read
    at the walk); a snapshot from the remembered walk runs that op again.
    """
    from tensorflow.python.data.ops.iterator_ops import OwnedIterator

    inner = getattr(obj, "obj", None)
    return inner if type(inner) is OwnedIterator else None


def _traversal(checkpoint: Any) -> tuple[list[Any], list[tuple[str, ...]]]:
    """TF's breadth-first traversal of the checkpoint: objects, and each one's path."""
    objects, paths = checkpoint._saver._graph_view.breadth_first_traversal()
    return objects, [tuple(ref.name for ref in paths[obj]) for obj in objects]


def _has_slots(obj: Any) -> bool:
    """Whether TF's walk asks ``obj`` for slot variables (its own test, in ``checkpoint/util.py``)."""
    from tensorflow.python.training import optimizer as optimizer_v1

    return isinstance(obj, optimizer_v1.Optimizer) or "get_slot_names" in dir(obj)


@dataclass(frozen=True)
class _Walk:
    objects: list[Any]  # the traversal, compared by identity
    paths: list[tuple[str, ...]]
    keys: list[str]  # checkpoint keys, in the walk's order
    owners: list[Any]  # per key: the variable or iterator it reads, or None for the proto
    iterators: list[bool]  # per key: whether its owner is a tf.data iterator
    graph: Any  # the object-graph proto tensor (a constant)


class WalkCache:
    """The last full walk of one checkpoint, reused while its object graph is unchanged.

    Attributes:
        hits: snapshots taken without a full walk (for tests and benchmarks).
    """

    def __init__(self) -> None:
        self._walk: _Walk | None = None
        self.hits = 0

    def read(self, checkpoint: Any, read: Callable[[Any], Any]) -> tuple[list[str], list[Any]] | None:
        """Keys and values of a snapshot from the remembered walk, or ``None`` if it is stale.

        Args:
            checkpoint: the ``tf.train.Checkpoint`` walked before.
            read: reads a ``ResourceVariable`` as the snapshot does.
        """
        walk = self._walk
        if walk is None:
            return None
        objects, paths = _traversal(checkpoint)
        if len(objects) != len(walk.objects) or paths != walk.paths:
            return None
        for a, b in zip(objects, walk.objects):
            if a is not b:
                return None
        tensors = []
        for owner, iterator in zip(walk.owners, walk.iterators):
            if owner is None:
                tensors.append(walk.graph)
            elif iterator:
                tensors.append(owner._serialize_to_tensors()["_STATE"])  # its position now
            else:
                variable = plain_variable(owner)
                if variable is None:
                    return None
                tensors.append(read(variable))
        self.hits += 1
        return list(walk.keys), tensors

    def learn(self, checkpoint: Any, serialized: dict[Any, dict[str, Any]]) -> None:
        """Remember a full walk (``{object: {key: value}}``), if it is one that can be reused."""
        self._walk = None
        keys: list[str] = []
        owners: list[Any] = []
        iterators: list[bool] = []
        graph = None
        for obj, tensor_dict in serialized.items():
            for key, value in tensor_dict.items():
                iterator = False
                if key == _GRAPH_KEY:
                    graph = value
                    owners.append(None)
                elif len(tensor_dict) == 1 and not isinstance(value, dict) and plain_variable(obj) is not None:
                    owners.append(obj)
                elif len(tensor_dict) == 1 and _owned_iterator(obj) is not None and key.endswith(_ITERATOR_KEY):
                    owners.append(_owned_iterator(obj))
                    iterator = True
                else:
                    return  # an object computing other tensors, or slices: walk every time
                keys.append(key)
                iterators.append(iterator)
        if graph is None:
            return
        objects, paths = _traversal(checkpoint)
        if any(_has_slots(obj) for obj in objects):
            return
        self._walk = _Walk(objects, paths, keys, owners, iterators, graph)
