"""The goodput part of a session: the run's ledger across restarts, kept by the chief.

At start-up (on the step thread) the part reads ``asupervisor-goodput.json`` from the
logdir; once the session has restored, it carries the run's totals over to this segment
(:func:`._ledger.resume`: the time lost between the segments, the steps to be done
again). From then on ``status().goodput`` (``SessionAttribute.goodput``), the Prometheus
text and the TensorBoard scalars (``goodput/*``, at each summary) show the run's totals
with this segment's figures (``ctx.time_account``) added. The chief rewrites the file
(atomically, on its own thread ``asv-goodput``) when the session starts, at each
checkpoint commit, every ``save_summaries_secs`` of wall time (the part's own clock, not
the session's: the ledger measures wall time, and a test moving the session's clock by
hand moves the saves and summaries only), and at the end of the session (its last job,
with the stop reason), never per step. A ledger that cannot be read is logged
and the run counted afresh; one that cannot be written is logged, never a training's
error. Never imports another feature.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from .._core._abc import SessionAttribute, SessionPart
from .._core._clock import Clock, MonotonicClock
from .._core._services import Service, engine_context
from .._logging import describe, get_logger
from ._ledger import LEDGER_FILE, Totals, read_ledger, remove_leftovers, resume, write_ledger

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from .._core._abc import SessionContext
    from .._core._services import ServiceContext
    from .._core._status import Goodput

__all__ = ["GoodputPart"]

log = get_logger(__name__)


class GoodputPart(SessionPart):
    """The run's goodput ledger (see the module docstring).

    Args:
        logdir: where the ledger is kept (``None``: nowhere; this segment alone is shown).
        is_chief: only the chief reads and writes the ledger.
        interval_secs: ``save_summaries_secs``: how often the ledger is rewritten besides
            at commits and at the end (0: only then).
        clock: the clock of that interval (the event loop's by default).
    """

    name = "goodput"

    def __init__(
        self, logdir: str | Path | None, *, is_chief: bool, interval_secs: float, clock: Clock | None = None
    ) -> None:
        self.clock: Clock = MonotonicClock() if clock is None else clock
        self.path = None if logdir is None or not is_chief else Path(logdir) / LEDGER_FILE
        self.interval_secs = interval_secs
        self._ctx: SessionContext | None = None
        self._previous: Totals | None = None
        self._base: Totals | None = None  # the previous segments', once this one restored
        self._write_lock = threading.Lock()
        self._committed: anyio.Event | None = None
        self._final: Totals | None = None  # the totals at the session's end

    def start(self, ctx: SessionContext) -> None:
        """Keep the session (its time account and step count)."""
        self._ctx = ctx
        self._previous = self._base = self._final = None

    def extra_attributes(self, ctx: SessionContext) -> Mapping[Any, Callable[[], Any]]:
        """``goodput``: the run's totals now."""
        return {SessionAttribute.goodput: self.goodput}

    def restore(self, ctx: SessionContext, *, recovering: bool = False) -> str | None:
        """On the step thread at start-up: read the ledger the run's earlier segments left."""
        if self.path is not None and not recovering:
            try:
                self._previous = read_ledger(self.path)
            except (OSError, ValueError) as exc:
                log.warning(
                    "goodput.ledger_unreadable", path=str(self.path), error=describe(exc), action="counted afresh"
                )
        return None

    def services(self, ctx: SessionContext) -> Iterable[Service]:
        """Once restored: the run's totals carried over; the chief's ledger writer."""
        previous = self._previous
        base = self._base = resume(previous, started_at=ctx.time_account.started_at, restored_step=ctx.global_step)
        if previous is not None:
            log.info(
                "goodput.resumed",
                restarts=base.restarts,
                redone_steps=base.redone_steps - previous.redone_steps,
                wall_secs=round(base.wall_secs, 3),
            )
        return [] if self.path is None else [LedgerService(self)]

    def totals(self, *, ended: str | None = None) -> Totals:
        """Any thread: the run's totals now (``ended``: the stop reason, at the end)."""
        if self._final is not None:
            return self._final
        ctx = self._ctx
        assert ctx is not None, "the goodput part is used before its session started"
        times = ctx.time_account
        base = self._base
        if base is None:  # still starting: this segment alone
            base = resume(None, started_at=times.started_at, restored_step=times.start_step)
        return base.add(times.segment(ctx.control.reason), step=ctx.global_step, ended=ended)

    def goodput(self) -> Goodput:
        """Any thread: ``status().goodput``."""
        return self.totals().goodput()

    def scalars(self) -> Mapping[str, float]:
        """For TensorBoard at each summary: the ratio, the wall and productive seconds, and
        each cause's seconds (``goodput/badput/<cause>``)."""
        if self._ctx is None:
            return {}
        g = self.goodput()
        out = {
            "goodput/ratio": g.goodput,
            "goodput/wall_secs": g.wall_secs,
            "goodput/productive_secs": g.productive_secs,
        }
        out.update({f"goodput/badput/{cause}": secs for cause, secs in g.badput.items()})
        return out

    def write(self, *, ended: str | None = None) -> None:
        """Not on the loop: rewrite the ledger with the totals now; an error is raised."""
        assert self.path is not None
        with self._write_lock:
            write_ledger(self.path, self.totals(ended=ended))

    def release(self) -> None:
        """The session's last job: the totals fixed, the ledger's final write with the
        stop reason (not after a failed start: the logdir may be another training's)."""
        ctx = self._ctx
        if self._base is None or ctx is None:
            return
        final = self.totals(ended=ctx.control.reason or "completed")
        self._final = final  # status() after the session: these totals, no longer growing
        if self.path is None:
            return
        try:
            with self._write_lock:
                write_ledger(self.path, final)
        except OSError as exc:
            log.error("goodput.write_failed", path=str(self.path), error=describe(exc))
        else:
            log.info("goodput.recorded", goodput=round(final.goodput().goodput, 4), wall_secs=round(final.wall_secs, 3))

    def _wake(self) -> None:
        """On the loop: a checkpoint was committed."""
        if self._committed is not None:
            self._committed.set()


class LedgerService(Service):
    """Rewrites the ledger at start, at each checkpoint commit and every ``interval_secs``,
    on a thread of its own; a failed write is logged and tried again at the next."""

    name = "goodput"
    restart = None  # it never fails: write errors are logged

    def __init__(self, part: GoodputPart) -> None:
        self.part = part

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Write once now, then at each commit or tick, until cancelled."""
        part = self.part
        engine = engine_context(ctx)
        thread = engine.new_thread("asv-goodput")
        assert part._ctx is not None
        checkpoints = part._ctx.extra(SessionAttribute.checkpoints, None)
        if checkpoints is not None:
            loop = engine.loop

            def committed() -> None:  # on the committing thread: it must not block
                loop.call_if_running(part._wake)

            checkpoints.on_commit(committed)
        task_status.started()
        ctx.set_service_state(self.name, "running")
        every, clock = part.interval_secs, part.clock
        assert part.path is not None
        try:  # the session owns the logdir by now
            await thread.call(remove_leftovers, part.path)
        except OSError as exc:
            log.warning("goodput.leftover_kept", path=str(part.path), error=describe(exc))
        while True:
            part._committed = anyio.Event()  # a commit from now on: another write
            try:
                await thread.call(part.write)
            except OSError as exc:
                log.error("goodput.write_failed", path=str(part.path), error=describe(exc))
            event = part._committed
            async with anyio.create_task_group() as tg:
                if every > 0:

                    async def tick(deadline: float = clock.now() + every) -> None:
                        await clock.sleep_until(deadline)
                        tg.cancel_scope.cancel()

                    tg.start_soon(tick)
                await event.wait()
                tg.cancel_scope.cancel()
