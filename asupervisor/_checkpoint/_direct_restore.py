"""Restoring a checkpoint of plain variables by reading its files straight into them.

TensorFlow's restore matches the object graph in Python, then reads each tensor through
its bundle reader (small buffered reads, a checksum, a copy) into new tensors that the
variables adopt. For the common checkpoint (every value a plain numeric variable that
exists now, nothing deferred), this module does the same in fewer steps:

1. :func:`plan`: walk the checkpoint's object graph and the live one together from the
   root, child by child name, as TF's restore matches them. Only if every checkpoint
   object holding values is matched to exactly one live, initialised plain
   ``ResourceVariable`` (or a Keras variable wrapping one) of the same shape and dtype,
   holding one value (``VARIABLE_VALUE``) of a plain numeric dtype in one piece, and
   nothing is left for later (no slot variables of TF1 optimizers, no registered savers,
   no iterator or other saveable), and the checkpoint is a ``tf.train.Checkpoint``
   whose ``restore`` and ``read`` are TF's own (not a subclass's), is there a plan;
   otherwise ``None`` and the caller uses TF's restore, unchanged.
2. :class:`Prefetch` (made by :func:`start` before the plan, so that the disk works
   while the model is checked): read the index (a LevelDB table; every block's checksum
   checked), then, on a thread per data file (up to :data:`READERS`), the object graph
   and every plain value, in file order, with large ``preadv`` calls into new numpy
   arrays (aligned as TF's tensors are, so that the variables adopt them without a
   copy), each piece's masked CRC32C (the checksum TF's reader checks) chained by the
   reader as it arrives (the GIL released); :meth:`Prefetch.finish` waits for the last
   value. A short file or a bad checksum raises TF's ``DataLossError`` naming the file
   and key before any variable changes, as TF's own restore of one device's values does.
3. :func:`assign`: only when every value has been read and checked, hand each array to
   its variable (``AssignVariableOp``, which adopts the buffer: no copy).

Runs on the caller's thread (never the event loop) and the reader threads, joined
before :meth:`Prefetch.finish` or :meth:`Prefetch.cancel` returns.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import struct
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._tf import tf
from . import _bundle, _index
from ._walk_cache import checkpoint_children, initialized, plain_variable

__all__ = ["Planned", "Prefetch", "assign", "plan", "read_index", "start"]

#: bytes per ``preadv`` call, each piece's checksum computed by the reader as it
#: arrives while the kernel's read-ahead reads the next: the last value's check ends a
#: piece after its last byte (8 MiB pieces ended ~1.3 ms after it at 16 MB)
PIECE_BYTES = 2 << 20

_VALUE = "VARIABLE_VALUE"


@dataclass
class Planned:
    """One value to restore: the variable, the checkpoint key and the index entry."""

    variable: Any
    key: str
    entry: Any


def plan(checkpoint: Any, graph: Any, entries: dict[str, Any]) -> list[Planned] | None:
    """Which variable of ``checkpoint``'s objects takes which of ``entries``, matched
    through the checkpoint's object ``graph`` as TF's restore matches them; ``None`` if
    TF's restore must do it (see the module docstring for when). Creates the
    checkpoint's ``save_counter`` if it has none yet, as TF's restore does."""
    base = tf().train.Checkpoint
    if not isinstance(checkpoint, base) or type(checkpoint).restore is not base.restore or type(checkpoint).read is not base.read:
        return None  # a subclass that restores its own way: it is asked to
    create_counter = getattr(checkpoint, "_maybe_create_save_counter", None)
    if create_counter is not None:
        create_counter()  # as TF's restore does (after its read: the counter is then deferred)
    live: dict[int, Any] = {}
    stack = [(0, checkpoint)]
    while stack:
        node_id, obj = stack.pop()
        known = live.get(node_id)
        if known is not None:
            if known is not obj:
                return None  # two live objects for one checkpoint object
            continue
        live[node_id] = obj
        node = graph.nodes[node_id]
        if node.slot_variables or node.HasField("registered_saver"):
            return None
        if node.children:
            children = checkpoint_children(obj)
            for ref in node.children:
                child = children.get(ref.local_name)
                if child is not None:
                    stack.append((ref.node_id, child))
    planned: list[Planned] = []
    owners: set[int] = set()
    for node_id, node in enumerate(graph.nodes):
        if not node.attributes:
            continue
        obj = live.get(node_id)
        if obj is None or len(node.attributes) != 1 or node.attributes[0].name != _VALUE:
            return None  # a value TF would defer, or not a variable's
        variable = plain_variable(obj)
        if variable is None or id(variable) in owners or not initialized(variable):
            return None
        owners.add(id(variable))
        key = node.attributes[0].checkpoint_key
        entry = entries.get(key)
        if entry is None or entry.slices or entry.dtype not in _bundle._PLAIN_DTYPES:
            return None
        shape = variable.shape
        if not shape.is_fully_defined() or [d.size for d in entry.shape.dim] != shape.as_list():
            return None
        if variable.dtype.base_dtype.as_datatype_enum != entry.dtype:
            return None
        planned.append(Planned(variable, key, entry))
    return planned


def read_index(prefix: str) -> tuple[int, dict[str, Any]] | None:
    """``(number of data files, {key: BundleEntryProto})`` of the checkpoint ``prefix``
    (:func:`._index.read`: every block's checksum checked); ``None`` for an index this
    module does not read (compressed, big-endian): TF's reader reads those.

    Raises:
        ValueError: the index is damaged (naming it).
    """
    from tensorflow.core.protobuf import tensor_bundle_pb2

    try:
        header, entries = _index.read(prefix)
    except _index.Unsupported:
        return None
    if header.endianness != tensor_bundle_pb2.BundleHeaderProto.LITTLE:
        return None
    return header.num_shards, entries


def _data_loss(message: str) -> Exception:
    error: Exception = tf().errors.DataLossError(None, None, message)
    return error


#: the key of the object graph proto in a TF2 checkpoint
GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def _string_scalar(data: bytes, entry: Any, path: str) -> bytes:
    """The value of a scalar string tensor stored as ``data`` (TF's encoding: the length
    as a varint, the masked CRC32C of the length, the bytes), checked against ``entry``."""
    if entry.dtype != _bundle._STRING or entry.shape.dim:
        raise _data_loss(f"{path}: {GRAPH_KEY} is not a scalar string")
    try:
        length, pos = _index.varint(data, 0)
    except ValueError:
        raise _data_loss(f"{path}: truncated or corrupt {GRAPH_KEY}") from None
    if len(data) != entry.size or pos + 4 + length != len(data):
        raise _data_loss(f"{path}: truncated or corrupt {GRAPH_KEY}")
    crc = _bundle._crc_bytes(struct.pack("<I" if length <= 0xFFFFFFFF else "<Q", length))
    crc = _bundle._crc_bytes(data[pos : pos + 4], crc)
    crc = _bundle._crc_bytes(data[pos + 4 :], crc)
    if _bundle._mask(crc) != entry.crc32c:
        raise _data_loss(f"{path}: checksum mismatch for {GRAPH_KEY} (corrupt data file)")
    return data[pos + 4 :]


#: TF's alignment of tensor memory (``EIGEN_MAX_ALIGN_BYTES``): a numpy array so aligned
#: becomes a tensor without a copy when handed to an op
_ALIGN = 64
#: numpy asks for transparent huge pages for arrays of this many bytes and more
_NUMPY_HUGE_BYTES = 4 << 20
#: values of this many bytes or more get their memory before the reads start, and the
#: caller faults it in (:meth:`Prefetch.finish`) while the reader waits on the disk
POPULATE_BYTES = 1 << 20
_MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", None)
# Linux 5.14+ (older kernels refuse it: EINVAL); Python's mmap module does not name it,
# its value is 23 on x86-64 and arm64 (asm-generic)
_MADV_POPULATE_WRITE = 23 if platform.machine() in ("x86_64", "aarch64", "arm64") else None
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _madvise(start: int, end: int, advice: int | None) -> bool:
    """``madvise`` of the whole pages from the one holding ``start`` to the one holding
    ``end - 1`` (the GIL released); whether the kernel took it (never raises: every use
    here is for speed only)."""
    if _LIBC is None or advice is None or end <= start:
        return False
    lo = start & -mmap.PAGESIZE
    return int(_LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(end - lo), advice)) == 0


def _aligned_empty(shape: list[int], dtype: Any, nbytes: int) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose memory starts at a multiple of :data:`_ALIGN`
    bytes, in small pages as TF's own tensors are: numpy has the kernel back large arrays
    with huge pages, whose first touch waited for the kernel to compact memory in some
    processes (a first restore of 128 MB: 85-340 ms against 78-220 ms without them)."""
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    address = raw.ctypes.data
    if nbytes >= _NUMPY_HUGE_BYTES:
        _madvise(address, address + raw.nbytes, _MADV_NOHUGEPAGE)
    start = -address % _ALIGN
    array: np.ndarray = raw[start : start + nbytes].view(dtype).reshape(shape)
    return array


def _array_for(entry: Any, least: int) -> np.ndarray | None:
    """A new array for ``entry``'s value if it has ``least`` bytes or more; ``None`` if
    fewer, or if its shape and dtype need another number of bytes than it has.

    numpy memory, aligned as TF's: :func:`assign` hands it to the variable without a
    copy, and the reader runs no TF op (a thread's first op cost ~5 ms, with the disk
    idle)."""
    if entry.size < least:
        return None
    dtype = tf().dtypes.as_dtype(entry.dtype)
    shape = [dim.size for dim in entry.shape.dim]
    count = 1
    for size in shape:
        count *= size
    if count * dtype.size != entry.size:
        return None
    return _aligned_empty(shape, dtype.as_numpy_dtype, entry.size)


def _preadv(fd: int, into: memoryview, offset: int, path: str) -> int:
    """``os.preadv(fd, [into], offset)``; an ``OSError`` names ``path`` (the OS's own
    message for a read does not)."""
    try:
        return os.preadv(fd, [into], offset)
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, path) from exc


