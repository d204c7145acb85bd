"""Restoring a checkpoint of plain variables by reading its files straight into them.

TensorFlow's restore matches the object graph in Python, then reads each tensor through
its bundle reader (small buffered reads, a checksum, a copy) into new tensors that the
variables adopt. For the common checkpoint (every value a plain numeric variable that
exists now, nothing deferred), this module does the same in fewer steps:

1. :func:`plan`: the checkpoint's object graph and the live one, walked together from
   the root, child by child name, as TF's restore matches them (the restore's one walk,
   :class:`...snapshot._graph.SavedGraphMatch`, also used by its model check). Only if every checkpoint
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
   copy; a large value this package wrote at a block of its file, not in the page
   cache, with direct I/O: the disk writes it into the array, in huge pages as far as
   it fills them (requests of up to 4 MiB), no page cache taken, no copy), each
   piece's masked CRC32C (the checksum TF's reader checks) chained as it arrives
   (the GIL released; a large value's by a checker thread while the reader reads on);
   :meth:`Prefetch.finish` waits for the last value. A short file or a bad
   checksum raises TF's ``DataLossError`` naming the file and key before any variable
   changes, as TF's own restore of one device's values does.
3. :func:`assign`: only when every value has been read and checked, hand each array to
   its variable (``AssignVariableOp``, which adopts the buffer: no copy).

Runs on the caller's thread (never the event loop), the reader threads and the checker
thread, all joined before :meth:`Prefetch.finish`, :meth:`Prefetch.checked` or
:meth:`Prefetch.cancel` returns.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import queue
import struct
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .... import _tf_internals
from ...._tf import tf
from ...snapshot._graph import SavedGraphMatch
from ...snapshot._walk_cache import initialized, plain_variable
from . import _bundle, _direct, _index

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


def plan(checkpoint: Any, match: SavedGraphMatch, entries: dict[str, Any]) -> list[Planned] | None:
    """Which variable of ``checkpoint``'s objects takes which of ``entries``, as ``match``
    (the checkpoint's object graph matched to the live one) pairs them; ``None`` if TF's
    restore must do it (see the module docstring for when). Creates the checkpoint's
    ``save_counter`` if it has none yet, as TF's restore does, and adds it to ``match``."""
    base = tf().train.Checkpoint
    if (
        not isinstance(checkpoint, base)
        or type(checkpoint).restore is not base.restore
        or type(checkpoint).read is not base.read
    ):
        return None  # a subclass that restores its own way: it is asked to
    # as TF's restore does (after its read: the counter is then deferred)
    _tf_internals.maybe_create_save_counter(checkpoint)
    match.add_root_child("save_counter")
    graph = match.graph
    live = match.live_by_node()
    if live is None:
        return None  # two live objects for one checkpoint object
    for node_id in live:
        node = graph.nodes[node_id]
        if node.slot_variables or node.HasField("registered_saver"):
            return None
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
    tensor_bundle_pb2 = _tf_internals.proto_module(_tf_internals.TENSOR_BUNDLE_PB2)
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
#: values of this many bytes or more get their memory before the reads start, faulted
#: in by the checker (:meth:`Prefetch._assist`) while the reader waits on the disk, and
#: their checksums chained by the checker while the reader reads on
POPULATE_BYTES = 1 << 20
#: bytes the checker faults in at a time (between two looks for pieces to check)
POPULATE_CHUNK = 2 << 20
_MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", None)
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
#: a transparent huge page (x86-64, and arm64 with 4 KiB pages): the memory of a value read
#: with direct I/O is in such pages where it fills them (:func:`_aligned_empty`)
HUGE_PAGE = 2 << 20
# Linux 5.14+ (older kernels refuse it: EINVAL); Python's mmap module does not name it,
# its value is 23 on x86-64 and arm64 (asm-generic)
_MADV_POPULATE_WRITE = 23 if platform.machine() in ("x86_64", "aarch64", "arm64") else None
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_mmap: Any = None
if _LIBC is not None:
    _mmap = _LIBC.mmap
    _mmap.restype = ctypes.c_void_p
    _mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _madvise(start: int, end: int, advice: int | None) -> bool:
    """``madvise`` of the whole pages from the one holding ``start`` to the one holding
    ``end - 1`` (the GIL released); whether the kernel took it (never raises: every use
    here is for speed only)."""
    if _LIBC is None or advice is None or end <= start:
        return False
    lo = start & -mmap.PAGESIZE
    return int(_LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(end - lo), advice)) == 0


