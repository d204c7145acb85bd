"""When checkpoints are taken: the checkpoint service, step triggers, ``save_now``, final save.

:class:`CheckpointSaver` coordinates every save of one session:

* the timer (``save_model_secs``), driven by :class:`CheckpointService` on the event
  loop with the injectable clock, asks for a snapshot at the next step boundary;
* the step trigger (``save_model_steps``): the step loop calls :meth:`on_step` on the
  step thread when the global step reaches the next multiple, and the snapshot is taken
  right there, at that boundary;
* once at start-up when the state was initialised rather than restored;
* ``Supervisor.save_now()`` and the final save on stop, which wait for the commit.

In multi-worker training every worker has a saver and snapshots at the same steps; a
non-chief writes to a temporary directory (:mod:`._multi_worker` states the rule).

Snapshots are taken on the step thread (see :mod:`._checkpoint`); writes run in order on
one dedicated writer thread, never on the event loop nor on the step thread. A periodic
save that comes while the previous write is still in flight is skipped and logged
(``checkpoint.skipped reason=busy``); ``save_now`` and the final save are queued behind
it. A write error is kept and raised by the next save (the service's failure policy
then applies) or at stop, never lost. The same step is never saved twice.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._checkpoint import Checkpointer, Snapshot
from ._clock import interval_ticks
from ._logging import describe, get_logger
from ._multi_worker import AGREED_STOP_REASONS, WorkerTempWriter
from ._services import Service
from ._threads import ThreadClosedError

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from ._handoff import Waiter
    from ._runtime import Runtime
    from ._services import ServiceContext
    from ._status import CheckpointInfo
    from ._threads import DedicatedThread

__all__ = ["CheckpointSaver", "CheckpointService", "restore_on_startup", "services_for"]

log = get_logger(__name__)


def _noop() -> None:
    return None


class CheckpointSaver:
    """Coordinates the saves of one session (see the module docstring).

    Args:
        rt: the session.
        checkpointer: snapshots, restores and (by default) writes to ``logdir``.
        save_steps: ``save_model_steps``.
        write: writes a snapshot on the writer thread (a non-chief's temporary save);
            ``checkpointer.write`` by default.
        multi_worker: every worker saves at the same steps: step saves queue instead of
            being skipped while a write is in flight, final saves follow the agreed rule.
    """

    def __init__(
        self,
        rt: Runtime,
        checkpointer: Checkpointer,
        *,
        save_steps: int | None,
        write: Callable[..., CheckpointInfo | None] | None = None,
        multi_worker: bool = False,
    ) -> None:
        self.rt = rt
        self.checkpointer = checkpointer
        self.save_steps = save_steps
        self._write_fn = checkpointer.write if write is None else write
        self.multi_worker = multi_worker
        self._writer: DedicatedThread | None = None
        self._in_flight = 0
        self._error: BaseException | None = None
        self._waiters: dict[int, Waiter[Any]] = {}
        self._lock = threading.Lock()

    # -- step thread -----------------------------------------------------------------

    def arm(self) -> None:
        """On the step thread: set the step at which :meth:`on_step` fires next."""
        n = self.save_steps
        self.rt.next_trigger_step = math.inf if n is None else (self.rt.step // n + 1) * n

    def on_step(self) -> None:
        """On the step thread, when the step trigger fires: snapshot and hand off."""
        self.arm()
        error = self._take_error()
        if error is not None:
            self.rt.control.request_stop(error, reason="service:checkpoint")
            return
        self._snapshot("steps", force=self.multi_worker, keep=False)

    def _snapshot(self, reason: str, *, force: bool, keep: bool) -> int | None:
        """Snapshot now and hand it to the writer; returns the step, ``None`` if skipped.

        The hand-off to the writer happens here, whatever becomes of the caller (a
        cancelled ``save()`` must not lose a snapshot it asked for). With ``keep`` the
        write's waiter is kept for ``save()`` under the step.
        """
        rt = self.rt
        if rt.recovering:
            log.warning("checkpoint.skipped", reason=reason, step=rt.step, why="recovering from a step error")
            return None
        with self._lock:
            busy = self._in_flight > 0
        if busy and not force:
            log.warning(
                "checkpoint.skipped", reason=reason, step=rt.step, why="busy: the previous save is still being written"
            )
            return None
        try:
            for check in rt.before_snapshot:
                check()
        except Exception as exc:  # e.g. a NaN loss not read yet: the state is not saved
            rt.control.state_suspect = True
            rt.control.request_stop(exc)
            log.error("checkpoint.skipped", reason=reason, step=rt.step, why=describe(exc))
            return None
        rt.sync_global_step()
        snap = self.checkpointer.snapshot(rt.step)
        if snap is None:
            return None
        with self._lock:
            self._in_flight += 1
        rt.loop.call_soon(functools.partial(self._launch, snap, keep))
        return snap.step

    # -- writer thread ---------------------------------------------------------------

    def _write(self, snap: Snapshot) -> CheckpointInfo | None:
        with self._lock:
            others = self._in_flight - 1  # snapshots queued behind this one
        try:
            # never fewer than 2 checkpoints while another save is in flight
            info = self._write_fn(snap, min_keep=2 if others > 0 else 1)
        except Exception as exc:
            log.error("checkpoint.failed", step=snap.step, error=describe(exc))
            with self._lock:
                if self._error is None:
                    self._error = exc
            return None
        finally:
            with self._lock:
                self._in_flight -= 1
        if info is not None:  # None: a non-chief's temporary save
            self.rt.last_checkpoint = info
        return info

    # -- event loop ------------------------------------------------------------------

    def _launch(self, snap: Snapshot, keep: bool) -> None:
        try:
            if self._writer is None:
                self._writer = self.rt.new_thread("asv-checkpoint")
            waiter = self._writer.submit(self._write, snap)
        except ThreadClosedError as exc:  # the session is already closing its threads
            log.error("checkpoint.failed", step=snap.step, error=describe(exc))
            with self._lock:
                self._in_flight -= 1
                if self._error is None:
                    self._error = exc
            return
        if keep:
            # a save() cancelled before it took its waiter leaves it here: drop finished ones
            self._waiters = {k: w for k, w in self._waiters.items() if not w.done}
            self._waiters[snap.step] = waiter

    def _take_error(self) -> BaseException | None:
        with self._lock:
            error, self._error = self._error, None
        return error

    def raise_pending(self) -> None:
        """Raise the error of a background write that nobody has seen yet."""
        error = self._take_error()
        if error is not None:
            raise error

    async def drain(self) -> None:
        """Wait until every write handed to the writer so far is committed (or failed)."""
        await self.rt.step_thread.call(_noop)  # hand-offs made by step jobs are queued
        if self._writer is not None:
            await self._writer.call(_noop)

    async def save(self, reason: str, *, force: bool = False, wait: bool = False) -> CheckpointInfo | None:
        """Snapshot at the next step boundary and write it in the background.

        Args:
            reason: why (``timer``, ``startup``, ``save_now``, ``final``), for logs.
            force: queue behind a write in flight instead of skipping.
            wait: return only once the checkpoint is committed.

        Returns:
            The committed checkpoint when ``wait``, else ``None``.
        """
        self.raise_pending()
        step = await self.rt.step_thread.submit_at_boundary(self._snapshot, reason, force=force, keep=wait).wait()
        if step is None or not wait:
            if wait:
                await self.drain()
                self.raise_pending()
                return self.checkpointer.last
            return None
        # The launch was scheduled on the loop before this wait's wake-up: it is there.
        waiter = self._waiters.pop(step)
        info: CheckpointInfo | None = await waiter.wait()
        self.raise_pending()
        return info

    async def final_save(self) -> None:
        """The stop's final checkpoint (the runtime skips it when state is suspect).

        In multi-worker training only for a stop every worker reaches at the same step.
        """
        reason = self.rt.control.reason
        if self.multi_worker and reason not in AGREED_STOP_REASONS:
            log.warning(
                "checkpoint.skipped",
                reason="final",
                step=self.rt.step,
                why=f"multi-worker: the other workers may not stop at this step (stop reason {reason})",
            )
            return
        await self.save("final", force=True, wait=True)

    async def aclose(self) -> None:
        """At stop: wait for writes in flight; raise an error none has raised yet."""
        await self.drain()
        self.raise_pending()


class CheckpointService(Service):
    """Saves every ``interval_secs`` (and once at start-up after an init).

    Args:
        saver: the session's save coordinator.
        interval_secs: seconds between timed saves; 0 for none.
        save_at_start: take a checkpoint right away (the state was initialised).
    """

    name = "checkpoint"

    def __init__(self, saver: CheckpointSaver, interval_secs: float, *, save_at_start: bool) -> None:
        self.saver = saver
        self.interval_secs = interval_secs
        self.save_at_start = save_at_start

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Take the start-up checkpoint, then one per tick until cancelled."""
        if self.save_at_start:
            await self.saver.save("startup", force=True)
            self.save_at_start = False  # a restart of this service must not redo it
        task_status.started()
        ctx.set_service_state(self.name, "running")
        if self.interval_secs <= 0:
            return
        first = ctx.clock.now() + self.interval_secs
        async for _ in interval_ticks(ctx.clock, self.interval_secs, first_at=first):
            await self.saver.save("timer")


def restore_on_startup(rt: Runtime) -> bool:
    """On the step thread at start-up: set up checkpointing and restore the latest good one.

    Returns whether a checkpoint was restored.
    """
    config = rt.config
    if config.logdir is None:
        return False
    checkpointer = Checkpointer(
        rt.checkpoint,
        config.logdir,
        basename=config.checkpoint_basename,
        max_to_keep=config.max_to_keep,
        keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
    )
    worker_writer = None
    if config.is_chief:
        checkpointer.prepare()
    elif config.multi_worker:
        assert config.cluster is not None
        worker_writer = WorkerTempWriter(config.logdir, config.cluster, basename=config.checkpoint_basename)
        worker_writer.clean_leftovers()
    rt.checkpointer = checkpointer
    path = checkpointer.restore()
    if path is not None:
        rt.restored_from = path
        rt.last_checkpoint = checkpointer.last
        rt.step = int(rt.global_step_var.numpy())
        log.info("session.restored", step=rt.step, path=path)
    if config.is_chief or worker_writer is not None:
        rt.saver = CheckpointSaver(
            rt,
            checkpointer,
            save_steps=config.save_model_steps,
            write=None if worker_writer is None else worker_writer.write,
            multi_worker=config.multi_worker,
        )
        rt.saver.arm()
    return path is not None


def services_for(rt: Runtime) -> list[Service]:
    """The checkpoint service of ``rt`` (chief, or any worker of a multi-worker
    training, with a logdir and saving enabled)."""
    saver = rt.saver
    config = rt.config
    if saver is None:
        return []
    if config.save_model_secs <= 0 and config.save_model_steps is None:
        return []  # saving disabled: no start-up, timed or final checkpoint
    rt.final_save.append(saver.final_save)
    rt.closers.append(saver.aclose)
    if config.multi_worker:  # steps only, the same on every worker (see _multi_worker)
        return [CheckpointService(saver, 0, save_at_start=False)]
    return [CheckpointService(saver, config.save_model_secs, save_at_start=rt.restored_from is None)]
