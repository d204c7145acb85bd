"""Writing TensorFlow tensor bundles (the files of a TF2 checkpoint) without ``SaveV2``.

A checkpoint ``<prefix>`` is one or more data files ``<prefix>.data-0000j-of-0000N``
holding the tensors' bytes (back to back, but for gaps the format allows), and an index
``<prefix>.index``: a LevelDB-format table (TensorFlow's
``tensorflow/core/lib/io/table_builder``) mapping the key ``""`` to a
``BundleHeaderProto`` and each tensor key to a ``BundleEntryProto`` (dtype, shape, data
file, offset, size and the masked CRC32C of the bytes). TensorFlow's reader checks every
index block's checksum and each tensor's; this module writes both, so plain
``tf.train.Checkpoint.restore`` and ``tf.train.load_checkpoint`` read its files.

For plain numeric and bool tensors the data file is the tensors' memory as it is, a
large tensor (1 MiB or more) starting at a 4 KiB boundary (:func:`._direct.placed_at`:
a restore reads it from there with direct I/O). For a data file of 32 MB or more, where
the filesystem takes direct I/O (:mod:`._direct`), a large tensor in aligned memory
(the staging buffers) goes to disk straight from its buffer, the rest through a reused
aligned bounce buffer, past the page cache; elsewhere a write is
buffered ``pwrite(2)`` calls of :data:`CHUNK_BYTES` straight from the snapshot's buffers.
Either way the writes are made by the idle-priority thread of :mod:`._idle_io` when
the caller passes one, with one CRC32C pass per tensor (``google-crc32c``, hardware
accelerated, run with the GIL released). String tensors (the object graph) use TF's string encoding.
Anything else (variant tensors such as a ``tf.data`` iterator's state, resources,
quantized types, slices of partitioned variables) is not handled here:
:func:`encodable` says no and the caller uses ``SaveV2``.

Plain file work on the caller's thread (the checkpoint writer thread); never the event
loop. TensorFlow is imported only for the index protos.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .... import _tf_internals
from ...._logging import get_logger
from . import _direct
from ._idle_io import CHUNK_BYTES, IdleIO, pwrite_all

__all__ = [
    "available",
    "checked",
    "encodable",
    "self_check",
    "slot_offset",
    "write_bundle",
    "write_data_over",
    "write_index_file",
]

log = get_logger(__name__)

_MASK_DELTA = 0xA282EAD8
_TABLE_MAGIC = 0xDB4775248B80FB57
_BLOCK_SIZE = 256 << 10  # TF's table::Options default
_RESTART_INTERVAL = 16
_NO_COMPRESSION = b"\x00"
_FOOTER_HANDLES = 40  # two BlockHandles, padded to their maximal encoded length

# TF DataType enums whose on-disk bytes are the tensor's memory (DataTypeCanUseMemcpy):
# float, double, int32, uint8, int16, int8, complex64, int64, bool, bfloat16, uint16,
# complex128, half, uint32, uint64. Not: string (7, encoded below), quantized types,
# resource (20), variant (21), float8 and 4-bit types.
_PLAIN_DTYPES = frozenset({1, 2, 3, 4, 5, 6, 8, 9, 10, 14, 17, 18, 19, 22, 23})
_STRING = 7


def _load_crc32c() -> tuple[Callable[[int, Any], int], Callable[[int, int, int], int] | None] | None:
    """``(extend_bytes, extend_address)`` from google-crc32c, or ``None`` without it.

    ``extend_address(crc, address, nbytes)`` calls the library's C function through ctypes
    (which releases the GIL) on memory that is not a ``bytes`` object, such as a
    tensor's buffer; the Python binding would need a copy into ``bytes`` first.
    """
    try:
        import google_crc32c
        from google_crc32c import _crc32c
    except ImportError:
        return None
    if google_crc32c.implementation != "c":
        return None  # the pure-Python fallback is far too slow for tensor data
    by_address: Callable[[int, int, int], int] | None
    try:
        fn = ctypes.CDLL(_crc32c.__file__).crc32c_extend  # found in the module's libcrc32c
        fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        fn.restype = ctypes.c_uint32
        by_address = fn
    except (OSError, AttributeError):
        by_address = None
    return _crc32c.extend, by_address


_crc = _load_crc32c()


def available() -> bool:
    """Whether this module can write bundles here (google-crc32c's C library, little endian)."""
    return _crc is not None and sys.byteorder == "little"


_checked: list[bool] = []  # the self-check's verdict, once per process
_check_lock = threading.Lock()


def self_check() -> bool:
    """Whether TensorFlow's own reader reads back what this writer writes, here and now.

    This module writes TF's on-disk format by hand, and computes checksums through a C
    symbol of google-crc32c's private module: a TensorFlow or google-crc32c release could
    break it without a word. So the first call in a process writes a tiny bundle (two
    data files, every dtype :func:`encodable` accepts, scalars, an empty tensor, strings
    with NUL and non-ASCII bytes) to a temporary directory and reads every value back
    with ``tf.train.load_checkpoint``, byte for byte. On any difference or error it
    returns ``False`` for the rest of the process and logs ``checkpoint.native_writer_off``
    once (the caller then uses TF's ``SaveV2``). A few milliseconds, on the first save.
    """
    with _check_lock:
        if not _checked:
            _checked.append(_run_self_check())
        return _checked[0]


def checked() -> bool | None:
    """The verdict of :func:`self_check` if it has run in this process, else ``None``
    (without running it)."""
    return _checked[0] if _checked else None


def _self_check_tensors(tf_: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "scalar": tf_.constant(1.25, tf_.float32),
        "empty": tf_.zeros([0, 3], tf_.float32),
        "strings": tf_.constant([b"", b"a\x00b", "\u00e9t\u00e9".encode()]),
        "string": tf_.constant(b"x" * 300),
    }
    for name in ("float16", "bfloat16", "float32", "float64", "complex64", "complex128"):
        values[name] = tf_.cast(tf_.constant([[1.5, -2.25, 3.0]]), getattr(tf_, name))
    for name in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"):
        values[name] = tf_.cast(tf_.constant([[0, 1, 100]]), getattr(tf_, name))
    values["bool"] = tf_.constant([True, False])
    # large enough to be placed at a block boundary after the small ones (the gap before it)
    values["large"] = tf_.range(_direct.DIRECT_MIN_BYTES // 4, dtype=tf_.int32)
    return values


def _run_self_check() -> bool:
    import tempfile

    from ...._logging import describe
    from ...._tf import tf

    if not available():
        return False
    tf_ = tf()
    try:
        values = _self_check_tensors(tf_)
        keys = sorted(values)
        tensors = [values[k] for k in keys]
        groups = [list(range(0, len(keys), 2)), list(range(1, len(keys), 2))]
        _sweep_checks()
        with tempfile.TemporaryDirectory(prefix=f"{_CHECK_PREFIX}{os.getpid()}-") as directory:
            prefix = os.path.join(directory, "check")
            write_bundle(prefix, keys, tensors, groups)
            reader = tf_.train.load_checkpoint(prefix)
            for key, tensor in zip(keys, tensors):
                got = np.asarray(reader.get_tensor(key))
                want = np.asarray(tensor.numpy())
                if got.dtype != want.dtype or got.shape != want.shape:
                    raise ValueError(f"{key}: read {got.dtype}{got.shape}, wrote {want.dtype}{want.shape}")
                strings = want.dtype.kind in "OS"
                same = got.tolist() == want.tolist() if strings else got.tobytes() == want.tobytes()
                if not same:
                    raise ValueError(f"{key}: TensorFlow read other values than were written")
    except Exception as exc:
        log.warning(
            "checkpoint.native_writer_off",
            why=describe(exc),
            consequence="checkpoints are written by TensorFlow's SaveV2 in this process (slower, same files)",
        )
        return False
    return True


_CHECK_PREFIX = "asv-bundle-check-"


def _sweep_checks() -> None:
    """Remove the self-check directories of processes that are gone (killed during their
    check, a SIGKILL leaves its directory): ``asv-bundle-check-<pid>-*`` in the
    temporary directory, ``<pid>`` no longer running. Best effort."""
    import re
    import shutil
    import tempfile

    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        found = re.fullmatch(re.escape(_CHECK_PREFIX) + r"(\d+)-\w+", name)
        if found is None or int(found.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(found.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        except OSError:
            continue  # running, but not ours to signal: alive


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def _crc_bytes(data: bytes, crc: int = 0) -> int:
    assert _crc is not None
    return int(_crc[0](crc, data))


def _crc_array(array: np.ndarray, crc: int = 0) -> int:
    assert _crc is not None
    by_address = _crc[1]
    if by_address is None:
        return _crc_bytes(array.tobytes(), crc)
    return int(by_address(crc, array.ctypes.data, array.nbytes))


def _file_sum(tensors: Sequence[Any], placed: Sequence[tuple[int, int, int]]) -> tuple[int, int]:
    """The size and CRC32C of a data file just written with ``tensors`` at ``placed``,
    from the tensors' bytes still in memory (the gaps before aligned ones read as zeros):
    the checksum a remote's commit marker carries, without reading the file back."""
    crc = end = 0
    for tensor, (offset, size, _) in zip(tensors, placed):
        if offset > end:
            crc = _crc_bytes(bytes(offset - end), crc)
        if int(tensor.dtype.as_datatype_enum) == _STRING:
            for part in _string_bytes(tensor)[0]:
                crc = _crc_bytes(part, crc)
        elif size:
            crc = _crc_array(_plain_array(tensor), crc)
        end = offset + size
    return end, crc


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encodable(tensor: Any, slice_spec: str) -> bool:
    """Whether :func:`write_bundle` writes ``tensor`` (else ``SaveV2`` must)."""
    if slice_spec:
        return False
    try:
        enum = int(tensor.dtype.as_datatype_enum)
    except (AttributeError, TypeError):
        return False
    return enum in _PLAIN_DTYPES or enum == _STRING


def _plain_array(tensor: Any) -> np.ndarray:
    """The tensor's bytes as a C-contiguous array; the tensor's own buffer when possible."""
    if tensor.shape.rank:
        array = np.asarray(tensor)  # shares the tensor's (copy-on-write) buffer
    else:
        array = np.asarray(tensor.numpy())  # a scalar: nothing worth sharing
    array = np.ascontiguousarray(array).reshape(-1).view(np.uint8)  # bfloat16 has no buffer format
    expected = int(tensor.shape.num_elements()) * int(tensor.dtype.size)
    if array.nbytes != expected:
        raise ValueError(f"{tensor.dtype.name} tensor of {expected} bytes reads as {array.nbytes}")
    return array


def _plain_nbytes(tensor: Any) -> int:
    """The bytes of a plain tensor's data (0 for a string tensor)."""
    if int(tensor.dtype.as_datatype_enum) == _STRING:
        return 0
    return int(tensor.shape.num_elements()) * int(tensor.dtype.size)


def _string_bytes(tensor: Any) -> tuple[list[bytes], int]:
    """TF's on-disk string tensor: varint lengths, masked CRC of the lengths, the bytes."""
    values = np.asarray(tensor.numpy(), dtype=object).reshape(-1)
    elems = [bytes(v) for v in values]
    crc = 0
    lengths = bytearray()
    for elem in elems:
        lengths += _varint(len(elem))
        crc = _crc_bytes(struct.pack("<I" if len(elem) <= 0xFFFFFFFF else "<Q", len(elem)), crc)
    length_crc = struct.pack("<I", _mask(crc))
    crc = _crc_bytes(length_crc, crc)
    for elem in elems:
        crc = _crc_bytes(elem, crc)
    return [bytes(lengths), length_crc, *elems], crc


def _write_strings(fd: int, tensor: Any, offset: int) -> tuple[int, int]:
    """A string tensor written at ``offset`` in TF's encoding; its size and CRC32C."""
    parts, crc = _string_bytes(tensor)
    size = 0
    for part in parts:
        pwrite_all(fd, part, offset + size)
        size += len(part)
    return size, crc


def _write_at(
    fd: int,
    data: Any,
    offset: int,
    check: Callable[[], None] | None = None,
    io: IdleIO | None = None,
    chunk: int = CHUNK_BYTES,
) -> None:
    """Write the buffer ``data`` at ``offset`` in pieces of ``chunk`` bytes, calling
    ``check`` between them; through ``io`` when given."""
    if io is not None:
        io.write(fd, data, offset, check, chunk)
        return
    view = memoryview(data).cast("B")
    for start in range(0, len(view), chunk):
        if check is not None and start:
            check()
        pwrite_all(fd, view[start : start + chunk], offset + start)


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """An ``OSError`` raised inside names ``path`` (``os.write`` and friends do not)."""
    try:
        yield
    except OSError as exc:
        exc.filename = exc.filename or path
        raise


def write_data_file(
    path: str,
    tensors: Sequence[Any],
    check: Callable[[], None] | None = None,
    io: IdleIO | None = None,
    direct: bool = True,
) -> list[tuple[int, int, int]]:
    """Write ``tensors`` into a new file ``path``; ``(offset, size, crc)`` of each.

    With direct I/O when large and the filesystem takes it (:mod:`._direct`: large tensors
    in aligned memory at aligned offsets, written from their own memory, the rest through
    a bounce buffer), else buffered, back to back. The file is left unsynced (the commit
    fsyncs it). ``check`` is called between chunks and may raise to abandon the write.
    With ``io`` the bytes are written by its idle-priority thread. An ``OSError`` names
    ``path`` (``os.write`` alone does not). ``direct=False``: always buffered.
    """
    if direct and _direct.wanted(os.path.dirname(path) or ".", sum(map(_plain_nbytes, tensors))):
        try:
            return _write_data_file_direct(path, tensors, check, io)
        except _direct.DirectRefused:
            log.debug("checkpoint.direct_io_off", path=path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    placed: list[tuple[int, int, int]] = []
    offset = 0
    with _naming(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            for tensor in tensors:
                if check is not None:
                    check()
                if int(tensor.dtype.as_datatype_enum) == _STRING:
                    size, crc = _write_strings(fd, tensor, offset)
                else:
                    array = _plain_array(tensor)
                    size = array.nbytes
                    offset = _direct.placed_at(offset, size)  # a large one at a block (the gap reads as zeros)
                    if size:
                        _write_at(fd, array, offset, check, io)
                    crc = _crc_array(array) if size else 0
                placed.append((offset, size, crc))
                offset += size
        finally:
            os.close(fd)
    return placed


def _write_data_file_direct(
    path: str, tensors: Sequence[Any], check: Callable[[], None] | None, io: IdleIO | None
) -> list[tuple[int, int, int]]:
    placed: list[tuple[int, int, int]] = []

    def write(fd: int, data: Any, offset: int, chunk: int) -> None:
        if check is not None:
            check()  # between two of the stream's writes too (each may be one chunk)
        _write_at(fd, data, offset, check, io, chunk)

    with _naming(path):
        fd = _direct.open_direct(path)
        try:
            with _direct.AlignedStream(fd, path, write) as stream:
                for tensor in tensors:
                    if check is not None:
                        check()
                    if int(tensor.dtype.as_datatype_enum) == _STRING:
                        parts, crc = _string_bytes(tensor)
                        offset = stream.offset
                        for part in parts:
                            stream.append(part)
                        size = stream.offset - offset
                    else:
                        array = _plain_array(tensor)
                        size = array.nbytes
                        crc = _crc_array(array) if size else 0
                        offset = stream.append_array(array)
                    placed.append((offset, size, crc))
                stream.close()
        finally:
            os.close(fd)
    return placed


def _block(entries: list[tuple[bytes, bytes]], restart_interval: int) -> bytes:
    """A table block: prefix-compressed entries, then the restart offsets and their count."""
    out = bytearray()
    restarts: list[int] = []
    last = b""
    for i, (key, value) in enumerate(entries):
        if i % restart_interval == 0:
            restarts.append(len(out))
            shared = 0
        else:
            shared = 0
            limit = min(len(last), len(key))
            while shared < limit and last[shared] == key[shared]:
                shared += 1
        out += _varint(shared) + _varint(len(key) - shared) + _varint(len(value))
        out += key[shared:]
        out += value
        last = key
    if not restarts:
        restarts.append(0)
    out += struct.pack(f"<{len(restarts)}I", *restarts)
    out += struct.pack("<I", len(restarts))
    return bytes(out)


def _table(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A LevelDB-format table (no compression) of ``entries``, sorted by key."""
    out = bytearray()

    def raw_block(contents: bytes) -> bytes:
        handle = _varint(len(out)) + _varint(len(contents))
        crc = _crc_bytes(_NO_COMPRESSION, _crc_bytes(contents))
        out.extend(contents)
        out.extend(_NO_COMPRESSION)
        out.extend(struct.pack("<I", _mask(crc)))
        return handle

    index: list[tuple[bytes, bytes]] = []
    pending: list[tuple[bytes, bytes]] = []
    pending_size = 0
    for key, value in entries:
        pending.append((key, value))
        pending_size += len(key) + len(value) + 8
        if pending_size >= _BLOCK_SIZE:
            index.append((key, raw_block(_block(pending, _RESTART_INTERVAL))))
            pending, pending_size = [], 0
    if pending:
        index.append((pending[-1][0], raw_block(_block(pending, _RESTART_INTERVAL))))
    metaindex = raw_block(_block([], _RESTART_INTERVAL))
    index_handle = raw_block(_block(index, 1))
    handles = metaindex + index_handle
    out += handles + b"\x00" * (_FOOTER_HANDLES - len(handles))
    out += struct.pack("<Q", _TABLE_MAGIC)
    return bytes(out)


def index_bytes(entries: dict[str, Any], num_shards: int) -> bytes:
    """The ``.index`` file: the header under ``""``, then ``entries`` (key → BundleEntryProto)."""
    versions_pb2 = _tf_internals.proto_module(_tf_internals.VERSIONS_PB2)
    tensor_bundle_pb2 = _tf_internals.proto_module(_tf_internals.TENSOR_BUNDLE_PB2)
    header = tensor_bundle_pb2.BundleHeaderProto(
        num_shards=num_shards,
        endianness=tensor_bundle_pb2.BundleHeaderProto.LITTLE,
        version=versions_pb2.VersionDef(producer=1),  # kTensorBundleVersion
    )
    rows = [(b"", header.SerializeToString())]
    rows += sorted((key.encode(), entry.SerializeToString()) for key, entry in entries.items())
    return _table(rows)


def entry_proto(tensor: Any, shard: int, offset: int, size: int, crc: int) -> Any:
    """The ``BundleEntryProto`` of one tensor written at ``offset`` of data file ``shard``."""
    tensor_bundle_pb2 = _tf_internals.proto_module(_tf_internals.TENSOR_BUNDLE_PB2)
    entry = tensor_bundle_pb2.BundleEntryProto(
        dtype=int(tensor.dtype.as_datatype_enum), shard_id=shard, offset=offset, size=size, crc32c=_mask(crc)
    )
    for dim in tensor.shape.as_list():
        entry.shape.dim.add(size=dim)
    return entry


def data_path(prefix: str, shard: int, num_shards: int) -> str:
    """TF's name of data file ``shard`` of ``num_shards``."""
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


def write_index_file(path: str, index: bytes) -> None:
    """Write a new ``.index`` file (unsynced: the commit syncs); an error names ``path``."""
    with _naming(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            pwrite_all(fd, index, 0)
        finally:
            os.close(fd)


def slot_offset(offset: int, nbytes: int, align: int) -> int:
    """Where a staged value of ``nbytes`` goes in a slot (:mod:`._slots`) whose next free
    byte is ``offset``: as :func:`._direct.placed_at` places it, and a small one at the
    next multiple of ``align`` (a numpy view of it needs its dtype's alignment)."""
    return _direct.placed_at(offset + (-offset % align), nbytes)


def write_data_over(
    keys: Sequence[str],
    tensors: Sequence[Any],
    fd: int,
    path: str,
    offset_of: Callable[[Any], int | None],
    end: int,
    check: Callable[[], None] | None = None,
) -> tuple[int, dict[str, Any]]:
    """The one data file of a bundle in the open file ``fd`` (``path``), whose bytes at
    ``offset_of(tensor)`` already hold that tensor (staged there, :mod:`._slots`): those
    are summed, the others (``offset_of`` gives ``None``) written from ``end`` on. Returns
    the data's end and the index entries (key → BundleEntryProto) for :func:`index_bytes`.
    """
    entries: dict[str, Any] = {}
    with _naming(path):
        for key, tensor in zip(keys, tensors):
            if check is not None:
                check()
            at = offset_of(tensor)
            if int(tensor.dtype.as_datatype_enum) == _STRING:
                offset = end
                size, crc = _write_strings(fd, tensor, offset)
            else:
                array = _plain_array(tensor)
                size = array.nbytes
                offset = _direct.placed_at(end, size) if at is None else at
                if at is None and size:
                    _write_at(fd, array, offset, check)
                crc = _crc_array(array) if size else 0
            if at is None:
                end = offset + size
            if key in entries:
                raise ValueError(f"duplicate checkpoint key {key!r}")
            entries[key] = entry_proto(tensor, 0, offset, size, crc)
    return end, entries


def write_bundle(
    prefix: str,
    keys: Sequence[str],
    tensors: Sequence[Any],
    groups: Sequence[Sequence[int]],
    run_parallel: Callable[[Callable[[int], list[tuple[int, int, int]]], int], list[list[tuple[int, int, int]]]]
    | None = None,
    check: Callable[[], None] | None = None,
    io: IdleIO | None = None,
    direct: bool = True,
    checksums: bool = False,
) -> dict[str, tuple[int, int]]:
    """Write a bundle at ``prefix``: data file ``j`` holds the tensors ``groups[j]``.

    Every tensor must be :func:`encodable`. ``run_parallel(fn, n)`` (optional) returns
    ``[fn(0), ..., fn(n - 1)]``, computed in parallel; the data files are then written
    at the same time. The index is written last. Files are not synced. ``check`` is
    called between chunks and may raise to abandon the write (the caller removes what
    was written). ``io`` (optional) writes the data at idle priority. ``direct``: large
    data files with direct I/O where the filesystem takes it. Returns, with ``checksums``,
    each file's size and CRC32C by its name's suffix (``".index"``,
    ``".data-00000-of-00001"``), computed from the bytes in memory (else ``{}``).
    """
    count = len(groups)

    def write_group(j: int) -> list[tuple[int, int, int]]:
        return write_data_file(data_path(prefix, j, count), [tensors[i] for i in groups[j]], check, io, direct)

    if run_parallel is not None and count > 1:
        placed = run_parallel(write_group, count)
    else:
        placed = [write_group(j) for j in range(count)]
    entries: dict[str, Any] = {}
    for j, group in enumerate(groups):
        for i, (offset, size, crc) in zip(group, placed[j]):
            if keys[i] in entries:
                raise ValueError(f"duplicate checkpoint key {keys[i]!r}")
            entries[keys[i]] = entry_proto(tensors[i], j, offset, size, crc)
    index = index_bytes(entries, count)
    if check is not None:
        check()
    write_index_file(f"{prefix}.index", index)
    if not checksums:
        return {}
    sums = {".index": (len(index), _crc_bytes(index))}
    for j, group in enumerate(groups):
        name = data_path(prefix, j, count)[len(prefix) :]
        sums[name] = _file_sum([tensors[i] for i in group], placed[j])
    return sums
