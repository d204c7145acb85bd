"""The store settings as values: :class:`FastPath` (the fast store's switches in one
frozen object, all off for the plain store), the values of ``checkpoint_store`` and its
environment variable. :mod:`._choose` turns a setting into a store. Pure values: no file
work, no TensorFlow, no platform question.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["ENV_VAR", "PLAIN", "STORE_KINDS", "FastPath", "check_store_kind"]

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
        staging_files: the RAM tier's snapshots staged straight into reused data files
            of the tier, mapped into memory (with ``native_writer``; ``fast/_slots.py``).
    """

    native_writer: bool = True
    direct_writes: bool = True
    own_restore: bool = True
    direct_reads: bool = True
    huge_pages: bool = True
    idle_io: bool = True
    early_writeback: bool = True
    staging_files: bool = True

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
    staging_files=False,
)


def check_store_kind(value: object, where: str = "checkpoint_store") -> str | None:
    """``value`` if it is ``None`` or one of :data:`STORE_KINDS`, else a ``ValueError``
    naming ``where`` and the value."""
    if value is None or value in STORE_KINDS:
        return value
    raise ValueError(f"{where} must be one of {', '.join(map(repr, STORE_KINDS))}, got {value!r}")
