"""The checkpoint part of a session: restore at start-up, every save, the final checkpoint.

:class:`CheckpointPart` is what the engine knows of checkpoints (through
``SessionPart``): it restores the latest good checkpoint at start-up (and again to
recover from an aborted step), tracks ``run_loop``'s ``tf.data`` iterator, fires the
step saves (its ``next_trigger``/``on_step``), runs the checkpoint service (timed and
start-up saves), takes the final checkpoint and waits for writes in flight at the end.
The chief owns the logdir for the session (:class:`.store._owner.OwnerLock`, let go in
``release``). It offers ``SessionAttribute.checkpoints`` (``save_now``, the last checkpoint, saves for
``CheckpointSaverHook``). When to save is decided in one place, the session's
:class:`.policy._cadence.Cadence`; how (the writer, waits, retries) in :mod:`.saving._saver`; the
snapshots, writes and restores in :mod:`._manager`. Never imports another feature.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core._abc import SaveReason, SessionAttribute, SessionPart
from .._logging import get_logger
from .._tf import tf
from ._manager import Checkpointer, write_checkpoint_now
from .policy._cadence import Cadence, MomentKind
from .policy._policies import EverySeconds, KeepPolicy, RamTierBudget, SaveMoment, SavePolicy
from .saving._multi_worker import WorkerTempWriter
from .saving._saver import CheckpointSaver, CheckpointService
from .store import FastPath, OwnerLock

if TYPE_CHECKING:
    from .._cluster import ClusterInfo
    from .._core._abc import SessionContext
    from .._core._services import Service
    from .._core._status import CheckpointInfo
    from .store import CheckpointStore, MemoryTier, TieredStore

__all__ = ["CheckpointPart"]

log = get_logger(__name__)


def _same_dir(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name the same directory, however each is spelled."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet): compare where they would resolve
        return os.path.realpath(a) == os.path.realpath(b)


class CheckpointPart(SessionPart):
    """Checkpoints of one session (see the module docstring).

    Args:
        logdir: the checkpoint directory (``None``: no checkpoints of the session's own).
        basename: checkpoint file prefix.
        is_chief: the chief writes checkpoints.
        cluster: the cluster (multi-worker: every worker snapshots at the same steps).
        multi_worker: whether this is one of several training workers.
        save_policy: when to save (``None``: this session saves only on ``save_now`` and
            for hooks).
        keep_policy: which checkpoints retention keeps.
        when_busy: ``checkpoint_when_busy``.
        staging: ``checkpoint_staging`` (:class:`Checkpointer`'s ``staging``).
        fast_path: the store (``checkpoint_store``): :class:`Checkpointer`'s ``fast_path``.
        remote: a URL logdir's tiered store (``logdir`` is then its local working
            directory; ``store`` too): opened, and the remote's newest checkpoint brought
            down, before the restore.
        memory: the RAM tier below ``logdir`` (the chief of a single-worker training
            only; :class:`Checkpointer`'s ``memory``).
        ram_save_secs: seconds between RAM saves, or ``"auto"`` (a 2 % overhead budget).
        store: a store object for ``logdir`` (``Supervisor(store=...)``), else chosen.
    """

    name = "checkpoint"

    def __init__(
        self,
        logdir: str | Path | None,
        *,
        basename: str,
        is_chief: bool,
        cluster: ClusterInfo | None,
        multi_worker: bool,
        save_policy: SavePolicy | None,
        keep_policy: KeepPolicy,
        when_busy: str,
        staging: bool = True,
        fast_path: FastPath | None = None,
        remote: TieredStore | None = None,
        memory: MemoryTier | None = None,
        ram_save_secs: float | str = "auto",
        store: CheckpointStore | None = None,
    ) -> None:
        self.logdir = None if logdir is None else Path(logdir)
        self.remote = remote
        self.memory = memory
        self.ram_save_secs = ram_save_secs
        self.store = store
        self._commit_listeners: list[Callable[[], None]] = []  # shared with the checkpointer
        self.fast_path = fast_path
        self.basename = basename
        self.is_chief = is_chief
        self.cluster = cluster
        self.multi_worker = multi_worker
        self.save_policy = save_policy
        self.keep_policy = keep_policy
        self.when_busy = when_busy
        self.staging = staging
        self.checkpointer: Checkpointer | None = None
        self.saver: CheckpointSaver | None = None
        self._restored_from: str | None = None
        self._ctx: SessionContext | None = None
        self._owner: OwnerLock | None = None  # the chief's lock of logdir, for the session

    def start(self, ctx: SessionContext) -> None:
        """Keep the session for saves made on behalf of hooks and front doors."""
        self._ctx = ctx

    @property
    def restorable(self) -> bool:
        """Whether a checkpoint directory is set up (a step error can then be recovered from)."""
        return self.checkpointer is not None

    @property
    def saving(self) -> bool:
        """Whether this session saves checkpoints (start-up, timed, step and final saves)."""
        return self.saver is not None and self.save_policy is not None

    # -- what the other parts and the front doors see (CheckpointSaving) -----------------

    @property
    def last(self) -> CheckpointInfo | None:
        """The latest committed checkpoint of the logdir, or ``None``."""
        return None if self.checkpointer is None else self.checkpointer.last

    @property
    def restored_from(self) -> str | None:
        """The checkpoint this session started from, or ``None``."""
        return self._restored_from

    @property
    def commits(self) -> int:
        """How many checkpoints this session committed into its logdir so far."""
        return 0 if self.checkpointer is None else self.checkpointer.commits

    @contextlib.contextmanager
    def pinned(self, path: str) -> Iterator[bool]:
        """Keep the committed checkpoint ``path`` from retention while the block runs (an
        upload reads it); yields whether it is still there. Any thread."""
        if self.checkpointer is None:
            yield False
            return
        with self.checkpointer.pinned(path) as there:
            yield there

    def extra_attributes(self, ctx: SessionContext) -> Mapping[Any, Callable[[], Any]]:
        """``SessionAttribute.checkpoints``: this part."""
        return {SessionAttribute.checkpoints: lambda: self}

    def save_on_step_thread(self, directory: str | None = None, basename: str | None = None) -> str:
        """On the step thread: checkpoint the state now and make it the latest; its path.

        What ``CheckpointSaverHook`` saves through. Into the session's own logdir it goes
        through the session's checkpointer (same commit protocol and retention, and a step
        already saved is not written twice), however ``directory`` spells it (relative,
        through ``..`` or a symlink); elsewhere, a one-off checkpointer for that
        directory with the same protocol.
        """
        target: str | Path | None = directory if directory is not None else self.logdir
        if self.remote is not None and str(target).rstrip("/") == self.remote.tier.url:
            target = self.logdir  # the URL logdir: its local tier, uploaded from there
        if target is None:
            raise ValueError("no checkpoint directory: the Supervisor has no logdir")
        name = basename or self.basename
        ctx = self._ctx
        assert ctx is not None, "the session has not started"
        ctx.check_before_snapshot()
        ctx.sync_global_step()
        step = ctx.global_step
        own = self.checkpointer
        if own is not None and name == self.basename and _same_dir(target, own.logdir):
            snap = own.snapshot(step)
            if snap is None:  # this step is already saved (or being written)
                return str(own.logdir / f"{name}-{step}")
            return own.write(snap).path
        return write_checkpoint_now(
            ctx.state,
            target,
            name,
            step,
            max_to_keep=None,
            keep_policy=self.keep_policy,
            fast_path=self.fast_path,
            metrics=getattr(ctx, "current_metrics", None),
        )

    def save_in_background(self, reason: SaveReason, *, agreed: bool = False) -> int | None:
        """On the step thread: snapshot the state now and write it in the background
        (queued behind a write in flight); the step, or ``None`` when there is nothing to
        save into (no logdir, not the chief) or the snapshot was skipped. In multi-worker
        training only ``agreed``: every worker calls it at this same step (a snapshot is
        a collective)."""
        if self.saver is None or (self.multi_worker and not agreed):
            return None
        return self.saver._snapshot(reason, force=True)

    async def save_now(self) -> CheckpointInfo:
        """``Supervisor.save_now()``: a checkpoint at the next step boundary, committed."""
        if self.multi_worker:
            raise RuntimeError(
                "save_now() is not available in multi-worker training: every worker must "
                "snapshot at the same step; use save_model_steps"
            )
        if self.saver is None:
            raise RuntimeError("save_now() needs a logdir and a chief supervisor (is_chief=True)")
        info = await self.saver.save("save_now", force=True, wait=True)
        assert info is not None
        return info

    # -- session phases ----------------------------------------------------------------

    def restore(self, ctx: SessionContext, *, recovering: bool = False) -> str | None:
        """On the step thread: set up checkpointing and restore the latest good checkpoint.

        At start-up: called again for each start-up retry (``Runtime._start_up``), so a
        transient error raised here sets nothing aside. When ``recovering`` (a recovery,
        a divergence rollback): restores the latest checkpoint without setting any aside;
        ``run_loop``'s data iterator goes back to that checkpoint's position (to the start
        of its dataset when the checkpoint was taken before the iterator began: the
        start-up one).

        Raises:
            CheckpointError: another model's checkpoint, or checkpoint files of which
                none loads.
            tf.errors.AbortedError, tf.errors.UnavailableError: transient; the caller retries.
        """
        if self.logdir is None:
            return None
        if recovering:
            assert self.checkpointer is not None
            path = self.checkpointer.restore(strict=False)
            if path is not None:
                self.checkpointer.iterators.rewind_unless_held(path)
                ctx.set_step(int(ctx.global_step_var.numpy()))
            return path
        checkpointer = Checkpointer(
            ctx.state,
            self.logdir,
            basename=self.basename,
            keep_policy=self.keep_policy,
            staging=self.staging,
            fast_path=self.fast_path,
            metrics=getattr(ctx, "current_metrics", None),  # recorded in each checkpoint
            store=self.store,
            memory=self.memory if self.is_chief and not self.multi_worker else None,
        )
        checkpointer.commit_listeners = self._commit_listeners
        if self.memory is not None and (self.multi_worker or not self.is_chief):
            log.warning(
                "checkpoint.ram_tier_off",
                why="multi-worker training: every worker restores the same checkpoint, and a RAM tier is one machine's",
            )
        worker_writer = None
        if self.is_chief:
            if self._owner is None:
                self._owner = OwnerLock(self.logdir)
            checkpointer.prepare(self._owner)
        if self.remote is not None:  # both tiers' newest checkpoint becomes the local latest
            self.remote.open(self._owner, agree=self.multi_worker)
        if not self.is_chief and self.multi_worker:
            assert self.cluster is not None
            worker_writer = WorkerTempWriter(
                self.logdir, self.cluster, basename=self.basename, fast_path=checkpointer.store.fast
            )
            worker_writer.clean_leftovers()
        self.checkpointer = checkpointer
        path = checkpointer.restore()
        self._restored_from = path
        if path is not None:
            ctx.set_step(int(ctx.global_step_var.numpy()))
            log.info("session.restored", step=ctx.global_step, path=path)
        if self.is_chief or worker_writer is not None:
            self.saver = CheckpointSaver(
                ctx,
                checkpointer,
                cadence=Cadence(self.save_policy, partial(self._moment, ctx), lambda: ctx.global_step),
                write=None if worker_writer is None else worker_writer.write,
                multi_worker=self.multi_worker,
                when_busy=self.when_busy,
                ram_cadence=None if checkpointer.ram is None else self._ram_cadence(ctx),
            )
        return path

    def _ram_cadence(self, ctx: SessionContext) -> Cadence:
        """The RAM tier's cadence: ``ram_save_secs`` apart, or by a 2 % overhead budget
        between 0.5 and 10 s apart (:class:`.policy._policies.RamTierBudget`; the first
        save's cost, a process's first, is not a measurement)."""
        secs = self.ram_save_secs
        policy = RamTierBudget() if secs == "auto" else EverySeconds(float(secs))
        return Cadence(policy, partial(self._moment, ctx), lambda: ctx.global_step, warmup=1)

    @property
    def tiers(self) -> Mapping[str, int]:
        """Each tier's newest committed step (``disk``, ``ram``; any thread)."""
        return {} if self.checkpointer is None else self.checkpointer.tiers

    def on_commit(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each commit to the logdir (the committing thread)."""
        self._commit_listeners.append(listener)

    def recorded_metrics(self, path: str) -> Mapping[str, float] | None:
        """The metrics checkpoint ``path`` recorded, if this session committed it."""
        return None if self.checkpointer is None else self.checkpointer.recorded_metrics(path)

    async def settle(self, ctx: SessionContext) -> None:
        """Before a recovery's restore: a checkpoint being written is the one to restore."""
        if self.saver is not None:
            await self.saver.drain()

    def next_trigger(self, step: int) -> float:
        """The next multiple of ``save_model_steps`` (when this session saves)."""
        return float("inf") if self.saver is None else self.saver.next_trigger(step)

    def on_step(self, ctx: SessionContext) -> None:
        """A step the cadence names: snapshot now if the save policy says so."""
        assert self.saver is not None
        self.saver.on_step()

    def services(self, ctx: SessionContext) -> Iterable[Service]:
        """The checkpoint service (start-up and timed saves), when this session saves.
        Asked on the loop as the session starts: the writer thread starts here."""
        if self.saver is not None:
            self.saver.start_writer()
        if not self.saving:
            return []  # saving disabled: no start-up, timed or final checkpoint
        assert self.saver is not None
        services = [CheckpointService(self.saver, save_at_start=self.saver.cadence.due("startup"))]
        if self.saver.ram_cadence is not None:
            services.append(
                CheckpointService(self.saver, save_at_start=False, cadence=self.saver.ram_cadence, reason="ram")
            )
        return services

    def _moment(self, ctx: SessionContext, kind: MomentKind) -> SaveMoment:
        return SaveMoment(
            kind=kind,
            step=ctx.global_step,
            restored=self._restored_from is not None,
            stop_reason=ctx.control.reason,
            multi_worker=self.multi_worker,
            agreed=ctx.control.agreed,
        )

    def iterator_for(
        self, ctx: SessionContext, data: Any, checkpoint_iterator: bool | None, *, fresh: bool = False
    ) -> Iterator[Any] | None:
        """A ``tf.data`` iterator tracked in checkpoints as ``checkpoint_iterator`` says.

        Raises:
            CheckpointError: ``checkpoint_iterator=True`` and the position of ``data``
                cannot be checkpointed (or ``data`` is not a ``tf.data.Dataset``).
        """
        from .snapshot._iterator_state import serialisation_problem, untrackable_error

        if not isinstance(data, tf().data.Dataset):
            if checkpoint_iterator:
                raise untrackable_error(f"data is a {type(data).__name__}, not a tf.data.Dataset")
            return None
        if self.checkpointer is not None:
            iterator: Iterator[Any] = self.checkpointer.track_iterator(data, checkpoint_iterator, fresh=fresh)
            return iterator
        iterator = iter(data)
        if checkpoint_iterator:  # no checkpoints here, but the same pipeline fails with them
            problem = serialisation_problem(iterator)
            if problem is not None:
                raise untrackable_error(problem)
        return iterator

    def wake(self) -> None:
        """At a stop: release the step thread's wait for the writer."""
        if self.saver is not None:
            self.saver.wake()

    async def final(self, ctx: SessionContext) -> None:
        """The final checkpoint."""
        if not self.saving:
            return
        assert self.saver is not None
        if not self.saver.cadence.due("stop"):
            log.warning(
                "checkpoint.skipped",
                reason="final",
                step=ctx.global_step,
                why=f"the save policy does not save at this stop (stop reason {ctx.control.reason})",
            )
            return
        await self.saver.save("final", force=True, wait=True)

    def release(self) -> None:
        """The session's last job on the step thread: the logdir's lock let go (the next
        training may own it)."""
        if self.checkpointer is not None:
            self.checkpointer.close()
        if self._owner is not None:
            self._owner.release()

    async def aclose(self, ctx: SessionContext) -> None:
        """Wait for writes in flight (abandoned at the stop's deadline); raise an error
        none has raised yet."""
        if self.saving:
            assert self.saver is not None
            await self.saver.aclose()
