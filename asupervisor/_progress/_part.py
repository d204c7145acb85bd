"""The progress display: one line updated in place on a terminal, plain lines elsewhere.

``Supervisor(progress=True)`` adds a :class:`ProgressPart`. Its service reads the
session's status on the event loop every ``interval_secs`` (step, ``max_steps``,
steps/sec, ETA, the step output's scalars such as ``loss``, the last checkpoint saved;
``resumed at step N`` once, when the session restored one) and hands
the text to a dedicated thread that writes it, so a slow terminal never blocks the event
loop and nothing runs on the step thread (the scalars are the status's, read at a step
boundary at most once a second). On a terminal the line is rewritten in place (``\\r``,
cut to the terminal's width) and the newest checkpoint at each refresh gets a line of its own; when the
stream is not a terminal (a pipe, a file) a plain line is written every
``plain_every_secs``. The first Ctrl-C prints how the stop goes on, a second one what
it abandons. Writing errors (a closed pipe) drop the output, never the training.

The display is the console of its stream (``_logging.add_console``): the log lines of
asupervisor's handlers writing to the same file go above the live line (it is cleared,
the line written, the live line redrawn below), every write to that file under one lock,
taken by a logging thread for at most a second (a stalled display never blocks a save or
a stop: the line is then written directly). One event, one line: the Ctrl-C lines are
the display's (the log's ``session.signal`` and ``session.stop_requested`` that follow
them are not printed on that file, nor, after a second one, ``checkpoint.abandoned``); a checkpoint
and the session's end are the log's when a log handler prints ``checkpoint.saved`` and
``session.stopped`` on that file, otherwise the display's.
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import IO, TYPE_CHECKING, Any

from .._core._abc import SessionAttribute, SessionPart
from .._core._clock import interval_ticks
from .._core._services import Service
from .._logging import add_console, remove_console, shown_on

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from .._core._abc import SessionContext
    from .._core._services import ServiceContext
    from .._core._status import CheckpointInfo, Status
    from .._core._threads import DedicatedThread

__all__ = ["ProgressPart", "render"]

#: erase to the end of the line (ANSI EL)
_CLEAR = "\x1b[K"
#: the longest a logging thread waits for the display's writer before writing directly
_LOCK_WAIT_SECS = 1.0
#: the loggers of the events a log line may report instead of the display
_CHECKPOINT_LOGGER = "asupervisor._checkpoint._manager"  # checkpoint.saved
_SESSION_LOGGER = "asupervisor._core._runtime"  # session.stopped
_RESTORE_LOGGER = "asupervisor._checkpoint._part"  # session.restored


def _fmt_secs(secs: float) -> str:
    secs = int(secs)
    h, rest = divmod(secs, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def render(status: Status, restored: CheckpointInfo | None = None) -> str:
    """The progress line of ``status`` (no newline); ``restored``: the checkpoint the
    session resumed from, never shown as a save."""
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
    if status.last_checkpoint is not None and status.last_checkpoint != restored:
        parts.append(f"saved @{status.last_checkpoint.step}")
    return "  ".join(parts)


class _Output:
    """The display's writes to its stream, and the console of that stream (log lines
    above the live line); every write under one lock. A failing stream is dropped."""

    def __init__(self, stream: IO[str], in_place: bool) -> None:
        self.stream: IO[str] | None = stream
        self.in_place = in_place
        self.live: str | None = None  # the live line shown in place (cut to the width)
        self._lock = threading.Lock()
        self.claimed: set[str] = set()  # events the display reports itself

    def write(self, text: str, keep: bool, final: bool = False) -> None:
        """On the progress thread: the live line (``keep=False``, in place), or a line of
        its own (above the live line, which is redrawn unless ``final``)."""
        with self._lock:
            stream = self.stream
            if stream is None:
                return
            try:
                if not self.in_place:
                    out = text + "\n"
                elif keep:
                    out = "\r" + text + _CLEAR + "\n"
                    if final:
                        self.live = None
                    elif self.live is not None:
                        out += self.live + _CLEAR
                else:
                    # room for the terminal's echo of ^C after the line: it must not wrap
                    width = max(20, shutil.get_terminal_size().columns - 3)
                    self.live = text[:width]
                    out = "\r" + self.live + _CLEAR
                stream.write(out)
                stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: the display stops
                self.stream = None
                self.live = None

    # -- the console (``_logging.Console``): any thread --------------------------------

    def write_above(self, line: str) -> bool:
        if not self._lock.acquire(timeout=_LOCK_WAIT_SECS):
            return False  # the display's writer is stuck: the caller writes the line itself
        try:
            stream = self.stream
            if stream is None:
                return False
            if self.in_place:
                live = self.live
                stream.write("\r" + _CLEAR + line + "\n" + (live + _CLEAR if live is not None else ""))
            else:
                stream.write(line + "\n")
            stream.flush()
            return True
        finally:
            self._lock.release()

    def claims(self, event: str, fields: Mapping[str, Any]) -> bool:
        return event in self.claimed


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
        part.resumed(self.session)
        async for now in interval_ticks(ctx.clock, part.interval_secs, first_at=start + part.interval_secs):
            status = self.session.status()
            checkpoint = status.last_checkpoint
            if checkpoint is not None and checkpoint.step != part.last_checkpoint_step:
                part.last_checkpoint_step = checkpoint.step
                if not part.log_shows(_CHECKPOINT_LOGGER):  # else checkpoint.saved is its line
                    part.emit(f"checkpoint at step {checkpoint.step}: {checkpoint.path}", keep=True)
            if part.output is not None and (part.output.in_place or now - last_plain >= part.plain_every_secs):
                last_plain = now
                part.emit(render(status, part.restored), keep=not part.output.in_place)


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
        #: the checkpoint the session resumed from (shown once, never as a save)
        self.restored: CheckpointInfo | None = None
        self._thread: DedicatedThread | None = None
        self._ctx: SessionContext | None = None
        self._told_stop = False
        self._told_again = False

    def start(self, ctx: SessionContext) -> None:
        """Open the output on its own thread; become the console of its stream."""
        stream = self.stream if self.stream is not None else sys.stderr
        is_tty = getattr(stream, "isatty", None)
        try:
            in_place = bool(is_tty and is_tty())
        except (OSError, ValueError):  # a closed stream
            in_place = False
        self.output = _Output(stream, in_place=in_place)
        self._thread = ctx.new_thread("asv-progress")
        self._ctx = ctx
        add_console(stream, self.output)

    def resumed(self, ctx: SessionContext) -> None:
        """Once, as the services start: ``resumed at step N`` when the session restored a
        checkpoint (unless the log prints ``session.restored`` on the same file); that
        checkpoint is never listed as a save."""
        checkpoints = ctx.extra(SessionAttribute.checkpoints, None)
        status = ctx.status()
        if checkpoints is None or checkpoints.restored_from is None or status.last_checkpoint is None:
            return
        self.restored = status.last_checkpoint
        self.last_checkpoint_step = self.restored.step
        if not self.log_shows(_RESTORE_LOGGER):
            self.emit(f"resumed at step {status.global_step} from {checkpoints.restored_from}", keep=True)

    def log_shows(self, logger_name: str) -> bool:
        """Whether an info event of ``logger_name`` is printed on the display's file."""
        output = self.output
        return output is not None and output.stream is not None and shown_on(output.stream, logger_name, logging.INFO)

    def services(self, ctx: SessionContext) -> Iterable[Service]:
        """The service refreshing the display."""
        return [_ProgressService(self, ctx)]

    def wake(self) -> None:
        """At a stop (any thread): the first signal says how the stop goes on, a second
        one what it abandons. The session tells which (``signalled``: the first signal's
        name; ``hurried``: a second came; read with ``getattr``, not in the Protocol)."""
        ctx, output = self._ctx, self.output
        name = getattr(ctx, "signalled", None)
        if ctx is None or output is None or not isinstance(name, str):
            return
        key = "Ctrl-C" if name == "SIGINT" else name
        if getattr(ctx, "hurried", False):
            if not self._told_again:
                self._told_again = self._told_stop = True
                # the session logs these right after: this line says them
                output.claimed.update(("session.signal", "session.stop_requested", "checkpoint.abandoned"))
                self.emit(_second_signal_line(ctx, key), keep=True)
            return
        if self._told_stop:
            return
        self._told_stop = True
        output.claimed.update(("session.signal", "session.stop_requested"))
        if ctx.logdir is None:
            text = f"stopping gracefully at step {ctx.global_step}; {key} again to stop at once"
        else:
            text = f"stopping gracefully — final checkpoint at step {ctx.global_step}; {key} again to abandon it"
        self.emit(text, keep=True)

    async def aclose(self, ctx: SessionContext) -> None:
        """A last line: where the session ended (and why, unless ``session.stopped`` is
        printed on the same file)."""
        status = ctx.status()
        why = "" if self.log_shows(_SESSION_LOGGER) else f"  stopped ({status.stop_reason})"
        thread, output = self._thread, self.output
        if thread is None or output is None:
            return
        try:
            thread.submit_nowait(output.write, render(status, self.restored) + why, True, True)
        except Exception:  # the thread is closing: the line is dropped
            return

    def ended(self) -> None:
        """The session's end, its signal handlers given back: log lines go straight to the
        stream again. Not at ``release``: a second signal between the two is still the
        session's, and its display line must still stand for its log line."""
        if self.output is not None:
            remove_console(self.output)

    def emit(self, text: str, *, keep: bool) -> None:
        """Hand ``text`` to the progress thread (any thread; never blocks)."""
        thread, output = self._thread, self.output
        if thread is None or output is None:
            return
        try:
            thread.submit_nowait(output.write, text, keep)
        except Exception:  # the thread is closing: the line is dropped
            return


def _second_signal_line(ctx: SessionContext, key: str) -> str:
    """What a second signal does: the final checkpoint is abandoned (unless committed)."""
    if ctx.logdir is None:
        return f"second {key}: stopping now"
    last = ctx.status().last_checkpoint
    if last is not None and last.step >= ctx.global_step:
        return f"second {key}: stopping now; the final checkpoint (step {last.step}) is committed"
    latest = (
        f"the latest committed checkpoint is step {last.step}" if last is not None else "no checkpoint was committed"
    )
    return f"second {key}: abandoning the final checkpoint; {latest}"
