"""The chooser: which store a directory gets, decided once, and the only module that
imports the implementations (``plain/``, ``fast/``, ``memory/``, ``remote/``), each
inside a function, when it is chosen.

``Supervisor(checkpoint_store=...)`` (or, when that is not given, the environment
variable ``ASUPERVISOR_CHECKPOINT_STORE``) says ``"auto"`` (the default: fast on Linux,
plain elsewhere), ``"fast"`` or ``"plain"``. :func:`resolve_store` turns it into a
:class:`~._options.FastPath`, :func:`open_store` into the store of a directory. Nothing
else in the package asks which platform it runs on. A URL logdir gets its remote tier
from :func:`open_remote_tier` and its store, the local one then the remote tier, from
:func:`open_tiered_store`; the RAM tier from :func:`open_memory_tier`.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _url
from ._options import ENV_VAR, PLAIN, FastPath, check_store_kind
from ._types import CheckpointStore

if TYPE_CHECKING:
    from .memory._tier import MemoryTier
    from .remote._io import RemoteFS
    from .remote._store import TieredStore
    from .remote._tier import RemoteTier

__all__ = [
    "check_url",
    "fast_store_available",
    "inspect_ram_tier",
    "inspect_remote",
    "load_fast",
    "open_memory_tier",
    "open_remote_fs",
    "open_remote_tier",
    "open_store",
    "open_tiered_store",
    "ram_tier_root",
    "resolve_store",
    "restore_latest",
    "restore_path",
]


def open_store(logdir: str | os.PathLike[str], setting: str | FastPath | None = None) -> CheckpointStore:
    """The store of the local directory ``logdir`` for ``setting`` (as
    :func:`resolve_store` takes it): the plain store, or the fast one, imported now."""
    fast = resolve_store(setting)
    if fast.kind == "plain":
        from .plain._store import PlainStore

        return PlainStore(Path(logdir))
    from .fast._store import FastStore

    return FastStore(Path(logdir), fast)


def fast_store_available() -> bool:
    """Whether this platform runs the fast store (Linux: the system calls it is built on)
    and its code is there (``store/fast/`` is optional: without it, the plain store)."""
    return sys.platform.startswith("linux") and _fast_code_present()


@functools.cache
def _fast_code_present() -> bool:
    try:
        load_fast()
    except ImportError:
        return False
    return True


_LOAD_LOCK = threading.Lock()


def load_fast() -> None:
    """Import the fast store's modules, all at once and one thread at a time, when the fast
    store is chosen (a ``Supervisor`` is made, as a rule on the main thread): the step
    threads of two sessions starting side by side then find them loaded, instead of
    importing them concurrently, each half of them, from its first save or restore.

    Raises:
        ImportError: its code is not there (optional code).
    """
    with _LOAD_LOCK:
        import asupervisor._checkpoint.store.fast._bundle
        import asupervisor._checkpoint.store.fast._direct
        import asupervisor._checkpoint.store.fast._direct_restore
        import asupervisor._checkpoint.store.fast._idle_io
        import asupervisor._checkpoint.store.fast._index  # noqa: F401

        from ..snapshot import _iterator_state, _snapshot
        from .fast import _bundle, _direct, _index

        _snapshot.use_staging(_direct.aligned_empty, _bundle._PLAIN_DTYPES)
        _iterator_state.use_index_reader(_index.read)


def resolve_store(setting: str | FastPath | None = None) -> FastPath:
    """The store for ``setting`` (``checkpoint_store``; ``None``: the environment
    variable :data:`ENV_VAR`, else ``"auto"``; a :class:`FastPath` as it is, for A/B
    benchmarks of one mechanism).

    Raises:
        ValueError: an unknown value (naming where it came from), or ``"fast"`` on a
            platform without it.
    """
    if isinstance(setting, FastPath):
        if setting.kind == "fast" and not fast_store_available():
            raise ValueError(f"the fast store needs Linux and its code, this is {sys.platform}")
        return setting
    kind = check_store_kind(setting)
    if kind is None:
        kind = check_store_kind(os.environ.get(ENV_VAR) or None, f"the environment variable {ENV_VAR}") or "auto"
    if kind == "plain":
        return PLAIN
    if not fast_store_available():
        if kind == "fast":
            why = (
                f"needs Linux, this is {sys.platform}"
                if not sys.platform.startswith("linux")
                else "needs its code, asupervisor._checkpoint.store.fast, which cannot be imported here"
            )
            raise ValueError(f"checkpoint_store='fast' {why}; use 'auto' or 'plain'")
        return PLAIN
    return FastPath()


def restore_path(
    checkpoint: Any, path: str | os.PathLike[str], *, strict: bool = True, setting: str | FastPath | None = None
) -> None:
    """Restore the checkpoint ``path`` through the store of its directory (for
    ``setting``, as :func:`resolve_store` takes it): checked against the model, every
    value's checksum verified."""
    open_store(Path(path).parent, setting).restore_path(checkpoint, os.fspath(path), strict=strict)


