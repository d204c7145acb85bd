"""A snapshot of a ``tf.train.Checkpoint``: taken on the step thread, at a step boundary.

:func:`take_snapshot` walks the object graph (or reuses the last walk, :mod:`._walk_cache`)
and reads every value to save. TensorFlow's reads are copy-on-write (a later in-place
update copies the buffer while a read tensor still holds it), so the snapshot is
consistent and costs no copy of the data on the step thread. Never on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._exceptions import CheckpointError
from .._logging import get_logger
from .._tf import tf
from ._walk_cache import WalkCache, plain_variable

__all__ = ["Snapshot", "take_snapshot"]

log = get_logger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """The values of a checkpoint at one step boundary, ready to be written."""

    step: int
    keys: list[str]
    slices: list[str]
    tensors: list[Any]
    taken_at: float  # perf_counter when taken
    blocked_secs: float


def _serialized(checkpoint: Any) -> tuple[dict[Any, dict[str, Any]], Any]:
    """TF's own walk of the object graph: ``{trackable: {key: value}}`` and the graph proto."""
    serialized, _, registered, proto = checkpoint._saver._gather_serialized_tensors(None)
    if registered:
        raise CheckpointError(
            "the state holds objects with registered savers (e.g. DTensor), which "
            "asupervisor cannot snapshot; save them with tf.train.Checkpoint directly"
        )
    return serialized, proto


def _variable_reader() -> Callable[[Any], Any]:
    """``read(variable)``: its value as TF's checkpoint closure reads it, in fewer ops.

    TF's closure (``ResourceVariable._serialize_to_tensors``) runs five ops per
    variable (an initialised check, the copy-on-read switch, the read and two
    identities, one to the CPU): ~0.1 ms each on a CPU, so tens of milliseconds of step
    loop for a model of a few hundred variables. This runs the two that matter: switch
    the variable to copy-on-write (as TF does, so the snapshot shares its buffer and
    the next update copies) and read it. The value stays on the variable's device; the
    writer thread copies it to the host.
    """
    from tensorflow.python.ops import gen_resource_variable_ops as ops

    disable_copy_on_read = ops.disable_copy_on_read
    read_variable_op = ops.read_variable_op

    def read(variable: Any) -> Any:
        handle = variable.handle
        disable_copy_on_read(handle)
        return read_variable_op(handle, variable.dtype)

    return read


def take_snapshot(checkpoint: Any, step: int, walks: WalkCache | None = None) -> Snapshot:
    """On the step thread: read every value to save (copy-on-write, no data copy).

    Args:
        checkpoint: the ``tf.train.Checkpoint``.
        step: the step being saved.
        walks: where the last object-graph walk of ``checkpoint`` is kept, to skip the
            next walk while the graph is unchanged (:mod:`._walk_cache`).
    """
    t0 = time.perf_counter()
    counter = getattr(checkpoint, "_maybe_create_save_counter", None)
    if counter is not None:  # as tf.train.Checkpoint.save() does: plain TF restores match
        counter()
        checkpoint.save_counter.assign_add(1)
    read = _variable_reader()
    cached = None if walks is None else walks.read(checkpoint, read)
    if cached is not None:
        keys, tensors = cached
        t1 = time.perf_counter()
        return Snapshot(step, keys, [""] * len(keys), tensors, t1, t1 - t0)
    serialized, _ = _serialized(checkpoint)
    if walks is not None:
        walks.learn(checkpoint, serialized)
    keys, slices, tensors = _read_serialized(serialized, read)
    t1 = time.perf_counter()
    return Snapshot(step, keys, slices, tensors, t1, t1 - t0)


def _read_serialized(
    serialized: dict[Any, dict[str, Any]], read: Callable[[Any], Any]
) -> tuple[list[str], list[str], list[Any]]:
    """The keys, slice specs and values of TF's walk, every variable read now."""
    from tensorflow.python.training.saving import saveable_object

    tensor_type = tf().Tensor
    keys: list[str] = []
    slices: list[str] = []
    tensors: list[Any] = []
    for obj, tensor_dict in serialized.items():
        variable = plain_variable(obj) if len(tensor_dict) == 1 else None
        for key, value in tensor_dict.items():
            by_slice = value if isinstance(value, dict) else {"": value}
            for slice_spec, tensor in by_slice.items():
                if variable is not None and not slice_spec:
                    tensor = read(variable)  # what TF's closure reads, in 2 ops instead of 5
                elif isinstance(tensor, saveable_object.SaveSpec):
                    tensor = tensor.tensor  # reads the variable now
                if tensor is None:  # an uninitialised variable: TF skips it too
                    continue
                if not isinstance(tensor, tensor_type):
                    # Keras 3 hands over a distributed variable itself: read it here, at
                    # the boundary, or SaveV2 would read it on the writer thread later
                    # (a SyncOnRead variable's read is a collective all-reduce)
                    tensor = tf().convert_to_tensor(tensor)
                keys.append(key)
                slices.append(slice_spec)
                tensors.append(tensor)
    return keys, slices, tensors
