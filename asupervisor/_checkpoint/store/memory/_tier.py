"""The RAM tier of one logdir: a directory in memory that survives the process.

A SIGKILL, an OOM kill or a crash of the interpreter loses the process, not the page
cache of a RAM file system (``/dev/shm`` on Linux, a ``tmpfs``): checkpoints written
there can be saved every second or so at a cost a disk save could not meet, and a restart
on the same machine resumes from them. A reboot, a power loss or a fresh machine loses
them: the disk (and the object store) serve then, as without this tier.

The tier's directory is ``<root>/asupervisor-<uid>/<hash of the logdir's real path>``: an
ordinary checkpoint directory (a state file, ``<basename>-<step>.*``, written through the
store protocol, :attr:`MemoryTier.store`), so every guarantee of a commit holds in it.
A random token, in the tier (``asupervisor-ram-tier.json``) and in the logdir
(``asupervisor.ram-tier``, which also names the tier for ``asupervisor inspect``), ties
the two: a logdir removed and made again (a new training under an old name) lacks it,
and the tier's old checkpoints are removed, not restored.

What it holds: at most :attr:`MemoryTier.max_to_keep` committed checkpoints (retention
keeps the newest), plus the one being written. Nothing here decides when to save or
which checkpoint to restore: the checkpointer does, through the same door.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...._logging import get_logger
from .. import _names, _state_file, _writeback

if TYPE_CHECKING:
    from .._types import CheckpointStore

__all__ = ["IDENTITY_FILE", "POINTER_FILE", "MemoryTier", "default_root", "report", "tier_dir"]

log = get_logger(__name__)

#: the file tying a tier's directory to its logdir
IDENTITY_FILE = "asupervisor-ram-tier.json"

#: the file in the logdir naming its RAM tier's directory (for ``asupervisor inspect``)
POINTER_FILE = "asupervisor.ram-tier"


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


def report(logdir: Path) -> dict[str, Any] | None:
    """What the RAM tier of ``logdir`` holds, for ``asupervisor inspect``: its directory,
    whether it is there (a reboot empties it), its checkpoints (name, step, bytes) and the
    newest step; ``None`` if the logdir never had one. Reads only."""
    pointer = _read_json(Path(logdir) / POINTER_FILE)
    if pointer is None or not isinstance(pointer.get("dir"), str):
        return None
    directory = Path(pointer["dir"])
    identity = _read_json(directory / IDENTITY_FILE)
    present = identity is not None and identity.get("token") == pointer.get("token")
    checkpoints = []
    if present:
        for name in _names.scan_checkpoints(directory, None):
            if _names.missing_files(directory / name) is None:
                files = _names.checkpoint_files(directory / name)
                size = sum(f.stat().st_size for f in files if f.exists())
                checkpoints.append({"name": name, "step": _names.step_of(name), "bytes": size})
    steps = [c["step"] for c in checkpoints if c["step"] is not None]
    return {
        "dir": str(directory),
        "present": present,
        "checkpoints": checkpoints,
        "newest_step": max(steps, default=None),
    }


def _read_json(path: Path) -> dict[str, Any] | None:
    """A small JSON object file, or ``None`` (missing, unreadable, not an object)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


class MemoryTier:
    """The RAM tier of ``logdir`` (see the module docstring).

    Args:
        logdir: the disk directory this tier sits below.
        store: the store of the tier's directory (:func:`tier_dir`), chosen by the chooser.
        max_to_keep: the committed checkpoints the tier holds at most.
    """

    #: the committed checkpoints a tier holds at most, by default
    MAX_TO_KEEP = 2

    def __init__(self, logdir: Path, store: CheckpointStore, *, max_to_keep: int = MAX_TO_KEEP) -> None:
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

        The tier and its logdir share a random token (the tier's :data:`IDENTITY_FILE`,
        the logdir's :data:`POINTER_FILE`): a logdir removed and made again lacks it (an
        inode number can be reused, a token is not), and the tier is emptied first.

        Raises:
            OSError: the directory cannot be made or written (named in the error).
        """
        os.makedirs(self.dir.parent, mode=0o700, exist_ok=True)
        self._sweep_orphans()
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        pointer = _read_json(self.logdir / POINTER_FILE)
        recorded = _read_json(self.dir / IDENTITY_FILE)
        token = recorded.get("token") if recorded else None
        if token is None or pointer is None or pointer.get("token") != token:
            if any(p.name != IDENTITY_FILE for p in self.dir.iterdir()):
                log.warning(
                    "checkpoint.ram_tier_reset",
                    dir=str(self.dir),
                    logdir=str(self.logdir),
                    why="its checkpoints are not this logdir's (it was made again since, or never used this tier)",
                )
                self.clear()
                os.makedirs(self.dir, mode=0o700, exist_ok=True)
            token = secrets.token_hex(16)
            _writeback.replace_text(
                self.dir / IDENTITY_FILE, json.dumps({"logdir": os.path.realpath(self.logdir), "token": token})
            )
        _writeback.replace_text(self.logdir / POINTER_FILE, json.dumps({"dir": str(self.dir), "token": token}))
        self.store.clean_leftovers()

    def _sweep_orphans(self) -> None:
        """Remove the tiers (of this user, under this root) whose logdir no longer exists:
        a run's logdir deleted would otherwise hold its RAM until a reboot. A tier whose
        logdir exists is left alone, whoever's it is (its own start resets it if needed)."""
        try:
            siblings = [p for p in self.dir.parent.iterdir() if p.is_dir() and p != self.dir]
        except OSError:
            return
        for tier in siblings:
            identity = _read_json(tier / IDENTITY_FILE)
            logdir = identity.get("logdir") if identity else None
            if not isinstance(logdir, str) or os.path.exists(logdir):
                continue
            shutil.rmtree(tier, ignore_errors=True)
            log.info("checkpoint.ram_tier_swept", dir=str(tier), logdir=logdir, why="its logdir is gone")

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