def _aligned_empty(shape: list[int], dtype: Any, nbytes: int, *, direct: bool = False, huge: bool = True) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose memory starts at a multiple of :data:`_ALIGN`
    bytes, in small pages as TF's own tensors are: numpy has the kernel back large arrays
    with huge pages, whose first touch waited for the kernel to compact memory in some
    processes (a first restore of 128 MB, read through the page cache: 85-340 ms against
    78-220 ms without them).

    A large one (:func:`_direct_room`) starts at a block and has room after it up to the
    next block boundary, for a direct read of whole blocks. With ``direct`` (it is to be
    read so) and ``huge`` (the store's ``huge_pages``), one of :data:`HUGE_PAGE` or more
    is in memory of its own (:func:`_huge_room`): huge pages as far as it fills them."""
    room = _direct_room(nbytes)
    if direct and huge and room >= HUGE_PAGE and _MADV_HUGEPAGE is not None:
        raw, start = _huge_room(room), 0
    else:
        align = _direct.ALIGN if room else _ALIGN
        raw = np.empty((room or nbytes) + align, np.uint8)
        address = raw.ctypes.data
        if nbytes >= _NUMPY_HUGE_BYTES:
            _madvise(address, address + raw.nbytes, _MADV_NOHUGEPAGE)
        start = -address % align
    array: np.ndarray = raw[start : start + nbytes].view(dtype).reshape(shape)
    return array


def _huge_room(room: int) -> np.ndarray:
    """``room`` bytes of new memory (a mapping of their own, unmapped once the last array
    on it goes) starting at a huge page, in huge pages as far as they fill them: a direct
    read's requests are as large as the memory they fill is contiguous (a request took at
    most 254 pieces here: ~1 MiB of small pages, 4 MiB of huge ones), and the disk's time
    went by requests (16 MiB: 8 requests, 6.4 ms into huge pages; 17, 10.8 ms into small
    ones). Never memory malloc gave before, which small pages may already back."""
    mapping = mmap.mmap(-1, room + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(mapping, np.uint8)
    address = raw.ctypes.data
    start = -address % HUGE_PAGE
    # huge pages only where the value fills them: none holds memory it does not use
    _madvise(address, address + raw.nbytes, _MADV_NOHUGEPAGE)
    _madvise(address + start, address + start + (room & -HUGE_PAGE), _MADV_HUGEPAGE)
    return raw[start : start + room]


def _direct_room(nbytes: int) -> int:
    """The bytes a direct read of a value of ``nbytes`` fills (whole blocks); 0 if such a
    value is read buffered."""
    if nbytes < _direct.DIRECT_MIN_BYTES:
        return 0
    return nbytes + -nbytes % _direct.ALIGN


def _array_for(entry: Any, least: int, *, direct: bool = False, huge: bool = True) -> np.ndarray | None:
    """A new array for ``entry``'s value if it has ``least`` bytes or more; ``None`` if
    fewer, or if its shape and dtype need another number of bytes than it has;
    ``direct``: to be read with direct I/O, ``huge``: then in huge pages (:func:`_aligned_empty`).

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
    return _aligned_empty(shape, dtype.as_numpy_dtype, entry.size, direct=direct, huge=huge)


def _preadv(fd: int, into: memoryview, offset: int, path: str) -> int:
    """``os.preadv(fd, [into], offset)``; an ``OSError`` names ``path`` (the OS's own
    message for a read does not)."""
    try:
        return os.preadv(fd, [into], offset)
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, path) from exc


