"""Committing checkpoint files, and removing them (what retention drops: :mod:`._retention`).

The layout is in :mod:`._names`.

The commit protocol (:func:`commit`; :func:`._state_file.write_state` for the state file alone): the data is written under
a temporary prefix, every file is fsynced, renamed to its final name, the directory is
fsynced, and only then is the ``checkpoint`` file atomically replaced (temporary file,
fsync, rename, directory fsync). A crash at any instant leaves the previous state file,
which names only complete checkpoints. A checkpoint under its final name that the state
file does not name yet (a commit) or no longer names (retention deleting it) is marked
pending meanwhile, so that one a crash leaves behind is removed at the next start.

A save that fails or is abandoned removes everything it wrote (:func:`remove_partial`,
and the state file's temporary copy in :func:`commit`); the ``OSError`` it raises names
the file (``os.write`` and ``os.fsync`` alone do not).

This module does plain file work; it never touches model state and must never run on the
event loop thread (callers use the writer or step thread). The state-file proto comes
from TensorFlow, imported lazily.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

from ..._logging import describe, get_logger
from . import _names, _state_file, _writeback

__all__ = [
    "clean_leftovers",
    "commit",
    "delete_checkpoint",
    "probe_writable",
    "remove_partial",
    "retire_checkpoint",
    "set_aside",
]

log = get_logger(__name__)


def probe_writable(logdir: Path) -> None:
    """Create, write, fsync and remove a small file in ``logdir``; raises ``OSError`` (with
    the file name) when the directory cannot be written: read-only, no permission, full."""
    probe = logdir / f"{_names.STATE_FILE}{_names.TMP_MARKER}probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            os.write(fd, b"\0" * 4096)  # one page: a full file system refuses it
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        exc.filename = exc.filename or str(probe)
        raise
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    _writeback.fsync_path(logdir)


def commit(
    tmp_prefix: Path, final_prefix: Path, state: _state_file.CheckpointState, retiring: Sequence[Path] = ()
) -> None:
    """Commit the checkpoint ``tmp_prefix`` as ``final_prefix`` (fsync its files, rename
    them, data first and index last, fsync the directory), then name it in the state file
    (``state``, which must name it) as :func:`write_state` does.

    The state file's temporary copy is written and fsynced while a thread
    (``asv-checkpoint-fsync``, joined here) fsyncs the data files, instead of after them.
    Every file and the renames are durable before the state file is replaced.
    ``retiring`` are the checkpoints ``state`` no longer names, for the caller to delete
    (:func:`retire_checkpoint`): they are marked pending before the state file is
    replaced, so that a crash before their deletion still has them removed at the next
    start.
    """
    logdir = final_prefix.parent
    paths = _names.checkpoint_files(tmp_prefix)
    if not paths:
        raise FileNotFoundError(f"no checkpoint files were written under {tmp_prefix}")
    data = [p for p in paths if not p.name.endswith(".index")]
    errors: list[Exception] = []

    def sync_data() -> None:
        try:
            for p in data:
                _writeback.fsync_path(p)
        except Exception as exc:  # raised below, on the committing thread
            errors.append(exc)

    syncer = threading.Thread(target=sync_data, name="asv-checkpoint-fsync", daemon=True)
    syncer.start()
    staged: Path | None = None
    pending: Path | None = None
    try:
        for p in paths:
            if p.name.endswith(".index"):
                _writeback.fsync_path(p)
        staged = _state_file._stage_state(logdir, state)
    finally:
        syncer.join()
    assert staged is not None
    try:
        if errors:
            raise errors[0]
        # Until the state file names it, a checkpoint under its final name is marked
        # pending: one interrupted here is removed at the next start, not left unnamed.
        pending = _mark_pending(final_prefix)
        # Data first, index last: an index under the final name implies complete data.
        for f in data + [p for p in paths if p.name.endswith(".index")]:
            os.replace(f, logdir / (final_prefix.name + f.name[len(tmp_prefix.name) :]))
        _writeback.fsync_path(logdir)
        for prefix in retiring:
            _mark_pending(prefix)
        _state_file._install_state(logdir, staged, state)  # now it is the latest
    except BaseException:
        staged.unlink(missing_ok=True)
        if pending is not None:  # what was renamed into place is not named: remove it
            _finish_pending(final_prefix, _named(logdir))
        raise
    pending.unlink(missing_ok=True)


def _mark_pending(prefix: Path) -> Path:
    """Create ``<prefix>.asv-tmp-pending`` (not fsynced: after a power loss a checkpoint
    may stay unnamed, as without it); returns its path."""
    marker = prefix.parent / f"{prefix.name}{_names.PENDING}"
    marker.touch()
    return marker


def delete_checkpoint(prefix: Path) -> None:
    """Remove the files of the checkpoint ``prefix``, index first (missing files are fine)."""
    for f in sorted(_names.checkpoint_files(prefix), key=lambda p: not p.name.endswith(".index")):
        try:
            f.unlink()
        except FileNotFoundError:
            pass


def remove_partial(prefix: Path) -> None:
    """Remove everything a failed or abandoned save under the temporary ``prefix`` wrote:
    its files (TF's own temporary names included) and its ``<prefix>_temp/`` directory."""
    parent = prefix.parent
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for entry in entries:
        if entry == f"{prefix.name}_temp" or entry.startswith(f"{prefix.name}."):
            path = parent / entry
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:  # left for clean_leftovers at the next start
                log.error("checkpoint.cleanup_failed", path=str(path), error=describe(exc))


def retire_checkpoint(prefix: Path) -> None:
    """Delete a checkpoint the state file no longer names (retention).

    Marked pending meanwhile (:func:`commit` marks it already, before the state file
    stops naming it), so that what a crash leaves of it is removed at the next start
    instead of staying behind unnamed.
    """
    marker = _mark_pending(prefix)
    delete_checkpoint(prefix)
    marker.unlink(missing_ok=True)


def _named(logdir: Path) -> set[str | None]:
    """The checkpoint names the state file holds."""
    state = _state_file.read_state(logdir)
    return set() if state is None else {*state.paths, state.latest}


def _finish_pending(prefix: Path, named: set[str | None]) -> list[str]:
    """Delete the checkpoint ``prefix`` marked pending unless it is ``named``, then its
    marker; returns the names removed."""
    gone = [] if prefix.name in named else [f.name for f in _names.checkpoint_files(prefix)]
    marker = prefix.parent / f"{prefix.name}{_names.PENDING}"
    try:
        if gone:
            delete_checkpoint(prefix)
        marker.unlink(missing_ok=True)
    except OSError as exc:  # the marker stays: the next start tries again
        log.error("checkpoint.cleanup_failed", path=str(prefix), error=describe(exc))
        return []
    return [*gone, marker.name]


def clean_leftovers(logdir: Path) -> list[str]:
    """Remove what interrupted saves left.

    That is every name holding the temporary marker and, for each ``<name>.asv-tmp-pending``
    marker, the checkpoint ``<name>`` unless the state file names it (a commit interrupted
    before the state file named it, or a retention deletion interrupted half-way).
    """
    removed: list[str] = []
    try:
        entries = os.listdir(logdir)
    except FileNotFoundError:
        return removed
    pending = [e[: -len(_names.PENDING)] for e in entries if e.endswith(_names.PENDING)]
    named = _named(logdir) if pending else set()
    for name in pending:
        removed.extend(_finish_pending(logdir / name, named))
    for entry in entries:
        if _names.TMP_MARKER not in entry or entry.endswith(_names.PENDING):
            continue
        path = logdir / entry
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                path.unlink()
            except FileNotFoundError:
                continue
        removed.append(entry)
    if removed:
        log.info("checkpoint.leftovers_removed", logdir=str(logdir), files=sorted(removed))
    return removed


def set_aside(prefix: Path, tag: str) -> list[str]:
    """Rename the files of the checkpoint ``prefix`` to ``<name>.<tag>...``; returns the new names.

    For a checkpoint that failed to load: kept for inspection, out of the way of a new
    checkpoint of the same step, and no longer a checkpoint name (``step_of`` gives
    ``None`` for it, and nothing here deletes it).
    """
    moved: list[str] = []
    for f in _names.checkpoint_files(prefix):
        target = f.parent / f"{prefix.name}.{tag}{f.name[len(prefix.name) :]}"
        try:
            os.replace(f, target)
        except FileNotFoundError:
            continue
        moved.append(target.name)
    if moved:
        _writeback.fsync_path(prefix.parent)
    return sorted(moved)
