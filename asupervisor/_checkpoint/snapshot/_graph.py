"""The object graph of a checkpoint: every walk of it, in one place.

A checkpoint's state is a graph of trackable objects (``tf.train.Checkpoint``, models,
layers, optimizers, variables, ``tf.data`` iterators). Every part of the checkpoint
code that walks it goes through here:

* :func:`serialized` — TensorFlow's own serialising walk (every object asked for its
  tensors): a snapshot's full walk, which :mod:`._walk_cache` then reuses while the graph
  is unchanged, and the key-by-key model check of a restore;
* :func:`traversal` / :func:`live_objects` — TensorFlow's breadth-first traversal of the
  live objects (with each one's path): the walk cache's check that the graph is
  unchanged, a restore's check for live values the checkpoint lacks, and the clean-up
  of a failed restore;
* :class:`SavedGraphMatch` — a checkpoint's saved object graph walked together with
  the live one, node by node, as TensorFlow's restore matches them: done once per
  restore, for both the model check and the direct read's plan.

Never on the event loop.
"""

from __future__ import annotations

from typing import Any

from ... import _tf_internals as internals
from ..._exceptions import CheckpointError

__all__ = ["SavedGraphMatch", "checkpoint_children", "live_objects", "serialized", "traversal"]


def serialized(checkpoint: Any) -> tuple[dict[Any, dict[str, Any]], Any]:
    """TF's own walk of the object graph: ``{trackable: {key: value}}`` and the graph proto
    (``None`` in the public fallback, :func:`..._tf_internals.gather_serialized_tensors`).

    Raises:
        CheckpointError: an object has a registered saver (DTensor), which a snapshot
            cannot take.
    """
    found, registered, proto = internals.gather_serialized_tensors(checkpoint)
    if registered:
        raise CheckpointError(
            "the state holds objects with registered savers (e.g. DTensor), which "
            "asupervisor cannot snapshot; save them with tf.train.Checkpoint directly"
        )
    return found, proto


def live_objects(checkpoint: Any) -> list[Any]:
    """Every live object of ``checkpoint``'s graph, root first (TF's breadth-first
    traversal)."""
    return internals.graph_objects(checkpoint)


def traversal(checkpoint: Any) -> tuple[list[Any], list[tuple[str, ...]]] | None:
    """TF's breadth-first traversal of ``checkpoint``: the live objects, root first, and
    each one's path of child names; ``None`` where TF's traversal with paths is missing
    (the caller then keeps no walk cache, :mod:`..._tf_internals`)."""
    found = internals.breadth_first_traversal_with_paths(checkpoint)
    if found is None:
        return None
    objects, paths = found
    return objects, [tuple(ref.name for ref in paths[obj]) for obj in objects]


def checkpoint_children(obj: Any) -> dict[str, Any]:
    """``{local name: child}`` of a trackable as a checkpoint sees them (``{}`` for
    anything else)."""
    try:
        return internals.trackable_children(obj)
    except (AttributeError, TypeError):
        return {}


class SavedGraphMatch:
    """A checkpoint's saved object graph matched to the live objects, in one walk.

    The saved graph (``TrackableObjectGraph``) and the live one are walked together from
    the root, child by child name, as TF's restore matches them. Keys are *not* compared
    as strings: a variable reachable by several paths is keyed by whichever path was
    shortest when it was saved (a Keras optimizer's variable list, built after start-up,
    makes the model's kernels' keys ``optimizer/_trainable_variables/N``), so the live
    graph at start-up would name it differently.

    Attributes:
        graph: the saved object graph.
        pairs: every ``(node id, live object)`` pair the walk reached, each once.
    """

    def __init__(self, checkpoint: Any, graph: Any) -> None:
        self.graph = graph
        self.pairs: list[tuple[int, Any]] = []
        self._root = checkpoint
        self._seen: set[tuple[int, int]] = set()
        self._walk(0, checkpoint)

    def _walk(self, node_id: int, obj: Any) -> None:
        nodes = self.graph.nodes
        stack = [(node_id, obj)]
        while stack:
            node_id, obj = stack.pop()
            if (node_id, id(obj)) in self._seen:
                continue
            self._seen.add((node_id, id(obj)))
            self.pairs.append((node_id, obj))
            node = nodes[node_id]
            if node.children:
                live = checkpoint_children(obj)
                for ref in node.children:
                    child = live.get(ref.local_name)
                    if child is not None:
                        stack.append((ref.node_id, child))

    def add_root_child(self, name: str) -> None:
        """Match the root's child ``name`` (and what hangs from it), made after the walk
        (a restore's ``save_counter``, created as TF's restore creates it)."""
        child = checkpoint_children(self._root).get(name)
        if child is None:
            return
        for ref in self.graph.nodes[0].children:
            if ref.local_name == name:
                self._walk(ref.node_id, child)

    def keys(self) -> tuple[dict[int, str], set[int]]:
        """``{id(live object): checkpoint key of its value}``, and the ids of the live
        objects matched to a saved object holding any value. A TF1 optimizer's slot
        variables (the saved graph's ``slot_variables``, not children) are matched as TF's
        restore matches them: ``optimizer.get_slot(variable, slot name)``."""
        matched: dict[int, str] = {}
        with_values: set[int] = set()
        nodes = self.graph.nodes
        first: dict[int, Any] = {}
        for node_id, obj in self.pairs:
            first.setdefault(node_id, obj)

        def match(node_id: int, obj: Any) -> None:
            attributes = nodes[node_id].attributes
            if attributes:
                with_values.add(id(obj))
            for attr in attributes:
                if attr.name == "VARIABLE_VALUE":
                    matched[id(obj)] = attr.checkpoint_key

        for node_id, obj in self.pairs:
            match(node_id, obj)
            for slot in nodes[node_id].slot_variables:
                live_slot = _slot_of(obj, first.get(slot.original_variable_node_id), slot.slot_name)
                if live_slot is not None:
                    match(slot.slot_variable_node_id, live_slot)
        return matched, with_values

    def live_by_node(self) -> dict[int, Any] | None:
        """``{node id: its live object}``; ``None`` if a saved object matched two live ones."""
        live: dict[int, Any] = {}
        for node_id, obj in self.pairs:
            known = live.setdefault(node_id, obj)
            if known is not obj:
                return None
        return live


def _slot_of(optimizer: Any, variable: Any, name: str) -> Any:
    """``optimizer``'s slot ``name`` of ``variable`` (a TF1 optimizer's ``get_slot``), or ``None``."""
    get_slot = getattr(optimizer, "get_slot", None)
    if variable is None or not callable(get_slot):
        return None
    try:
        return get_slot(variable, name)
    except Exception:  # not a TF1 optimizer's get_slot: no slot matched (the check compares by key)
        return None
