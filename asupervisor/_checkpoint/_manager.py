"""Taking, writing and restoring checkpoints of a ``tf.train.Checkpoint``.

A save has two halves:

* :meth:`Checkpointer.snapshot` runs **on the step thread**, at a step boundary. It walks
  the object graph and reads every value to save. TensorFlow's reads are copy-on-write
  (a later in-place update copies the buffer while a read tensor still holds it), so the
  snapshot is consistent and costs no copy of the data on the step thread.
* :meth:`Checkpointer.write` runs **on the checkpoint writer thread**: it writes the
  snapshot with TF's ``SaveV2`` op as an ordinary TF2 object checkpoint under a temporary
  prefix, then commits it (:mod:`.files`), applies retention and updates
  :attr:`Checkpointer.last`.

Restore (:func:`restore_latest`, also used by ``SessionManager``) tries the newest
checkpoint named in the state file first and falls back to older ones, then to the
complete checkpoints on disk, when one is missing files or fails to load with a data
error (``checkpoint.corrupt`` is logged with the reason). A damaged state file (garbled,
binary, empty, dangling, missing) is not trusted: the checkpoints on disk are tried
newest first and the writer repairs the file. Every value is read and checksummed before
the restore returns, including those TF defers to their objects' creation (optimizer
slots). Checkpoint files of which none loads are a :class:`~asupervisor.CheckpointError`
listing each; transient errors (``AbortedError``, ``UnavailableError``) and other
non-data errors propagate as themselves, for the caller to retry or report, and never
mark a checkpoint corrupt. A checkpoint of a different model (a variable missing or of
another shape or dtype) is a :class:`~asupervisor.CheckpointError` naming the variables,
raised before anything is restored. This module never runs on the event loop thread.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._core._status import CheckpointInfo
from .._exceptions import CheckpointError
from .._logging import describe, get_logger
from .._tf import tf
from . import _bundle
from ._walk_cache import WalkCache, plain_variable
from .files import _commit, _names, _state_file, _writeback

__all__ = [
    "Checkpointer",
    "RestoreOutcome",
    "SaveAbandoned",
    "Snapshot",
    "candidates",
    "check_matches",
    "restore_latest",
    "restore_newest",
    "restore_path",
    "write_checkpoint_now",
]

log = get_logger(__name__)

#: keys a checkpoint may lack without being "another model"
_OPTIONAL_KEYS = ("save_counter/.ATTRIBUTES/VARIABLE_VALUE", "global_step/.ATTRIBUTES/VARIABLE_VALUE")
_ITERATOR_ATTR = "asv_data_iterator"

# One commit at a time per directory: the writer thread and a synchronous save (a
# CheckpointSaverHook on the step thread) must not interleave their read-modify-write of
# the state file.
_commit_locks: dict[str, threading.Lock] = {}
_commit_locks_guard = threading.Lock()


def _commit_lock(logdir: Path) -> threading.Lock:
    key = os.path.realpath(logdir)
    with _commit_locks_guard:
        return _commit_locks.setdefault(key, threading.Lock())


class SaveAbandoned(Exception):
    """A save given up at a stop's deadline (:meth:`Checkpointer.abandon`); nothing of it
    stays on disk and the previous checkpoint stays the latest."""


def _write_error(exc: BaseException, final: Path, step: int) -> CheckpointError | None:
    """The :class:`CheckpointError` saying where and why the save of ``final`` failed, for
    an ``OSError`` or a TensorFlow error; ``None`` for anything else."""
    where = f"could not save checkpoint {final.name} (step {step}) in {final.parent}"
    if isinstance(exc, OSError):
        cause = exc.strerror or str(exc)
        errno = f" (errno {exc.errno})" if exc.errno is not None else ""
        target = f"{exc.filename}: " if exc.filename else ""
        return CheckpointError(f"{where}: {target}{cause}{errno}; nothing of this save was kept")
    op_error = getattr(getattr(tf(), "errors", None), "OpError", None)
    if op_error is not None and isinstance(exc, op_error):
        message = getattr(exc, "message", "") or str(exc)
        return CheckpointError(f"{where}: {type(exc).__name__}: {message}; nothing of this save was kept")
    return None


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


# At least this much data per data shard. Below it one SaveV2 (no temporary directory, no
# MergeV2Checkpoints) is faster: with early writeback the disk, not the checksumming, is
# what a large save waits for, and a 16 MB state wrote 1.2x faster unsharded.
_SHARD_BYTES = 32 << 20
_MAX_SHARDS = 4


def _nbytes(tensor: Any) -> int:
    try:
        return int(tensor.shape.num_elements() or 0) * int(tensor.dtype.size)
    except (TypeError, ValueError, AttributeError):  # strings, variants: small, unknown size
        return 0


def _shards(tensors: list[Any]) -> list[list[int]]:
    """Indices into ``tensors`` per data shard: balanced by bytes, as many shards as cores help."""
    sizes = [_nbytes(t) for t in tensors]
    big = sum(1 for n in sizes if n >= _SHARD_BYTES // 4)
    count = max(1, min(_MAX_SHARDS, os.cpu_count() or 1, sum(sizes) // _SHARD_BYTES, big))
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        j = loads.index(min(loads))
        groups[j].append(i)
        loads[j] += sizes[i]
    return [g for g in groups if g]


# Write plain tensors with our own bundle writer (see _bundle) instead of SaveV2; a
# switch for A/B benchmarks and tests.
_NATIVE_WRITER = True


def write_snapshot(snapshot: Snapshot, prefix: str, check: Callable[[], None] | None = None) -> None:
    """Write ``snapshot`` as a TF2 object checkpoint at ``prefix``.

    Plain numeric, bool and string tensors are written by :mod:`._bundle` straight from
    the snapshot's buffers (when google-crc32c is there); TF's ``SaveV2`` writes the rest
    (variant tensors such as a ``tf.data`` iterator's state, slices). A checkpoint with
    both is written as two bundles merged into one index with ``MergeV2Checkpoints``, as
    TF's own multi-device saver does. A large snapshot is written as several data shards
    in parallel (short-lived threads joined here). ``check`` is called between chunks
    of the native writer and between parts, and may raise to abandon the write (the
    caller removes what was written; ``SaveV2`` itself cannot be interrupted).
    """
    if not (_NATIVE_WRITER and _bundle.available()):
        _save_v2(snapshot, prefix, _shards(snapshot.tensors))
        return
    native = [i for i, (t, s) in enumerate(zip(snapshot.tensors, snapshot.slices)) if _bundle.encodable(t, s)]
    if len(native) == len(snapshot.tensors):
        _write_native(snapshot, prefix, check)
        return
    if not native:
        _save_v2(snapshot, prefix, _shards(snapshot.tensors))
        return
    rest = sorted(set(range(len(snapshot.tensors))) - set(native))
    parts = [f"{prefix}_temp/part-{j:05d}-of-00002" for j in range(2)]
    os.makedirs(f"{prefix}_temp", exist_ok=True)
    _write_native(_subset(snapshot, native), parts[0], check)
    if check is not None:
        check()
    sub = _subset(snapshot, rest)
    _save_v2(sub, parts[1], [list(range(len(rest)))])
    with tf().device("/cpu:0"):
        from tensorflow.python.ops import gen_io_ops

        gen_io_ops.merge_v2_checkpoints(parts, prefix, delete_old_dirs=True)


def _subset(snapshot: Snapshot, indices: list[int]) -> Snapshot:
    def pick(values: list[Any]) -> list[Any]:
        return [values[i] for i in indices]

    return Snapshot(snapshot.step, pick(snapshot.keys), pick(snapshot.slices), pick(snapshot.tensors), snapshot.taken_at, 0.0)


def _write_native(snapshot: Snapshot, prefix: str, check: Callable[[], None] | None = None) -> None:
    groups = _shards(snapshot.tensors)
    if len(groups) == 1:
        _bundle.write_bundle(prefix, snapshot.keys, snapshot.tensors, groups, check=check)
        return
    with ThreadPoolExecutor(len(groups), thread_name_prefix="asv-checkpoint-shard") as pool:
        _bundle.write_bundle(
            prefix, snapshot.keys, snapshot.tensors, groups, lambda fn, n: list(pool.map(fn, range(n))), check
        )


def _save_v2(snapshot: Snapshot, prefix: str, groups: list[list[int]]) -> None:
    tf_ = tf()
    from tensorflow.python.ops import gen_io_ops

    with tf_.device("/cpu:0"):
        if len(groups) == 1:
            gen_io_ops.save_v2(prefix, snapshot.keys, snapshot.slices, snapshot.tensors)
            return
        parts = [f"{prefix}_temp/part-{j:05d}-of-{len(groups):05d}" for j in range(len(groups))]

        def save_part(j: int) -> None:
            idx = groups[j]
            with tf_.device("/cpu:0"):
                gen_io_ops.save_v2(
                    parts[j],
                    [snapshot.keys[i] for i in idx],
                    [snapshot.slices[i] for i in idx],
                    [snapshot.tensors[i] for i in idx],
                )

        with ThreadPoolExecutor(len(groups), thread_name_prefix="asv-checkpoint-shard") as pool:
            list(pool.map(save_part, range(len(groups))))
        gen_io_ops.merge_v2_checkpoints(parts, prefix, delete_old_dirs=True)


def _object_graph(reader: Any) -> Any:
    """The checkpoint's object graph (how its objects connect, and their keys)."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return graph


def _children(obj: Any) -> dict[str, Any]:
    try:
        return dict(obj._trackable_children(save_type="checkpoint"))
    except (AttributeError, TypeError):
        return {}


def _matched_keys(checkpoint: Any, graph: Any) -> tuple[dict[int, str], set[int]]:
    """``{id(live object): checkpoint key of its value}``, matched as TF's restore does,
    and the ids of the live objects matched to a checkpoint object holding any value.

    The checkpoint's object graph and the live one are walked together from the root,
    child by child name. Keys are *not* compared as strings: a variable reachable by
    several paths is keyed by whichever path was shortest when it was saved (a Keras
    optimizer's variable list, built after start-up, makes the model's kernels' keys
    ``optimizer/_trainable_variables/N``), so the live graph at start-up would name it
    differently.
    """
    matched: dict[int, str] = {}
    with_values: set[int] = set()
    seen: set[tuple[int, int]] = set()
    stack = [(0, checkpoint)]
    while stack:
        node_id, obj = stack.pop()
        if (node_id, id(obj)) in seen:
            continue
        seen.add((node_id, id(obj)))
        node = graph.nodes[node_id]
        if node.attributes:
            with_values.add(id(obj))
        for attr in node.attributes:
            if attr.name == "VARIABLE_VALUE":
                matched[id(obj)] = attr.checkpoint_key
        live = _children(obj)
        for ref in node.children:
            child = live.get(ref.local_name)
            if child is not None:
                stack.append((ref.node_id, child))
    return matched, with_values


def _surely_matches(checkpoint: Any, matched: dict[int, str], with_values: set[int], shapes: Any, dtypes: Any) -> bool:
    """True if every object of the state with values has them in the checkpoint, each
    variable with its shape and dtype. Cheap: TF's walk of the object graph, no value read.

    ``False`` only means "not sure": :func:`check_matches` then compares key by key, as
    TF's own save would name them (a walk that reads every variable, ~10x the cost).
    """
    from tensorflow.python.training.saving import saveable_object_util

    variable = tf().Variable
    objects, _ = checkpoint._saver._graph_view._breadth_first_traversal()
    for obj in objects:
        if id(obj) not in with_values:
            if saveable_object_util.trackable_has_serialize_to_tensor(obj) or obj._gather_saveables_for_checkpoint():
                return False  # values of its own that the checkpoint lacks (or keeps elsewhere)
            continue  # holds no value of its own (a container, a model, ...)
        key = matched.get(id(obj))
        if key is None:
            if isinstance(obj, variable):
                return False
            continue  # another kind of saveable (an iterator, ...) that the checkpoint has
        if key not in shapes:
            return False
        shape = getattr(obj, "shape", None)
        dtype = getattr(obj, "dtype", None)
        if shape is None or dtype is None or not shape.is_fully_defined() or list(shape) != list(shapes[key]):
            return False
        if dtypes[key] != getattr(dtype, "base_dtype", dtype):
            return False
    return True


def check_matches(checkpoint: Any, path: str, *, allow_missing: tuple[str, ...] = (), reader: Any = None) -> None:
    """Raise :class:`CheckpointError` if ``path`` holds another model than ``checkpoint``.

    Compares the index and object graph of ``path`` (no data read) with the variables the
    state holds now: a variable the checkpoint lacks, or has with another shape or dtype,
    is named. Checkpoint values the state has no object for yet are allowed (objects
    created later, such as optimizer slots, are restored when they are created).
    ``reader``: the checkpoint's ``tf.train.load_checkpoint`` reader, if already open.
    """
    from tensorflow.python.training.saving.saveable_object_util import SaveableCompatibilityConverter as converter

    if reader is None:
        reader = tf().train.load_checkpoint(path)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    matched, with_values = _matched_keys(checkpoint, _object_graph(reader))
    if _surely_matches(checkpoint, matched, with_values, shapes, dtypes):
        return
    serialized, _ = _serialized(checkpoint)
    missing, wrong = [], []
    for obj, tensor_dict in serialized.items():
        if obj is None:
            continue
        obj = getattr(obj, "obj", obj) if isinstance(obj, converter) else obj  # a tf.distribute variable
        live_keys = [k for k in tensor_dict if k.endswith("/.ATTRIBUTES/VARIABLE_VALUE")]
        if not live_keys:
            continue
        live_key = live_keys[0]
        name = str(getattr(obj, "name", None) or type(obj).__name__)
        key = matched.get(id(obj))
        if key is None or key not in shapes:
            if live_key not in _OPTIONAL_KEYS and not any(live_key.startswith(p) for p in allow_missing):
                missing.append(f"{live_key} ({name})")
            continue
        shape = getattr(obj, "shape", None)
        dtype = getattr(obj, "dtype", None)
        if shape is not None and shape.is_fully_defined() and list(shape) != list(shapes[key]):
            wrong.append(f"{live_key} ({name}): checkpoint shape {list(shapes[key])}, model shape {list(shape)}")
        elif dtype is not None and dtypes[key] != getattr(dtype, "base_dtype", dtype):
            wrong.append(f"{live_key} ({name}): checkpoint dtype {dtypes[key].name}, model dtype {dtype.name}")
    missing.sort()
    wrong.sort()
    if missing or wrong:
        parts = []
        if missing:
            parts.append(f"missing from the checkpoint: {', '.join(missing)}")
        if wrong:
            parts.append(f"different in the checkpoint: {'; '.join(wrong)}")
        raise CheckpointError(
            f"checkpoint {path} was written by a different model ({' | '.join(parts)}); "
            "point logdir at this model's checkpoints or start from an empty directory"
        )


def _deferred_keys(status: Any) -> list[str]:
    """The checkpoint keys a restore left for later: values of checkpoint objects that
    matched no live object yet (a Keras optimizer's slots before its first apply, a
    ``tf.data`` iterator not created yet). TF restores them when those objects appear."""
    coordinator = getattr(status, "_checkpoint", None)
    graph = getattr(coordinator, "object_graph_proto", None)
    matched = getattr(coordinator, "matched_proto_ids", None)
    if graph is None or matched is None:  # another TF: nothing known to be deferred
        return []
    keys: list[str] = []
    for node_id, node in enumerate(graph.nodes):
        if node.attributes and node_id not in matched:
            keys.extend(attr.checkpoint_key for attr in node.attributes)
    return keys


def _verify_values(path: str, keys: list[str], reader: Any) -> None:
    """Read ``keys`` of the checkpoint ``path`` now (one ``RestoreV2``), checking each
    value's checksum; raises TF's ``DataLossError`` (or another data error) if one is bad."""
    if not keys:
        return
    from tensorflow.python.ops import gen_io_ops

    dtypes = reader.get_variable_to_dtype_map()
    found: list[str] = []
    for key in keys:
        if key in dtypes:
            found.append(key)
        else:  # a saveable's tensors are named after its attribute: ITERATOR -> ITERATOR_STATE
            found.extend(k for k in dtypes if k.startswith(key))
    if not found:
        return
    shapes = reader.get_variable_to_shape_map()
    batch: list[str] = []
    size = 0
    with tf().device("/cpu:0"):
        for i, key in enumerate(found):
            batch.append(key)
            dtype = dtypes[key]
            size += _prod(shapes.get(key) or []) * max(int(dtype.size), 1)
            if size >= _VERIFY_BATCH_BYTES or i == len(found) - 1:
                # the values are dropped at once: memory stays bounded by one batch
                gen_io_ops.restore_v2(path, batch, [""] * len(batch), [dtypes[k] for k in batch])
                batch, size = [], 0


#: values read per ``RestoreV2`` when checking deferred values (bounds the memory held)
_VERIFY_BATCH_BYTES = 64 << 20


def _prod(dims: list[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def restore_path(checkpoint: Any, path: str, *, strict: bool = True) -> None:
    """Restore ``path`` into ``checkpoint`` (checking it matches the model first).

    Every value of the checkpoint is read and checksummed before this returns: the
    values TF restores now, and those it defers until their objects are created
    (optimizer slots), which are read once here so that a corrupt one is found at
    start-up, not at the first step.
    """
    reader = tf().train.load_checkpoint(path)
    if strict:
        check_matches(checkpoint, path, allow_missing=(f"{_ITERATOR_ATTR}/",), reader=reader)
    try:
        status = checkpoint.restore(path).expect_partial()
        _verify_values(path, _deferred_keys(status), reader)
    except BaseException:
        _forget_deferred(checkpoint, path)
        raise


def _forget_deferred(checkpoint: Any, path: str) -> None:
    """Drop the restores a failed restore of ``path`` left waiting for objects to appear.

    TF keeps them on the live objects (``_deferred_dependencies``) and runs every one
    when the object is created (optimizer slots at the first step): left there, the
    first step would restore values of the checkpoint that failed, or read its files
    after they were set aside.
    """

    def keep(position: Any) -> bool:
        return getattr(getattr(position, "checkpoint", None), "save_path_string", None) != path

    try:
        objects, _ = checkpoint._saver._graph_view._breadth_first_traversal()
    except Exception as exc:  # another TF: nothing more can be done here
        log.debug("checkpoint.deferred_not_cleared", path=path, error=describe(exc))
        return
    for obj in objects:
        deferred = getattr(obj, "_self_unconditional_deferred_dependencies", None)
        if isinstance(deferred, dict):
            for name in list(deferred):
                kept = [p for p in deferred[name] if keep(p)]
                if kept:
                    deferred[name] = kept
                else:
                    del deferred[name]
        slots = getattr(obj, "_deferred_slot_restorations", None)  # TF1-style optimizers
        if isinstance(slots, dict):
            for by_variable in slots.values():
                if isinstance(by_variable, dict):
                    for key in list(by_variable):
                        by_variable[key] = [p for p in by_variable[key] if keep(p)]


#: what the checkpoint reader's errors (which carry no error code) say about bad files
_DATA_MESSAGE = re.compile(
    r"checksum|corrupt|truncat|data loss|magic|sstable|invalid proto|unable to open table|"
    r"failed to parse|not found|no such file|out of range|bad |mismatch",
    re.IGNORECASE,
)


def _data_error(exc: BaseException) -> bool:
    """Whether ``exc``, raised restoring a checkpoint, says its files are bad (checksum,
    format, a file missing), as opposed to a transient or environmental failure
    (``AbortedError``, ``UnavailableError``, ``PermissionDeniedError``, ...)."""
    errors = tf().errors
    if isinstance(exc, errors.OpError):
        if type(exc) is errors.OpError:  # tf.train.load_checkpoint's reader loses the code
            return _DATA_MESSAGE.search(str(exc)) is not None
        return isinstance(exc, (errors.DataLossError, errors.NotFoundError, errors.InvalidArgumentError, errors.OutOfRangeError))
    from google.protobuf.message import DecodeError

    if isinstance(exc, (FileNotFoundError, IsADirectoryError, DecodeError, UnicodeDecodeError)):
        return True
    return isinstance(exc, (IndexError, ValueError)) and not isinstance(exc, OSError)


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


@dataclass
class RestoreOutcome:
    """What :func:`restore_newest` found.

    Attributes:
        path: the checkpoint restored, or ``None``.
        corrupt: newer checkpoints whose files exist but failed to load (data errors).
        gone: newer checkpoints the state file names whose files do not exist.
        state_problem: what is wrong with the state file (``None``: nothing), when the
            checkpoints on disk were scanned instead of trusting it.
        state: the state file as read (``None``: none, or unreadable).
    """

    path: str | None = None
    corrupt: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    state_problem: str | None = None
    state: _state_file.CheckpointState | None = None


def _candidates(logdir: Path, basename: str | None) -> tuple[list[str], _state_file.CheckpointState | None, str | None]:
    """Checkpoint prefixes (absolute) to try, newest first; the state read; its problem.

    A readable state file naming an existing latest checkpoint is trusted: its
    checkpoints come first, in its order. The complete checkpoints on disk
    (``<basename>-<step>`` with its index and every data shard; with ``basename``
    ``None`` only when the state file is damaged) follow as fallbacks. A damaged state
    file (unreadable, naming nothing, or its latest gone), or a missing one while
    checkpoints exist: every checkpoint, newest step first.
    """
    state, problem = _state_file.inspect_state(logdir)
    names: list[str] = []
    if state is not None:
        names = [n for n in state.paths if n != state.latest] + ([state.latest] if state.latest is not None else [])
        names.reverse()
        if state.latest is None:
            problem = "it names no checkpoint"
        elif not os.path.exists(_absolute(logdir, state.latest) + ".index"):
            problem = f"it names {state.latest}, whose files are gone"
    on_disk = _names.scan_checkpoints(logdir, basename) if (basename is not None or problem is not None) else []
    if state is None or problem is not None:
        # unnamed and incomplete (an index alone, a shard missing): not a checkpoint of
        # ours (with a sound state file, restore_newest checks only those it reaches)
        on_disk = [n for n in on_disk if n in names or _names.missing_files(logdir / n) is None]
    if state is None and problem is None and on_disk:
        problem = "it is missing"
    if problem is None:
        ordered = names + [n for n in on_disk if n not in names]
    else:
        steps = {n: _names.step_of(Path(n).name) for n in {*names, *on_disk}}
        stepped = sorted((n for n in steps if steps[n] is not None), key=lambda n: -(steps[n] or 0))
        ordered = stepped + [n for n in names if steps[n] is None]
    return [_absolute(logdir, n) for n in ordered], state, problem


def _absolute(logdir: Path, name: str) -> str:
    return name if os.path.isabs(name) else str(logdir / name)


def candidates(logdir: Path, basename: str | None = None) -> list[str]:
    """Checkpoint prefixes (absolute) a restore tries, newest first (see :func:`_candidates`)."""
    return _candidates(logdir, basename)[0]


def restore_latest(checkpoint: Any, logdir: Path, *, strict: bool = True, basename: str | None = None) -> str | None:
    """Restore the newest good checkpoint in ``logdir``; returns its path, or ``None``.

    A checkpoint that is missing files or fails to load is reported
    (``checkpoint.corrupt path=... reason=...``) and the one before it is tried; a
    damaged state file is reported and the checkpoints on disk are tried instead.

    Raises:
        CheckpointError: the checkpoint belongs to a different model (``strict`` only),
            or checkpoint files exist and none of them loads (each named with why).
        tf.errors.AbortedError, tf.errors.UnavailableError: a transient failure (the
            caller may retry; nothing is counted as corrupt).
    """
    return restore_newest(checkpoint, logdir, strict=strict, basename=basename).path


def restore_newest(checkpoint: Any, logdir: Path, *, strict: bool, basename: str | None = None) -> RestoreOutcome:
    """:func:`restore_latest`, with what failed on the way (:class:`RestoreOutcome`).

    Only data errors (checksum, format, missing files) make a checkpoint count as
    corrupt; any other error (transient, permission, resources) propagates as itself.
    """
    paths, state, problem = _candidates(logdir, basename)
    outcome = RestoreOutcome(state_problem=problem, state=state)
    if problem is not None:
        log.error("checkpoint.state_damaged", path=str(logdir / _names.STATE_FILE), reason=problem,
                  action="restoring the newest checkpoint on disk that loads")
    failures: list[tuple[str, str]] = []
    named = set() if state is None else {_absolute(logdir, n) for n in (*state.paths, state.latest) if n}
    for path in paths:
        reason = _names.missing_files(Path(path))
        if reason is not None and path not in named:
            log.debug("checkpoint.ignored", path=path, reason=reason)  # not ours: left alone
            continue
        if reason is not None and not os.path.exists(path + ".index") and not _names.checkpoint_files(Path(path)):
            outcome.gone.append(path)
            log.warning("checkpoint.gone", path=path, action="trying the previous one")
            continue
        if reason is None:
            try:
                t0 = time.perf_counter()
                restore_path(checkpoint, path, strict=strict)
            except CheckpointError:
                raise
            except Exception as exc:
                if not _data_error(exc):
                    raise
                reason = _reason(exc)
            else:
                log.info("checkpoint.restored", path=path, secs=round(time.perf_counter() - t0, 4))
                outcome.path = path
                return outcome
        log.error("checkpoint.corrupt", path=path, reason=reason, action="trying the previous one")
        outcome.corrupt.append(path)
        failures.append((path, reason))
    if failures:
        listing = "; ".join(f"{p}: {r}" for p, r in failures)
        raise CheckpointError(
            f"no checkpoint in {logdir} loads ({listing}); nothing was restored, initialised "
            "or changed: move the damaged checkpoints away (or restore them from a copy) "
            "to start again"
        )
    return outcome


class Checkpointer:
    """Saves and restores one ``tf.train.Checkpoint`` in a log directory.

    Args:
        checkpoint: the ``tf.train.Checkpoint`` holding the whole state.
        logdir: the directory of the checkpoints and the state file.
        basename: checkpoints are ``<logdir>/<basename>-<step>``.
        max_to_keep: the newest checkpoints kept (``None``: all). Retention counts and
            deletes only the checkpoints it manages: ``<basename>-<step>`` named in the
            state file with a commit time not in the future (as
            ``tf.train.CheckpointManager``, which leaves others' checkpoints alone).
        keep_checkpoint_every_n_hours: also keep one checkpoint per this many hours.
        wall_clock: wall-clock time for commit timestamps (``time.time``).
    """

    def __init__(
        self,
        checkpoint: Any,
        logdir: Path,
        *,
        basename: str = "model.ckpt",
        max_to_keep: int | None = 5,
        keep_checkpoint_every_n_hours: float | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.checkpoint = checkpoint
        self.logdir = Path(logdir)
        self.basename = basename
        self.max_to_keep = max_to_keep
        self.keep_every_secs = None if keep_checkpoint_every_n_hours is None else keep_checkpoint_every_n_hours * 3600
        self.wall_clock = wall_clock
        self.started_at = wall_clock()
        self.last: CheckpointInfo | None = None
        self.last_commit_secs: float | None = None  # snapshot handed over → named in the state file
        self.last_snapshot_step: int | None = None  # step thread only
        self._iterator_source: Any = None
        self._iterator: Any = None
        self._iterator_problem: str | None = None  # why TF cannot serialise it (track_iterator)
        self._iterator_checked = False
        self._iterator_logged: Any = None  # the iterator whose skip was logged
        self._iterator_share_pending = False  # an iterator was attached; its share not yet logged
        self._iterator_share_logged = False  # once per session
        self._lock = threading.Lock()
        self._owner = False  # whether this process writes the directory (prepare() was called)
        self._walks = WalkCache()  # step thread only
        self._abandon = threading.Event()  # set by abandon(): writes give up

    # -- step thread ---------------------------------------------------------------

    def prepare(self) -> None:
        """On start-up: create the directory and remove leftovers of interrupted saves.

        Called by the process that writes the directory (the chief), which from then on
        also sets aside checkpoints that fail to load (:meth:`restore`). It proves the
        directory can be written (a small file is written, synced and removed), so that a
        read-only, forbidden or full logdir fails the start, not the first save.

        Raises:
            CheckpointError: the directory cannot be created or written; names the path
                and the OS cause, chained to the ``OSError``.
        """
        try:
            self.logdir.mkdir(parents=True, exist_ok=True)
            _commit.probe_writable(self.logdir)
        except OSError as exc:
            target = exc.filename or self.logdir
            raise CheckpointError(
                f"logdir {self.logdir} cannot be written, so no checkpoint could be saved: "
                f"{target}: {exc.strerror or exc}"
                + (f" (errno {exc.errno})" if exc.errno is not None else "")
                + "; give a writable directory with free space"
            ) from exc
        _commit.clean_leftovers(self.logdir)
        self._owner = True

    def restore(self, *, strict: bool = True) -> str | None:
        """Restore the newest good checkpoint; returns its path or ``None``.

        In the directory's writer (after :meth:`prepare`), the state file is then made
        to name what was restored: newer checkpoints that failed to load are taken out of
        it and their files renamed aside (:meth:`_set_aside`), and a damaged state file is
        rewritten (``checkpoint.state_repaired``). Left as they were, the state file would
        keep calling a corrupt checkpoint the latest, and retention would keep it and
        delete good ones.

        Raises:
            CheckpointError: a different model, or checkpoint files exist and none loads.
        """
        outcome = restore_newest(self.checkpoint, self.logdir, strict=strict, basename=self.basename)
        path = outcome.path
        if path is not None and self._owner and (outcome.corrupt or outcome.gone or outcome.state_problem):
            self._set_aside(outcome.corrupt, path, outcome)
        elif path is None and self._owner and outcome.state_problem is not None:
            self._set_aside_state(outcome.state_problem)
        if path is not None:
            step = _names.step_of(Path(path).name)
            self.last = CheckpointInfo(path=path, step=step if step is not None else -1, time=os.path.getmtime(path + ".index"))
            self.last_snapshot_step = self.last.step
        return path

    def _set_aside(self, corrupt: list[str], restored: str, outcome: RestoreOutcome | None = None) -> None:
        """Make the state file name ``restored`` as the latest and drop ``corrupt`` (and
        checkpoints that are gone) from it, then rename the files of ``corrupt`` to
        ``<name>.corrupt-<time>.*``; nothing is deleted.

        A damaged state file is rewritten from the checkpoints on disk: those of this
        basename up to ``restored``, oldest first, stamped with their index file's time.
        """
        bad = {Path(p).name for p in corrupt} | ({Path(p).name for p in outcome.gone} if outcome else set())
        latest = _relative_name(self.logdir, restored)
        tag = "corrupt-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime(self.wall_clock()))
        with _commit_lock(self.logdir):
            state, problem = _state_file.inspect_state(self.logdir)
            if outcome is not None and outcome.state_problem is not None:
                problem = outcome.state_problem
            restored_step = _names.step_of(Path(restored).name)
            if problem is not None or state is None:
                names = [
                    n for n in reversed(_names.scan_checkpoints(self.logdir, self.basename))
                    if n not in bad
                    and (restored_step is None or (_names.step_of(n) or 0) <= restored_step)
                    and _names.missing_files(self.logdir / n) is None
                ]
                if latest not in names:
                    names.append(latest)
                stamps = [os.path.getmtime(self.logdir / f"{n}.index") for n in names]
                preserved = state.last_preserved if state is not None else 0.0
                repaired = _state_file.CheckpointState(latest, names, stamps, preserved)
            else:
                kept = [(p, t) for p, t in zip(state.paths, state.timestamps) if p not in bad]
                if latest not in [p for p, _ in kept]:
                    kept.append((latest, os.path.getmtime(restored + ".index")))
                    kept.sort(key=lambda pt: _names.step_of(Path(pt[0]).name) or -1)
                repaired = _state_file.CheckpointState(latest, [p for p, _ in kept], [t for _, t in kept], state.last_preserved)
            _state_file.write_state(self.logdir, repaired)
            if problem is not None or (outcome is not None and outcome.gone):
                log.warning(
                    "checkpoint.state_repaired",
                    path=str(self.logdir / _names.STATE_FILE),
                    problem=problem or "it names checkpoints whose files are gone",
                    gone=[Path(p).name for p in outcome.gone] if outcome is not None and outcome.gone else None,
                    set_aside=sorted(Path(p).name for p in corrupt) or None,
                    latest=latest,
                    paths=repaired.paths,
                )
            for name in sorted({Path(p).name for p in corrupt}):
                moved = _commit.set_aside(self.logdir / name, tag)
                log.warning("checkpoint.set_aside", path=str(self.logdir / name), files=moved)

    def _set_aside_state(self, problem: str) -> None:
        """A damaged state file with no checkpoint on disk to name: rename it to
        ``checkpoint.corrupt-<time>`` (kept for inspection), so that the first save
        starts a new one instead of keeping what it named."""
        tag = "corrupt-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime(self.wall_clock()))
        source = self.logdir / _names.STATE_FILE
        target = self.logdir / f"{_names.STATE_FILE}.{tag}"
        with _commit_lock(self.logdir):
            try:
                os.replace(source, target)
            except FileNotFoundError:
                return
            _writeback.fsync_path(self.logdir)
        log.warning("checkpoint.state_repaired", path=str(source), problem=problem, set_aside=target.name, latest=None)

    def snapshot(self, step: int) -> Snapshot | None:
        """Snapshot the state at ``step``; ``None`` if that step is already saved."""
        if step == self.last_snapshot_step:
            return None
        snap = take_snapshot(self.checkpoint, step, self._walks)
        self.last_snapshot_step = step
        return snap

    def track_iterator(self, dataset: Any, mode: bool | None = None) -> Any:
        """An iterator over ``dataset``, part of the checkpoint as ``mode`` says.

        ``mode`` is ``run_loop``'s ``checkpoint_iterator``: ``None`` tracks the iterator
        when TensorFlow can serialise it, else logs ``checkpoint.iterator_skipped`` once
        and leaves it out; ``True`` raises :class:`CheckpointError` instead; ``False``
        leaves it out. The check (:func:`._iterator_state.serialisation_problem`) runs
        once per new iterator, before its position is restored and before any step.

        The iterator of the same dataset object is reused within a session (so a retried
        or second ``run_loop`` goes on where the last stopped); if the restored checkpoint
        holds an iterator position, a new tracked iterator resumes from it.
        """
        from ._iterator_state import serialisation_problem, untrackable_error

        if self._iterator_source is dataset and self._iterator is not None:
            iterator = self._iterator
        else:
            iterator = iter(dataset)
            self._iterator_source, self._iterator = dataset, iterator
            self._iterator_problem = None if mode is False else serialisation_problem(iterator)
            self._iterator_checked = mode is not False
        if mode is not False and not self._iterator_checked:  # reused, never checked
            self._iterator_problem = serialisation_problem(iterator)
            self._iterator_checked = True
        track = mode is not False
        if track and self._iterator_problem is not None:
            if mode:
                raise untrackable_error(self._iterator_problem)
            if self._iterator_logged is not iterator:
                self._iterator_logged = iterator
                log.warning(
                    "checkpoint.iterator_skipped",
                    reason=self._iterator_problem,
                    action="left out of checkpoints: a resumed run restarts the data",
                )
            track = False
        if track:
            if getattr(self.checkpoint, _ITERATOR_ATTR, None) is not iterator:
                try:
                    setattr(self.checkpoint, _ITERATOR_ATTR, iterator)  # restores a deferred position
                except tf().errors.OpError as exc:
                    from ._iterator_state import restore_mismatch_error

                    _untrack(self.checkpoint, _ITERATOR_ATTR)
                    self._iterator_source = self._iterator = None
                    raise restore_mismatch_error(exc, self.last.path if self.last else None) from exc
                self._iterator_share_pending = not self._iterator_share_logged
        elif getattr(self.checkpoint, _ITERATOR_ATTR, None) is not None:
            _untrack(self.checkpoint, _ITERATOR_ATTR)  # an earlier run_loop's iterator
            self._iterator_share_pending = False
        return iterator

    # -- any thread ----------------------------------------------------------------

    def abandon(self) -> None:
        """Make the write in flight, and any later one, give up before its commit.

        For a stop whose deadline has come: the writer stops between chunks, removes what
        it wrote and raises :class:`SaveAbandoned`; the previous checkpoint stays the
        latest. A write already committing (renames and the state file) completes.
        """
        self._abandon.set()

    def _check_abandon(self) -> None:
        if self._abandon.is_set():
            raise SaveAbandoned("the save was abandoned: the stop's grace period ran out")

    def _report_iterator_share(self, prefix: str) -> None:
        """On the writer thread, after a commit: log once per session how much of the
        checkpoint the data iterator's state is (``checkpoint.iterator_state``); a
        warning when it is most of it (a large shuffle buffer). Never fails a save."""
        if not self._iterator_share_pending:
            return
        try:
            self._log_iterator_share(prefix)
        except Exception:  # a report only: the checkpoint is committed, never fail the save
            self._iterator_share_pending = False

    def _log_iterator_share(self, prefix: str) -> None:
        from ._iterator_state import DOMINANT_BYTES, DOMINANT_SHARE, iterator_share

        try:
            share = iterator_share(prefix)
        except Exception as exc:  # an index this reader does not know (compressed, ...)
            self._iterator_share_pending = False
            log.debug("checkpoint.iterator_state_unknown", path=prefix, error=describe(exc))
            return
        if share is None:  # taken before the iterator was attached: the next one will tell
            return
        self._iterator_share_pending = False
        self._iterator_share_logged = True
        mine, total = share
        ratio = round(mine / total, 3) if total else 0.0
        if ratio > DOMINANT_SHARE and mine >= DOMINANT_BYTES:
            log.warning(
                "checkpoint.iterator_state",
                bytes=mine,
                checkpoint_bytes=total,
                share=ratio,
                path=prefix,
                hint="the data iterator's buffers (shuffle, prefetch) are most of each checkpoint; a "
                "smaller shuffle buffer or run_loop(..., checkpoint_iterator=False) makes checkpoints smaller",
            )
        else:
            log.info("checkpoint.iterator_state", bytes=mine, checkpoint_bytes=total, share=ratio, path=prefix)

    # -- writer thread -------------------------------------------------------------

    def write(self, snapshot: Snapshot, *, min_keep: int = 1) -> CheckpointInfo:
        """Write, commit, apply retention; returns the committed checkpoint.

        Args:
            snapshot: what :meth:`snapshot` took.
            min_keep: keep at least this many (2 while another save is in flight).

        Raises:
            CheckpointError: the files could not be written (disk full, I/O error, ...):
                names the file and the OS cause, chained to the original error. Nothing
                of the failed save stays on disk.
            SaveAbandoned: :meth:`abandon` was called before the commit.
        """
        t0 = time.perf_counter()
        name = f"{self.basename}-{snapshot.step}"
        final = self.logdir / name
        tmp = self.logdir / f"{name}{_names.TMP_MARKER}{secrets.token_hex(4)}"
        check = self._check_abandon
        try:
            check()
            with _writeback.early_writeback(tmp):
                write_snapshot(snapshot, str(tmp), check)
            _writeback.sync_data(tmp, check)  # the long wait for the disk, abandonable
            with _commit_lock(self.logdir):
                check()  # the last point where the save can be given up
                info, state, delete = self._plan(name, snapshot, min_keep)
                _commit.commit(tmp, final, state, [self.logdir / old for old in delete])  # now it is the latest
        except BaseException as exc:
            _commit.remove_partial(tmp)
            error = _write_error(exc, final, snapshot.step)
            if error is not None:
                raise error from exc
            raise
        # durable and named in the state file: retention's deletions come after
        self.last_commit_secs = time.perf_counter() - t0
        for old in delete:
            try:
                _commit.retire_checkpoint(self.logdir / old)
            except OSError as exc:  # marked pending: the next start removes it
                log.error("checkpoint.cleanup_failed", path=str(self.logdir / old), error=describe(exc))
        with self._lock:
            self.last = info
        log.info(
            "checkpoint.saved",
            step=snapshot.step,
            path=info.path,
            secs=round(self.last_commit_secs, 4),
            blocked_secs=round(snapshot.blocked_secs, 4),
            deleted=delete or None,
        )
        self._report_iterator_share(info.path)
        return info

    def _plan(
        self, name: str, snapshot: Snapshot, min_keep: int = 1
    ) -> tuple[CheckpointInfo, _state_file.CheckpointState, list[str]]:
        """The state file naming ``name``, its checkpoint, and the checkpoints retention drops."""
        now = self.wall_clock()
        state = _state_file.read_own_state(self.logdir) or _state_file.CheckpointState(last_preserved=self.started_at)
        if state.last_preserved == 0.0:
            state.last_preserved = self.started_at
        keep = [(p, t) for p, t in zip(state.paths, state.timestamps) if p != name]
        latest_step = _names.step_of(state.latest) if state.latest else None
        if latest_step is not None and latest_step > snapshot.step and state.latest in state.paths:
            # an older snapshot committed after a newer checkpoint (a hook's synchronous
            # save): keep it in step order and leave the newer one the latest
            at = next((i for i, (p, _) in enumerate(keep) if (_names.step_of(p) or -1) > snapshot.step), len(keep))
            keep.insert(at, (name, now))
            latest = state.latest
        else:
            keep.append((name, now))
            latest = name
        state = _state_file.CheckpointState(latest, [p for p, _ in keep], [t for _, t in keep], state.last_preserved)
        prefix = f"{self.basename}-"

        def managed(path: str, stamp: float) -> bool:
            # ours (not plain tf.train.Checkpoint.save's, nor another basename's), and not
            # stamped in the future (a clock reset): as tf.train.CheckpointManager
            return path.startswith(prefix) and path[len(prefix) :].isdigit() and stamp <= now

        state, delete = _commit.select_retention(
            state,
            max_to_keep=None if self.max_to_keep is None else max(self.max_to_keep, min_keep),
            keep_every_secs=self.keep_every_secs,
            managed=managed,
        )
        return CheckpointInfo(path=str(self.logdir / name), step=snapshot.step, time=now), state, delete


def _relative_name(logdir: Path, path: str) -> str:
    """``path`` relative to ``logdir`` when inside it (as the state file names it)."""
    try:
        return str(Path(path).relative_to(logdir))
    except ValueError:
        return path


def _untrack(checkpoint: Any, name: str) -> None:
    """Remove attribute ``name`` from ``checkpoint`` and from what it saves."""
    if name in vars(checkpoint):
        delattr(checkpoint, name)
    delete = getattr(checkpoint, "_delete_tracking", None)
    if delete is not None and any(ref.name == name for ref in checkpoint._checkpoint_dependencies):
        delete(name)


def write_checkpoint_now(
    checkpoint: Any,
    directory: str | os.PathLike[str],
    basename: str,
    step: int,
    *,
    max_to_keep: int | None,
    keep_checkpoint_every_n_hours: float | None = None,
) -> str:
    """On the step thread: snapshot and commit ``<directory>/<basename>-<step>`` now.

    The synchronous save (same files, commit protocol and retention as the checkpoint
    service) for callers that need the checkpoint to be the latest when this returns,
    such as ``CheckpointSaverHook``. Returns the checkpoint's path prefix.
    """
    checkpointer = Checkpointer(
        checkpoint,
        Path(directory),
        basename=basename,
        max_to_keep=max_to_keep,
        keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
    )
    checkpointer.logdir.mkdir(parents=True, exist_ok=True)
    return checkpointer.write(take_snapshot(checkpoint, step)).path