def restore_latest(
    checkpoint: Any,
    logdir: str | os.PathLike[str],
    *,
    strict: bool = True,
    basename: str | None = None,
    setting: str | FastPath | None = None,
) -> str | None:
    """Restore the newest good checkpoint of ``logdir`` through its store (falling back
    past damaged ones, nothing set aside: a reader's restore); its path, or ``None``."""
    return open_store(logdir, setting).restore_newest(checkpoint, strict=strict, basename=basename).path


def ram_tier_root(root: str | os.PathLike[str] | bool) -> Path:
    """Where the RAM tier goes for ``ram_tier=root`` (``True``: ``/dev/shm``).

    Raises:
        ValueError: ``True`` and there is no ``/dev/shm`` here (the message says what to give).
    """
    if root is True:
        from .memory._tier import default_root

        return default_root()
    return Path(os.fspath(root))  # type: ignore[arg-type]


def open_memory_tier(
    logdir: str | os.PathLike[str], root: str | os.PathLike[str] | bool, setting: str | FastPath | None = None
) -> MemoryTier:
    """The RAM tier below the disk directory ``logdir`` (:class:`.memory._tier.MemoryTier`),
    under ``root`` (``True``: ``/dev/shm``). Its store is the directory's store without
    what a RAM file system has no use for (direct I/O, writeback, the idle I/O thread,
    huge pages): the native writer and the own restore where ``setting`` has them, the
    snapshots staged straight into reused data files (:mod:`.fast._slots`) with the native
    writer.

    Raises:
        ValueError: ``root`` is ``True`` and there is no ``/dev/shm`` here.
    """
    from .memory._tier import MemoryTier, tier_dir

    base = ram_tier_root(root)
    fast = resolve_store(setting)
    if fast.kind == "fast":
        fast = FastPath(
            native_writer=fast.native_writer,
            own_restore=fast.own_restore,
            direct_writes=False,
            direct_reads=False,
            huge_pages=False,
            idle_io=False,
            early_writeback=False,
            staging_files=fast.staging_files,
        )
    directory = tier_dir(base, Path(logdir))
    if fast.kind != "fast" or not (fast.native_writer and fast.staging_files):
        return MemoryTier(Path(logdir), open_store(directory, fast))
    from .fast._store import FastStore

    keep = MemoryTier.MAX_TO_KEEP
    return MemoryTier(Path(logdir), FastStore(directory, fast, slots=keep + 1), max_to_keep=keep)


def check_url(url: str) -> str:
    """``url`` checked as a logdir (:func:`._url.check_url`), and the remote store's code
    there to serve it (optional code: said now, not at the session's start); normalised.

    Raises:
        ValueError: a bad URL, a scheme nothing handles, or no remote store here.
    """
    normal = _url.check_url(url)
    try:
        import asupervisor._checkpoint.store.remote._tier  # noqa: F401
    except ImportError as exc:
        raise ValueError(
            f"logdir {url!r} is a URL, and this installation lacks object storage's code "
            f"(asupervisor._checkpoint.store.remote: {exc}); use a local path"
        ) from None
    return normal


def inspect_ram_tier(logdir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What the RAM tier of the local ``logdir`` holds (:func:`.memory._tier.report`), or
    ``None`` (none, or the RAM tier's code is not installed)."""
    try:
        from .memory._tier import report
    except ImportError:
        return None
    return report(Path(logdir))


def open_remote_tier(url: str, local_dir: Path, **kwargs: Any) -> RemoteTier:
    """The remote tier of the URL logdir ``url`` (:class:`.remote._tier.RemoteTier`)."""
    from .remote._tier import RemoteTier

    return RemoteTier(url, local_dir, **kwargs)


def open_tiered_store(local: CheckpointStore, tier: RemoteTier) -> TieredStore:
    """The store of a URL logdir: ``local`` (its working directory's), then ``tier``
    (:class:`.remote._store.TieredStore`)."""
    from .remote._store import TieredStore

    return TieredStore(local, tier)


def open_remote_fs(url: str) -> RemoteFS:
    """The bounded file system of ``url`` (:class:`.remote._io.RemoteFS`)."""
    from .remote._io import RemoteFS

    return RemoteFS(url)


def inspect_remote(url: str) -> dict[str, Any]:
    """``asupervisor inspect`` of a URL logdir (:func:`.remote._report.inspect_remote`)."""
    from .remote._report import inspect_remote as report

    return report(url)
