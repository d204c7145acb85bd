"""The checkpoints of one log directory: :class:`Checkpointer`.

A save has two halves: :meth:`Checkpointer.snapshot` on the step thread
(:mod:`.snapshot._snapshot`), :meth:`Checkpointer.write` on the checkpoint writer thread
(:mod:`._write`, then the commit protocol of :mod:`.store` and retention, then
:attr:`Checkpointer.last`). :meth:`Checkpointer.restore` restores the newest good
checkpoint (:mod:`._restore`), setting damaged ones aside and repairing a damaged state
file; :meth:`Checkpointer.track_iterator` (:mod:`.snapshot._iterator_tracking`) puts ``run_loop``'s data iterator in the
checkpoint. :func:`write_checkpoint_now` is the synchronous save of
``CheckpointSaverHook`` into another directory. This module never runs on the event
loop thread.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core._status import CheckpointInfo
from .._exceptions import CheckpointError
from .._logging import describe, get_logger
from .policy._policies import AnyKeepPolicy, KeepPolicy, LatestN, keep_policy_for
from .snapshot import _metrics, _snapshot
from .snapshot._iterator_tracking import IteratorTracker
from .snapshot._walk_cache import WalkCache
from .store import (
    CheckpointStore,
    FastPath,
    OwnerLock,
    RestoreOutcome,
    SaveAbandoned,
    open_store,
    write_error,
)
from .store import candidates as _candidates
from .store import names as _names
from .store import retention as _retention
from .store import state_file as _state_file
from .store import writeback as _writeback

if TYPE_CHECKING:
    from .store import IdleIO, MemoryTier

#: the tiers a snapshot is written to (:attr:`.snapshot._snapshot.Snapshot.tier`)
DISK, RAM = "disk", "ram"

__all__ = ["Checkpointer", "write_checkpoint_now"]

log = get_logger(__name__)


class Checkpointer:
    """Saves and restores one ``tf.train.Checkpoint`` in a log directory.

    Args:
        checkpoint: the ``tf.train.Checkpoint`` holding the whole state.
        logdir: the directory of the checkpoints and the state file.
        basename: checkpoints are ``<logdir>/<basename>-<step>``.
        max_to_keep: the newest checkpoints kept (``None``: all). Retention counts and
            deletes only the checkpoints it manages: ``<basename>-<step>`` named in the
            state file with a commit time not in the future (as
            ``tf.train.CheckpointManager``, which leaves others' checkpoints alone).
        keep_checkpoint_every_n_hours: also keep one checkpoint per this many hours.
        keep_policy: retention as a policy object (:mod:`.policy._policies`), instead of the two
            numbers above.
        wall_clock: wall-clock time for commit timestamps (``time.time``).
        staging: copy the variables into staging buffers kept for the session at each
            snapshot (one memcpy on the step thread, no copy-on-write in the next step;
            the buffers cost the state's size in host memory), :mod:`.snapshot._snapshot`.
            Effective once the native bundle writer has passed its self-check (from the
            second save of a process); ``False``: copy-on-write snapshots only.
        fast_path: the store's fast path (:class:`.store.FastPath`;
            :data:`~.store.PLAIN`: the plain store); ``None``: what
            :func:`.store.resolve_store` picks. Every byte of the directory goes
            through :attr:`store`, chosen here once.
        metrics: on the step thread, the metrics of the state at a snapshot
            (``SessionContext.current_metrics``), recorded in each checkpoint
            (:mod:`.snapshot._metrics`) and offered to the keep policy; ``None``: none.
    """

    def __init__(
        self,
        checkpoint: Any,
        logdir: Path,
        *,
        basename: str = "model.ckpt",
        max_to_keep: int | None = 5,
        keep_checkpoint_every_n_hours: float | None = None,
        keep_policy: KeepPolicy | None = None,
        wall_clock: Callable[[], float] = time.time,
        staging: bool = True,
        fast_path: FastPath | None = None,
        metrics: Callable[[], Mapping[str, float]] | None = None,
        store: CheckpointStore | None = None,
        memory: MemoryTier | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        self.logdir = Path(logdir) if store is None else store.logdir
        #: where every checkpoint byte and state-file update of the directory goes
        self.store: CheckpointStore = open_store(self.logdir, fast_path) if store is None else store
        self.basename = basename
        self.keep_policy = keep_policy or keep_policy_for(max_to_keep, keep_checkpoint_every_n_hours)
        self.wall_clock = wall_clock
        self.started_at = wall_clock()
        self.last: CheckpointInfo | None = None
        #: checkpoints this checkpointer committed (the remote tier's upload cadence counts them)
        self.commits = 0
        self.last_commit_secs: float | None = None  # snapshot handed over → named in the state file
        self.last_phase_secs: dict[str, float] = {}  # the last write's: files written; made the latest
        self.last_snapshot_step: int | None = None  # step thread only
        #: ``run_loop``'s data iterator in the checkpoint (step thread; its share reported once)
        self.iterators = IteratorTracker(checkpoint)
        self._lock = threading.Lock()
        self._owner = False  # whether this process writes the directory (prepare() was called)
        self._walks = WalkCache()  # step thread, but prepare() on the writer's
        self._staging = _snapshot.Staging() if staging else None
        self._staging_logged = 0  # bytes of staging buffers last logged
        self._abandon = threading.Event()  # set by abandon(): writes give up
        #: called between the chunks of a write (the saver's hang-watchdog mark)
        self.on_progress: Callable[[], None] | None = None
        self._metrics_source = metrics
        #: name → the metrics recorded in that checkpoint (writer thread, under the commit
        #: lock): filled at each commit, and when first asked for one of an earlier run
        self._recorded: dict[str, Mapping[str, float]] = {}
        self._pinned: dict[str, int] = {}  # checkpoints retention must leave (an upload reads them)
        self._saved_log = log.info  # how each commit is logged
        self.memory = memory
        #: the RAM tier's checkpoints: written from this checkpointer's snapshots
        self.ram: Checkpointer | None = None
        if memory is not None:
            self.ram = Checkpointer(
                checkpoint,
                memory.dir,
                basename=basename,
                keep_policy=LatestN(memory.max_to_keep),
                wall_clock=wall_clock,
                staging=False,
                store=memory.store,
            )
            self.ram._saved_log = log.debug  # one a second: not news
        #: a RAM checkpoint restored, not on disk yet: :meth:`promote` copies it there
        self.promotion: str | None = None
        #: the newest step committed to ``logdir`` (restored, saved or promoted), if any
        self.disk_step: int | None = None
        #: called after each commit to ``logdir``, on the committing thread (must not block)
        self.commit_listeners: list[Callable[[], None]] = []

    # -- step thread ---------------------------------------------------------------

    def prepare(self, owner: OwnerLock | None = None) -> None:
        """On start-up: create the directory and remove leftovers of interrupted saves.

        The directory and its missing parents are created durably (each fsynced into its
        parent: a power loss must not take committed checkpoints away with their
        directory). With ``owner`` (the session's lock of this directory), the lock is
        taken first: a directory another live training owns fails here, before anything
        in it is touched (:class:`.store._owner.OwnerLock`).

        Called by the process that writes the directory (the chief), which from then on
        also sets aside checkpoints that fail to load (:meth:`restore`). It proves the
        directory can be written (a small file is written, synced and removed), so that a
        read-only, forbidden or full logdir fails the start, not the first save.

        Raises:
            CheckpointError: the directory cannot be created or written; names the path
                and the OS cause, chained to the ``OSError``. Or another live training
                owns it (the message names its host, pid and start time).
        """
        try:
            self.store.prepare(owner)  # the owner's lock before anything in it is touched
        except OSError as exc:
            target = exc.filename or self.logdir
            raise CheckpointError(
                f"logdir {self.logdir} cannot be written, so no checkpoint could be saved: "
                f"{target}: {exc.strerror or exc}"
                + (f" (errno {exc.errno})" if exc.errno is not None else "")
                + "; give a writable directory with free space"
            ) from exc
        self.store.clean_leftovers()
        self._owner = True
        if self.memory is not None and self.ram is not None:
            try:
                self.memory.prepare()  # under the logdir's owner lock: one training per tier too
            except OSError as exc:
                raise CheckpointError(
                    f"the RAM tier {self.memory.dir} cannot be written: {exc.filename or self.memory.dir}: "
                    f"{exc.strerror or exc}; give ram_tier a writable directory on a RAM file system, "
                    "or ram_tier=False"
                ) from exc
            self.ram._owner = True

    def restore(self, *, strict: bool = True) -> str | None:
        """Restore the newest good checkpoint; returns its path or ``None``.

        In the directory's writer (after :meth:`prepare`), the state file is then made
        to name what was restored: newer checkpoints that failed to load are taken out of
        it and their files renamed aside (:meth:`_set_aside`), and a damaged state file is
        rewritten (``checkpoint.state_repaired``). Left as they were, the state file would
        keep calling a corrupt checkpoint the latest, and retention would keep it and
        delete good ones.

        Raises:
            CheckpointError: a different model, or checkpoint files exist and none loads.
        """
        from_ram = self._restore_from_ram(strict)
        if from_ram is not None:
            return from_ram
        outcome = self.store.restore_newest(self.checkpoint, strict=strict, basename=self.basename)
        path = outcome.path
        if path is not None and self._owner and (outcome.corrupt or outcome.gone or outcome.state_problem):
            self._set_aside(outcome.corrupt, path, outcome)
        elif path is None and self._owner and outcome.state_problem is not None:
            self._set_aside_state(outcome.state_problem)
        if path is not None:
            step = _names.step_of(Path(path).name)
            self.last = CheckpointInfo(
                path=path, step=step if step is not None else -1, time=self.store.committed_at(path)
            )
            self.last_snapshot_step = self.disk_step = self.last.step
        return path

    def _newest_on_disk(self) -> int:
        """The step of the newest complete checkpoint of ``logdir`` (-1: none)."""
        steps = [_names.step_of(n) for n in self.store.complete_checkpoints(self.basename)]
        return max((s for s in steps if s is not None), default=-1)

    def _restore_from_ram(self, strict: bool) -> str | None:
        """Restore the RAM tier's newest intact checkpoint if it is newer than every one on
        disk (checked as every restore is; damaged ones set aside in RAM); its path, or
        ``None`` for the disk's restore. A RAM tier none of whose newer checkpoints loads
        is logged and left for the disk."""
        ram, memory = self.ram, self.memory
        if ram is None or memory is None:
            return None
        on_disk = self._newest_on_disk()
        newest = memory.newest_step(self.basename)
        if newest is None or newest <= on_disk:
            return None
        try:
            path = ram.restore(strict=strict)
        except CheckpointError as exc:
            log.error("checkpoint.ram_tier_unusable", dir=str(memory.dir), error=str(exc), action="restoring from disk")
            return None
        if path is None or ram.last is None or ram.last.step <= on_disk:
            return None  # what loads in RAM is not newer than the disk's: the disk's restore
        self.last = ram.last
        self.last_snapshot_step = ram.last.step
        self.promotion = path
        self.disk_step = on_disk if on_disk >= 0 else None
        log.info("checkpoint.restored_from_tier", tier=RAM, path=path, step=ram.last.step, disk_step=on_disk)
        return path

    def close(self) -> None:
        """At the session's end, on the step thread, no write in flight: the data iterator
        and the remembered object walk let go (the checkpoint object, in reference cycles
        with the session, would keep them until a garbage collection on any thread), and
        what the RAM tier's store holds (its spare data files removed). Never fails the stop."""
        try:
            self.iterators.close()
            self._walks.clear()
            if self.ram is not None:
                self.ram.store.close()
        except Exception as exc:
            log.error("checkpoint.close_failed", logdir=str(self.logdir), error=describe(exc))

    def promote(self) -> CheckpointInfo | None:
        """On the writer thread, after a restore from the RAM tier: copy that checkpoint
        into ``logdir`` and commit it there (the commit protocol and retention of any
        save), so the disk, and a remote tier after it, hold it too. ``None`` if there
        was nothing to promote or the disk has a newer one by now.

        Raises:
            CheckpointError: the copy could not be written (named, as a save's error).
        """
        source, self.promotion = self.promotion, None
        if source is None or self.last is None or Path(self.last.path).parent != Path(source).parent:
            return None
        step = self.last.step
        name = f"{self.basename}-{step}"
        final = self.logdir / name
        tmp = self.logdir / f"{name}{_names.TMP_MARKER}{secrets.token_hex(4)}"
        t0 = time.perf_counter()
        store = self.store
        try:
            _writeback.copy_checkpoint(Path(source), tmp, self._check_abandon)
            with store.commit_lock:
                self._check_abandon()
                # its metrics as it recorded them (KeepBest ranks it), read when first asked
                recorded = _metrics.Recorded(lambda: _metrics.read(str(final)))
                snapshot = _snapshot.Snapshot(step, [], [], [], t0, 0.0, recorded)
                info, state, delete = self._plan(name, snapshot)
                store.commit(tmp, final, state, [self.logdir / old for old in delete])
        except BaseException as exc:
            store.remove_partial(tmp)
            error = write_error(exc, final, step)
            if error is not None:
                raise error from exc
            raise
        for old in delete:
            try:
                store.retire(self.logdir / old)
            except OSError as exc:
                log.error("checkpoint.cleanup_failed", path=str(self.logdir / old), error=describe(exc))
        with self._lock:
            if self.last is not None and self.last.step == step:
                self.last = info
            self.commits += 1
            self.disk_step = max(step, self.disk_step if self.disk_step is not None else -1)
        self._committed()
        log.info("checkpoint.promoted", tier=RAM, step=step, path=info.path, secs=round(time.perf_counter() - t0, 4))
        return info

    @property
    def tiers(self) -> dict[str, int]:
        """Each tier's newest committed step this process knows of: ``disk`` and, with
        the RAM tier, ``ram`` (any thread)."""
        out: dict[str, int] = {}
        if self.disk_step is not None:
            out[DISK] = self.disk_step
        if self.ram is not None and self.ram.last is not None:
            out[RAM] = self.ram.last.step
        return out

    def _set_aside(self, corrupt: list[str], restored: str, outcome: RestoreOutcome | None = None) -> None:
        """Make the state file name ``restored`` as the latest and drop ``corrupt`` (and
        checkpoints that are gone) from it, then rename the files of ``corrupt`` to
        ``<name>.corrupt-<time>.*``; nothing is deleted.

        A damaged state file is rewritten from the checkpoints on disk: those of this
        basename up to ``restored``, oldest first, stamped with their index file's time.
        """
        bad = {Path(p).name for p in corrupt} | ({Path(p).name for p in outcome.gone} if outcome else set())
        latest = _relative_name(self.logdir, restored)
        tag = "corrupt-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime(self.wall_clock()))
        with self.store.commit_lock:
            state, problem = self.store.inspect_state()
            if outcome is not None and outcome.state_problem is not None:
                problem = outcome.state_problem
            on_disk = self.store.complete_checkpoints(self.basename) if problem is not None or state is None else []
            repaired = _candidates.repaired_state(
                state if problem is None else None,
                latest,
                bad=bad,
                on_disk=on_disk,
                committed_at=lambda name: self.store.committed_at(self.logdir / name),
                last_preserved=state.last_preserved if state is not None else 0.0,
            )
            self.store.write_state(repaired)
            if problem is not None or (outcome is not None and outcome.gone):
                log.warning(
                    "checkpoint.state_repaired",
                    path=str(self.logdir / _names.STATE_FILE),
                    problem=problem or "it names checkpoints whose files are gone",
                    gone=[Path(p).name for p in outcome.gone] if outcome is not None and outcome.gone else None,
                    set_aside=sorted(Path(p).name for p in corrupt) or None,
                    latest=latest,
                    paths=repaired.paths,
                )
            for name in sorted({Path(p).name for p in corrupt}):
                moved = self.store.set_aside(name, tag)
                log.warning("checkpoint.set_aside", path=str(self.logdir / name), files=moved)

    def _set_aside_state(self, problem: str) -> None:
        """A damaged state file with no checkpoint on disk to name: rename it to
        ``checkpoint.corrupt-<time>`` (kept for inspection), so that the first save
        starts a new one instead of keeping what it named."""
        tag = "corrupt-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime(self.wall_clock()))
        with self.store.commit_lock:
            moved = self.store.set_aside_state(tag)
        if moved is not None:
            path = str(self.logdir / _names.STATE_FILE)
            log.warning("checkpoint.state_repaired", path=path, problem=problem, set_aside=moved, latest=None)

    def snapshot(self, step: int, tier: str = DISK) -> _snapshot.Snapshot | None:
        """Snapshot the state at ``step`` for ``tier`` (``"disk"``, or ``"ram"``: the RAM
        tier's); ``None`` if that tier has that step already (or, for the RAM tier, the
        disk has it: a RAM copy would be no newer)."""
        ram = self.ram if tier == RAM else None
        if tier == RAM and (ram is None or step == ram.last_snapshot_step):
            return None
        if step == self.last_snapshot_step:
            return None
        value, metrics = _metrics.record(self._metrics_source, step)
        extra = () if value is None else ((_metrics.METRICS_KEY, value),)
        staging = self._ram_staging() if ram is not None else None
        staging = self._staging_ready() if staging is None else staging
        snap = _snapshot.take_snapshot(self.checkpoint, step, self._walks, staging, extra, metrics, tier)
        if ram is not None:
            ram.last_snapshot_step = step
        else:
            self.last_snapshot_step = step
        return snap

    def _staging_ready(self) -> _snapshot.Staging | None:
        """The staging buffers, if snapshots are to be staged now: not before the native
        writer has proven itself (``SaveV2`` would need tensors again)."""
        if self._staging is None or not self.store.fast.native_writer:
            return None
        return self._staging if self.store.native_writer_checked() else None

    def _ram_staging(self) -> _snapshot.Staging | None:
        """The RAM tier store's own staging buffers (its reused data files), if a snapshot
        taken now would be staged there (step thread)."""
        ram = self.ram
        staging = None if ram is None else ram.store.staging()
        if staging is None or not ram.store.native_writer_checked():  # type: ignore[union-attr]
            return None
        return staging if staging.ready() else None

    def _prepare_staging(self, snapshot: _snapshot.Snapshot, stopping: Callable[[], bool] | None) -> None:
        """On the writer thread after a save: have the staging buffers ready for the next
        (for a RAM save, the RAM tier store's)."""
        ram_staging = None if snapshot.tier != RAM or self.ram is None else self.ram.store.staging()
        if ram_staging is not None and self.ram is not None and self.ram.store.native_writer_checked():
            ram_staging.prepare(snapshot.tensors, stopping)
            return
        staging = self._staging_ready()
        if staging is None or any(isinstance(t, _snapshot.Staged) for t in snapshot.tensors):
            return
        if staging.prepare(snapshot.tensors, stopping) and staging.nbytes != self._staging_logged:
            self._staging_logged = staging.nbytes
            log.info("checkpoint.staging", bytes=staging.nbytes, step=snapshot.step)

    def track_iterator(self, dataset: Any, mode: bool | None = None, *, fresh: bool = False) -> Any:
        """An iterator over ``dataset``, part of the checkpoint as ``mode`` says
        (:meth:`.IteratorTracker.track`; a position that does not fit names the restored
        checkpoint; ``fresh``: a new pass)."""
        return self.iterators.track(dataset, mode, self.last.path if self.last else None, fresh=fresh)

    # -- any thread ----------------------------------------------------------------

    def abandon(self) -> None:
        """Make the write in flight, and any later one, give up before its commit.

        For a stop whose deadline has come: the writer stops between chunks, removes what
        it wrote and raises :class:`SaveAbandoned`; the previous checkpoint stays the
        latest. A write already committing (renames and the state file) completes.
        """
        self._abandon.set()
        if self.ram is not None:
            self.ram.abandon()

    def _check_abandon(self) -> None:
        progress = self.on_progress
        if progress is not None:  # between chunks: the hang watchdog's sign of a slow, not stuck, save
            progress()
        if self._abandon.is_set():
            raise SaveAbandoned(
                "the save was abandoned at the stop's deadline (its grace period ran out, or a second stop signal)"
            )

    # -- writer thread -------------------------------------------------------------

    def write(self, snapshot: _snapshot.Snapshot, *, min_keep: int = 1, io: IdleIO | None = None) -> CheckpointInfo:
        """Write, commit, apply retention; returns the committed checkpoint.

        Args:
            snapshot: what :meth:`snapshot` took.
            min_keep: keep at least this many (2 while another save is in flight).
            io: does the kernel-heavy file work (writing and syncing the data, deleting
                retired checkpoints) at idle priority: the background writer's (fast
                store); ``None``: all of it on the calling thread. The commit itself (the
                renames and the state file, under the commit lock) always runs on the
                calling thread at its priority: at idle priority it could crawl while
                ``tf.data`` saturates the CPUs, holding the lock and the stop.

        Raises:
            CheckpointError: the files could not be written (disk full, I/O error, ...):
                names the file and the OS cause, chained to the original error. Nothing
                of the failed save stays on disk.
            SaveAbandoned: :meth:`abandon` was called before the commit.
        """
        if snapshot.tier == RAM and self.ram is not None:
            return self.ram.write(snapshot, min_keep=min_keep, io=io)
        t0 = time.perf_counter()
        name = f"{self.basename}-{snapshot.step}"
        final = self.logdir / name
        tmp = self.logdir / f"{name}{_names.TMP_MARKER}{secrets.token_hex(4)}"
        check = self._check_abandon
        store = self.store
        try:
            store.write(snapshot, tmp, check, io)  # files written and on disk, abandonable
            written = time.perf_counter()
            with store.commit_lock:
                check()  # the last point where the save can be given up
                info, state, delete = self._plan(name, snapshot, min_keep)
                retiring = [self.logdir / old for old in delete]
                store.commit(tmp, final, state, retiring)  # now it is the latest
        except BaseException as exc:
            store.remove_partial(tmp)
            error = write_error(exc, final, snapshot.step)
            if error is not None:
                raise error from exc
            raise
        # durable and named in the state file: retention's deletions come after
        committed = time.perf_counter()
        self.last_commit_secs = committed - t0
        self.last_phase_secs = {"write": written - t0, "commit": committed - written}
        for old in delete:
            try:
                store.retire(self.logdir / old, io)
            except OSError as exc:  # marked pending: the next start removes it
                log.error("checkpoint.cleanup_failed", path=str(self.logdir / old), error=describe(exc))
        with self._lock:
            self.last = info
            self.commits += 1
            self.disk_step = max(snapshot.step, self.disk_step if self.disk_step is not None else -1)
        self._committed()
        self._saved_log(
            "checkpoint.saved",
            step=snapshot.step,
            path=info.path,
            secs=round(self.last_commit_secs, 4),
            blocked_secs=round(snapshot.blocked_secs, 4),
            deleted=delete or None,
        )
        self.iterators.report_share(info.path)
        return info

    def _committed(self) -> None:
        """Tell the listeners a checkpoint was committed to ``logdir`` (never fails a save)."""
        for listener in list(self.commit_listeners):
            try:
                listener()
            except Exception as exc:
                log.error("checkpoint.listener_failed", error=describe(exc))

    def recorded_metrics(self, path: str) -> Mapping[str, float] | None:
        """The metrics a checkpoint this checkpointer committed recorded (``None``: not
        known without reading its files)."""
        recorded = self._recorded.get(Path(path).name)
        return None if recorded is None or isinstance(recorded, _metrics.Recorded) else recorded

    def prepare_next(self, snapshot: _snapshot.Snapshot, stopping: Callable[[], bool] | None = None) -> None:
        """On the writer thread, after ``snapshot`` was written (not when the session is
        stopping: there is no next save): make the next snapshot cheaper for the step
        thread. The staging buffers are allocated and touched (:meth:`.Staging.prepare`),
        and a walk of many variables gets its batched read made (:meth:`.WalkCache.prepare`);
        both ask ``stopping()`` between their pieces, so a stop waits for one at most."""
        try:
            self._prepare_staging(snapshot, stopping)
        except Exception as exc:  # e.g. MemoryError: this save is committed, the next ones copy-on-write
            self._staging = None  # for the session: its buffers are freed
            log.warning("checkpoint.staging_failed", step=snapshot.step, error=describe(exc))
        if self._walks.prepare(stopping):
            log.debug("checkpoint.batched_read", step=snapshot.step)

    def _plan(
        self, name: str, snapshot: _snapshot.Snapshot, min_keep: int = 1
    ) -> tuple[CheckpointInfo, _state_file.CheckpointState, list[str]]:
        """The state file naming ``name``, its checkpoint, and the checkpoints retention drops."""
        now = self.wall_clock()
        state = self.store.read_state() or _state_file.CheckpointState(last_preserved=self.started_at)
        if state.last_preserved == 0.0:
            state.last_preserved = self.started_at
        state = _state_file.adding(state, name, now)
        # ours, not stamped in the future (a clock reset), not pinned by an upload
        managed = _retention.managed_by(self.basename, now=now, pinned=self._pinned)
        policy = self.keep_policy
        if min_keep > 1:  # another save is in flight: never fewer than min_keep
            policy = AnyKeepPolicy(policy, LatestN(min_keep))
        self._recorded[name] = snapshot.metrics
        state, delete = _retention.select_retention(state, policy=policy, managed=managed, metrics=self._metrics_of)
        named = set(state.paths)
        self._recorded = {n: m for n, m in self._recorded.items() if n in named}
        return CheckpointInfo(path=str(self.logdir / name), step=snapshot.step, time=now), state, delete

    @contextlib.contextmanager
    def pinned(self, path: str) -> Iterator[bool]:
        """Keep the committed checkpoint ``path`` from retention while the block runs (its
        upload reads it); yields whether it is still there to be read. Any thread."""
        name = Path(path).name
        with self.store.commit_lock:  # no retention decision is half made meanwhile
            self._pinned[name] = self._pinned.get(name, 0) + 1
        try:
            yield _names.missing_files(self.logdir / name) is None
        finally:
            with self.store.commit_lock:
                left = self._pinned.pop(name) - 1
                if left:
                    self._pinned[name] = left

    def _metrics_of(self, name: str) -> Mapping[str, float]:
        """The metrics recorded in checkpoint ``name``: those of its snapshot, or (one of
        an earlier run) read from its files when a policy first looks (unreadable: none)."""
        recorded = self._recorded.get(name)
        if recorded is None:
            prefix = str(self.logdir / name)
            recorded = self._recorded[name] = _metrics.Recorded(lambda: _metrics.read(prefix))
        return recorded


def _relative_name(logdir: Path, path: str) -> str:
    """``path`` relative to ``logdir`` when inside it (as the state file names it)."""
    try:
        return str(Path(path).relative_to(logdir))
    except ValueError:
        return path


def write_checkpoint_now(
    checkpoint: Any,
    directory: str | os.PathLike[str],
    basename: str,
    step: int,
    *,
    max_to_keep: int | None,
    keep_checkpoint_every_n_hours: float | None = None,
    keep_policy: KeepPolicy | None = None,
    fast_path: FastPath | None = None,
    metrics: Callable[[], Mapping[str, float]] | None = None,
) -> str:
    """On the step thread: snapshot and commit ``<directory>/<basename>-<step>`` now.

    The synchronous save (same files, commit protocol and retention as the checkpoint
    service) for callers that need the checkpoint to be the latest when this returns,
    such as ``CheckpointSaverHook``. Returns the checkpoint's path prefix. ``fast_path``:
    the store, as :class:`Checkpointer` takes it (a session passes its own choice);
    ``metrics``: what the checkpoint records, as :class:`Checkpointer` takes it.
    """
    checkpointer = Checkpointer(
        checkpoint,
        Path(directory),
        basename=basename,
        max_to_keep=max_to_keep,
        keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
        keep_policy=keep_policy,
        fast_path=fast_path,
        metrics=metrics,
    )
    _writeback.make_dirs_durable(checkpointer.logdir)
    value, recorded = _metrics.record(metrics, step)
    extra = () if value is None else ((_metrics.METRICS_KEY, value),)
    return checkpointer.write(_snapshot.take_snapshot(checkpoint, step, extra=extra, metrics=recorded)).path
