"""Checkpoint files on disk: names, the ``checkpoint`` state file, committing, retention.

Layout of a log directory (TF's own, so plain TensorFlow reads it)::

    checkpoint                              CheckpointState text proto, relative paths
    model.ckpt-<step>.index                 a committed TF2 object checkpoint
    model.ckpt-<step>.data-00000-of-00001
    model.ckpt-<step>.asv-tmp-<hex>.*       a save in flight (removed at start-up)
    model.ckpt-<step>.asv-tmp-pending       that checkpoint is being committed or deleted
    model.ckpt-<step>.corrupt-<time>.*      a checkpoint that failed to load, set aside
    checkpoint.asv-tmp-<pid>                the state file's next version, being written
    checkpoint.asv-tmp-probe-<pid>          start-up's proof that the directory is writable

The commit protocol (:func:`commit`; :func:`write_state` for the state file alone): the data is written under
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

import ctypes
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._logging import describe, get_logger

__all__ = [
    "PENDING",
    "TMP_MARKER",
    "CheckpointState",
    "clean_leftovers",
    "commit",
    "delete_checkpoint",
    "early_writeback",
    "fsync_path",
    "inspect_state",
    "missing_files",
    "probe_writable",
    "read_own_state",
    "read_state",
    "remove_partial",
    "retire_checkpoint",
    "scan_checkpoints",
    "select_retention",
    "set_aside",
    "step_of",
    "sync_data",
    "write_state",
]

log = get_logger(__name__)

STATE_FILE = "checkpoint"
TMP_MARKER = ".asv-tmp-"
#: ``<checkpoint name>.asv-tmp-pending``: that checkpoint's files are being renamed into
#: place (a commit) or deleted (retention); see :func:`clean_leftovers`
PENDING = TMP_MARKER + "pending"
_DATA_RE = re.compile(r"\.data-(\d{5})-of-(\d{5})$")


@dataclass
class CheckpointState:
    """The content of the ``checkpoint`` state file, with paths relative to the logdir.

    Attributes:
        latest: the newest committed checkpoint (a prefix name), or ``None``.
        paths: the checkpoints retention manages, oldest first (``latest`` last).
        timestamps: the wall-clock commit time of each of ``paths``.
        last_preserved: time of the last checkpoint kept by ``keep_checkpoint_every_n_hours``.
    """

    latest: str | None = None
    paths: list[str] = field(default_factory=list)
    timestamps: list[float] = field(default_factory=list)
    last_preserved: float = 0.0


def _state_proto() -> Any:
    from tensorflow.python.training.checkpoint_state_pb2 import CheckpointState as Proto

    return Proto


def _relative(logdir: Path, path: str) -> str:
    p = Path(path)
    if p.is_absolute():
        try:
            return str(p.relative_to(logdir))
        except ValueError:
            return str(p)  # outside logdir: keep it absolute, as TF does
    return path


_STATE_FIELDS = {
    "model_checkpoint_path": str,
    "all_model_checkpoint_paths": str,
    "all_model_checkpoint_timestamps": float,
    "last_preserved_timestamp": float,
}
_STATE_LINE = re.compile(r'(\w+): (?:"((?:[^"\\]|\\.)*)"|([-+.\w]+))')


def _parse_state(text: str) -> dict[str, list[object]] | None:
    """The fields of a state file as TF and this module write it (one ``name: value`` a
    line); ``None`` for anything else, which :func:`read_state` leaves to protobuf."""
    from google.protobuf import text_encoding

    fields: dict[str, list[object]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _STATE_LINE.fullmatch(line.strip())
        if m is None or m.group(1) not in _STATE_FIELDS:
            return None
        kind = _STATE_FIELDS[m.group(1)]
        try:
            if kind is str:
                if m.group(2) is None:
                    return None
                value: object = text_encoding.CUnescape(m.group(2)).decode()
            else:
                value = float(m.group(3))
        except (TypeError, ValueError, UnicodeDecodeError):
            return None
        fields.setdefault(m.group(1), []).append(value)
    return fields


def read_state(logdir: Path) -> CheckpointState | None:
    """Parse ``<logdir>/checkpoint``; ``None`` if there is none or it is unreadable."""
    return inspect_state(logdir)[0]


def inspect_state(logdir: Path) -> tuple[CheckpointState | None, str | None]:
    """Parse ``<logdir>/checkpoint``: ``(state, None)``, ``(None, None)`` when there is no
    state file, or ``(None, why)`` when it cannot be read as one (garbled text, binary
    garbage); never raises for the file's content.
    """
    path = logdir / STATE_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        why = f"not text ({exc.reason} at byte {exc.start} of {len(raw)})"
        log.error("checkpoint.state_corrupt", path=str(path), reason=why)
        return None, why
    fields = _parse_state(text)  # the usual file, without protobuf's (slower) text parser
    if fields is None or any(len(fields.get(k, ())) > 1 for k in ("model_checkpoint_path", "last_preserved_timestamp")):
        from google.protobuf import text_format

        proto = _state_proto()()
        try:
            text_format.Merge(text, proto)
        except (text_format.ParseError, UnicodeDecodeError, ValueError) as exc:
            why = f"garbled ({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})"
            log.error("checkpoint.state_corrupt", path=str(path), reason=why)
            return None, why
        fields = {
            "model_checkpoint_path": [proto.model_checkpoint_path],
            "all_model_checkpoint_paths": list(proto.all_model_checkpoint_paths),
            "all_model_checkpoint_timestamps": list(proto.all_model_checkpoint_timestamps),
            "last_preserved_timestamp": [proto.last_preserved_timestamp],
        }
    named = str((fields.get("model_checkpoint_path") or [""])[0])
    paths = [_relative(logdir, str(p)) for p in fields.get("all_model_checkpoint_paths", [])]
    latest = _relative(logdir, named) if named else None
    if latest is not None and latest not in paths:
        paths.append(latest)
    stamps = [float(t) for t in fields.get("all_model_checkpoint_timestamps", [])]  # type: ignore[arg-type]
    if len(stamps) != len(paths):
        stamps = [0.0] * len(paths)
    preserved = float((fields.get("last_preserved_timestamp") or [0.0])[0])  # type: ignore[arg-type]
    return CheckpointState(latest, paths, stamps, preserved), None


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


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory so that renames in it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        exc.filename = exc.filename or str(path)  # os.fsync does not say which file
        raise
    finally:
        os.close(fd)


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages, do not wait
_SYNC_FILE_RANGE_WAIT = 1 | 2 | 4  # WAIT_BEFORE | WRITE | WAIT_AFTER: write back and wait
_SYNC_CHUNK_BYTES = 16 << 20  # between two checks of a save's abandon flag
_WRITEBACK_POLL_SECS = 0.001
_WRITEBACK_MIN_BYTES = 1 << 20  # hand at least this much over per call


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


def _start_writeback(watch: list[tuple[Path, str]], stop: threading.Event) -> None:
    """Until ``stop``: ask the kernel to write back the data files appearing in ``watch``.

    Each file is handed over in ranges as it grows (from where the last call ended), so
    no call rescans what is already under writeback.
    """
    assert _sync_file_range is not None
    fds: dict[str, int] = {}
    started: dict[int, int] = {}  # fd -> bytes handed to writeback so far
    try:
        while not stop.wait(_WRITEBACK_POLL_SECS):
            for directory, prefix in watch:
                try:
                    entries = os.listdir(directory)
                except FileNotFoundError:
                    continue
                for entry in entries:
                    if entry.startswith(prefix) and ".data-" in entry and entry not in fds:
                        try:
                            fd = os.open(directory / entry, os.O_RDONLY)
                        except FileNotFoundError:  # renamed meanwhile: found again next poll
                            continue
                        fds[entry] = fd
                        started[fd] = 0
            for fd, done in started.items():
                size = os.fstat(fd).st_size
                if size - done >= _WRITEBACK_MIN_BYTES:
                    _sync_file_range(fd, done, size - done, _SYNC_FILE_RANGE_WRITE)
                    started[fd] = size
    except OSError as exc:  # only a speed-up: the fsync of commit() still makes it durable
        log.debug("checkpoint.writeback_stopped", error=describe(exc))
    finally:
        for fd in fds.values():
            os.close(fd)


@contextmanager
def early_writeback(prefix: Path) -> Iterator[None]:
    """While the body writes the checkpoint ``prefix``, start the kernel's writeback early.

    A thread polls for the data files (``<prefix>.data-*`` and the shards under
    ``<prefix>_temp/``, including TF's own temporary names) and calls
    ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` on them, so the disk writes while
    ``SaveV2`` is still checksumming and copying, and the fsync of :func:`commit` finds
    little left to do. It only *starts* writeback: durability still comes from that fsync.
    A no-op where ``sync_file_range`` does not exist (not Linux).
    """
    if _sync_file_range is None:
        yield
        return
    stop = threading.Event()
    watch = [(prefix.parent, prefix.name + "."), (prefix.parent / f"{prefix.name}_temp", "part-")]
    thread = threading.Thread(target=_start_writeback, args=(watch, stop), name="asv-checkpoint-writeback", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def sync_data(prefix: Path, check: Callable[[], None]) -> None:
    """Write the data files of the checkpoint ``prefix`` back to disk, calling ``check``
    between chunks of a few MB (it raises to abandon the save).

    What makes a large save abandonable at a stop's deadline: the ``fsync`` of the
    commit, which nothing can interrupt, then finds (almost) nothing left to write.
    Without ``sync_file_range`` (not Linux) only ``check`` is called.
    """
    check()
    if _sync_file_range is None:
        return
    for path in checkpoint_files(prefix):
        if path.name.endswith(".index"):
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            for offset in range(0, size, _SYNC_CHUNK_BYTES):
                try:
                    failed = _sync_file_range(fd, offset, min(_SYNC_CHUNK_BYTES, size - offset), _SYNC_FILE_RANGE_WAIT)
                except OSError:
                    failed = -1
                if failed:  # the commit's fsync still makes it durable, or reports the error
                    log.debug("checkpoint.sync_data_stopped", path=str(path), errno=ctypes.get_errno())
                    return
                check()
        finally:
            os.close(fd)


def probe_writable(logdir: Path) -> None:
    """Create, write, fsync and remove a small file in ``logdir``; raises ``OSError`` (with
    the file name) when the directory cannot be written: read-only, no permission, full."""
    probe = logdir / f"{STATE_FILE}{TMP_MARKER}probe-{os.getpid()}"
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
    fsync_path(logdir)


def _proto_text(state: CheckpointState) -> str:
    from google.protobuf import text_format

    proto = _state_proto()(
        model_checkpoint_path=state.latest or "",
        all_model_checkpoint_paths=state.paths,
        all_model_checkpoint_timestamps=state.timestamps,
        last_preserved_timestamp=state.last_preserved,
    )
    return str(text_format.MessageToString(proto))


# What this process last wrote to each state file, with the file's identity then
# (inode, size, mtime, ctime): a commit reads its own previous write back from here
# instead of parsing the file again, as long as nobody replaced it since.
_written: dict[str, tuple[tuple[int, int, int, int], CheckpointState]] = {}
_written_lock = threading.Lock()


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _copy(state: CheckpointState) -> CheckpointState:
    return CheckpointState(state.latest, list(state.paths), list(state.timestamps), state.last_preserved)


def read_own_state(logdir: Path) -> CheckpointState | None:
    """:func:`read_state`, without parsing the file again if it is still what this process wrote."""
    try:
        st = os.stat(logdir / STATE_FILE)
    except FileNotFoundError:
        return None
    with _written_lock:
        known = _written.get(os.path.realpath(logdir))
    if known is not None and known[0] == _identity(st):
        return _copy(known[1])
    return read_state(logdir)


def _stage_state(logdir: Path, state: CheckpointState) -> Path:
    """Write and fsync the state file's temporary copy; returns its path."""
    tmp = logdir / f"{STATE_FILE}{TMP_MARKER}{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(_proto_text(state))
            f.flush()
            os.fsync(f.fileno())
    except BaseException as exc:
        if isinstance(exc, OSError):
            exc.filename = exc.filename or str(tmp)
        tmp.unlink(missing_ok=True)  # a failed save leaves nothing behind
        raise
    return tmp


def _install_state(logdir: Path, staged: Path, state: CheckpointState) -> None:
    """Rename the staged copy over the state file and fsync the directory."""
    target = logdir / STATE_FILE
    os.replace(staged, target)
    fsync_path(logdir)
    with _written_lock:
        _written[os.path.realpath(logdir)] = (_identity(os.stat(target)), _copy(state))


def write_state(logdir: Path, state: CheckpointState) -> None:
    """Atomically replace ``<logdir>/checkpoint`` (temp file, fsync, rename, dir fsync)."""
    _install_state(logdir, _stage_state(logdir, state), state)


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


def commit(
    tmp_prefix: Path, final_prefix: Path, state: CheckpointState, retiring: Sequence[Path] = ()
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
    paths = checkpoint_files(tmp_prefix)
    if not paths:
        raise FileNotFoundError(f"no checkpoint files were written under {tmp_prefix}")
    data = [p for p in paths if not p.name.endswith(".index")]
    errors: list[Exception] = []

    def sync_data() -> None:
        try:
            for p in data:
                fsync_path(p)
        except Exception as exc:  # raised below, on the committing thread
            errors.append(exc)

    syncer = threading.Thread(target=sync_data, name="asv-checkpoint-fsync", daemon=True)
    syncer.start()
    staged: Path | None = None
    pending: Path | None = None
    try:
        for p in paths:
            if p.name.endswith(".index"):
                fsync_path(p)
        staged = _stage_state(logdir, state)
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
        fsync_path(logdir)
        for prefix in retiring:
            _mark_pending(prefix)
        _install_state(logdir, staged, state)  # now it is the latest
    except BaseException:
        staged.unlink(missing_ok=True)
        if pending is not None:  # what was renamed into place is not named: remove it
            _finish_pending(final_prefix, _named(logdir))
        raise
    pending.unlink(missing_ok=True)


def _mark_pending(prefix: Path) -> Path:
    """Create ``<prefix>.asv-tmp-pending`` (not fsynced: after a power loss a checkpoint
    may stay unnamed, as without it); returns its path."""
    marker = prefix.parent / f"{prefix.name}{PENDING}"
    marker.touch()
    return marker


def delete_checkpoint(prefix: Path) -> None:
    """Remove the files of the checkpoint ``prefix``, index first (missing files are fine)."""
    for f in sorted(checkpoint_files(prefix), key=lambda p: not p.name.endswith(".index")):
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
    state = read_state(logdir)
    return set() if state is None else {*state.paths, state.latest}


def _finish_pending(prefix: Path, named: set[str | None]) -> list[str]:
    """Delete the checkpoint ``prefix`` marked pending unless it is ``named``, then its
    marker; returns the names removed."""
    gone = [] if prefix.name in named else [f.name for f in checkpoint_files(prefix)]
    marker = prefix.parent / f"{prefix.name}{PENDING}"
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
    pending = [e[: -len(PENDING)] for e in entries if e.endswith(PENDING)]
    named = _named(logdir) if pending else set()
    for name in pending:
        removed.extend(_finish_pending(logdir / name, named))
    for entry in entries:
        if TMP_MARKER not in entry or entry.endswith(PENDING):
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
    for f in checkpoint_files(prefix):
        target = f.parent / f"{prefix.name}.{tag}{f.name[len(prefix.name):]}"
        try:
            os.replace(f, target)
        except FileNotFoundError:
            continue
        moved.append(target.name)
    if moved:
        fsync_path(prefix.parent)
    return sorted(moved)


def step_of(name: str) -> int | None:
    """The step in a checkpoint name ``<basename>-<step>``, or ``None``."""
    _, sep, tail = name.rpartition("-")
    return int(tail) if sep and tail.isdigit() else None


def select_retention(
    state: CheckpointState,
    *,
    max_to_keep: int | None,
    keep_every_secs: float | None,
    managed: Callable[[str, float], bool] | None = None,
) -> tuple[CheckpointState, list[str]]:
    """Apply retention to ``state`` (just committed); returns the new state and what to delete.

    Only the checkpoints ``managed(name, timestamp)`` accepts are counted and deleted
    (all by default); the others stay named and on disk, as ``tf.train.CheckpointManager``
    leaves alone what it does not manage. The newest ``max_to_keep`` managed checkpoints
    stay (``None``: all of them). An older one is kept for good (dropped from the managed
    list, not deleted) when it is at least ``keep_every_secs`` younger than the last one
    kept that way, like ``tf.train.CheckpointManager``. The latest checkpoint is never
    deleted.
    """
    last_preserved = state.last_preserved
    if max_to_keep is None:
        return CheckpointState(state.latest, list(state.paths), list(state.timestamps), last_preserved), []
    keep = max(1, max_to_keep)
    entries = list(zip(state.paths, state.timestamps))
    ours = [i for i, (p, t) in enumerate(entries) if p != state.latest and (managed is None or managed(p, t))]
    counted = len(ours) + (1 if state.latest in state.paths else 0)  # the latest counts, always kept
    dropped: set[int] = set()
    delete: list[str] = []
    for i in ours:
        if counted <= keep:
            break
        path, stamp = entries[i]
        dropped.add(i)
        counted -= 1
        if keep_every_secs is not None and stamp - last_preserved >= keep_every_secs:
            last_preserved = stamp
            continue
        delete.append(path)
    kept = [e for i, e in enumerate(entries) if i not in dropped]
    return CheckpointState(state.latest, [p for p, _ in kept], [t for _, t in kept], last_preserved), delete
