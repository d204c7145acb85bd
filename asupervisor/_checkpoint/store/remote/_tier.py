"""The remote tier of a URL logdir: prove it, own it, bring its newest checkpoint down,
copy committed checkpoints up (see :mod:`._layout` for what the remote holds).

Every method blocks (network calls) and runs on a thread of the session's: start-up's
:meth:`RemoteTier.open` and :meth:`RemoteTier.pull` on the step thread before the first
step, :meth:`RemoteTier.upload` on the upload thread (``asv-upload``), the lease's
renewal on its own. Never on the event loop.

Every wait is bounded (:class:`._io.Bound`, ``ASUPERVISOR_REMOTE_TIMEOUT_SECS``, 60 s by
default): the start's checks in all, a download and an upload by their progress. An
upload without progress for that long is reported stalled; it is cut, and retried, when
the lease could expire (the renewals fail too: the network is gone), or after ten times
that bound without progress (a slow link is not cut: a file under 100 MiB goes up in one
request, whose progress shows only at its end). Every write (objects, marker, state
object, deletions) is fenced by the lease (:meth:`._lease.RemoteLease.check`): once
another training holds it, this one writes nothing more there (``remote.fenced``, once).
Objects of an upload that did not commit are removed after the next one commits and at a
clean stop, and multipart uploads left under the logdir are aborted at the start and at
a clean stop.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...._exceptions import CheckpointError, LeaseLostError
from ...._logging import describe, get_logger
from ...snapshot import _metrics
from .. import _commit, _names, _retention, _state_file, _writeback
from ._io import Bound, RemoteFS
from ._layout import MARKER_SUFFIX, Marker, RemoteCheckpoint, crc32c_hex, crc32c_of, list_remote, marker_problem
from ._lease import RemoteLease
from ._settings import timeout_secs

if TYPE_CHECKING:
    from ...policy._policies import KeepPolicy
    from .._types import CheckpointStore

__all__ = ["RemoteTier", "Uploaded"]

log = get_logger(__name__)

_EVENTS = "events.out.tfevents."
#: an upload without progress for this many times the bound is cut (a last resort: the
#: lease's expiry cuts it first when the network is gone)
_IDLE_CUT = 10
#: the most a stop's clean-up of the remote waits (it runs in the stop's wind-down)
_FINISH_SECS = 3.0
#: the owner id of the remote's lease, kept in the local tier (a restart is the same owner)
OWNER_ID_FILE = "asupervisor.remote-owner"


class Abandoned(Exception):
    """An upload was abandoned (the stop's deadline)."""


@dataclass(frozen=True)
class Uploaded:
    """The newest checkpoint committed on the remote.

    Attributes:
        name: its prefix name.
        step: its step.
        time: when it was committed there (``time.time()``).
    """

    name: str
    step: int
    time: float


class RemoteTier:
    """The remote tier of one URL logdir (see the module docstring).

    Args:
        url: the logdir's URL (checked: :func:`._url.check_url`).
        local_dir: the local working directory (the local tier).
        basename: checkpoint file prefix (``None``: any, for readers).
        keep_policy: retention, applied on the remote too (``None``: readers).
        owner: whether this training writes the remote (the chief): it takes the lease,
            cleans leftovers and uploads; the others only read.
        wall_clock: the time source of commit times and the lease.
    """

    #: what an upload cut at the stop's deadline raises
    Abandoned = Abandoned

    def __init__(
        self,
        url: str,
        local_dir: Path,
        *,
        basename: str | None,
        keep_policy: KeepPolicy | None,
        owner: bool,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.local_dir = Path(local_dir)
        self.basename = basename
        self.keep_policy = keep_policy
        self.owner = owner
        self.wall_clock = wall_clock
        self.io: RemoteFS | None = None
        self.lease: RemoteLease | None = None
        #: the newest checkpoint committed on the remote (``None``: none yet)
        self.uploaded: Uploaded | None = None
        self._events_sent: dict[str, int] = {}
        self._markers: dict[str, Marker] = {}  # commit markers read so far (never rewritten)
        self._abandon = False
        #: the bound on remote waits (``ASUPERVISOR_REMOTE_TIMEOUT_SECS``)
        self.timeout = timeout_secs()
        #: the local owner lock this training holds (set by the checkpoint part), recorded
        #: in the lease so that a restart on this host can tell its holder is gone
        self.own_lock: Path | None = None
        #: when the newest remote commit happened (``time.time()``; ``None``: none known)
        self.committed_wall: float | None = None
        #: whether the upload in flight made no progress for ``timeout`` seconds
        self.stalled = False
        self._unfinished: set[str] = set()  # checkpoints whose upload began and did not commit
        self._fence_said = False

    def __repr__(self) -> str:
        return f"RemoteTier({self.url!r}, local_dir={str(self.local_dir)!r})"

    # -- start-up (the step thread) ----------------------------------------------------

    @property
    def fs(self) -> RemoteFS:
        """The remote's file system, every call bounded (:class:`._io.RemoteFS`)."""
        assert self.io is not None, "open() first"
        return self.io

    @property
    def fenced(self) -> bool:
        """Whether another training took the lease: this one writes nothing more there."""
        return self.lease is not None and self.lease.lost is not None

    @contextlib.contextmanager
    def _fenced(self, what: str) -> Iterator[None]:
        """A write to the remote (the owner's): only while this training holds the lease,
        checked just before it (:meth:`._lease.RemoteLease.check`), and cut if it is
        still in flight when the lease could expire (the network went away meanwhile)."""
        lease = self.lease
        if lease is None:
            yield
            return
        try:
            lease.check()
        except LeaseLostError as exc:
            self._say_fenced(exc)
            raise
        with self.fs.bounded(Bound(f"{what}, while this training holds the lease", until=lease.held_for)):
            yield

    def _say_fenced(self, exc: LeaseLostError) -> None:
        """The first time the lease is found lost (by a write's fence or the renewal): say so."""
        if self._fence_said:
            return
        self._fence_said = True
        log.error(
            "remote.fenced",
            url=self.url,
            error=str(exc),
            local_dir=str(self.local_dir),
            hint="nothing more is written there; this training's checkpoints stay in local_dir",
        )

    def _owner_id(self) -> str:
        """The owner id kept in the local tier (made on first use)."""
        path = self.local_dir / OWNER_ID_FILE
        try:
            kept = path.read_text().strip()
        except OSError:
            kept = ""
        if len(kept) == 32 and all(c in "0123456789abcdef" for c in kept):
            return kept
        made = uuid.uuid4().hex
        try:
            self.local_dir.mkdir(parents=True, exist_ok=True)
            _writeback.replace_text(path, made + "\n")
        except OSError as exc:  # a new id each start: a restart waits for the lease to expire
            log.warning("remote.owner_id_unsaved", path=str(path), error=describe(exc))
        return made

    def _path(self, name: str) -> str:
        assert self.io is not None
        return self.io.path(name)

    def open(self) -> None:
        """Connect, prove the remote can be used (written, for the owner), take its lease,
        remove the objects of checkpoints never committed and abort the multipart uploads
        left under the logdir (the owner); all within ``timeout`` seconds.

        Raises:
            StorageUnreachableError: no answer within ``timeout`` seconds.
            CheckpointError: the bucket does not exist, credentials are refused, the
                remote cannot be written, or another training holds the lease.
        """
        self._abandon = False
        if self.io is None:
            try:
                self.io = RemoteFS(self.url)
            except Exception as exc:
                raise CheckpointError(f"logdir {self.url} cannot be opened: {describe(exc)}") from exc
        with self.io.bounded(Bound("the start's checks", total=self.timeout)):
            try:
                if self.owner:
                    probe = self._path(f".asv-probe-{uuid.uuid4().hex[:8]}")
                    self.fs.pipe_file(probe, b"")
                    self.fs.rm_file(probe)
                else:
                    self._listing()
            except CheckpointError:
                raise
            except Exception as exc:
                raise CheckpointError(
                    f"logdir {self.url} cannot be {'written' if self.owner else 'read'} "
                    f"(bucket, path or credentials): {describe(exc)}"
                ) from exc
            if self.owner:
                if self.lease is None:
                    own_lock = None if self.own_lock is None else str(self.own_lock)
                    self.lease = RemoteLease(
                        self.fs, self.io.root, self.url, self.wall_clock, owner_id=self._owner_id(), own_lock=own_lock
                    )
                if self.lease.number is None:  # a start-up retry holds it already
                    self.lease.acquire()
                self._clean_leftovers()

    def _listing(self) -> list[dict[str, Any]]:
        assert self.io is not None
        self.fs.invalidate_cache(self.io.root)
        try:
            return list(self.fs.ls(self.io.root, detail=True))
        except FileNotFoundError:
            return []

    def checkpoints(self) -> list[RemoteCheckpoint]:
        """The checkpoints on the remote, committed or not, oldest first."""
        return list_remote(self._listing(), self.basename)

    def _clean_leftovers(self) -> None:
        for ckpt in self.checkpoints():
            if not ckpt.committed:
                self._delete(ckpt, marker_first=False)
                log.warning("remote.leftover_removed", url=self.url, checkpoint=ckpt.name, objects=len(ckpt.sizes))
        self._abort_multipart("a crashed upload's")

    def _abort_multipart(self, whose: str, timeout: float | None = None) -> None:
        """Abort the multipart uploads in progress under the logdir (S3: stored and billed,
        yet in no listing); the lease holds, so none of them is another training's."""
        assert self.io is not None
        with self._fenced("aborting multipart uploads"):
            aborted = self.io.abort_multipart(self.io.root, timeout=self.timeout if timeout is None else timeout)
        if aborted:
            log.warning("remote.multipart_aborted", url=self.url, whose=whose, keys=len(aborted))

    def _delete(self, ckpt: RemoteCheckpoint, *, marker_first: bool = True) -> None:
        self._markers.pop(ckpt.name, None)
        names = sorted(ckpt.sizes)
        marker = ckpt.name + MARKER_SUFFIX
        if marker_first and marker in names:  # from here on it does not exist for any reader
            self._rm(marker)
        for name in names:
            if name != marker or not marker_first:
                self._rm(name)

    def _rm(self, name: str) -> None:
        with self._fenced(f"deleting {name}"), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(name))

    def _marker(self, ckpt: RemoteCheckpoint) -> Marker | None:
        marker = self._markers.get(ckpt.name)
        if marker is None:  # a marker is written once and never changed: read each once
            try:
                marker = Marker.from_bytes(self.fs.cat_file(self._path(ckpt.name + MARKER_SUFFIX)))
            except (FileNotFoundError, ValueError) as exc:
                log.warning("remote.marker_unreadable", url=self.url, checkpoint=ckpt.name, error=describe(exc))
                return None
            self._markers[ckpt.name] = marker
        problem = marker_problem(marker, ckpt.sizes)
        if problem is not None:
            log.warning("remote.checkpoint_damaged", url=self.url, checkpoint=ckpt.name, problem=problem)
            return None
        return marker

    def committed(self) -> list[tuple[RemoteCheckpoint, Marker]]:
        """The committed checkpoints whose objects match their markers, newest first."""
        out = []
        for ckpt in reversed(self.checkpoints()):
            if ckpt.committed:
                marker = self._marker(ckpt)
                if marker is not None:
                    out.append((ckpt, marker))
        return out

    def fetch(self, store: CheckpointStore, marker: Marker) -> Path:
        """The committed checkpoint ``marker`` names, in ``store``'s directory (downloaded
        and verified if it is not there yet); its local path prefix."""
        prefix = self.local_dir / marker.name
        if _names.missing_files(prefix) is not None:
            self.local_dir.mkdir(parents=True, exist_ok=True)
            self._download(store, marker)
        return prefix

    def lease_owner(self) -> str | None:
        """Who holds the lease now (``host h pid p, renewed ... ago``), or ``None``."""
        assert self.io is not None
        lease = RemoteLease(self.fs, self.io.root, self.url, self.wall_clock)
        return lease.holder()

    def read_state(self) -> tuple[_state_file.CheckpointState | None, str | None]:
        """The remote state object and what is wrong with its content (``None``: nothing).

        Raises:
            Exception: it could not be read (a network error): not a damaged object.
        """
        try:
            raw = self.fs.cat_file(self._path(_names.STATE_FILE))
        except FileNotFoundError:
            return None, None
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            return None, describe(exc)
        state = _state_file.parse_state_text(text)
        return state, None if state is not None else "not a checkpoint state"

    def pull(self, store: CheckpointStore, *, agree: bool = False) -> str | None:
        """Make the newest committed checkpoint of both tiers the local latest: download
        the remote's newest when it is newer than the local tier's (a fresh machine, or
        another machine trained on), verified against its marker's checksums; a damaged
        one is skipped for the next older. Returns the name downloaded, or ``None``.

        ``agree`` (multi-worker training): every worker must restore the same step, and
        the other workers restore the remote's newest; local checkpoints newer than it
        (never uploaded) are set aside (renamed ``<name>.not-uploaded-<time>.*``, kept),
        so this worker restores the remote's newest too.
        """
        assert self.basename is not None, "a training's tier"
        local = store.complete_checkpoints(self.basename)
        with self.fs.bounded(Bound("the start's checks", total=self.timeout)):
            committed = self.committed()
        remote_step = committed[0][0].step if committed else None
        if agree:
            newer = [n for n in local if remote_step is None or (_names.step_of(n) or 0) > remote_step]
            if newer:
                self._set_aside_unuploaded(store, newer)
                local = [n for n in local if n not in newer]
        local_step = _names.step_of(local[0]) if local else None
        damaged: list[str] = []
        for ckpt, marker in committed:
            if local_step is not None and ckpt.step <= local_step:
                if ckpt.step < local_step:
                    log.info("remote.behind", url=self.url, remote_step=ckpt.step, local_step=local_step)
                self._found(marker)
                return None
            try:
                self._download(store, marker)
            except CheckpointError as exc:
                log.warning("remote.checkpoint_damaged", url=self.url, checkpoint=ckpt.name, problem=str(exc))
                damaged.append(f"{ckpt.name}: {exc}")
                continue
            self._found(marker)  # the newest intact one: a damaged newer one is replaced by the next upload
            return ckpt.name
        if damaged:  # never an init_fn over a run whose every checkpoint is damaged
            raise CheckpointError(
                f"every checkpoint on {self.url} failed its check, and none is on this machine: "
                + "; ".join(damaged)
                + " (restore or remove them to start over)"
            )
        return None

    def _found(self, marker: Marker) -> None:
        """The remote's newest intact checkpoint is ``marker``'s (what an upload must pass)."""
        self.uploaded = Uploaded(marker.name, marker.step, marker.committed_at)
        self.committed_wall = marker.committed_at

    def _set_aside_unuploaded(self, store: CheckpointStore, names: list[str]) -> None:
        """Rename local checkpoints the remote never got out of the way of a restore, and
        drop them from the local state file."""
        tag = f"not-uploaded-{int(self.wall_clock())}"
        with store.commit_lock:
            for name in names:
                store.set_aside(name, tag)
            state = store.read_state()
            if state is not None:
                store.write_state(_state_file.dropping(state, names))
        log.warning(
            "remote.local_set_aside",
            url=self.url,
            checkpoints=names,
            tag=tag,
            why="in multi-worker training every worker restores the remote's newest checkpoint; these never reached it",
        )

    def _download(self, store: CheckpointStore, marker: Marker) -> None:
        tmp = self.local_dir / f"{marker.name}{_names.TMP_MARKER}dl{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        try:
            with self.fs.bounded(Bound(f"the download of {marker.name}", idle=self.timeout)):
                self._download_files(marker, tmp)
            with store.commit_lock:
                state = store.read_state() or _state_file.CheckpointState()
                new = _state_file.adding(state, marker.name, marker.committed_at)
                _commit.commit(tmp, self.local_dir / marker.name, new)
        except BaseException:
            _commit.remove_partial(tmp)
            raise
        size = sum(s for s, _ in marker.files.values())
        log.info(
            "remote.downloaded",
            url=self.url,
            checkpoint=marker.name,
            bytes=size,
            secs=round(time.monotonic() - started, 3),
        )

    def _download_files(self, marker: Marker, tmp: Path) -> None:
        """Download ``marker``'s files beside ``tmp``, each verified against it."""
        for name, (size, crc) in marker.files.items():
            target = Path(f"{tmp}{name[len(marker.name) :]}")
            self.fs.get_file(self._path(name), str(target))
            got = os.path.getsize(target)
            if got != size:
                raise CheckpointError(f"{name}: {got} bytes, its commit marker says {size}")
            got_crc = crc32c_of(target)
            if got_crc != crc:
                raise CheckpointError(f"{name}: CRC32C {got_crc}, its commit marker says {crc}")

    # -- uploads (the upload thread) ---------------------------------------------------

    def abandon(self) -> None:
        """Any thread: stop an upload in flight at its next part (the stop's deadline)."""
        self._abandon = True

    def _check(self) -> None:
        if self._abandon:
            raise Abandoned("the upload was abandoned at the stop's deadline")

    def _put(self, local: Path, name: str, carried: tuple[int, int] | None = None) -> tuple[int, str]:
        """Upload ``local`` as ``name`` (fenced; abandonable mid-file); its size and CRC32C:
        ``carried`` (as the write computed them) when its size is the file's, else read."""
        size = os.path.getsize(local)
        crc = crc32c_hex(carried[1]) if carried is not None and carried[0] == size else crc32c_of(local)
        path = self._path(name)
        try:
            with self._fenced(f"the upload of {name}"):
                self.fs.put_file(str(local), path, self._check, abort_cut=False)
        except BaseException:
            if not self.fenced:  # its multipart upload, unless that could be another owner's now
                with contextlib.suppress(Exception), self._fenced(f"aborting the cut upload of {name}"):
                    self.fs.abort_cut(path)
            raise
        return size, crc

    def _on_stall(self, stalled: bool) -> None:
        """An upload went ``timeout`` seconds without progress (or moved again)."""
        self.stalled = stalled
        if stalled:
            log.warning(
                "remote.stalled",
                url=self.url,
                no_progress_secs=self.timeout,
                hint="the upload goes on; it is cut and retried if the lease could expire, or after ten times that",
            )
        else:
            log.info("remote.moving", url=self.url)

    def upload(
        self,
        prefix: Path,
        step: int,
        committed_at: float,
        metrics: Mapping[str, float] | None = None,
        files: Mapping[str, tuple[int, int]] | None = None,
    ) -> Uploaded | None:
        """Copy the local checkpoint ``prefix`` to the remote and commit it there: its
        files, then its marker, then the state object; then retention on the remote, the
        objects of earlier uploads that never committed, and the summaries. Each write is
        fenced by the lease. ``None`` when the checkpoint is no longer on the local disk
        (retention deleted it meanwhile: a newer one follows); its objects are removed.
        ``metrics`` and ``files`` (each file's size and CRC32C by suffix,
        :class:`.._types.Written`) as the write had them: what they lack is read.

        Raises:
            Abandoned: the stop's deadline came first (the previous remote checkpoint
                stays the latest).
            LeaseLostError: another training holds the lease: nothing more is written.
            StorageUnreachableError: no progress for ten times ``timeout`` seconds, or a
                write still in flight when the lease could expire.
            Exception: a network or storage error (the caller retries).
        """
        with self.fs.bounded(
            Bound(
                f"the upload of {prefix.name}",
                stall=self.timeout,
                idle=_IDLE_CUT * self.timeout,
                on_stall=self._on_stall,
            )
        ):
            try:
                return self._upload(prefix, step, committed_at, metrics, files or {})
            finally:
                self.stalled = False  # this upload is over, whatever ended it

    def _upload(
        self,
        prefix: Path,
        step: int,
        committed_at: float,
        metrics: Mapping[str, float] | None,
        files: Mapping[str, tuple[int, int]],
    ) -> Uploaded | None:
        name = prefix.name
        paths = _names.checkpoint_files(prefix)
        if _names.missing_files(prefix) is not None:
            return None
        started = time.monotonic()
        # as the write had them, else read (for retention on the remote; unreadable: none)
        metrics = _metrics.read(str(prefix)) if metrics is None else dict(metrics)
        sums: dict[str, tuple[int, str]] = {}
        data = [f for f in paths if not f.name.endswith(".index")]
        index = [f for f in paths if f.name.endswith(".index")]
        self._unfinished.add(name)
        try:
            for f in data + index:
                sums[f.name] = self._put(f, f.name, files.get(f.name[len(name) :]))
        except FileNotFoundError:
            log.info("remote.upload_superseded", url=self.url, checkpoint=name, why="retired locally meanwhile")
            self._remove_unfinished()
            return None
        self._check()
        marker = Marker(name, step, sums, committed_at, metrics)
        with self._fenced(f"the commit marker of {name}"):
            self.fs.pipe_file(self._path(name + MARKER_SUFFIX), marker.to_bytes())
        self._unfinished.discard(name)
        self._markers[name] = marker
        uploaded = Uploaded(name, step, committed_at)
        self.uploaded = uploaded
        self.committed_wall = self.wall_clock()
        self._write_state(marker)
        size = sum(s for s, _ in sums.values())
        secs = time.monotonic() - started
        log.info("remote.uploaded", url=self.url, checkpoint=name, step=step, bytes=size, secs=round(secs, 3))
        self._remove_unfinished()
        self.sync_events()
        return uploaded

    def _remove_unfinished(self) -> None:
        """Remove the objects of uploads that began and never committed (cut by an error,
        by the stop's deadline, or superseded), unless they committed meanwhile."""
        if not self._unfinished:
            return
        by_name = {c.name: c for c in self.checkpoints()}
        for name in sorted(self._unfinished):
            ckpt = by_name.get(name)
            if ckpt is not None and not ckpt.committed:
                self._delete(ckpt, marker_first=False)
                log.info("remote.unfinished_removed", url=self.url, checkpoint=name, objects=len(ckpt.sizes))
            self._unfinished.discard(name)

    def _read_remote_state(self) -> _state_file.CheckpointState | None:
        state, problem = self.read_state()
        if problem is not None:
            log.warning("remote.state_damaged", url=self.url, problem=problem, hint="rebuilt from the commit markers")
        return state

    def _write_state(self, marker: Marker) -> None:
        """Name ``marker``'s checkpoint in the state object and apply retention."""
        committed = {c.name: m for c, m in self.committed()}
        state = self._read_remote_state()
        if state is None:  # none yet, or damaged: the markers say what is committed
            ordered = sorted(committed.values(), key=lambda m: m.step)
            state = _state_file.named(None, [(m.name, m.committed_at) for m in ordered])
        state = _state_file.dropping(state, [p for p in state.paths if p not in committed])
        state = _state_file.adding(state, marker.name, marker.committed_at)
        assert self.keep_policy is not None, "a reader does not upload"
        assert self.basename is not None, "a reader does not upload"
        state, delete = _retention.select_retention(
            state,
            policy=self.keep_policy,
            managed=_retention.managed_by(self.basename),
            metrics=lambda p: marker.metrics if p == marker.name else committed[p].metrics if p in committed else {},
        )
        with self._fenced("the state object"):
            self.fs.pipe_file(self._path(_names.STATE_FILE), _state_file.state_text(state).encode())
        by_name = {c.name: c for c in self.checkpoints()}
        for name in delete:
            if name in by_name:
                self._delete(by_name[name])
                log.debug("remote.retired", url=self.url, checkpoint=name)

    def sync_events(self) -> None:
        """Upload the summaries' event files that grew since they were last uploaded."""
        try:
            entries = [e for e in os.listdir(self.local_dir) if e.startswith(_EVENTS)]
        except FileNotFoundError:
            return
        for entry in sorted(entries):
            try:
                size = os.path.getsize(self.local_dir / entry)
            except FileNotFoundError:
                continue
            if self._events_sent.get(entry) == size:
                continue
            self._check()
            with self._fenced(f"the upload of {entry}"):
                self.fs.put_file(str(self.local_dir / entry), self._path(entry))
            self._events_sent[entry] = size

    # -- the end -----------------------------------------------------------------------

    def renew(self) -> None:
        """Renew the lease (the lease thread), within ``timeout`` seconds.

        Raises:
            LeaseLostError: another training took the logdir over.
        """
        if self.lease is not None and self.lease.number is not None:
            try:
                with self.fs.bounded(Bound("the lease's renewal", total=self.timeout)):
                    self.lease.renew()
            except LeaseLostError as exc:
                self._say_fenced(exc)
                raise

    def finish(self) -> None:
        """A stop (the upload thread, after the final upload): remove what uploads that
        never committed left, and abort multipart uploads under the logdir; best effort,
        within a few seconds (the stop's wind-down), and only while this training holds
        the lease."""
        if self.io is None or self.lease is None or self.lease.number is None or self.fenced:
            return
        try:
            with self.fs.bounded(Bound("the stop's clean-up", total=min(self.timeout, _FINISH_SECS))):
                self._remove_unfinished()
                self._abort_multipart("this training's cut uploads", timeout=min(self.timeout, _FINISH_SECS))
        except Exception as exc:  # the next start removes them
            log.warning("remote.cleanup_failed", url=self.url, error=describe(exc), hint="the next start removes them")

    def close(self) -> None:
        """Release the lease and close the connection (the step thread, at the end)."""
        try:
            if self.lease is not None and self.io is not None:
                try:
                    with self.fs.bounded(Bound("the lease's release", total=self.timeout)):
                        self.lease.release()
                except Exception as exc:  # expires by itself: the next training waits for it
                    log.warning("remote.lease_release_failed", url=self.url, error=describe(exc))
        finally:
            io, self.io = self.io, None
            if io is not None:
                io.close()
