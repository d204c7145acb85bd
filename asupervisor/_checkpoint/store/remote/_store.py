"""The tiered store of a URL logdir: the local store first, then object storage.

:class:`TieredStore` is a :class:`.._types.CheckpointStore`: every write, commit, restore
and repair goes to the local store of the working directory (plain or fast, as chosen);
its commit is the local commit, after which it wakes the upload (its listeners, on the
committing thread: no polling). It asks the local store for the checksums its writer can
compute as it writes, and hands them, by checkpoint, to :meth:`TieredStore.upload`, which
copies the checkpoint to the remote tier (:class:`._tier.RemoteTier`: objects, marker,
state object, retention there) without reading a file twice. :meth:`TieredStore.open`
proves the remote, takes its lease and brings its newest checkpoint down before the
restore. Never on the event loop: start-up on the step thread, write and commit on the
writer thread, upload on the upload thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...._core._status import CheckpointInfo
from ...._logging import describe, get_logger
from .. import _names

if TYPE_CHECKING:
    from ...snapshot._snapshot import Snapshot, Staging
    from .._owner import OwnerLock
    from .._state_file import CheckpointState
    from .._types import CheckpointStore, IdleIO, RestoreOutcome, Written
    from ._tier import RemoteTier, Uploaded

__all__ = ["TieredStore"]

log = get_logger(__name__)


class TieredStore:
    """The local store ``local``, then the remote tier ``tier`` (see the module docstring).

    Args:
        local: the store of the working directory (``tier.local_dir``).
        tier: the remote tier.
    """

    def __init__(self, local: CheckpointStore, tier: RemoteTier) -> None:
        self.local = local
        self.tier = tier
        self.logdir = local.logdir
        self.fast = local.fast
        self.commit_lock = local.commit_lock
        self._lock = threading.Lock()
        self._files: dict[str, Mapping[str, tuple[int, int]]] = {}  # checkpoint (or tmp) name → sums
        self._listeners: list[Callable[[], None]] = []
        #: the newest checkpoint committed locally (by this store, or found at :meth:`open`)
        self.newest: CheckpointInfo | None = None
        #: local commits so far (the upload's cadence counts them)
        self.commits = 0

    @property
    def kind(self) -> str:
        """``"tiered"``."""
        return "tiered"

    def __repr__(self) -> str:
        return f"TieredStore({self.local!r}, {self.tier.url!r})"

    # -- start-up: the remote proved, its lease taken, its newest checkpoint brought down

    def open(self, owner: OwnerLock | None = None, *, agree: bool = False) -> None:
        """Prove the remote and take its lease (its owner), then make the newer of both
        tiers' newest checkpoints the local latest (``agree``: across a cluster). The
        step thread, before the restore.

        Raises:
            CheckpointError, StorageUnreachableError, LeaseLostError: as
                :meth:`.RemoteTier.open` and :meth:`.RemoteTier.pull`.
        """
        self.logdir.mkdir(parents=True, exist_ok=True)
        if owner is not None and owner.held:
            self.tier.own_lock = owner.path
        self.tier.open()
        self.tier.pull(self.local, agree=agree)
        state = self.local.read_state()
        if state is not None and state.latest is not None and state.latest in state.paths:
            stamp = state.timestamps[state.paths.index(state.latest)]
            self._set_newest(state.latest, stamp)

    def on_commit(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each local commit, on the committing thread (it must
        not block: the upload service's wakes its task)."""
        self._listeners.append(listener)

    def _set_newest(self, name: str, stamp: float) -> None:
        step = _names.step_of(name)
        if step is not None and (self.newest is None or step >= self.newest.step):
            self.newest = CheckpointInfo(path=str(self.logdir / name), step=step, time=stamp)

    # -- the protocol: the local store's, with the checksums kept and the upload woken --

    def prepare(self, owner: OwnerLock | None = None) -> None:
        """The local store's :meth:`~.CheckpointStore.prepare`."""
        self.local.prepare(owner)

    def clean_leftovers(self) -> list[str]:
        """The local store's."""
        return self.local.clean_leftovers()

    def write(
        self,
        snapshot: Snapshot,
        tmp: Path,
        check: Callable[[], None],
        io: IdleIO | None = None,
        *,
        durable: bool = True,
        checksums: bool = False,
    ) -> Written:
        """Write locally, with the checksums the writer computes as it writes (kept for
        the upload of this checkpoint, under ``tmp``'s name until its commit)."""
        written = self.local.write(snapshot, tmp, check, io, durable=durable, checksums=True)
        if written.files:
            with self._lock:
                self._files[tmp.name] = written.files
        return written

    def remove_partial(self, tmp: Path) -> None:
        """The local store's; the sums of ``tmp`` forgotten."""
        with self._lock:
            self._files.pop(tmp.name, None)
        self.local.remove_partial(tmp)

    def commit(self, tmp: Path, final: Path, state: CheckpointState, retiring: Sequence[Path] = ()) -> None:
        """The local commit; then the upload is woken (its listeners called)."""
        self.local.commit(tmp, final, state, retiring)
        named = set(state.paths)
        with self._lock:
            files = self._files.pop(tmp.name, None)
            if files is not None:
                self._files[final.name] = files
            self._files = {n: f for n, f in self._files.items() if n in named or _names.TMP_MARKER in n}
        if final.name in named:
            self._set_newest(final.name, state.timestamps[state.paths.index(final.name)])
        self.commits += 1
        for listener in list(self._listeners):
            try:
                listener()
            except Exception as exc:  # a wake that failed: the next commit wakes it
                log.error("remote.wake_failed", error=describe(exc))

    def retire(self, prefix: Path, io: IdleIO | None = None) -> None:
        """The local store's."""
        self.local.retire(prefix, io)

    def read_state(self) -> CheckpointState | None:
        """The local state file."""
        return self.local.read_state()

    def inspect_state(self) -> tuple[CheckpointState | None, str | None]:
        """The local store's."""
        return self.local.inspect_state()

    def complete_checkpoints(self, basename: str) -> list[str]:
        """The local store's."""
        return self.local.complete_checkpoints(basename)

    def committed_at(self, prefix: str | Path) -> float:
        """The local store's."""
        return self.local.committed_at(prefix)

    def restore_newest(self, checkpoint: Any, *, strict: bool, basename: str | None) -> RestoreOutcome:
        """The local store's: :meth:`open` made the newer tier's newest the local latest."""
        return self.local.restore_newest(checkpoint, strict=strict, basename=basename)

    def restore_path(self, checkpoint: Any, path: str, *, strict: bool = True) -> None:
        """The local store's."""
        self.local.restore_path(checkpoint, path, strict=strict)

    def write_state(self, state: CheckpointState) -> None:
        """The local store's."""
        self.local.write_state(state)

    def set_aside(self, name: str, tag: str) -> list[str]:
        """The local store's."""
        return self.local.set_aside(name, tag)

    def set_aside_state(self, tag: str) -> str | None:
        """The local store's."""
        return self.local.set_aside_state(tag)

    def idle_io(self, thread: Callable[[], Callable[..., Any]]) -> IdleIO | None:
        """The local store's."""
        return self.local.idle_io(thread)

    def native_writer_checked(self) -> bool:
        """The local store's."""
        return self.local.native_writer_checked()

    def staging(self) -> Staging | None:
        """The local store's."""
        return self.local.staging()

    def close(self) -> None:
        """The local store's (the remote tier is closed by the session's remote part)."""
        self.local.close()

    # -- the upload ---------------------------------------------------------------------

    def upload(self, local: CheckpointInfo, metrics: Mapping[str, float] | None = None) -> Uploaded | None:
        """The upload thread: copy the committed checkpoint ``local`` to the remote with the
        metrics and checksums its write produced (:meth:`.RemoteTier.upload`)."""
        prefix = Path(local.path)
        with self._lock:
            files = self._files.get(prefix.name)
        return self.tier.upload(prefix, local.step, local.time, metrics, files)
