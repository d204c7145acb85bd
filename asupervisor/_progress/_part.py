"""The progress display: one line updated in place on a terminal, plain lines elsewhere.

``Supervisor(progress=True)`` adds a :class:`ProgressPart`. Its service reads the
session's status on the event loop every ``interval_secs`` (step, ``max_steps``,
steps/sec, ETA, the step output's scalars such as ``loss``, the last checkpoint) and hands
the text to a dedicated thread that writes it, so a slow terminal never blocks the event
loop and nothing runs on the step thread (the scalars are the status's, read at a step
boundary at most once a second). On a terminal the line is rewritten in place (``\\r``,
cut to the terminal's width) and the newest checkpoint at each refresh gets a line of its own; when the
stream is not a terminal (a pipe, a file) a plain line is written every
``plain_every_secs``. The first Ctrl-C prints how the stop goes on. Writing errors (a
closed pipe) drop the output, never the training.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING

from .._core._abc import SessionPart
from .._core._clock import interval_ticks
from .._core._services import Service

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from .._core._abc import SessionContext
    from .._core._services import ServiceContext
    from .._core._status import Status
    from .._core._threads import DedicatedThread

__all__ = ["ProgressPart", "render"]


def _fmt_secs(secs: float) -> str:
    secs = int(secs)
    h, rest = divmod(secs, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def render(status: Status) -> str:
    """The progress line of ``status`` (no newline)."""
    step = f"step {status.global_step}" + (f"/{status.max_steps}" if status.max_steps is not None else "")
    parts = [step]
    if status.epoch is not None:  # as Keras shows it: the pass in progress, 1-based
        shown = status.epoch + 1 if status.epochs is None else min(status.epoch + 1, status.epochs)
        parts.insert(0, f"epoch {shown}" + (f"/{status.epochs}" if status.epochs is not None else ""))
        if status.epoch_step is not None and status.steps_per_epoch:
            parts.append(f"({status.epoch_step}/{status.steps_per_epoch})")
    if status.steps_per_sec:
        parts.append(f"{status.steps_per_sec:.1f} steps/s")
    for name, value in sorted(status.metrics.items())[:4]:
        parts.append(f"{name} {value:.4g}")
    if status.eta_secs is not None:
        parts.append(f"ETA {_fmt_secs(status.eta_secs)}")
    if status.last_checkpoint is not None:
        parts.append(f"saved @{status.last_checkpoint.step}")
    return "  ".join(parts)


class _Output:
    """Writes to a stream on the progress thread; a failing stream is dropped."""

    def __init__(self, stream: IO[str], in_place: bool) -> None:
        self.stream: IO[str] | None = stream
        self.in_place = in_place
        self._shown = 0  # width of the line shown in place

    def write(self, text: str, keep: bool) -> None:
        stream = self.stream
        if stream is None:
            return
        try:
            if self.in_place:
                width = max(20, shutil.get_terminal_size().columns - 1)
                line = text[:width]
                pad = " " * max(0, self._shown - len(line))
                stream.write("\r" + line + pad + ("\n" if keep else ""))
                self._shown = 0 if keep else len(line)
            else:
                stream.write(text + "\n")
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: the display stops
            self.stream = None


class _ProgressService(Service):
    name = "progress"

    def __init__(self, part: ProgressPart, ctx: SessionContext) -> None:
        self.part = part
        self.session = ctx

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        part = self.part
        task_status.started()
        ctx.set_service_state(self.name, "running")
        start = ctx.clock.now()
        last_plain = start
        async for now in interval_ticks(ctx.clock, part.interval_secs, first_at=start + part.interval_secs):
            status = self.session.status()
            checkpoint = status.last_checkpoint
            if checkpoint is not None and checkpoint.step != part.last_checkpoint_step:
                part.last_checkpoint_step = checkpoint.step
                part.emit(f"checkpoint at step {checkpoint.step}: {checkpoint.path}", keep=True)
            if part.output is not None and (part.output.in_place or now - last_plain >= part.plain_every_secs):
                last_plain = now
                part.emit(render(status), keep=not part.output.in_place)


class ProgressPart(SessionPart):
    """The progress display of one session (see the module docstring).

    Args:
        stream: where to write (``sys.stderr`` by default: standard output stays the
            program's).
        interval_secs: how often the line is refreshed.
        plain_every_secs: how often a plain line is written when the stream is not a
            terminal.
    """

    name = "progress"

    def __init__(
        self, stream: IO[str] | None = None, *, interval_secs: float = 0.5, plain_every_secs: float = 10.0
    ) -> None:
        self.stream = stream
        self.interval_secs = interval_secs
        self.plain_every_secs = plain_every_secs
        self.output: _Output | None = None
        self.last_checkpoint_step: int | None = None
        self._thread: DedicatedThread | None = None
        self._ctx: SessionContext | None = None
        self._told_stop = False

    def start(self, ctx: SessionContext) -> None:
        """Open the output on its own thread."""
        stream = self.stream if self.stream is not None else sys.stderr
        is_tty = getattr(stream, "isatty", None)
        self.output = _Output(stream, in_place=bool(is_tty and is_tty()))
        self._thread = ctx.new_thread("asv-progress")
        self._ctx = ctx

    def services(self, ctx: SessionContext) -> Iterable[Service]:
        """The service refreshing the display."""
        return [_ProgressService(self, ctx)]

    def wake(self) -> None:
        """At a stop (any thread): the first Ctrl-C says how the stop goes on."""
        ctx = self._ctx
        if ctx is None or self._told_stop or ctx.control.reason != "signal:SIGINT":
            return
        self._told_stop = True
        self.emit(
            f"stopping gracefully — final checkpoint at step {ctx.global_step}; Ctrl-C again to abandon it",
            keep=True,
        )

    async def aclose(self, ctx: SessionContext) -> None:
        """A last line: where the session ended."""
        status = ctx.status()
        self.emit(render(status) + f"  stopped ({status.stop_reason})", keep=True)

    def emit(self, text: str, *, keep: bool) -> None:
        """Hand ``text`` to the progress thread (any thread; never blocks)."""
        thread, output = self._thread, self.output
        if thread is None or output is None:
            return
        try:
            thread.submit_nowait(output.write, text, keep)
        except Exception:  # the thread is closing: the line is dropped
            return
