"""Which checkpoint store a logdir gets, decided once: the fast Linux store or the plain one.

``Supervisor(checkpoint_store=...)`` (or, when that is not given, the environment
variable ``ASUPERVISOR_CHECKPOINT_STORE``) says ``"auto"`` (the default: fast on Linux,
plain elsewhere), ``"fast"`` or ``"plain"``. :func:`resolve_store` turns it into a
:class:`FastPath`: the fast store's switches in one frozen object, all off for the plain
store. Nothing else in the package asks which platform it runs on or reads a switch of
its own. Pure decisions: no file work, no TensorFlow.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from dataclasses import dataclass, fields

__all__ = ["ENV_VAR", "PLAIN", "STORE_KINDS", "FastPath", "fast_store_available", "resolve_store"]

#: the environment variable that chooses the store when ``checkpoint_store`` is not given
ENV_VAR = "ASUPERVISOR_CHECKPOINT_STORE"

#: the values of ``checkpoint_store``
STORE_KINDS = ("auto", "fast", "plain")


@dataclass(frozen=True, kw_only=True)
class FastPath:
    """The fast local store's mechanisms, each of which can be switched off alone (for
    A/B benchmarks and tests); all off is the plain store.

    Attributes:
        native_writer: the project's own tensor-bundle writer instead of TF's ``SaveV2``
            (and, with it, staging buffers for the snapshot).
        direct_writes: large data files written with ``O_DIRECT``, past the page cache.
        own_restore: the restore reads the values itself (reader threads, each value's
            checksum checked as it arrives) and hands plain variables their values
            without TF's ``RestoreV2``.
        direct_reads: that restore reads large values not in the page cache with
            ``O_DIRECT``.
        huge_pages: those direct reads land in huge pages.
        idle_io: a save's ``write(2)`` calls and retention's deletions on a
            ``SCHED_IDLE`` thread.
        early_writeback: ``sync_file_range`` while the data is written, so the commit's
            fsync finds little left.
    """

    native_writer: bool = True
    direct_writes: bool = True
    own_restore: bool = True
    direct_reads: bool = True
    huge_pages: bool = True
    idle_io: bool = True
    early_writeback: bool = True

    @property
    def kind(self) -> str:
        """``"plain"`` when every mechanism is off, else ``"fast"``."""
        return "fast" if any(getattr(self, f.name) for f in fields(self)) else "plain"


#: the plain store: TF's ``SaveV2``/``RestoreV2`` and portable file calls
PLAIN = FastPath(
    native_writer=False,
    direct_writes=False,
    own_restore=False,
    direct_reads=False,
    huge_pages=False,
    idle_io=False,
    early_writeback=False,
)


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


def check_store_kind(value: object, where: str = "checkpoint_store") -> str | None:
    """``value`` if it is ``None`` or one of :data:`STORE_KINDS`, else a ``ValueError``
    naming ``where`` and the value."""
    if value is None or value in STORE_KINDS:
        return value
    raise ValueError(f"{where} must be one of {', '.join(map(repr, STORE_KINDS))}, got {value!r}")


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
