"""Writing a snapshot as a TF2 object checkpoint, on the checkpoint writer thread.

:func:`write_snapshot` writes under a temporary prefix, with the project's own tensor
bundle writer (the fast store's, passed in) or TF's ``SaveV2`` op, sharded when large, checking
between chunks whether the save was abandoned (:class:`SaveAbandoned`, the stop's
deadline). Write errors name the file and the OS cause. Which writer and whether
direct I/O are the store's choice (:mod:`.store`), passed in. Never on the event loop
nor on the step thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ...._logging import get_logger
from ...._tf import tf
from ...snapshot import _snapshot
from .._errors import SaveAbandoned

if TYPE_CHECKING:
    from .._types import IdleIO, NativeWriter

__all__ = ["SaveAbandoned", "write_snapshot"]

log = get_logger(__name__)


# At least this much data per data shard. Below it one SaveV2 (no temporary directory, no
# MergeV2Checkpoints) is faster: with early writeback the disk, not the checksumming, is
# what a large save waits for, and a 16 MB state wrote 1.2x faster unsharded.
_SHARD_BYTES = 32 << 20


_MAX_SHARDS = 4

_SMALL_FIRST = 64 << 10  # values under this many bytes are placed before the others of their shard


def _nbytes(tensor: Any) -> int:
    try:
        return int(tensor.shape.num_elements() or 0) * int(tensor.dtype.size)
    except (TypeError, ValueError, AttributeError):  # strings, variants: small, unknown size
        return 0


def _shards(tensors: list[Any]) -> list[list[int]]:
    """Indices into ``tensors`` per data shard: balanced by bytes, as many shards as cores help.

    Within a shard the small values come first (the object-graph proto, scalars), the large
    after them, each kind in the snapshot's order: a cold restore reads the proto (to match
    the model) before any variable, and finds it in the first pages the kernel reads
    ahead, then reads on sequentially instead of going back to the start.
    """
    sizes = [_nbytes(t) for t in tensors]
    big = sum(1 for n in sizes if n >= _SHARD_BYTES // 4)
    count = max(1, min(_MAX_SHARDS, os.cpu_count() or 1, sum(sizes) // _SHARD_BYTES, big))
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        j = loads.index(min(loads))
        groups[j].append(i)
        loads[j] += sizes[i]
    return [sorted(g, key=lambda i: (sizes[i] >= _SMALL_FIRST, i)) for g in groups if g]


def write_snapshot(
    snapshot: _snapshot.Snapshot,
    prefix: str,
    check: Callable[[], None] | None = None,
    io: IdleIO | None = None,
    *,
    native: NativeWriter | None = None,
    direct: bool = True,
    checksums: bool = False,
) -> dict[str, tuple[int, int]]:
    """Write ``snapshot`` as a TF2 object checkpoint at ``prefix``.

    Plain numeric, bool and string tensors are written by :mod:`._bundle` straight from
    the snapshot's buffers (when google-crc32c is there); TF's ``SaveV2`` writes the rest
    (variant tensors such as a ``tf.data`` iterator's state, slices). A checkpoint with
    both is written as two bundles merged into one index with ``MergeV2Checkpoints``, as
    TF's own multi-device saver does. A large snapshot is written as several data shards
    in parallel (short-lived threads joined here). ``check`` is called between chunks
    of the native writer and between parts, and may raise to abandon the write (the
    caller removes what was written; ``SaveV2`` itself cannot be interrupted). With
    ``io`` the native writer's data go to disk from its idle-priority thread.
    ``native``: the fast store's native writer (its ``_bundle`` module); ``None``:
    ``SaveV2`` writes everything, in pieces (the plain store, :func:`_save_v2_in_pieces`).
    ``direct=False``: no data file is written with direct I/O.

    Returns, with ``checksums``, the size and CRC32C of each file the native writer
    produced, by its name's suffix (``".data-00000-of-00002"``), from the bytes it wrote
    (none for what TF writes: ``SaveV2``'s files, a merged index); else ``{}``.
    """
    if native is None:
        _save_v2_in_pieces(snapshot, prefix, check)
        return {}
    if not (native.available() and native.self_check()):
        _save_v2(snapshot, prefix, _shards(snapshot.tensors))
        return {}
    encodable = [i for i, (t, s) in enumerate(zip(snapshot.tensors, snapshot.slices)) if native.encodable(t, s)]
    if len(encodable) == len(snapshot.tensors):
        return _write_native(native, snapshot, prefix, check, io, direct, checksums)
    if not encodable:
        _save_v2(snapshot, prefix, _shards(snapshot.tensors))
        return {}
    rest = sorted(set(range(len(snapshot.tensors))) - set(encodable))
    parts = [f"{prefix}_temp/part-{j:05d}-of-00002" for j in range(2)]
    os.makedirs(f"{prefix}_temp", exist_ok=True)
    sums = _write_native(native, _subset(snapshot, encodable), parts[0], check, io, direct, checksums)
    if check is not None:
        check()
    sub = _subset(snapshot, rest)
    _save_v2(sub, parts[1], [list(range(len(rest)))])
    with tf().device("/cpu:0"):
        _merge_op(parts, prefix, delete_old_dirs=True)
    return _merged_sums(sums)


def _merged_sums(sums: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """The native part's sums under the names ``MergeV2Checkpoints`` renames its data files
    to (the first part's shards keep their numbers, of one more in all: ``SaveV2``'s); its
    index is merged into a new one, whose sum is not known."""
    shards = [name for name in sums if name.startswith(".data-")]
    total = len(shards) + 1
    return {f".data-{int(name[6:11]):05d}-of-{total:05d}": sums[name] for name in shards}


def _save_op(prefix: str, keys: list[str], slices: list[str], tensors: list[Any]) -> None:
    """TF's ``SaveV2`` (public as ``tf.raw_ops.SaveV2``)."""
    tf().raw_ops.SaveV2(prefix=prefix, tensor_names=keys, shape_and_slices=slices, tensors=tensors)


def _merge_op(parts: list[str], prefix: str, *, delete_old_dirs: bool) -> None:
    """TF's ``MergeV2Checkpoints`` (public as ``tf.raw_ops.MergeV2Checkpoints``)."""
    tf().raw_ops.MergeV2Checkpoints(
        checkpoint_prefixes=parts, destination_prefix=prefix, delete_old_dirs=delete_old_dirs
    )


def _subset(snapshot: _snapshot.Snapshot, indices: list[int]) -> _snapshot.Snapshot:
    def pick(values: list[Any]) -> list[Any]:
        return [values[i] for i in indices]

    return _snapshot.Snapshot(
        snapshot.step, pick(snapshot.keys), pick(snapshot.slices), pick(snapshot.tensors), snapshot.taken_at, 0.0
    )


def _write_native(
    bundle: NativeWriter,
    snapshot: _snapshot.Snapshot,
    prefix: str,
    check: Callable[[], None] | None = None,
    io: IdleIO | None = None,
    direct: bool = True,
    checksums: bool = False,
) -> dict[str, tuple[int, int]]:
    groups = _shards(snapshot.tensors)
    if len(groups) == 1:
        return bundle.write_bundle(
            prefix, snapshot.keys, snapshot.tensors, groups, check=check, io=io, direct=direct, checksums=checksums
        )
    with ThreadPoolExecutor(len(groups), thread_name_prefix="asv-checkpoint-shard") as pool:
        return bundle.write_bundle(
            prefix,
            snapshot.keys,
            snapshot.tensors,
            groups,
            lambda fn, n: list(pool.map(fn, range(n))),
            check,
            io,
            direct,
            checksums,
        )


def _save_v2(snapshot: _snapshot.Snapshot, prefix: str, groups: list[list[int]]) -> None:
    tf_ = tf()
    with tf_.device("/cpu:0"):
        if len(groups) == 1:
            _save_op(prefix, snapshot.keys, snapshot.slices, snapshot.tensors)
            return
        parts = [f"{prefix}_temp/part-{j:05d}-of-{len(groups):05d}" for j in range(len(groups))]

        def save_part(j: int) -> None:
            idx = groups[j]
            with tf_.device("/cpu:0"):
                _save_op(
                    parts[j],
                    [snapshot.keys[i] for i in idx],
                    [snapshot.slices[i] for i in idx],
                    [snapshot.tensors[i] for i in idx],
                )

        with ThreadPoolExecutor(len(groups), thread_name_prefix="asv-checkpoint-shard") as pool:
            list(pool.map(save_part, range(len(groups))))
        _merge_op(parts, prefix, delete_old_dirs=True)


#: The most one ``SaveV2`` call of the plain store writes: nothing can interrupt the op,
#: so this bounds how long an abandoned save (a stop's deadline) runs on (0.4 s on a disk
#: writing 40 MB/s), at the price of a data file per piece.
PIECE_BYTES = 16 << 20


def _split_axis(tensor: Any) -> int | None:
    """The first axis of ``tensor`` longer than 1 (along which it is written in slices)."""
    for axis, size in enumerate(tensor.shape):
        if size is not None and size > 1:
            return axis
    return None


def _pieces(snapshot: _snapshot.Snapshot, piece_bytes: int) -> list[list[tuple[str, str, Any]]]:
    """``(key, slice spec, tensor)`` per ``SaveV2`` call, each about ``piece_bytes`` at most:
    values back to back in snapshot order, a larger one in slices along its first long
    axis (TF's restore and reader put the whole value together again)."""
    pieces: list[list[tuple[str, str, Any]]] = []
    current: list[tuple[str, str, Any]] = []
    size = 0
    for key, spec, tensor in zip(snapshot.keys, snapshot.slices, snapshot.tensors):
        nbytes = _nbytes(tensor)
        axis = _split_axis(tensor) if nbytes > piece_bytes and not spec else None
        if axis is None:
            if current and size + nbytes > piece_bytes:
                pieces.append(current)
                current, size = [], 0
            current.append((key, spec, tensor))
            size += nbytes
            continue
        if current:
            pieces.append(current)
            current, size = [], 0
        dims = [int(d) for d in tensor.shape]
        rows = max(1, piece_bytes * dims[axis] // nbytes)
        for start in range(0, dims[axis], rows):
            length = min(rows, dims[axis] - start)
            extent = ":".join(f"{start},{length}" if i == axis else "-" for i in range(len(dims)))
            index = tuple(slice(start, start + length) if i == axis else slice(None) for i in range(len(dims)))
            pieces.append([(key, f"{' '.join(map(str, dims))} {extent}", tensor[index])])
    if current:
        pieces.append(current)
    return pieces


def _save_v2_in_pieces(snapshot: _snapshot.Snapshot, prefix: str, check: Callable[[], None] | None) -> None:
    """The plain store's write: TF's ``SaveV2``, one call per piece of :data:`PIECE_BYTES`
    (:func:`_pieces`) into ``<prefix>_temp/``, ``check`` between calls (it raises to
    abandon the save), then ``MergeV2Checkpoints`` (TF's own multi-device saver does the
    same). A state of one piece is one ``SaveV2`` straight to ``prefix``."""
    tf_ = tf()
    pieces = _pieces(snapshot, PIECE_BYTES)
    with tf_.device("/cpu:0"):
        if len(pieces) == 1:
            keys, specs, tensors = zip(*pieces[0])
            _save_op(prefix, list(keys), list(specs), list(tensors))
            return
        parts = [f"{prefix}_temp/part-{j:05d}-of-{len(pieces):05d}" for j in range(len(pieces))]
        for part, piece in zip(parts, pieces):
            if check is not None:
                check()
            keys, specs, tensors = zip(*piece)
            _save_op(part, list(keys), list(specs), list(tensors))
        if check is not None:
            check()
        _merge_op(parts, prefix, delete_old_dirs=True)
