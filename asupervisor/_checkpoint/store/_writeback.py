"""Getting checkpoint bytes to disk: fsync, and early writeback while the data is written.

:func:`early_writeback` asks the kernel (``sync_file_range``) to start writing a save's
files while they are still being written, so the fsync of the commit finds little left
to do; :func:`sync_data` waits for it. :func:`fsync_path` is the one fsync the commit
protocol and the state file use. Plain file work; never on the event loop thread.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..._core._files import replace_file
from ..._logging import describe, get_logger
from . import _names

__all__ = ["copy_checkpoint", "early_writeback", "fsync_path", "make_dirs_durable", "replace_text", "sync_data"]

log = get_logger(__name__)


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


def make_dirs_durable(path: Path) -> None:
    """Create ``path`` and its missing parents, each made durable in its parent.

    A directory entry is durable once its parent directory is fsynced: without it, a
    power loss can take a new logdir away with every checkpoint committed into it. Each
    directory created here is fsynced into its parent, and ``path``'s own parent is
    fsynced even when ``path`` already existed (someone's ``mkdir -p`` just before).

    Raises:
        OSError: a directory cannot be created (named in the error), or ``path`` is a file.
    """
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe) and probe.parent != probe:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):  # a file on the way: ENOTDIR, naming the path
        try:
            os.mkdir(directory)
        except FileExistsError:  # made meanwhile (another process)
            if not directory.is_dir():
                raise
        _fsync_parent(directory)
    if not missing:
        _fsync_parent(path)


def _fsync_parent(directory: Path) -> None:
    """fsync ``directory``'s parent; a parent this process may not open (no read
    permission) cannot be synced by it: logged, not an error."""
    try:
        fsync_path(directory.parent)
    except PermissionError as exc:
        log.debug("checkpoint.parent_not_synced", path=str(directory.parent), error=describe(exc))


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
    for path in _names.checkpoint_files(prefix):
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


_COPY_CHUNK = 8 << 20


def copy_checkpoint(source: Path, tmp: Path, check: Callable[[], None]) -> None:
    """Copy the files of checkpoint ``source`` (a prefix) to the prefix ``tmp`` (the same
    suffixes), in chunks with ``check()`` between them (it raises to abandon the copy;
    the caller removes what was copied). Not synced: the commit that follows syncs."""
    files = _names.checkpoint_files(source)
    if not files:
        raise FileNotFoundError(f"no checkpoint files under {source}")
    for path in files:
        target = tmp.parent / (tmp.name + path.name[len(source.name) :])
        with open(path, "rb") as src, open(target, "wb") as dst:
            while chunk := src.read(_COPY_CHUNK):
                dst.write(chunk)
                check()


def replace_text(path: Path, text: str) -> None:
    """Replace the small file ``path`` with ``text`` atomically (a crash leaves the old or
    the new, never a torn one); not synced: for files a lost update of costs nothing."""
    replace_file(path, text)
