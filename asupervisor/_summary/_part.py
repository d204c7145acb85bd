"""The summary part of a session: the event-file writer, the summary and step-counter services.

On the chief with a ``logdir`` the part opens the session's :class:`SummaryWriter` as the
session is entered (so hooks find it from ``after_create_session`` on) and offers it as
``SessionAttribute.summary_writer``; it closes it in the ``aclose`` phase. With
``save_summaries_secs > 0`` it runs the step counter (``global_step/sec``, kept for
``status().steps_per_sec`` and written to the event file) and, with a writer, the summary
service. Never imports another feature.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core._abc import SessionAttribute, SessionPart
from ._step_counter import StepCounterService
from ._writer import SummaryService, SummaryWriter

if TYPE_CHECKING:
    from .._core._abc import SessionContext
    from .._core._services import Service

__all__ = ["SummaryPart"]


class SummaryPart(SessionPart):
    """Summaries of one session (see the module docstring).

    Args:
        logdir: where event files go (``None``: no writer).
        is_chief: only the chief writes summaries.
        interval_secs: ``save_summaries_secs`` (0: no step counter, no summary service).
    """

    name = "summary"

    def __init__(self, logdir: str | Path | None, *, is_chief: bool, interval_secs: float) -> None:
        self.logdir = None if logdir is None else Path(logdir)
        self.is_chief = is_chief
        self.interval_secs = interval_secs
        self.writer: SummaryWriter | None = None
        #: the step counter's last measurement (``None`` before the first)
        self.steps_per_sec: float | None = None

    def start(self, ctx: SessionContext) -> None:
        """Open the event-file writer (chief with a logdir) on its own thread."""
        self.steps_per_sec = None
        if self.logdir is not None and self.is_chief:
            self.writer = SummaryWriter(self.logdir, ctx.new_thread("asv-summary"), ctx)

    def extra_attributes(self, ctx: SessionContext) -> Mapping[Any, Callable[[], Any]]:
        """``steps_per_sec`` always; ``summary_writer`` when there is one."""
        attributes: dict[Any, Callable[[], Any]] = {SessionAttribute.steps_per_sec: lambda: self.steps_per_sec}
        writer = self.writer
        if writer is not None:
            attributes[SessionAttribute.summary_writer] = lambda: writer
        return attributes

    def services(self, ctx: SessionContext) -> Iterable[Service]:
        """The step counter and, with a writer, the summary service."""
        if self.interval_secs <= 0:
            return []
        services: list[Service] = [StepCounterService(self.interval_secs, self._on_rate)]
        if self.writer is not None:
            services.append(SummaryService(self.interval_secs, self.writer, ctx))
        return services

    def _on_rate(self, step: int, rate: float) -> None:
        self.steps_per_sec = rate
        if self.writer is not None:
            self.writer.write(step, {"global_step/sec": rate})

    async def aclose(self, ctx: SessionContext) -> None:
        """One last summary of the steps since the last tick; the event file closed."""
        if self.writer is not None:
            await self.writer.aclose()
