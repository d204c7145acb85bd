"""The store protocol: what every checkpoint store does, and the seams the fast store
plugs into the plain store's code. Types only: nothing here runs.

A store is chosen once per directory by :func:`._choose.open_store` and used through
:class:`CheckpointStore` alone; the code above ``store/`` never asks which one it got
(only :attr:`CheckpointStore.fast` says which mechanisms are on, for the snapshot's
staging buffers). Implementations: ``plain/`` (TF's ``SaveV2``/``RestoreV2``, portable
file calls), ``fast/`` (the same protocol with the Linux fast path: the native writer,
direct I/O, the own restore, the idle I/O thread) and ``memory/`` (the RAM tier, below
the disk). Threads: :meth:`~CheckpointStore.prepare` and the restores on the step thread
at start-up; :meth:`~CheckpointStore.write`, :meth:`~CheckpointStore.commit` and
:meth:`~CheckpointStore.retire` on the writer thread; never the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from ..snapshot._snapshot import Snapshot, Staging
    from ._options import FastPath
    from ._owner import OwnerLock
    from ._state_file import CheckpointState

__all__ = ["CheckpointStore", "DirectReader", "IdleIO", "NativeWriter", "RestoreOutcome", "Written"]

T = TypeVar("T")


@dataclass
class RestoreOutcome:
    """What :func:`restore_newest` found.

    Attributes:
        path: the checkpoint restored, or ``None``.
        corrupt: newer checkpoints whose files exist but failed to load (data errors).
        gone: newer checkpoints the state file names whose files do not exist.
        state_problem: what is wrong with the state file (``None``: nothing), when the
            checkpoints on disk were scanned instead of trusting it.
        state: the state file as read (``None``: none, or unreadable).
    """

    path: str | None = None
    corrupt: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    state_problem: str | None = None
    state: CheckpointState | None = None


@dataclass(frozen=True)
class Written:
    """What a write produced beside its files.

    Attributes:
        files: the size and CRC32C of each file the writer computed them for while it
            wrote (from the bytes in memory, when asked to), by its name's suffix
            (``".index"``, ``".data-00000-of-00001"``); a file not here is summed by
            whoever needs it (the remote's upload, as it reads it).
    """

    files: Mapping[str, tuple[int, int]] = field(default_factory=dict)


class IdleIO(Protocol):
    """Runs file work on an idle-priority thread (the fast store's)."""

    def call(self, fn: Callable[[], T]) -> T: ...


class NativeWriter(Protocol):
    """The fast store's tensor-bundle writer, as the plain writing code calls it."""

    def available(self) -> bool: ...
    def self_check(self) -> bool: ...
    def encodable(self, tensor: Any, slice_spec: str) -> bool: ...

    write_bundle: Callable[..., dict[str, tuple[int, int]]]


class DirectReader(Protocol):
    """The fast store's own restore, as the plain restoring code calls it: ``start`` the
    readers of a checkpoint (``None``: an index it does not read), ``plan`` which
    variable takes which value, ``assign`` them."""

    def start(self, prefix: str) -> Any: ...
    def plan(self, checkpoint: Any, match: Any, entries: dict[str, Any]) -> Any: ...
    def assign(self, planned: Any, values: dict[str, Any]) -> None: ...


class CheckpointStore(Protocol):
    """One directory's checkpoints: every byte written and read goes through this.

    Attributes:
        logdir: the directory of the checkpoints and the state file.
        fast: the fast path's switches (all off for the plain store).
        commit_lock: serialises the state file's read-modify-write in this process.
    """

    logdir: Path
    fast: FastPath
    commit_lock: threading.Lock

    @property
    def kind(self) -> str:
        """``"plain"``, ``"fast"`` (or another implementation's name)."""
        ...

    # 1. prepare: the directory made, its owner's lock taken, leftovers removed
    def prepare(self, owner: OwnerLock | None = None) -> None: ...
    def clean_leftovers(self) -> list[str]: ...

    # 2. write: a snapshot's files under a temporary prefix, abandonable (``durable``:
    #    on the disk when it returns; ``False`` for a save removed right after), with the
    #    checksums the writer can compute as it writes when ``checksums`` (an upload's)
    def write(
        self,
        snapshot: Snapshot,
        tmp: Path,
        check: Callable[[], None],
        io: IdleIO | None = None,
        *,
        durable: bool = True,
        checksums: bool = False,
    ) -> Written: ...
    def remove_partial(self, tmp: Path) -> None: ...

    # 3. commit with a retention plan: the new latest, durable; what retention dropped
    def commit(self, tmp: Path, final: Path, state: CheckpointState, retiring: Sequence[Path] = ()) -> None: ...
    def retire(self, prefix: Path, io: IdleIO | None = None) -> None: ...

    # 4. the committed checkpoints and the state
    def read_state(self) -> CheckpointState | None: ...
    def inspect_state(self) -> tuple[CheckpointState | None, str | None]: ...
    def complete_checkpoints(self, basename: str) -> list[str]: ...
    def committed_at(self, prefix: str | Path) -> float: ...

    # 5. restore the newest intact one, with fallback; or a given one
    def restore_newest(self, checkpoint: Any, *, strict: bool, basename: str | None) -> RestoreOutcome: ...
    def restore_path(self, checkpoint: Any, path: str, *, strict: bool = True) -> None: ...

    # 6. repair: damaged checkpoints and state files set aside, the state rewritten
    def write_state(self, state: CheckpointState) -> None: ...
    def set_aside(self, name: str, tag: str) -> list[str]: ...
    def set_aside_state(self, tag: str) -> str | None: ...

    # 7. the services it needs: an idle I/O runner over the ``submit`` of a thread
    #    ``thread()`` makes (``None``, and no thread, if it needs none); staging buffers
    #    it lends the snapshot (its own allocator: the RAM tier's reused data files), or
    #    ``None`` (the checkpointer's own)
    def idle_io(self, thread: Callable[[], Callable[..., Any]]) -> IdleIO | None: ...
    def native_writer_checked(self) -> bool: ...
    def staging(self) -> Staging | None: ...

    # 8. close: what it holds released (nothing for the local stores)
    def close(self) -> None: ...