#: reader threads of a :class:`Prefetch`
READERS = 2


class Prefetch:
    """Reads a checkpoint's object graph, then every plain value into new arrays, in
    file order, on threads of its own, from the moment it is made (while the caller
    matches the object graph).

    Each reader checks each value's checksum piece by piece as it reads (the GIL
    released); :meth:`finish` waits for the last value; :meth:`check_ahead` turns the readers into
    checkers for TF's restore (each value read through a reused buffer, checked, left in
    the page cache), :meth:`checked` waits for them; :meth:`cancel` stops the readers
    between reads. Each joins the threads. One reader per data file, up to :data:`READERS`, each reading its files
    from start to end: on these disks two readers taking turns in one file were slower
    for a 16 MB checkpoint (one file) than one.
    """

    def __init__(self, prefix: str, num_shards: int, entries: dict[str, Any]) -> None:
        self._prefix = prefix
        self._num_shards = num_shards
        self.entries = entries  #: ``{key: BundleEntryProto}``, the checkpoint's index
        wanted = [(e.shard_id, e.offset, k) for k, e in entries.items() if e.dtype in _bundle._PLAIN_DTYPES and not e.slices]
        self._order = [k for _, _, k in sorted(wanted)]
        self._arrived = threading.Condition()
        self._graph: bytes | None = None  # the object graph proto, read first
        self._read: list[tuple[str, Any]] = []  # (key, numpy array), read and checked, as they arrive
        self._stop = False
        self._checking_only = False
        self._checked: set[str] = set()  # keys whose values were read and checked
        self._error: BaseException | None = None
        self._started: set[str] = set()  # keys a reader has begun to read
        self._arrays = {k: a for k in self._order if (a := _array_for(entries[k], POPULATE_BYTES)) is not None}
        shards = sorted({entries[k].shard_id for k in self._order}) or [0]
        count = min(READERS, len(shards))
        parts: list[list[str]] = [[k for k in self._order if shards.index(entries[k].shard_id) % count == j] for j in range(count)]
        self._threads = [threading.Thread(target=self._run, args=(part, j == 0), name="asv-restore-read") for j, part in enumerate(parts)]
        for thread in self._threads:
            thread.start()

    def _path(self, shard: int) -> str:
        return _bundle.data_path(self._prefix, shard, self._num_shards)

    def _run(self, keys: list[str], first: bool) -> None:
        fds: dict[int, int] = {}

        def fd_of(shard: int) -> int:
            fd = fds.get(shard)
            if fd is None:
                fd = fds[shard] = os.open(self._path(shard), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            return fd

        try:
            graph = self.entries.get(GRAPH_KEY) if first else None
            if graph is not None:
                path = self._path(graph.shard_id)
                raw = bytearray(graph.size)
                got = _preadv(fd_of(graph.shard_id), memoryview(raw), graph.offset, path)
                proto = _string_scalar(bytes(raw[:got]), graph, path)
                with self._arrived:
                    self._graph = proto
                    self._arrived.notify_all()
            scratch: memoryview | None = None
            for key in keys:
                if self._error is not None or self._stop:
                    return
                entry = self.entries[key]
                fd = fd_of(entry.shard_id)
                value = None if self._checking_only else self._read_one(fd, key, entry)
                if value is None:  # stopped, or only checking now (check_ahead)
                    if self._stop:
                        return
                    scratch = scratch or memoryview(bytearray(PIECE_BYTES))
                    self._read_checked(fd, key, entry, scratch, reuse=True)
                    continue
                with self._arrived:
                    self._read.append((key, value))
                    self._arrived.notify_all()
        except BaseException as exc:  # re-raised on the caller's thread by finish()
            with self._arrived:
                self._error = self._error or exc
                self._arrived.notify_all()
        finally:
            for fd in fds.values():
                os.close(fd)

    def _read_one(self, fd: int, key: str, entry: Any) -> Any | None:
        """``key``'s value read into a new numpy array and checked; ``None`` if stopped or
        switched to checking only (:meth:`check_ahead`) before the end."""
        self._started.add(key)
        value = self._arrays.get(key)
        if value is None:
            value = _array_for(entry, 0)
        if value is None:
            dims = [dim.size for dim in entry.shape.dim]
            raise _data_loss(f"{self._path(entry.shard_id)}: {key} has {entry.size} bytes in the index, not what its shape {dims} needs")
        view = value.reshape(-1).view(np.uint8).data
        return value if self._read_checked(fd, key, entry, view, reuse=False) else None

    def _read_checked(self, fd: int, key: str, entry: Any, into: memoryview, *, reuse: bool) -> bool:
        """Read ``entry``'s bytes into ``into`` (all of them; or, with ``reuse``, each piece
        over the last), chaining their checksum piece by piece as they arrive (the GIL
        released for both), then check it (:meth:`_check`). ``False`` if stopped first (or,
        into an array, switched to checking only)."""
        crc = _checksum()
        base = ctypes.addressof(ctypes.c_char.from_buffer(into)) if len(into) else 0
        value = 0
        done = 0
        while done < entry.size:
            if self._stop or (self._checking_only and not reuse):
                return False
            at = 0 if reuse else done
            got = _preadv(fd, into[at : at + min(PIECE_BYTES, entry.size - done)], entry.offset + done, self._path(entry.shard_id))
            if got <= 0:
                raise self._truncated(key, entry)
            value = int(crc(value, base + at, got))
            done += got
        self._check(key, entry, value)
        return True

    def _truncated(self, key: str, entry: Any) -> Exception:
        return _data_loss(f"{self._path(entry.shard_id)}: truncated (ends before {key}'s {entry.size} bytes at offset {entry.offset})")

    def _check(self, key: str, entry: Any, crc: int) -> None:
        """Raise TF's ``DataLossError`` naming the file and ``key`` unless ``crc`` (of the
        bytes read) is the index's; else count ``key`` as checked."""
        if _bundle._mask(crc) != entry.crc32c:
            raise _data_loss(f"{self._path(entry.shard_id)}: checksum mismatch for {key} (corrupt data file)")
        with self._arrived:
            self._checked.add(key)

    def check_ahead(self) -> None:
        """From now on read only to check: each value through a reused buffer per reader,
        its checksum checked, its bytes left in the page cache, while TF's restore reads
        them a step behind (:meth:`checked` waits for the readers). The values read so far
        (checked as they were read) are dropped; one a reader was in the middle of is read
        again."""
        with self._arrived:
            self._checking_only = True
            self._read = []
            self._arrays = {}

    def checked(self) -> set[str]:
        """After :meth:`check_ahead`: wait for the readers, return the keys whose values they read
        and checked.

        Raises:
            tf.errors.DataLossError: a data file is short or a value's checksum is wrong.
            OSError: a data file could not be opened or read.
        """
        for thread in self._threads:
            thread.join()
        if self._error is not None:
            raise self._error
        return set(self._checked)

    def index(self) -> tuple[dict[str, list[int]], dict[str, Any]]:
        """``(shapes, dtypes)`` by key, as ``tf.train.load_checkpoint``'s reader gives them."""
        tf_ = tf()
        shapes = {k: [d.size for d in e.shape.dim] for k, e in self.entries.items()}
        return shapes, {k: tf_.dtypes.as_dtype(e.dtype) for k, e in self.entries.items()}

    def graph(self) -> Any:
        """The checkpoint's object graph (``TrackableObjectGraph``), once the reader has
        read it (first); ``None`` if the checkpoint has none.

        Raises:
            tf.errors.DataLossError: its bytes are short or fail their checksum.
        """
        from tensorflow.core.protobuf import trackable_object_graph_pb2

        if GRAPH_KEY not in self.entries:
            return None
        with self._arrived:
            while self._graph is None and self._error is None:
                self._arrived.wait()
            if self._graph is None:
                assert self._error is not None
                raise self._error
        return trackable_object_graph_pb2.TrackableObjectGraph.FromString(self._graph)

    def finish(self) -> dict[str, Any]:
        """Wait for the last value (each checked by its reader); ``{key: numpy array}``.

        Raises:
            tf.errors.DataLossError: a data file is short or a value's checksum is wrong.
            OSError: a data file could not be opened or read.
        """
        values: dict[str, Any] = {}
        try:
            for key, array in list(self._arrays.items()):  # ahead of the readers, in file order
                if self._stop or self._error is not None or self._checking_only:
                    break
                if key not in self._started and not _madvise(array.ctypes.data, array.ctypes.data + array.nbytes, _MADV_POPULATE_WRITE):
                    break
            with self._arrived:
                while len(self._read) < len(self._order) and self._error is None:
                    self._arrived.wait()
                if self._error is not None:
                    raise self._error
                values.update(self._read)
        finally:
            self.cancel()
        return values

    def cancel(self) -> None:
        """Stop reading (between reads), drop what was read, join the threads."""
        self._stop = True
        for thread in self._threads:
            thread.join()
        self._read.clear()
        self._arrays = {}


def start(prefix: str) -> Prefetch | None:
    """Start reading the values of the checkpoint ``prefix`` (:class:`Prefetch`), or
    ``None`` if its index is of a kind this module does not read.

    Raises:
        ValueError: the index is damaged (naming it).
    """
    if _bundle._crc is None or _bundle._crc[1] is None:
        return None  # no checksum of a tensor's memory without a copy: TF's reader
    index = read_index(prefix)
    if index is None:
        return None
    return Prefetch(prefix, index[0], index[1])


def _checksum() -> Any:
    """google-crc32c's ``crc32c_extend(crc, address, nbytes)`` (the GIL released)."""
    crc = _bundle._crc
    if crc is None or crc[1] is None:
        raise RuntimeError("google-crc32c's C library is gone")  # start() checked it
    return crc[1]


def assign(planned: list[Planned], values: dict[str, Any]) -> None:
    """Hand each planned variable its value, read by :meth:`Prefetch.finish`
    (``AssignVariableOp`` makes each aligned numpy array a tensor without a copy and the
    variable adopts its buffer)."""
    from tensorflow.python.ops import gen_resource_variable_ops

    with tf().device("/cpu:0"):
        for p in planned:
            gen_resource_variable_ops.assign_variable_op(p.variable.handle, values[p.key])
