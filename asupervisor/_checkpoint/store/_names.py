"""Names of checkpoint files in a log directory, and reading them back.

Layout of a log directory (TF's own, so plain TensorFlow reads it)::

    checkpoint                              CheckpointState text proto, relative paths
    model.ckpt-<step>.index                 a committed TF2 object checkpoint
    model.ckpt-<step>.data-00000-of-00001
    model.ckpt-<step>.asv-tmp-<hex>.*       a save in flight (removed at start-up)
    model.ckpt-<step>.asv-tmp-pending       that checkpoint is being committed or deleted
    model.ckpt-<step>.corrupt-<time>.*      a checkpoint that failed to load, set aside
    checkpoint.asv-tmp-<pid>                the state file's next version, being written
    checkpoint.asv-tmp-probe-<pid>          start-up's proof that the directory is writable

Pure naming and listing: nothing here writes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..._logging import get_logger

__all__ = ["PENDING", "STATE_FILE", "TMP_MARKER", "checkpoint_files", "missing_files", "scan_checkpoints", "step_of"]

log = get_logger(__name__)


STATE_FILE = "checkpoint"


TMP_MARKER = ".asv-tmp-"


#: ``<checkpoint name>.asv-tmp-pending``: that checkpoint's files are being renamed into
#: place (a commit) or deleted (retention); see :func:`clean_leftovers`
PENDING = TMP_MARKER + "pending"


_DATA_RE = re.compile(r"\.data-(\d{5})-of-(\d{5})$")


def _relative(logdir: Path, path: str) -> str:
    p = Path(path)
    if p.is_absolute():
        try:
            return str(p.relative_to(logdir))
        except ValueError:
            return str(p)  # outside logdir: keep it absolute, as TF does
    return path


def checkpoint_files(prefix: Path) -> list[Path]:
    """The files of the checkpoint ``prefix`` that exist (index and data shards)."""
    parent = prefix.parent
    name = prefix.name
    try:
        entries = os.listdir(parent)
    except FileNotFoundError:
        return []
    out = []
    for entry in entries:
        if entry == f"{name}.index" or (entry.startswith(f"{name}.data-") and _DATA_RE.search(entry)):
            if not os.path.isdir(parent / entry):
                out.append(parent / entry)
    return sorted(out)


def missing_files(prefix: Path) -> str | None:
    """Why the checkpoint ``prefix`` is incomplete on disk, or ``None`` if all files exist."""
    files = checkpoint_files(prefix)
    if not any(f.name.endswith(".index") for f in files):
        return f"index file {prefix.name}.index is missing"
    shards = [m for f in files if (m := _DATA_RE.search(f.name))]
    if not shards:
        return f"no data file {prefix.name}.data-* exists"
    total = int(shards[0].group(2))
    present = {int(m.group(1)) for m in shards}
    absent = [i for i in range(total) if i not in present]
    if absent:
        return f"data shards {absent} of {total} are missing"
    return None


def step_of(name: str) -> int | None:
    """The step in a checkpoint name ``<basename>-<step>``, or ``None``."""
    _, sep, tail = name.rpartition("-")
    return int(tail) if sep and tail.isdigit() else None


def scan_checkpoints(logdir: Path, basename: str | None) -> list[str]:
    """Names of the checkpoints ``<basename>-<step>`` in ``logdir`` that have an index
    file, newest step first (any ``<name>-<step>`` when ``basename`` is ``None``).

    What a restore falls back on when the state file is damaged or names nothing that
    loads. Saves in flight and checkpoints set aside are not checkpoint names.
    """
    try:
        entries = os.listdir(logdir)
    except FileNotFoundError:
        return []
    head = re.escape(basename) if basename is not None else r".+"
    pattern = re.compile(rf"({head}-(\d+))\.index")
    found: list[tuple[int, str]] = []
    for entry in entries:
        m = pattern.fullmatch(entry)
        if m is None or TMP_MARKER in entry or os.path.isdir(logdir / entry):
            continue
        found.append((int(m.group(2)), m.group(1)))
    return [name for _, name in sorted(found, key=lambda t: (-t[0], t[1]))]
