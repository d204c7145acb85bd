"""A snapshot of a ``tf.train.Checkpoint``: taken on the step thread, at a step boundary.

:func:`take_snapshot` walks the object graph (TF's serialising walk, :mod:`._graph`) or
reuses the last walk (:mod:`._walk_cache`)
and reads every value to save, consistent at that boundary, in one of two ways:

* **Staged** (:class:`Staging`, the default once the native bundle writer is known to
  work): each CPU variable is copied into a staging buffer kept from one save to the
  next, and the read is dropped at once. The step thread pays one memcpy of the state
  into memory already touched; the next step updates the variables in place. One
  snapshot is staged at a time (the buffers cost the state's size in host memory, for
  the session); another snapshot taken while they are still being written takes the
  second way. PyTorch DCP's async save stages into pinned host buffers the same way.
* **Copy-on-write**: TensorFlow's reads are copy-on-write (a later in-place update copies
  the buffer while a read tensor still holds it), so keeping the reads costs no copy at
  the boundary, but the next step copies every variable it updates into freshly
  allocated memory: 1.6-2.3x a memcpy on the machines measured (fresh pages), with
  spikes. Used for variables on an accelerator, for values that are not plain numbers,
  and when the staging buffers are in use.

Never on the event loop.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import _tf_internals as internals
from ..._logging import get_logger
from ..._tf import tf
from . import _graph
from ._walk_cache import WalkCache, initialized, saved_variable

__all__ = ["Snapshot", "Staged", "Staging", "take_snapshot"]

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
    metrics: Mapping[str, float] = field(default_factory=dict)  # recorded with it (:mod:`._metrics`)
    tier: str = "disk"  # where it is to be written: "disk" (the logdir) or "ram" (the RAM tier)


class Staged:
    """A variable's value copied into a staging buffer at a step boundary.

    What the bundle writer needs of a tensor: ``dtype`` (a ``tf.DType``), ``shape`` (a
    ``tf.TensorShape``, made when asked: on the writer thread) and the bytes
    (``numpy.asarray(staged)``).
    """

    __slots__ = ("array", "dtype")

    def __init__(self, array: np.ndarray, dtype: Any) -> None:
        self.array = array
        self.dtype = dtype

    @property
    def shape(self) -> Any:
        """The value's ``tf.TensorShape``."""
        return tf().TensorShape(self.array.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.array if dtype is None else self.array.astype(dtype)

    def numpy(self) -> np.ndarray:
        """The staged value (the buffer itself: valid while its snapshot lives)."""
        return self.array


class Staging:
    """Staging buffers reused from one snapshot to the next; one snapshot at a time.

    The buffers are allocated and touched when a variable is first staged (or changes
    shape or dtype) and kept for the session: :attr:`nbytes` of host memory. They are
    taken by :meth:`begin` on the step thread and given back when the snapshot that holds
    them is garbage (its write is over), from whichever thread drops it.
    """

    def __init__(self) -> None:
        self._buffers: list[np.ndarray] = []
        self._busy = False
        self._lock = threading.Lock()
        self.nbytes = 0
        self.prepared = False  # buffers were made ready off the step thread (prepare)

    def ready(self) -> bool:
        """Whether a snapshot taken now would be staged (its buffers prepared and free)."""
        with self._lock:
            return self.prepared and not self._busy

    def begin(self) -> bool:
        """Take the buffers for a new snapshot; ``False`` while the last one holds them."""
        with self._lock:
            if self._busy:
                return False
            self._busy = True
            return True

    def release(self) -> Callable[[], None]:
        """The call giving back what the last :meth:`begin` took, once the snapshot
        holding it is gone (bound to that snapshot's buffers)."""
        return self.end

    def end(self) -> None:
        """Give the buffers back (the snapshot holding them is gone)."""
        with self._lock:
            self._busy = False

    def buffer(self, index: int, like: np.ndarray) -> np.ndarray:
        """Staging buffer ``index``, shaped and typed like ``like``; touched when new."""
        buffers = self._buffers
        if index < len(buffers):
            buf = buffers[index]
            if buf.shape == like.shape and buf.dtype == like.dtype:
                return buf
            self.nbytes -= buf.nbytes
        buf = aligned_empty(like.shape, like.dtype)  # aligned: the writer sends it to disk with direct I/O
        buf.reshape(-1).view(np.uint8)[::4096] = 0  # touch every page now, not in the next save
        self.nbytes += buf.nbytes
        if index < len(buffers):
            buffers[index] = buf
        else:
            buffers.append(buf)
        return buf

    def prepare(self, tensors: list[Any], stopping: Callable[[], bool] | None = None) -> bool:
        """Off the step thread, after a copy-on-write snapshot of ``tensors`` was written:
        allocate and touch the buffers the next snapshot will stage into, so that the
        step thread never pays for fresh memory (~2 ms per MiB on the VMs measured: a
        second per 512 MB). ``False`` if the buffers were in use (nothing done), or if
        ``stopping()``, asked before each buffer, said the session is stopping (no next
        save: the final one waits for one buffer at most; snapshots stay copy-on-write)."""
        if not self.begin():
            return False
        try:
            index = 0
            for tensor in tensors:
                if _stageable(tensor):
                    if stopping is not None and stopping():
                        return False
                    self.buffer(index, internals.numpy_view(tensor))
                    index += 1
            self.prepared = True
        finally:
            self.end()
        return True


def _stageable(value: Any) -> bool:
    """Whether a read value is staged: a plain-numbered tensor of rank >= 1 on the CPU.

    Runs once per variable on the step thread (:func:`..._tf_internals.fast_stageable`).
    """
    return internals.fast_stageable(value, _plain_dtypes())


# Staging is the fast store's: its aligned allocation and the dtypes its native writer
# takes are handed in by the store (use_staging) when its code loads; this module imports
# nothing of the store. ``load_staging`` (set by the store's door) loads it on first use.
_allocate: Callable[[Any, Any], np.ndarray] | None = None
_stage_dtypes: frozenset[int] | None = None
load_staging: Callable[[], None] | None = None


def use_staging(allocate: Callable[[Any, Any], np.ndarray], dtypes: frozenset[int]) -> None:
    """The store's aligned allocation and stageable dtypes (the fast store, as it loads)."""
    global _allocate, _stage_dtypes
    _allocate, _stage_dtypes = allocate, dtypes


def _load() -> None:
    if _stage_dtypes is None and load_staging is not None:
        try:
            load_staging()
        except ImportError:  # no fast store here: nothing is staged
            pass


def aligned_empty(shape: Any, dtype: Any) -> np.ndarray:
    """A staging buffer aligned for the native writer's direct I/O (plain ``numpy`` memory
    without the fast store, which then stages nothing anyway)."""
    _load()
    if _allocate is None:
        return np.empty(shape, dtype)
    return _allocate(shape, dtype)


def _plain_dtypes() -> frozenset[int]:
    """The dtypes the native writer stages (none without the fast store)."""
    if _stage_dtypes is None:
        _load()
    return _stage_dtypes if _stage_dtypes is not None else frozenset()


# Copies at the boundary run on this many threads (the step thread and short-lived
# helpers joined before the snapshot returns), in pieces of _COPY_PIECE bytes: two
# threads copied 512 MB in 0.65-0.75x the time of one on the 2-core VMs measured. Less
# than _COPY_PARALLEL_MIN bytes in all are copied by the step thread alone.
_COPY_THREADS = min(4, os.cpu_count() or 1)
_COPY_PIECE = 8 << 20
_COPY_PARALLEL_MIN = 16 << 20


class _Stager:
    """``stager(variable)``: the variable read, to be copied into the next staging buffer
    when it is :func:`_stageable` (a :class:`Staged` is returned), else the read itself.
    :meth:`copy` then does the copies, in parallel when large, and drops the reads."""

    def __init__(self, staging: Staging, read: Callable[[Any], Any]) -> None:
        self.staging = staging
        self.read = read
        self.count = 0
        self._copies: list[tuple[np.ndarray, np.ndarray]] = []  # (buffer, the variable's own memory)

    def __call__(self, variable: Any) -> Any:
        return self.stage(self.read(variable))

    def stage(self, value: Any) -> Any:
        """``value`` (a variable's read) queued for its staging buffer, as a :class:`Staged`;
        the read itself if it is not :func:`_stageable`."""
        if not _stageable(value):
            return value
        view = internals.numpy_view(value)  # the variable's own buffer, no copy (a CPU tensor)
        buf = self.staging.buffer(self.count, view)
        self._copies.append((buf, view))
        self.count += 1
        return Staged(buf, value.dtype)

    def reset(self) -> None:
        """Forget the values read so far (the walk starts again)."""
        self.count = 0
        self._copies = []

    def copy(self) -> None:
        """Copy every queued value into its buffer; the reads are dropped after, so the
        next step updates the variables in place."""
        copies, self._copies = self._copies, []
        total = sum(buf.nbytes for buf, _ in copies)
        threads = min(_COPY_THREADS, max(1, total // (_COPY_PARALLEL_MIN // 2)))
        if threads <= 1:
            for buf, view in copies:
                np.copyto(buf, view, casting="no")
            return
        pieces: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(threads)]
        loads = [0] * threads
        for buf, view in copies:
            dst = buf.reshape(-1).view(np.uint8)
            src = view.reshape(-1).view(np.uint8)
            for start in range(0, dst.nbytes, _COPY_PIECE):
                j = loads.index(min(loads))
                pieces[j].append((dst[start : start + _COPY_PIECE], src[start : start + _COPY_PIECE]))
                loads[j] += min(_COPY_PIECE, dst.nbytes - start)
        errors: list[BaseException] = []

        def run(part: list[tuple[np.ndarray, np.ndarray]]) -> None:
            try:
                for dst, src in part:
                    np.copyto(dst, src)  # releases the GIL
            except BaseException as exc:  # re-raised on the step thread below
                errors.append(exc)

        helpers = [threading.Thread(target=run, args=(part,), name="asv-snapshot-copy") for part in pieces[1:]]
        for helper in helpers:
            helper.start()
        run(pieces[0])
        for helper in helpers:
            helper.join()
        if errors:
            raise errors[0]


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
    ops = tf().raw_ops
    disable_copy_on_read = ops.DisableCopyOnRead
    read_variable_op = ops.ReadVariableOp

    def read(variable: Any) -> Any:
        handle = variable.handle
        disable_copy_on_read(resource=handle)
        return read_variable_op(resource=handle, dtype=variable.dtype)

    return read


_ONE: Any = None  # an int64 1 on the CPU, made once (a constant per save costs ~15 us)


def _count_save(counter: Any) -> None:
    """``counter += 1``, TF's ``save_counter``: one op for a plain variable (~7 us against
    ``assign_add(1)``'s ~30 us, which converts the 1 and wraps the result), else as TF does."""
    global _ONE
    plain = internals.resource_variable_type()
    if plain is None or type(counter) is not plain or counter.dtype != tf().int64:
        counter.assign_add(1)
        return
    if _ONE is None:
        with tf().device("/cpu:0"):
            _ONE = tf().constant(1, tf().int64)
    tf().raw_ops.AssignAddVariableOp(resource=counter.handle, value=_ONE)


def take_snapshot(
    checkpoint: Any,
    step: int,
    walks: WalkCache | None = None,
    staging: Staging | None = None,
    extra: Sequence[tuple[str, Any]] = (),
    metrics: Mapping[str, float] | None = None,
    tier: str = "disk",
) -> Snapshot:
    """On the step thread: read every value to save.

    Args:
        checkpoint: the ``tf.train.Checkpoint``.
        step: the step being saved.
        walks: where the last object-graph walk of ``checkpoint`` is kept, to skip the
            next walk while the graph is unchanged (:mod:`._walk_cache`).
        staging: staging buffers to copy the variables into (when free); ``None``: the
            snapshot keeps copy-on-write reads.
        extra: more ``(key, tensor)`` values, outside the object graph (a checkpoint's
            metrics, :mod:`._metrics`).
        metrics: the metrics those values record (:attr:`Snapshot.metrics`).
        tier: where it is to be written (:attr:`Snapshot.tier`). Set here, not on a copy:
            the staging buffers are given back when *this* object is gone.
    """
    t0 = time.perf_counter()
    counter = internals.create_save_counter(checkpoint)
    if counter is not None:  # as tf.train.Checkpoint.save() does: plain TF restores match
        _count_save(counter)
    read = _variable_reader()
    stager = _Stager(staging, read) if staging is not None and staging.prepared and staging.begin() else None
    release = None if stager is None else stager.staging.release()
    try:
        cached = None if walks is None else walks.read(checkpoint, read, None if stager is None else stager.stage)
        if stager is not None:
            read = stager
        if cached is not None:
            keys, tensors = cached
            slices = [""] * len(keys)
        else:
            if stager is not None:
                stager.reset()  # a stale walk may have read some variables already
            serialized, _ = _graph.serialized(checkpoint)
            if walks is not None:
                walks.learn(checkpoint, serialized)
            keys, slices, tensors = _read_serialized(serialized, read)
        if stager is not None:
            stager.copy()
    except BaseException:
        if release is not None:
            release()
        raise
    if extra:  # new lists: a cached walk's are kept for the next snapshot
        keys = [*keys, *(k for k, _ in extra)]
        slices = [*slices, *([""] * len(extra))]
        tensors = [*tensors, *(t for _, t in extra)]
    t1 = time.perf_counter()
    snap = Snapshot(step, keys, slices, tensors, t1, t1 - t0, dict(metrics or {}), tier)
    if release is not None:
        if stager is not None and stager.count:
            weakref.finalize(snap, release)  # the buffers are free once the snapshot is gone
        else:
            release()
    return snap


def _read_serialized(
    serialized: dict[Any, dict[str, Any]], read: Callable[[Any], Any]
) -> tuple[list[str], list[str], list[Any]]:
    """The keys, slice specs and values of TF's walk, every variable read now."""
    tensor_type = tf().Tensor
    keys: list[str] = []
    slices: list[str] = []
    tensors: list[Any] = []
    for obj, tensor_dict in serialized.items():
        variable = saved_variable(obj) if len(tensor_dict) == 1 else None
        if variable is not None and not initialized(variable):
            continue  # TF's walk skips it too (its closure reads None)
        for key, value in tensor_dict.items():
            by_slice = value if isinstance(value, dict) else {"": value}
            for slice_spec, tensor in by_slice.items():
                if variable is not None and not slice_spec:
                    tensor = read(variable)  # what TF's closure reads, in 2 ops instead of 5
                else:
                    tensor = internals.save_spec_tensor(tensor)  # a legacy SaveSpec: reads the variable now
                if tensor is None:  # an uninitialised variable: TF skips it too
                    continue
                if not isinstance(tensor, (tensor_type, Staged)):
                    # Keras 3 hands over a distributed variable itself: read it here, at
                    # the boundary, or SaveV2 would read it on the writer thread later
                    # (a SyncOnRead variable's read is a collective all-reduce)
                    tensor = tf().convert_to_tensor(tensor)
                keys.append(key)
                slices.append(slice_spec)
                tensors.append(tensor)
    return keys, slices, tensors
