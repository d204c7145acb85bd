"""How checkpoints are taken: the checkpoint service, step triggers, ``save_now``, final save.

Whether a moment saves is the session's :class:`._cadence.Cadence`'s answer (the save
policy, asked in that one place). :class:`CheckpointSaver` carries out every save of one
session:

* the timer (``save_model_secs``), driven by :class:`CheckpointService` on the event
  loop with the injectable clock, asks for a snapshot at the next step boundary;
* the step trigger (``save_model_steps``): the step loop calls :meth:`on_step` on the
  step thread when the global step reaches the next multiple, and the snapshot is taken
  right there, at that boundary;
* once at start-up when the state was initialised rather than restored;
* ``Supervisor.save_now()`` and the final save on stop, which wait for the commit.

In multi-worker training every worker has a saver and snapshots at the same steps; a
non-chief writes to a temporary directory (:mod:`._multi_worker` states the rule).

Snapshots are taken on the step thread (see :mod:`..snapshot`); writes run in order on
one dedicated writer thread, started with the session, never on the event loop nor on
the step thread. The step thread hands each snapshot straight to the writer (a waited-for
save's waiter is made on the loop beforehand), with no trip through the event loop. With
the fast store, the kernel-heavy part of each write (the data's ``write(2)`` calls,
deleting retired checkpoints) runs on a second thread at the OS's idle priority, so that
an event loop beside the training stays responsive (the store's ``idle_io``).

Cadence (``checkpoint_when_busy``): with ``"wait"`` (the default) a step save that is due
while the previous write is still in flight makes the step thread wait for it
(back-pressure, ``checkpoint.waited secs=...``), so every multiple of ``save_model_steps``
is saved; a timer tick waits on the event loop until the writer is free and then saves
once (ticks missed meanwhile coalesce into that save). With ``"skip"`` such periodic
saves are skipped and logged (``checkpoint.skipped why=busy...``). ``save_now`` and the
final save are always queued behind a write in flight. A write error is kept and raised
by the next save (the service's failure policy then applies) or at stop, never lost. The
same step is never saved twice.

A failed background save is retried by the next due save (``SAVE_RETRY``: up to two
retries within ten minutes, each logged as ``checkpoint.retrying`` and counted in
``status().restarts["checkpoint"]``); one more failure stops the session with the
error, and the final save is still attempted then: a transient write error (a storage
hiccup) costs one checkpoint, not the training, and a persistent one (a full disk) is
reported within a few saves, with the newest good checkpoint kept.

The final save is bounded by the stop's grace period: when the stop's deadline comes
while it is being written, the write is abandoned between chunks (its files removed, the
previous checkpoint stays the latest) and the stop logs ``shutdown.overrun
phase=final_checkpoint``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..._core._abc import SaveReason
from ..._core._clock import interval_ticks
from ..._core._divergence import SnapshotRefused
from ..._core._services import FailureWindow, RestartPolicy, Service
from ..._core._threads import ThreadClosedError
from ..._logging import describe, get_logger
from .._manager import Checkpointer
from ..policy._cadence import Cadence
from ..snapshot._snapshot import Snapshot
from ..store import SaveAbandoned

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from ..._core._abc import SessionContext
    from ..._core._handoff import Waiter
    from ..._core._services import ServiceContext
    from ..._core._status import CheckpointInfo
    from ..._core._threads import DedicatedThread
    from ..store import IdleIO

__all__ = ["WHEN_BUSY", "CheckpointSaver", "CheckpointService"]

log = get_logger(__name__)


def _noop() -> None:
    return None


#: ``checkpoint_when_busy`` values: wait for the write in flight, or skip the save
WHEN_BUSY = ("wait", "skip")
#: how long an abandoned final save may take to wind down (remove its files), out of the
#: stop's wind-down (the engine's ``_WIND_DOWN_SECS``): the rest is the closers' (summaries)
_ABANDON_GRACE_SECS = 0.5

#: a RAM checkpoint restored at start is copied to the disk once the first step is done
#: (the copy took 0.2 s of CPU from a 128 MB model's first step, its trace, on 2 cores),
#: or after this many seconds, or at a stop, whichever comes first
PROMOTE_AFTER_SECS = 10.0


class _Launched:
    """The hand-off of one waited-for save: the writer's waiter (made on the loop by
    ``save()``) and whether the step thread handed the snapshot to the writer."""

    __slots__ = ("handed", "waiter")

    def __init__(self, waiter: Waiter[Any]) -> None:
        self.waiter = waiter
        self.handed = False


#: how failed background saves are retried (by the next due save) before the session stops
SAVE_RETRY = RestartPolicy(max_restarts=2, window_secs=600.0, backoff_secs=1.0)


class CheckpointSaver:
    """Coordinates the saves of one session (see the module docstring).

    Args:
        ctx: the session.
        checkpointer: snapshots, restores and (by default) writes to ``logdir``.
        cadence: when to save (:class:`._cadence.Cadence`): the step trigger, and the
            measured save costs an adaptive timer feeds on.
        write: writes a snapshot on the writer thread (a non-chief's temporary save);
            ``checkpointer.write`` by default.
        multi_worker: every worker saves at the same steps: step saves queue instead of
            being skipped while a write is in flight, final saves follow the agreed rule.
        when_busy: ``"wait"`` (back-pressure) or ``"skip"``: what a periodic save does
            while the previous write is in flight (see the module docstring).
        ram_cadence: the RAM tier's cadence (its own timer and save costs), when the
            checkpointer has a RAM tier: its saves (``reason="ram"``) are skipped, never
            waited for, while a write is in flight, and a failed one is logged, not
            raised (the disk's saves go on).
    """

    def __init__(
        self,
        ctx: SessionContext,
        checkpointer: Checkpointer,
        *,
        cadence: Cadence,
        write: Callable[..., CheckpointInfo | None] | None = None,
        multi_worker: bool = False,
        when_busy: str = "wait",
        ram_cadence: Cadence | None = None,
    ) -> None:
        if when_busy not in WHEN_BUSY:
            raise ValueError(f"checkpoint_when_busy must be 'wait' or 'skip', got {when_busy!r}")
        self.ctx = ctx
        self.when_busy = when_busy
        self.checkpointer = checkpointer
        self.cadence = cadence
        self._write_fn = checkpointer.write if write is None else write
        self.multi_worker = multi_worker
        self._writer: DedicatedThread | None = None
        self._promoter: DedicatedThread | None = None  # a RAM checkpoint's copy to disk, at start
        self._stepped = threading.Event()  # the first step boundary passed (or a stop): promote now
        self._io: IdleIO | None = None
        self._in_flight = 0
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a write ends, or on stop
        self._failures = FailureWindow(SAVE_RETRY)
        self.ram_cadence = ram_cadence
        self._ram_failed = False  # a RAM save failed and was logged at error level

    # -- step thread -----------------------------------------------------------------

    def next_trigger(self, step: int) -> float:
        """The step at which :meth:`on_step` fires next, after ``step`` (the next one while
        a RAM checkpoint's promotion waits for the first step)."""
        due = self.cadence.next_step(step)
        if self.checkpointer.promotion is not None and not self._stepped.is_set():
            return min(due, step + 1)
        return due

    def on_step(self) -> None:
        """On the step thread, when the step trigger fires: snapshot and hand off, if the
        cadence says this step is due.

        With ``when_busy="wait"``, a write still in flight is waited for first.
        """
        if not self._stepped.is_set():
            self._stepped.set()
        if not self.cadence.due("step"):
            return
        if self.when_busy == "wait" and not self.multi_worker:
            self._wait_for_writer()
        error = self._take_error()
        if error is not None and not self._retry(error, "steps"):
            self.ctx.request_stop(error, reason="service:checkpoint")
            return
        self._snapshot("steps", force=self.multi_worker)

    def _retry(self, error: BaseException, reason: SaveReason) -> bool:
        """Whether this save may retry after the failed one (``SAVE_RETRY``); counted."""
        failed = self._failures.record(time.monotonic())  # the step thread: not the loop's clock
        if failed > SAVE_RETRY.max_restarts:
            return False
        log.warning("checkpoint.retrying", reason=reason, failures=failed, error=describe(error))
        self.ctx.set_service_state(CheckpointService.name, "restarting")  # counted in status().restarts
        self.ctx.set_service_state(CheckpointService.name, "running")
        return True

    def _wait_for_writer(self) -> None:
        """On the step thread: wait until no write is in flight, or the session stops."""
        with self._lock:
            if self._in_flight == 0:
                return
            t0 = time.perf_counter()
            control = self.ctx.control
            while self._in_flight > 0 and not control.stopping:
                self._idle.wait()
        secs = time.perf_counter() - t0
        self.ctx.record_badput("unproductive_checkpoint_save_time", secs)  # the step thread held: the goodput ledger's
        log.info("checkpoint.waited", step=self.ctx.global_step, secs=round(secs, 4))

    def wake(self) -> None:
        """From any thread (a stop): release the step thread's wait for the writer (and
        a promotion's wait for the first step)."""
        self._stepped.set()
        with self._lock:
            self._idle.notify_all()

    def _snapshot(self, reason: SaveReason, *, force: bool, keep: _Launched | None = None) -> int | None:
        """Snapshot now and hand it to the writer; returns the step, ``None`` if skipped.

        The hand-off to the writer happens here, whatever becomes of the caller (a
        cancelled ``save()`` must not lose a snapshot it asked for). With ``keep`` the
        write's waiter is handed to ``save()`` through it once launched.
        """
        ctx = self.ctx
        if ctx.recovering:
            log.warning("checkpoint.skipped", reason=reason, step=ctx.global_step, why="recovering from a step error")
            return None
        with self._lock:
            busy = self._in_flight > 0
        if reason == "ram" and (busy or ctx.control.stopping):
            return None  # the next tick's: a RAM save never waits
        if busy and not force:
            why = (
                "stopping: the final checkpoint saves the state"
                if ctx.control.stopping
                else "busy: the previous save is still being written (checkpoint_when_busy='skip')"
            )
            log.warning("checkpoint.skipped", reason=reason, step=ctx.global_step, why=why)
            return None
        held = time.perf_counter()  # the step thread held from here: the goodput ledger's badput
        try:
            ctx.check_before_snapshot()
        except SnapshotRefused as exc:  # a diverged state, which run_loop rolls back: not saved
            log.warning("checkpoint.skipped", reason=reason, step=ctx.global_step, why=str(exc))
            return None
        except Exception as exc:  # e.g. a NaN loss not read yet: the state is not saved
            ctx.mark_state_suspect()
            ctx.request_stop(exc)
            log.error("checkpoint.skipped", reason=reason, step=ctx.global_step, why=describe(exc))
            return None
        ctx.sync_global_step()
        # every worker's snapshot reads the others' (a collective): a barrier in a cluster;
        # alone, a snapshot (milliseconds, on the step thread) learns apart from the writes
        with ctx.watch_phase("barrier" if self.multi_worker else "snapshot"):
            snap = self.checkpointer.snapshot(ctx.global_step, "ram" if reason == "ram" else "disk")
        ctx.record_badput("unproductive_checkpoint_save_time", time.perf_counter() - held)
        if snap is None:
            return None
        with self._lock:
            self._in_flight += 1
        self._hand_off(snap, keep)
        return snap.step

    # -- writer thread ---------------------------------------------------------------

    def _write(self, snap: Snapshot) -> CheckpointInfo | None:
        if snap.tier == "ram":
            return self._write_ram(snap)
        with self._lock:
            others = self._in_flight - 1  # snapshots queued behind this one
        mark = self.ctx.watch_phase("save")  # the hang watchdog's: each chunk written is progress
        self.checkpointer.on_progress = mark.advance
        try:
            # never fewer than 2 checkpoints while another save is in flight
            info = self._write_fn(snap, min_keep=2 if others > 0 else 1, io=self._io)
            mark.end()  # a completed write: its duration is learned
            self._observe_phases(snap)
        except SaveAbandoned as exc:  # the stop's deadline: not an error of the save
            log.warning("checkpoint.abandoned", step=snap.step, why=str(exc))
            return None
        except Exception as exc:
            log.error("checkpoint.failed", step=snap.step, error=describe(exc))
            with self._lock:
                if self._error is None:
                    self._error = exc
            return None
        finally:
            self.checkpointer.on_progress = None
            mark.drop()  # a failed one is not learned from (after end(): nothing)
            self._one_done()
        self._measure(snap)
        control = self.ctx.control
        if not control.stopping:
            self.checkpointer.prepare_next(snap, lambda: control.stopping)
        return info  # None: a non-chief's temporary save

    def _one_done(self) -> None:
        """A job of the writer (a write, a promotion) ended: waiters for it may go on."""
        with self._lock:
            self._in_flight -= 1
            self._idle.notify_all()

    def _write_ram(self, snap: Snapshot) -> CheckpointInfo | None:
        """A RAM tier's write: its cost to its own cadence; a failure logged (at error
        level the first time, then at debug), never the session's error."""
        try:
            info = self.checkpointer.write(snap, io=self._io)  # at idle priority: training first
        except SaveAbandoned:
            return None
        except Exception as exc:
            (log.debug if self._ram_failed else log.error)("checkpoint.ram_failed", step=snap.step, error=describe(exc))
            self._ram_failed = True
            return None
        finally:
            self._one_done()
        ram = self.checkpointer.ram
        if self.ram_cadence is not None and ram is not None:
            self.ram_cadence.committed(snap, ram.last_commit_secs)
        control = self.ctx.control
        if not control.stopping:
            self.checkpointer.prepare_next(snap, lambda: control.stopping)
        return info

    def _promote(self) -> None:
        """On its own thread (``asv-checkpoint-promote``): a checkpoint restored from the
        RAM tier copied to the disk (:meth:`Checkpointer.promote`) while the writer goes
        on with the RAM tier's saves (a copy's fsync may take seconds); a failure is
        logged, the training goes on (the next disk save holds a newer state). It starts
        after the first step (:data:`PROMOTE_AFTER_SECS` at most): the copy's CPU would
        delay the first resumed step."""
        self._stepped.wait(PROMOTE_AFTER_SECS)
        try:
            self.checkpointer.promote()
        except SaveAbandoned:
            log.warning("checkpoint.promote_abandoned", why="the stop's deadline came first")
        except Exception as exc:
            log.error("checkpoint.promote_failed", error=describe(exc), action="the next disk save holds a newer state")

    def _observe_phases(self, snap: Snapshot) -> None:
        """After a write: its phases' durations for ``status().save_seconds``."""
        observe = self.ctx.observe_save_secs
        observe("blocked", snap.blocked_secs)
        for phase, secs in self.checkpointer.last_phase_secs.items():
            observe(phase, secs)
        self.checkpointer.last_phase_secs = {}

    def _measure(self, snap: Snapshot) -> None:
        """After a commit: the save's cost to the cadence (an adaptive timer's next interval)."""
        self.cadence.committed(snap, self.checkpointer.last_commit_secs)  # snapshot handed over → committed

    # -- event loop ------------------------------------------------------------------

    def start_writer(self) -> None:
        """On the loop, as the session starts: the writer thread (and the fast store's
        idle-priority I/O thread), so that the step thread hands each snapshot straight
        to it, with no trip through the event loop."""
        if self._writer is None:
            self._writer = self.ctx.new_thread("asv-checkpoint")
            self._io = self.checkpointer.store.idle_io(lambda: self.ctx.new_thread("asv-checkpoint-io").submit_nowait)
            if self.checkpointer.promotion is not None:  # restored from RAM: to disk, beside the saves
                self._promoter = self.ctx.new_thread("asv-checkpoint-promote")
                self._promoter.submit_nowait(self._promote)

    def _hand_off(self, snap: Snapshot, keep: _Launched | None) -> None:
        """On the step thread: queue the write of ``snap`` on the writer (its outcome to
        ``keep``'s waiter when a task waits for it)."""
        try:
            if self._writer is None:
                raise ThreadClosedError("the checkpoint writer was never started")
            if keep is None:
                self._writer.submit_nowait(self._write, snap)  # _write reports its own errors
            else:
                self._writer.submit_to(keep.waiter, self._write, snap)
                keep.handed = True
        except ThreadClosedError as exc:  # the session is already closing its threads
            log.error("checkpoint.failed", step=snap.step, error=describe(exc))
            with self._lock:
                self._in_flight -= 1
                self._idle.notify_all()
                if self._error is None:
                    self._error = exc

    def _take_error(self) -> BaseException | None:
        with self._lock:
            error, self._error = self._error, None
        return error

    def raise_pending(self) -> None:
        """Raise the error of a background write that nobody has seen yet."""
        error = self._take_error()
        if error is not None:
            raise error

    def abandon(self) -> None:
        """From any thread: make the write in flight (and later ones) give up before
        committing; see :meth:`Checkpointer.abandon`."""
        self.checkpointer.abandon()
        self.wake()

    async def writer_free(self) -> None:
        """Wait (cancellably) until the writes handed over so far are done."""
        writer = self._writer
        if writer is not None:
            await writer.submit(_noop).wait_cancellable()

    async def drain(
        self, *, abandon_on_cancel: bool = False, grace_secs: float = _ABANDON_GRACE_SECS, promotion: bool = True
    ) -> None:
        """Wait until every write handed to the writer so far is committed (or failed).

        With ``abandon_on_cancel`` (the stop's waits, bounded by its deadline), a
        cancellation abandons the writes in flight and waits at most ``grace_secs`` more
        for the writer to remove their files (what it leaves, the next start removes).
        ``promotion``: the copy of a restored RAM checkpoint to disk too.
        """
        # hand-offs made by step-boundary jobs are queued on the loop by now; at a boundary,
        # not as an ordinary job, which would wait for a running run_loop to end
        # (at a stop, a step thread still busy after the final phase is stuck, in a wait for
        # data, say: it hands nothing off in time, and the stop does not wait for it)
        step_thread = self.ctx.step_thread
        if not (abandon_on_cancel and step_thread.busy):
            await step_thread.submit_at_boundary(_noop).wait()
        self._stepped.set()  # a promotion waiting for the first step is waited for: now
        for thread in (self._writer, self._promoter) if promotion else (self._writer,):
            if thread is None:
                continue
            done = thread.submit(_noop)
            if abandon_on_cancel:
                await done.wait(self.abandon, grace_secs=grace_secs)
            else:
                await done.wait()

    async def save(self, reason: SaveReason, *, force: bool = False, wait: bool = False) -> CheckpointInfo | None:
        """Snapshot at the next step boundary and write it in the background.

        Args:
            reason: why (``timer``, ``startup``, ``save_now``, ``final``), for logs.
            force: queue behind a write in flight instead of skipping.
            wait: return only once the checkpoint is committed.

        Returns:
            The committed checkpoint when ``wait``, else ``None``.
        """
        if reason == "final":
            return await self._final(force=force, wait=wait)
        return await self._save(reason, force=force, wait=wait)

    async def _final(self, *, force: bool, wait: bool) -> CheckpointInfo | None:
        """The final save, the retry of a background write that failed (counted as one,
        ``SAVE_RETRY``): the writes in flight end first, so that whether one failed is
        known whatever the timing. A failure past the retries is raised after the final
        save was still attempted; one the final save retried is not (logged
        ``checkpoint.retrying``: a transient error cost one checkpoint, not the training)."""
        await self.drain(abandon_on_cancel=True, promotion=False)
        pending = self._take_error()
        exhausted = pending is not None and not self._retry(pending, "final")
        info = await self._save("final", force=force, wait=wait)
        if exhausted and pending is not None:
            raise pending
        return info

    async def _save(self, reason: SaveReason, *, force: bool, wait: bool) -> CheckpointInfo | None:
        if reason != "ram":  # a disk save's error is for the disk's saves to raise
            self.raise_pending()
        if reason == "timer" and self.when_busy == "wait" and not force:
            with self._lock:
                busy = self._in_flight > 0
            if busy:  # coalesce: one save once the writer is free (missed ticks are dropped)
                t0 = time.perf_counter()
                await self.writer_free()
                log.info(
                    "checkpoint.waited",
                    reason=reason,
                    step=self.ctx.global_step,
                    secs=round(time.perf_counter() - t0, 4),
                )
                self.raise_pending()
            force = True
        launched = _Launched(self.ctx.loop.waiter()) if wait else None
        step = await self.ctx.step_thread.submit_at_boundary(self._snapshot, reason, force=force, keep=launched).wait()
        if step is None or not wait:
            if wait:  # this step is saved already, or being written
                await self.drain(abandon_on_cancel=reason == "final")
                self.raise_pending()
                return self.checkpointer.last
            return None
        # the snapshot job handed the write over before it returned
        assert launched is not None
        if not launched.handed:  # the writer thread was already closed
            self.raise_pending()
            return None
        waiter = launched.waiter
        if reason == "final":  # bounded by the stop's deadline: abandoned when it comes
            info: CheckpointInfo | None = await waiter.wait(self.abandon, grace_secs=_ABANDON_GRACE_SECS)
        else:
            info = await waiter.wait()
        self.raise_pending()
        return info

    async def aclose(self) -> None:
        """At stop: wait for writes in flight (abandoned at the stop's deadline); raise an
        error none has raised yet."""
        await self.drain(abandon_on_cancel=True, grace_secs=0.0)  # the closers' deadline is the wind-down's end
        self.raise_pending()


class CheckpointService(Service):
    """Saves at each tick of the cadence's timer (and once at start-up after an init).

    The saver's :class:`._cadence.Cadence` says when: the interval between ticks (fixed,
    or adaptive: read again once each timed save is committed, the next tick that long
    after the last one, at once if that is past) and whether each tick and the start-up
    save are due.

    Args:
        saver: the session's save coordinator.
        save_at_start: take a checkpoint right away (the cadence's ``"startup"``
            moment, asked as the session starts).
        cadence: the timer's cadence (``None``: the saver's); the RAM tier's service has
            its own.
        reason: what each tick's save is (``"timer"``; ``"ram"``: the RAM tier's service,
            named ``checkpoint_ram``).
    """

    name = "checkpoint"
    restart = SAVE_RETRY  # a failed timed save: the service restarts, the next tick retries

    def __init__(
        self,
        saver: CheckpointSaver,
        *,
        save_at_start: bool,
        cadence: Cadence | None = None,
        reason: SaveReason = "timer",
    ) -> None:
        self.saver = saver
        self.cadence = saver.cadence if cadence is None else cadence
        self.save_at_start = save_at_start
        self.reason: SaveReason = reason
        if reason == "ram":
            self.name = "checkpoint_ram"

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Take the start-up checkpoint, then one per tick until cancelled."""
        if self.save_at_start:
            await self.saver.save("startup", force=True)
            self.save_at_start = False  # a restart of this service must not redo it
        task_status.started()
        ctx.set_service_state(self.name, "running")
        if self.cadence.adaptive:
            await self._adaptive_ticks(ctx)
            return
        interval = self.cadence.interval_secs()
        if math.isinf(interval):
            return
        first = ctx.clock.now() + interval
        async for _ in interval_ticks(ctx.clock, interval, first_at=first):
            await self._tick()

    async def _tick(self) -> None:
        if self.cadence.due("tick"):
            await self.saver.save(self.reason)

    async def _adaptive_ticks(self, ctx: ServiceContext) -> None:
        cadence = self.cadence
        secs = cadence.interval_secs()
        next_at = ctx.clock.now() + secs
        while True:
            halfway = next_at - secs / 2
            if halfway > ctx.clock.now():  # the step rate from here on is the next save's baseline
                await ctx.clock.sleep_until(halfway)
                cadence.sample_baseline()
            await ctx.clock.sleep_until(next_at)
            await self._tick()
            await self.saver.writer_free()  # this save's measured cost sets the next interval
            secs = cadence.interval_secs()
            next_at = max(next_at + secs, ctx.clock.now())
