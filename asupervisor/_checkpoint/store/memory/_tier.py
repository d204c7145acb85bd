"""The RAM tier of one logdir: a directory in memory that survives the process.

A SIGKILL, an OOM kill or a crash of the interpreter loses the process, not the page
cache of a RAM file system (``/dev/shm`` on Linux, a ``tmpfs``): checkpoints written
there can be saved every second or so at a cost a disk save could not meet, and a restart
on the same machine resumes from them. A reboot, a power loss or a fresh machine loses
them: the disk (and the object store) serve then, as without this tier.

The tier's directory is ``<root>/asupervisor-<uid>/<hash of the logdir's real path>``: an
ordinary checkpoint directory (a state file, ``<basename>-<step>.*``, written through the
store protocol, :attr:`MemoryTier.store`), so every guarantee of a commit holds in it.
A file ``asupervisor-ram-tier.json`` ties it to its logdir: the logdir's real path and
its directory's inode. A logdir removed and made again (a new training under an old
name) gets a new inode, and the tier's old checkpoints are removed, not restored.

What it holds: at most :attr:`MemoryTier.max_to_keep` committed checkpoints (retention
keeps the newest), plus the one being written. Nothing here decides when to save or
which checkpoint to restore: the checkpointer does, through the same door.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...._logging import describe, get_logger
from .. import _names, _state_file

if TYPE_CHECKING:
    from .._types import CheckpointStore

__all__ = ["IDENTITY_FILE", "MemoryTier", "default_root", "tier_dir"]

log = get_logger(__name__)

#: the file tying a tier's directory to its logdir
IDENTITY_FILE = "asupervisor-ram-tier.json"


def default_root() -> Path:
    """Where ``ram_tier=True`` puts the tier: ``/dev/shm`` (Linux's RAM file system).

    Raises:
        ValueError: there is none here (another platform): the message says to give a
            directory on a RAM file system instead.
    """
    shm = Path("/dev/shm")
    if sys.platform.startswith("linux") and shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    raise ValueError(
        f"ram_tier=True needs /dev/shm (Linux's RAM file system), which {sys.platform} lacks here; "
        "give ram_tier a directory on a RAM file system (a tmpfs) instead"
    )


def tier_dir(root: Path, logdir: Path) -> Path:
    """The tier's directory for ``logdir`` under ``root`` (one per logdir and user)."""
    digest = hashlib.sha256(os.path.realpath(logdir).encode()).hexdigest()[:16]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(root) / f"asupervisor-{uid}" / digest


def _identity(logdir: Path) -> dict[str, Any]:
    st = os.stat(logdir)
    return {"logdir": os.path.realpath(logdir), "dev": st.st_dev, "ino": st.st_ino}


class MemoryTier:
    """The RAM tier of ``logdir`` (see the module docstring).

    Args:
        logdir: the disk directory this tier sits below.
        store: the store of the tier's directory (:func:`tier_dir`), chosen by the chooser.
        max_to_keep: the committed checkpoints the tier holds at most.
    """

    def __init__(self, logdir: Path, store: CheckpointStore, *, max_to_keep: int = 2) -> None:
        self.logdir = Path(logdir)
        self.store = store
        self.dir = store.logdir
        self.max_to_keep = max_to_keep

    def __repr__(self) -> str:
        return f"MemoryTier({str(self.dir)!r}, logdir={str(self.logdir)!r})"

    def prepare(self) -> None:
        """At start-up, after the logdir's owner lock is taken: the directory made (mode
        0700), checkpoints of another logdir of the same name removed, leftovers of
        interrupted saves removed.

        Raises:
            OSError: the directory cannot be made or written (named in the error).
        """
        os.makedirs(self.dir.parent, mode=0o700, exist_ok=True)
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        identity = _identity(self.logdir)
        path = self.dir / IDENTITY_FILE
        try:
            recorded = json.loads(path.read_text())
        except FileNotFoundError:
            recorded = None
        except (OSError, ValueError) as exc:
            recorded = {"unreadable": describe(exc)}
        if recorded != identity:
            if recorded is not None or any(p.name != IDENTITY_FILE for p in self.dir.iterdir()):
                log.warning(
                    "checkpoint.ram_tier_reset",
                    dir=str(self.dir),
                    logdir=str(self.logdir),
                    why="its checkpoints are of another directory of this name (made again since)",
                )
                self.clear()
                os.makedirs(self.dir, mode=0o700, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(identity))
            os.replace(tmp, path)
        self.store.clean_leftovers()

    def newest_step(self, basename: str) -> int | None:
        """The step of the newest complete checkpoint the tier holds, or ``None``; reads
        only names, for ``status()`` and ``inspect``."""
        names = self.store.complete_checkpoints(basename)
        steps = [s for s in (_names.step_of(n) for n in names) if s is not None]
        return max(steps) if steps else None

    def state(self) -> _state_file.CheckpointState | None:
        """The tier's state file, if readable."""
        return self.store.read_state()

    def clear(self) -> None:
        """Remove the tier's directory and everything in it (what it held is gone)."""
        shutil.rmtree(self.dir, ignore_errors=True)