def _open_direct(path: str) -> int | None:
    """``path`` opened for direct reads; ``None`` if its filesystem refuses ``O_DIRECT``."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
    except OSError as exc:
        if _direct.is_refusal(exc):
            return None
        raise


class _Files:
    """One thread's descriptors of a checkpoint's data files, each opened when first
    asked for (buffered, or for direct reads), all closed by :meth:`close`."""

    def __init__(self, path: Any) -> None:
        self._path = path  # path(shard) -> the data file's name
        self._fds: dict[tuple[int, bool], int] = {}

    def fd(self, shard: int, direct: bool = False) -> int | None:
        """The descriptor of data file ``shard``; ``None`` if ``direct`` and its filesystem
        refuses direct I/O."""
        fd = self._fds.get((shard, direct))
        if fd is None:
            path = self._path(shard)
            fd = _open_direct(path) if direct else os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            if fd is None:
                return None
            self._fds[(shard, direct)] = fd
        return fd

    def buffered(self, shard: int) -> int:
        """The buffered descriptor of data file ``shard``."""
        fd = self.fd(shard)
        assert fd is not None
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _in_page_cache(fd: int, offset: int) -> bool:
    """Whether the page of the file ``fd`` holding byte ``offset`` is in the page cache
    (``mincore`` of a one-page read-only mapping: no I/O, nothing touched); ``True`` when
    it cannot be told (a buffered read is then the safe choice)."""
    if _LIBC is None:
        return True
    page = offset & -mmap.PAGESIZE
    address = _mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_SHARED, fd, page)
    if address is None or address == _MAP_FAILED:
        return True
    try:
        resident = ctypes.c_ubyte(1)
        if _LIBC.mincore(ctypes.c_void_p(address), ctypes.c_size_t(mmap.PAGESIZE), ctypes.byref(resident)) != 0:
            return True
        return bool(resident.value & 1)
    finally:
        _LIBC.munmap(ctypes.c_void_p(address), ctypes.c_size_t(mmap.PAGESIZE))


#: reader threads of a :class:`Prefetch`
READERS = 2
#: :meth:`Prefetch.finish` to the checker: fault the arrays in
_FAULT_IN = "fault in"


class Prefetch:
    """Reads a checkpoint's object graph, then every plain value into new arrays, in
    file order, on threads of its own, from the moment it is made (while the caller
    matches the object graph).

    A large value (:data:`POPULATE_BYTES`, 1 MiB, or more) not in the page cache, at a
    block of its file, is read with direct I/O (:meth:`_read_one`). Each value's checksum is
    checked piece by piece as it arrives (the GIL released): a small value's by its
    reader, a large value's by the checker thread (:meth:`_assist`), which also faults
    the large values' memory in ahead of the readers once :meth:`finish` wants them
    (until then a direct read asks for 2 MiB at a time). :meth:`finish` waits for the last
    value; :meth:`check_ahead` turns the readers into checkers for TF's restore (each
    value read through a reused buffer, checked, left in the page cache),
    :meth:`checked` waits for them; :meth:`cancel` stops the readers between reads. Each
    joins the threads. One reader per data file, up to :data:`READERS`, each reading its
    files from start to end: on these disks two readers taking turns in one file were
    slower for a 16 MB checkpoint (one file) than one.
    """

    def __init__(
        self,
        prefix: str,
        num_shards: int,
        entries: dict[str, Any],
        *,
        direct_reads: bool = True,
        huge_pages: bool = True,
    ) -> None:
        self._prefix = prefix
        self._num_shards = num_shards
        self.entries = entries  #: ``{key: BundleEntryProto}``, the checkpoint's index
        wanted = [
            (e.shard_id, e.offset, k) for k, e in entries.items() if e.dtype in _bundle._PLAIN_DTYPES and not e.slices
        ]
        self._order = [k for _, _, k in sorted(wanted)]
        self._arrived = threading.Condition()
        self._graph: bytes | None = None  # the object graph proto, read first
        self._read: list[tuple[str, Any]] = []  # (key, numpy array), read and checked, as they arrive
        self._stop = False
        self._checking_only = False
        self._checked: set[str] = set()  # keys whose values were read and checked
        self._error: BaseException | None = None
        self._asked: dict[str, int] = {}  # of each large value, the bytes a reader has asked for
        # of the large values, the pieces read, for the checker: (key, array, address, the
        # piece's offset in the value, bytes); ``None`` when a reader ends; _FAULT_IN from
        # finish(): the values go to the variables, fault their memory in
        self._pieces: queue.SimpleQueue[tuple[str, Any, int, int, int] | str | None] = queue.SimpleQueue()
        self._to_variables = False  # finish() was called: the values read go to the variables
        # direct reads of large values (until the filesystem refuses one): the values to
        # read so are chosen now, before the readers' buffered reads fill the page cache
        self._direct = direct_reads and _direct.ENABLED and not _direct.refused(os.path.dirname(prefix) or ".")
        self._direct_keys = self._uncached_blocks() if self._direct else set()
        self._arrays = {
            k: a
            for k in self._order
            if (a := _array_for(entries[k], POPULATE_BYTES, direct=k in self._direct_keys, huge=huge_pages)) is not None
        }
        self._direct_keys &= self._arrays.keys()
        shards = sorted({entries[k].shard_id for k in self._order}) or [0]
        count = min(READERS, len(shards))
        parts: list[list[str]] = [
            [k for k in self._order if shards.index(entries[k].shard_id) % count == j] for j in range(count)
        ]
        # the object graph is read first, by the checker if there is one (a reader starts
        # on the values at once), else by the first reader
        checker = bool(self._arrays)
        self._threads = [
            threading.Thread(target=self._run, args=(part, j == 0 and not checker), name="asv-restore-read")
            for j, part in enumerate(parts)
        ]
        if checker:
            self._threads.append(threading.Thread(target=self._assist, args=(count,), name="asv-restore-check"))
        for thread in self._threads:
            thread.start()

    def _path(self, shard: int) -> str:
        return _bundle.data_path(self._prefix, shard, self._num_shards)

    def _uncached_blocks(self) -> set[str]:
        """The keys of the large values at a block of their file (as this package writes
        them: :func:`._direct.placed_at`) whose first page is not in the page cache:
        they are read with direct I/O (:meth:`_read_one`)."""
        keys: set[str] = set()
        files = _Files(self._path)
        try:
            for key in self._order:
                entry = self.entries[key]
                if _direct_room(entry.size) and not entry.offset % _direct.ALIGN:
                    if not _in_page_cache(files.buffered(entry.shard_id), entry.offset):
                        keys.add(key)
        except OSError:
            pass  # the readers meet it again and name the file
        finally:
            files.close()
        return keys

    def _run(self, keys: list[str], first: bool) -> None:
        files = _Files(self._path)
        try:
            if first:
                self._read_graph(files)
            scratch: memoryview | None = None
            for key in keys:
                if self._error is not None or self._stop:
                    return
                entry = self.entries[key]
                if self._checking_only or not self._read_one(files, key, entry):
                    if self._stop or self._error is not None:
                        return
                    # only checking now (check_ahead)
                    scratch = scratch or memoryview(bytearray(PIECE_BYTES))
                    self._read_checked(files.buffered(entry.shard_id), key, entry, scratch, reuse=True)
        except BaseException as exc:  # re-raised on the caller's thread by finish()
            self._fail(exc)
        finally:
            self._pieces.put(None)
            files.close()

    def _read_graph(self, files: _Files) -> None:
        """Read the object graph (:meth:`graph` waits for it)."""
        graph = self.entries.get(GRAPH_KEY)
        if graph is None:
            return
        path = self._path(graph.shard_id)
        raw = bytearray(graph.size)
        got = _preadv(files.buffered(graph.shard_id), memoryview(raw), graph.offset, path)
        proto = _string_scalar(bytes(raw[:got]), graph, path)
        with self._arrived:
            self._graph = proto
            self._arrived.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._arrived:
            self._error = self._error or exc
            self._arrived.notify_all()

    def _publish(self, key: str, value: Any) -> None:
        """``key``'s value was read and checked: :meth:`finish` takes it."""
        with self._arrived:
            if not self._checking_only:
                self._read.append((key, value))
                self._arrived.notify_all()

    def _assist(self, readers: int) -> None:
        """The checker: chain the checksum of each large value's pieces as the readers
        hand them over, then check it and hand the value to :meth:`finish`, while the
        readers read on (a reader's own checksum of an 8 MiB piece left the disk idle
        ~1 ms). First it reads the object graph, while a reader starts on the values;
        then, once :meth:`finish` says the values go to the variables (TF's restore may
        take them instead: :meth:`check_ahead`), and while no piece is waiting, it faults
        the large values' memory in ahead of the readers (:data:`POPULATE_CHUNK` at a
        time, ``MADV_POPULATE_WRITE``: fresh memory ~0.3 ms/MiB to touch, more where the
        host took it back) so that a reader neither faults it in itself nor waits for
        that. Ends when every reader has ended."""
        crc = _checksum()
        running: dict[str, tuple[int, int]] = {}  # key: (checksum so far, bytes)
        ahead = list(self._arrays.items())
        at = 0  # of ahead[0], the bytes faulted in
        fault_in = False  # (finish() said so)
        try:
            files = _Files(self._path)
            try:
                self._read_graph(files)
            finally:
                files.close()
            while readers:
                try:
                    piece = self._pieces.get(block=not (ahead and fault_in))
                except queue.Empty:
                    key, array = ahead[0]
                    at = max(at, self._asked.get(key, 0))
                    end = min(array.nbytes, at + POPULATE_CHUNK)
                    if self._stop or self._checking_only or self._error is not None:
                        ahead.clear()
                    elif at < end and not _madvise(
                        array.ctypes.data + at, array.ctypes.data + end, _MADV_POPULATE_WRITE
                    ):
                        ahead.clear()  # a kernel before 5.14
                    elif end >= array.nbytes:
                        ahead.pop(0)
                        at = 0
                    else:
                        at = end
                    continue
                if piece is None:
                    readers -= 1
                    continue
                if isinstance(piece, str):  # _FAULT_IN
                    fault_in = True
                    continue
                key, array, address, start, nbytes = piece
                value, done = running.get(key, (0, 0)) if start else (0, 0)  # (read again from its start)
                value, done = int(crc(value, address, nbytes)), done + nbytes
                entry = self.entries[key]
                if done < entry.size:
                    running[key] = (value, done)
                    continue
                running.pop(key, None)
                self._check(key, entry, value)
                self._publish(key, array)
        except BaseException as exc:
            self._fail(exc)

    def _read_one(self, files: _Files, key: str, entry: Any) -> bool:
        """Read ``key``'s value into a new numpy array; a small one is checked and handed
        to :meth:`finish` here, a large one by the checker (:meth:`_assist`); ``False`` if
        stopped or switched to checking only (:meth:`check_ahead`) before the end.

        The values :meth:`_uncached_blocks` chose are read with direct I/O: the disk
        writes each straight into its array, with no page-cache memory taken and no copy
        (:func:`_direct_room`); the others, or all once the filesystem refuses a direct
        read, buffered."""
        large = self._arrays.get(key)
        value = large if large is not None else _array_for(entry, 0)
        if value is None:
            dims = [dim.size for dim in entry.shape.dim]
            raise _data_loss(
                f"{self._path(entry.shard_id)}: {key} has {entry.size} bytes in the index, not what its shape {dims} needs"
            )
        if self._direct and key in self._direct_keys:
            direct_fd = files.fd(entry.shard_id, direct=True)
            if direct_fd is None:
                self._direct = False  # the filesystem refuses direct I/O: buffered from here
            else:
                blocks = memoryview((ctypes.c_char * _direct_room(entry.size)).from_address(value.ctypes.data)).cast(
                    "B"
                )
                try:
                    return self._read_checked(direct_fd, key, entry, blocks, reuse=False, direct=True, value=value)
                except OSError as exc:
                    if not _direct.is_refusal(exc):
                        raise
                    self._direct = False  # the filesystem took the open, not the read: buffered from here
        view = value.reshape(-1).view(np.uint8).data
        return self._read_checked(files.buffered(entry.shard_id), key, entry, view, reuse=False, value=value)

    def _read_checked(
        self, fd: int, key: str, entry: Any, into: memoryview, *, reuse: bool, direct: bool = False, value: Any = None
    ) -> bool:
        """Read ``entry``'s bytes into ``into`` (all of them; or, with ``reuse``, each piece
        over the last) and check their checksum (:meth:`_check`): for a large ``value``
        (an array of :meth:`_assist`'s) the checker chains it piece by piece while this
        reader reads the next, else this reader chains it as each piece arrives (the GIL
        released for both); ``value`` (the array ``into`` is) then goes to
        :meth:`finish`. ``False`` if stopped first (or, into an array, switched to
        checking only). ``direct``: ``fd`` is opened for direct I/O and ``into`` has room
        for whole blocks (the last piece is asked for whole blocks; the bytes past the
        value are not checked and not the value's)."""
        crc = _checksum()
        base = ctypes.addressof(ctypes.c_char.from_buffer(into)) if len(into) else 0
        handed = value is not None and self._arrays.get(key) is value
        chained = 0
        done = 0
        while done < entry.size:
            if self._stop or self._error is not None or (self._checking_only and not reuse):
                return False
            at = 0 if reuse else done
            left = entry.size - done
            # direct: large pieces once the values are known to go to the variables (TF's
            # restore may take them instead, reading them again through the page cache)
            want = min(_direct.DIRECT_PIECE if direct and self._to_variables else PIECE_BYTES, left)
            if direct and PIECE_BYTES < want == left:
                # the last piece no larger than a buffered one (and the one before it
                # ending at a block): its check ends soon after its last byte
                want = (left - PIECE_BYTES) & -_direct.ALIGN or want
            ask = want + -want % _direct.ALIGN if direct else want
            if handed:
                self._asked[key] = done + ask  # the checker faults in only what lies beyond
            got = min(_preadv(fd, into[at : at + ask], entry.offset + done, self._path(entry.shard_id)), want)
            if got <= 0 or (direct and got < want):
                raise self._truncated(key, entry)
            if handed:
                self._pieces.put((key, value, base + at, done, got))
            else:
                chained = int(crc(chained, base + at, got))
            done += got
        if not handed:
            self._check(key, entry, chained)
            if value is not None:
                self._publish(key, value)
        return True

    def _truncated(self, key: str, entry: Any) -> Exception:
        return _data_loss(
            f"{self._path(entry.shard_id)}: truncated (ends before {key}'s {entry.size} bytes at offset {entry.offset})"
        )

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
        trackable_object_graph_pb2 = _tf_internals.proto_module(_tf_internals.OBJECT_GRAPH_PB2)
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
        """Wait for the last value (each checked); ``{key: numpy array}``.

        Raises:
            tf.errors.DataLossError: a data file is short or a value's checksum is wrong.
            OSError: a data file could not be opened or read.
        """
        values: dict[str, Any] = {}
        self._to_variables = True
        self._pieces.put(_FAULT_IN)  # the arrays are wanted: the checker faults them in ahead of the readers
        try:
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


def start(prefix: str, *, direct_reads: bool = True, huge_pages: bool = True) -> Prefetch | None:
    """Start reading the values of the checkpoint ``prefix`` (:class:`Prefetch`), or
    ``None`` if its index is of a kind this module does not read. ``direct_reads``:
    large values not in the page cache with direct I/O; ``huge_pages``: into huge pages
    (the store's :class:`~.store._options.FastPath`).

    Raises:
        ValueError: the index is damaged (naming it).
    """
    if _bundle._crc is None or _bundle._crc[1] is None:
        return None  # no checksum of a tensor's memory without a copy: TF's reader
    index = read_index(prefix)
    if index is None:
        return None
    return Prefetch(prefix, index[0], index[1], direct_reads=direct_reads, huge_pages=huge_pages)


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
    assign_variable_op = tf().raw_ops.AssignVariableOp
    with tf().device("/cpu:0"):
        for p in planned:
            assign_variable_op(resource=p.variable.handle, value=values[p.key])
