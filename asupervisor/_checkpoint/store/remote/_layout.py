"""What a URL logdir holds, and how a reader tells a committed checkpoint.

Object stores have no atomic rename, so a checkpoint is published in three writes::

    model.ckpt-<step>.data-*-of-*, .index   the files, under their final names
    model.ckpt-<step>.asv-commit            its commit marker: each file's size and CRC32C,
                                            and the metrics the checkpoint records
    checkpoint                              the state object (TF's CheckpointState text)

A checkpoint without its marker does not exist for any reader (TF's own
``tf.train.latest_checkpoint`` included: the state object names it only after its
marker), and its objects are removed by the next owner at start. Retention deletes a
checkpoint marker first, then its files. Besides: ``asupervisor.lease-<n>`` (the
owner's lease, :mod:`._lease`) and ``events.out.tfevents.*`` (summaries).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import google_crc32c

__all__ = [
    "MARKER_SUFFIX",
    "Marker",
    "RemoteCheckpoint",
    "crc32c_extend",
    "crc32c_hex",
    "crc32c_of",
    "list_remote",
    "marker_problem",
]

MARKER_SUFFIX = ".asv-commit"
_CHUNK = 8 << 20
_FILE_RE = re.compile(r"^(.+-(\d+))(\.index|\.data-\d{5}-of-\d{5}|\.asv-commit)$")


def crc32c_extend(crc: int, chunk: bytes) -> int:
    """``crc`` (a CRC32C so far) extended by ``chunk``."""
    return int(google_crc32c.extend(crc, chunk))


def crc32c_hex(crc: int) -> str:
    """A CRC32C as the 8 hex digits a marker holds."""
    return f"{crc:08x}"


def crc32c_of(path: Path) -> str:
    """The CRC32C of a local file, as 8 hex digits."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = crc32c_extend(crc, chunk)
    return crc32c_hex(crc)


@dataclass(frozen=True)
class Marker:
    """A commit marker: what the checkpoint ``name`` is made of.

    Attributes:
        name: the checkpoint's prefix name (``model.ckpt-1200``).
        step: its step.
        files: each file name with its size and CRC32C.
        committed_at: when it was committed locally (``time.time()``).
        metrics: the metrics recorded in the checkpoint (``{"val_loss": 0.4}``), for
            retention on the remote without a download (older markers: none).
    """

    name: str
    step: int
    files: dict[str, tuple[int, str]]
    committed_at: float
    metrics: dict[str, float] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """The marker object's content (JSON)."""
        body = {
            "format": 1,
            "name": self.name,
            "step": self.step,
            "committed_at": self.committed_at,
            "files": {n: {"size": s, "crc32c": c} for n, (s, c) in sorted(self.files.items())},
        }
        if self.metrics:
            body["metrics"] = dict(sorted(self.metrics.items()))
        return json.dumps(body, indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Marker:
        """Parse a marker; ``ValueError`` if it is not one."""
        try:
            body: Any = json.loads(data)
            files = {str(n): (int(v["size"]), str(v["crc32c"])) for n, v in body["files"].items()}
            metrics = {str(k): float(v) for k, v in (body.get("metrics") or {}).items()}
            return cls(str(body["name"]), int(body["step"]), files, float(body["committed_at"]), metrics)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a commit marker: {exc}") from None


@dataclass(frozen=True)
class RemoteCheckpoint:
    """A checkpoint as listed on the remote.

    Attributes:
        name: its prefix name.
        step: its step.
        committed: whether its marker exists.
        sizes: the size of each of its objects (the marker included).
    """

    name: str
    step: int
    committed: bool
    sizes: dict[str, int]


def list_remote(entries: list[dict[str, Any]], basename: str | None) -> list[RemoteCheckpoint]:
    """The checkpoints among ``entries`` (``fs.ls(root, detail=True)``), oldest step first.

    ``basename`` ``None``: any ``<name>-<step>``."""
    found: dict[str, dict[str, int]] = {}
    for entry in entries:
        if entry.get("type") == "directory":
            continue
        base = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
        m = _FILE_RE.match(base)
        if m is None or (basename is not None and m.group(1) != f"{basename}-{m.group(2)}"):
            continue
        found.setdefault(m.group(1), {})[base] = int(entry.get("size") or 0)
    out = [
        RemoteCheckpoint(name, int(name.rsplit("-", 1)[1]), name + MARKER_SUFFIX in sizes, sizes)
        for name, sizes in found.items()
    ]
    return sorted(out, key=lambda c: (c.step, c.name))


def marker_problem(marker: Marker, sizes: dict[str, int]) -> str | None:
    """Why the objects listed (``sizes``) do not match ``marker``, or ``None``."""
    for name, (size, _) in marker.files.items():
        if name not in sizes:
            return f"{name} is missing"
        if sizes[name] != size:
            return f"{name} has {sizes[name]} bytes, its marker says {size}"
    return None
