"""Reading a checkpoint's ``.index``: TensorFlow's LevelDB-format table of
``BundleEntryProto`` rows (the format :mod:`._bundle` writes), without TF's reader.

Used where TF's reader gives too little (it hides offsets and data files): the direct
restore (:mod:`._direct_restore`), the iterator's share of a checkpoint
(:mod:`...snapshot._iterator_state`), and tests. Every block's masked CRC32C is checked when
google-crc32c's C library is there (:func:`._bundle.available`).
"""

from __future__ import annotations

import struct
from typing import Any

from .... import _tf_internals
from . import _bundle

__all__ = ["Unsupported", "read", "varint"]

_FOOTER = 48  # two block handles padded to 40 bytes, then the 8-byte magic

# The rows of a value saved in slices (the plain store's large values, partitioned
# variables): TF keys each slice's row by an OrderedCode that starts with a 0 byte
# (``checkpoint::EncodeTensorNameSlice``); the value's own entry lists the slices.
_SLICE_KEY = b"\x00"


class Unsupported(ValueError):
    """An index of a kind this module does not read (a compressed block); TF's reader does."""


def varint(data: bytes, pos: int) -> tuple[int, int]:
    """The unsigned LEB128 varint at ``data[pos:]`` and the position after it.

    Raises:
        ValueError: it runs past the end of ``data`` or over 64 bits.
    """
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("bad varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _block(data: bytes, handle: bytes, path: str) -> bytes:
    """The contents of the block ``handle`` points at, its trailer checked."""
    offset, pos = varint(handle, 0)
    size, _ = varint(handle, pos)
    if offset + size + 5 > len(data):
        raise ValueError(f"{path}: a block runs past the end of the file (truncated?)")
    contents = data[offset : offset + size]
    kind = data[offset + size : offset + size + 1]
    (stored,) = struct.unpack_from("<I", data, offset + size + 1)
    if _bundle.available() and _bundle._mask(_bundle._crc_bytes(kind, _bundle._crc_bytes(contents))) != stored:
        raise ValueError(f"{path}: block checksum mismatch (corrupt index)")
    if kind != _bundle._NO_COMPRESSION:
        raise Unsupported(f"{path}: compressed index block")
    return contents


def _rows(block: bytes) -> list[tuple[bytes, bytes]]:
    """The ``(key, value)`` rows of one block (prefix-compressed keys)."""
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * restarts
    rows: list[tuple[bytes, bytes]] = []
    pos, last = 0, b""
    while pos < end:
        shared, pos = varint(block, pos)
        fresh, pos = varint(block, pos)
        length, pos = varint(block, pos)
        key = last[:shared] + block[pos : pos + fresh]
        pos += fresh
        rows.append((key, block[pos : pos + length]))
        pos += length
        last = key
    return rows


def read(prefix: str) -> tuple[Any, dict[str, Any]]:
    """``(BundleHeaderProto, {key: BundleEntryProto})`` of ``<prefix>.index``.

    Raises:
        Unsupported: a compressed block.
        ValueError: the index is damaged (naming it).
        OSError: it cannot be read.
    """
    from google.protobuf.message import DecodeError

    tensor_bundle_pb2 = _tf_internals.proto_module(_tf_internals.TENSOR_BUNDLE_PB2)
    path = f"{prefix}.index"
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _FOOTER or struct.unpack_from("<Q", data, len(data) - 8)[0] != _bundle._TABLE_MAGIC:
        raise ValueError(f"{path}: not a checkpoint index (bad magic, or truncated)")
    footer = data[-_FOOTER:-8]
    try:
        _, pos = varint(footer, 0)
        _, pos = varint(footer, pos)  # the metaindex handle
        start = pos
        _, pos = varint(footer, pos)
        _, pos = varint(footer, pos)
        header: Any = None
        entries: dict[str, Any] = {}
        for _, handle in _rows(_block(data, footer[start:pos], path)):
            for key, value in _rows(_block(data, handle, path)):
                if not key:
                    header = tensor_bundle_pb2.BundleHeaderProto.FromString(value)
                elif key.startswith(_SLICE_KEY):
                    continue  # one slice of a value saved in slices: its entry has them all
                else:
                    entries[key.decode()] = tensor_bundle_pb2.BundleEntryProto.FromString(value)
    except (struct.error, DecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: corrupt index ({exc})") from None
    if header is None:
        raise ValueError(f"{path}: no bundle header (corrupt index)")
    return header, entries
