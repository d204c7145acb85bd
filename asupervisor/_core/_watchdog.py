"""The hang watchdog: per-phase deadlines learned from observed durations.

A session's :class:`Watchdog` runs one loop on its own dedicated thread (``asv-watchdog``,
joined with the others at the end). It reads slots that the rest of the session writes
cheaply, and never takes a lock on the step thread's path:

* :class:`Beat` — the step loop's one float: ``> 0`` a step in flight since then, ``< 0``
  a wait in ``next(iterator)`` since then, ``0`` neither (three attribute writes a step);
* :class:`Mark` — a phase another piece of the session is in (``restore``, ``snapshot``, ``save``,
  ``barrier``: a multi-worker snapshot), with a progress counter (chunks written) that
  its owner bumps: a phase whose counter advances is slow, not stuck.

Each phase's deadline is ``max(floor_secs, factor x p99)`` of the durations observed
(completed phases only: the steps' and input waits' means between two polls, each mark's
whole duration); before anything is learned, for the first step and wait of each
``run_loop`` (tracing, compiling, a shuffle buffer), and for a step during which Python
code was seen running on the step thread (a retrace), ``unlearned_secs``. The p99s are
kept beside the checkpoints in ``asupervisor-watchdog.json`` (written atomically by the
chief after commits and at the end) and read at the next start-up, so a restarted
training starts with them.

On a breach: ``hang.detected`` (phase, step, secs, deadline_secs), every thread's stack
(``hang.stack``), the seconds as ``hang`` badput, the state marked suspect (no final
checkpoint of a state mid-step) and a stop with reason ``hang:<phase>``; if the session
has not ended ``exit_after_secs`` later, the process ends with ``os._exit(EXIT_HANG)``.
A log that cannot be written (a full pipe nobody reads, a hung log file system) does not
keep it alive: ``_LAST_RESORT_SECS`` after that the process ends unflushed, from a thread
armed before anything was logged.

This module imports nothing above ``_core`` and never TensorFlow (but
:func:`collective_options`, lazily).
"""

from __future__ import annotations

import collections
import json
import math
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .._logging import describe, get_logger
from ._exit import exit_now
from ._files import replace_file
from ._goodput import HANG
from ._status import EXIT_HANG
from ._threads import current_frames

if TYPE_CHECKING:
    from ._goodput import TimeAccount

__all__ = ["LEARNED_FILE", "PHASES", "Beat", "Mark", "Watchdog", "WatchdogOptions", "collective_options"]

log = get_logger(__name__)

#: the learned p99s, beside the checkpoints in the logdir
LEARNED_FILE = "asupervisor-watchdog.json"
#: the phases a deadline is learned for
PHASES = ("step", "input", "snapshot", "save", "restore", "barrier")
_SAMPLES = 256  # durations kept per phase (the newest)
#: after ``exit_after_secs``, how long the hang's exit may take to log and flush before the
#: process is ended without them (a blocked log write must not keep a hung process alive)
_LAST_RESORT_SECS = 5.0
#: in a multi-worker training, the least a step's or a barrier's deadline is by default
#: (``WatchdogOptions.peer_secs``): a peer that died, or stopped (SIGSTOP), is TensorFlow's
#: to notice (its coordination service's heartbeats, 10 s), which ends the job with the
#: lost task named (exit 75, restart every task); a deadline under that would race it and
#: name a hang instead. A peer alive but stuck (heartbeating) is the watchdog's to name.
PEER_SECS = 30.0


@dataclass(frozen=True, kw_only=True)
class WatchdogOptions:
    """The hang watchdog's settings: ``Supervisor(stop=asv.StopOptions(watchdog=...))``.

    A phase (``step``, ``input``, ``snapshot``, ``save``, ``restore``, ``barrier``) that makes no
    progress for longer than its deadline, ``max(floor_secs, factor x`` its observed
    p99\\ ``)``, is a hang: it is logged with every thread's stack and the process ends
    with ``asv.EXIT_HANG`` (124). See ``docs/watchdog.md``.

    Attributes:
        enabled: whether the watchdog runs (``False``: the one switch that turns it off).
        floor_secs: the shortest deadline of any phase.
        factor: how many times a phase's observed p99 its deadline is.
        unlearned_secs: the deadline of a phase nothing is learned for yet, and of the
            first step and the first wait for data of each ``run_loop`` (tracing,
            compiling, filling a shuffle buffer).
        exit_after_secs: after the stop a hang requested, how long the session may take
            to end before the process is ended (``os._exit``); ``None``: never (the stop
            alone, for an application that embeds the training).
        peer_secs: in a multi-worker training, the shortest deadline of a step or a
            barrier (a collective waiting on a peer). Above TensorFlow's heartbeat timeout
            (10 s), a dead or stopped peer is named lost by TensorFlow (exit 75) and only
            a peer alive but stuck is a hang (124); below it, both are named a hang.

    Raises:
        TypeError: a field has the wrong type (the message names it and the value).
        ValueError: a number is out of range (the message names it and the value).
    """

    enabled: bool = True
    floor_secs: float = 8.0
    factor: float = 4.0
    unlearned_secs: float = 1200.0
    exit_after_secs: float | None = 5.0
    peer_secs: float = PEER_SECS

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise TypeError(f"WatchdogOptions.enabled must be True or False, got {self.enabled!r}")
        for name in ("floor_secs", "factor", "unlearned_secs", "exit_after_secs", "peer_secs"):
            value = getattr(self, name)
            if value is None and name == "exit_after_secs":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"WatchdogOptions.{name} must be a number, got {value!r}")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"WatchdogOptions.{name} must be a finite number > 0, got {value!r}")

    def deadline(self, p99: float | None) -> float:
        """The deadline of a phase whose observed p99 is ``p99`` (``None``: unlearned)."""
        if p99 is None:
            return self.unlearned_secs
        return max(self.floor_secs, self.factor * p99)


class Beat:
    """The step thread's slot (see the module docstring); written by the step loop only."""

    __slots__ = ("at", "first", "ident")

    def __init__(self) -> None:
        #: ``> 0``: a step in flight since (``perf_counter``); ``< 0``: waiting for data
        #: since ``-at``; ``0``: neither
        self.at = 0.0
        #: ``TimeAccount.steps`` when the running ``run_loop`` began: its first step and
        #: wait get ``unlearned_secs``
        self.first = 0
        #: the step thread (``threading.get_ident()``), once a loop ran: whether Python
        #: code is running on it (a retrace), or it waits (a stuck op)
        self.ident: int | None = None


class Mark:
    """One phase in flight (``Watchdog.begin``); ``advance()`` tells it progressed, ``end()``
    that it completed (its duration is learned). A context manager too."""

    __slots__ = ("_dog", "phase", "progress", "seen", "since")

    def __init__(self, dog: Watchdog | None, phase: str, since: float) -> None:
        self._dog = dog
        self.phase = phase
        self.since = since
        self.progress = 0
        #: the watchdog's own: when it last saw ``progress`` change, and the value
        self.seen = (since, 0)

    def advance(self, n: int = 1) -> None:
        """Any thread (the phase's owner): the phase made progress (bytes, chunks)."""
        self.progress += n

    def end(self) -> None:
        """The phase completed: its duration is learned; idempotent."""
        dog, self._dog = self._dog, None
        if dog is not None:
            dog._ended(self)

    def drop(self) -> None:
        """The phase is over but no duration to learn from (it failed, did nothing)."""
        dog, self._dog = self._dog, None
        if dog is not None:
            dog._dropped(self)

    def __enter__(self) -> Mark:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.end()
        else:  # failed: not a duration to learn from
            self.drop()


class Watched(Protocol):
    """What the watchdog reads and calls of the session (``Runtime`` has it)."""

    step: int
    times: TimeAccount
    is_chief: bool

    @property
    def logdir(self) -> Path | None:
        """The logdir, where the learned p99s are kept."""
        ...

    def record_badput(self, cause: str, secs: float = 0.0, *, steps: int = 0) -> None:
        """Count badput in the goodput ledger."""
        ...

    def mark_state_suspect(self) -> None:
        """No more checkpoints of the state."""
        ...

    def request_stop(self, exc: BaseException | None = None, *, reason: str | None = None) -> None:
        """Stop the session."""
        ...


def _p99(samples: collections.deque[float]) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def read_learned(logdir: str | os.PathLike[str] | None) -> dict[str, float]:
    """The p99s kept in ``logdir`` (``{}``: none, or unreadable, which is logged)."""
    if logdir is None:
        return {}
    path = Path(logdir) / LEARNED_FILE
    try:
        data = json.loads(path.read_text())
        p99 = data["p99_secs"]
        return {k: float(v) for k, v in p99.items() if k in PHASES and math.isfinite(float(v)) and float(v) >= 0}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("watchdog.unreadable", path=str(path), error=describe(exc), action="learning afresh")
        return {}


class Watchdog:
    """The watchdog of one session (see the module docstring).

    Args:
        rt: the session.
        options: its settings.
        perf: the interval clock (``time.perf_counter``), injectable for tests.
        exit: ends the process with a status (``os._exit`` after flushing), injectable.
        cluster: a multi-worker training (collectives get ``options.peer_secs`` at least).
    """

    def __init__(
        self,
        rt: Watched,
        options: WatchdogOptions,
        *,
        perf: Callable[[], float] = time.perf_counter,
        exit: Callable[[int], object] | None = None,
        cluster: bool = False,
    ) -> None:
        self.rt = rt
        self.options = options
        self.cluster = cluster
        self.perf = perf
        self._exit = exit if exit is not None else exit_now
        self._hard_exit = exit if exit is not None else os._exit  # (no flush: the last resort)
        self._last_resort: threading.Thread | None = None
        self._watching = False  # run() watches (a test may call check() alone)
        self.beat = Beat()
        self.poll_secs = min(0.5, options.floor_secs / 8)
        self._samples = {phase: collections.deque[float](maxlen=_SAMPLES) for phase in PHASES}
        self._marks: set[Mark] = set()
        self._lock = threading.Lock()  # the marks and the samples (never the step loop's)
        self._stopped = threading.Event()
        self._dirty = False  # learned something since the file was written
        self._commit_seen = False
        self._seen: tuple[int, float, float] = (0, 0.0, 0.0)  # steps, productive, input_wait
        self.breached: str | None = None
        #: the step thread's innermost frame at the last look: (beat.at, where, moved)
        self._frame_seen: tuple[float, tuple[int, int] | None, bool] = (0.0, None, False)

    # -- what the session calls --------------------------------------------------------

    def begin(self, phase: str) -> Mark:
        """Any thread: a ``phase`` (one of :data:`PHASES`) begins now; its :class:`Mark`."""
        if phase not in PHASES:
            raise ValueError(f"a watched phase is one of {', '.join(PHASES)}, got {phase!r}")
        mark = Mark(self, phase, self.perf())
        with self._lock:
            self._marks.add(mark)
        return mark

    def load(self) -> None:
        """On the step thread at start-up: the p99s the last run kept in the logdir."""
        for phase, p99 in read_learned(self.rt.logdir).items():
            self._samples[phase].append(p99)

    def committed(self) -> None:
        """On the committing thread (must not block): the learned file is rewritten soon."""
        self._commit_seen = True

    def deadline(self, phase: str) -> float:
        """Any thread: ``phase``'s deadline now, in seconds (in a cluster, a collective's
        at least ``options.peer_secs``)."""
        with self._lock:
            secs = self.options.deadline(_p99(self._samples[phase]))
        if self.cluster and phase in ("step", "barrier"):
            secs = max(secs, self.options.peer_secs)
        return secs

    def p99s(self) -> dict[str, float]:
        """Any thread: the learned p99 of each phase that has one."""
        with self._lock:
            return {p: v for p, s in self._samples.items() if (v := _p99(s)) is not None}

    def close(self) -> None:
        """Any thread: end the watchdog's loop (it writes what it learned, then returns)."""
        self._stopped.set()

    # -- the watchdog's thread ---------------------------------------------------------

    def run(self) -> None:
        """On ``asv-watchdog``: check every ``poll_secs`` until :meth:`close`."""
        self._watching = True
        try:
            while not self._stopped.wait(self.poll_secs):
                if self.check():
                    self._after_breach()
                    if self._last_resort is not None:  # told, as this loop was: it ends now
                        self._last_resort.join()  # (here, not on the event loop: close())
                    return
                if self._commit_seen:
                    self._commit_seen = False
                    self.save()
            self.save()
        except Exception as exc:  # a watchdog that failed must not end a training
            log.error("watchdog.failed", error=describe(exc))

    def check(self) -> bool:
        """One look at every phase (the loop's body; tests call it with a fake clock):
        learns from what completed; on a breach logs it, stops the session, returns True."""
        now = self.perf()
        rt = self.rt
        times = rt.times
        steps, productive, waited = times.steps, times.productive, times.input_wait
        seen_steps, seen_productive, seen_waited = self._seen
        if steps != seen_steps:
            done, took = steps - seen_steps, productive - seen_productive
            if seen_steps == 0:  # the session's first step (tracing) is not learned from
                done, took = done - 1, took - (times.first_step_secs or 0.0)
            if done > 0:
                with self._lock:
                    self._samples["step"].append(max(0.0, took) / done)
                    self._samples["input"].append(max(0.0, waited - seen_waited) / done)
                self._dirty = True
            self._seen = (steps, productive, waited)
        beat = self.beat
        at = beat.at
        if at != 0.0:
            phase = "step" if at > 0 else "input"
            first = steps == beat.first
            moving = self._python_moving(at)
            deadline = self.options.unlearned_secs if first or moving else self.deadline(phase)
            secs = now - abs(at)
            if secs > deadline:
                return self._breach(phase, secs, deadline)
        with self._lock:
            marks = list(self._marks)
        for mark in marks:
            since, progress = mark.seen
            if mark.progress != progress:
                since, progress = now, mark.progress
                mark.seen = (since, progress)
            deadline = self.deadline(mark.phase)
            secs = now - since
            if secs > deadline:
                return self._breach(mark.phase, secs, deadline)
        return False

    def _python_moving(self, at: float) -> bool:
        """Whether Python code ran on the step thread during the step (or wait) in flight
        since ``at``: its innermost frame changed between two looks. A retrace (a new
        input shape, tracing again) runs Python for seconds to minutes and gets the
        unlearned deadline, as the first step does; a stuck op (a collective waiting on a
        peer, a ``py_function`` waiting on another thread) leaves the frame as it is."""
        ident = self.beat.ident
        frame = None if ident is None else current_frames().get(ident)
        where = None if frame is None else (id(frame.f_code), frame.f_lineno)
        seen_at, seen_where, moved = self._frame_seen
        if seen_at != at:  # another step: start over
            self._frame_seen = (at, where, False)
            return False
        moved = moved or (where is not None and where != seen_where)
        self._frame_seen = (at, where, moved)
        return moved

    def _ended(self, mark: Mark) -> None:
        secs = self.perf() - mark.since
        with self._lock:
            self._marks.discard(mark)
            self._samples[mark.phase].append(secs)
        self._dirty = True

    def _dropped(self, mark: Mark) -> None:
        with self._lock:
            self._marks.discard(mark)

    def _breach(self, phase: str, secs: float, deadline: float) -> bool:
        rt = self.rt
        self.breached = phase
        wait = self.options.exit_after_secs
        if wait is not None and self._watching:  # armed before the first log line: a log write may block
            self._last_resort = threading.Thread(
                target=self._exit_unless_stopped,
                args=(wait + _LAST_RESORT_SECS,),
                name="asv-watchdog-exit",
                daemon=True,
            )
            self._last_resort.start()
        log.error("hang.detected", phase=phase, step=rt.step, secs=round(secs, 3), deadline_secs=round(deadline, 3))
        try:
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in current_frames().items():
                stack = "".join(traceback.format_stack(frame))
                log.error("hang.stack", thread=names.get(ident, str(ident)), stack=stack)
        except Exception as exc:  # the stacks are help, not the stop
            log.error("hang.stack_failed", error=describe(exc))
        try:
            rt.record_badput(HANG, secs)
        except Exception as exc:
            log.error("hang.badput_failed", error=describe(exc))
        rt.mark_state_suspect()  # no final checkpoint of a state mid-step
        rt.request_stop(reason=f"hang:{phase}")
        return True

    def _after_breach(self) -> None:
        """The session has ``exit_after_secs`` to end; then the process is ended."""
        wait = self.options.exit_after_secs
        if wait is None or self._stopped.wait(wait):
            return
        log.error("hang.exit", phase=self.breached, status=EXIT_HANG, waited_secs=wait)
        self._exit(EXIT_HANG)

    def _exit_unless_stopped(self, secs: float) -> None:
        """On ``asv-watchdog-exit``: the process ended, unflushed, unless the session ends
        within ``secs`` (the watchdog's own exit, which logs and flushes first, may be
        stuck in a log write)."""
        if not self._stopped.wait(secs):
            self._hard_exit(EXIT_HANG)

    def save(self) -> None:
        """On the watchdog's thread: the learned p99s to the logdir (chief, when changed)."""
        rt = self.rt
        if not self._dirty or rt.logdir is None or not rt.is_chief:
            return
        self._dirty = False
        p99 = self.p99s()
        text = json.dumps(
            {
                "version": 1,
                "p99_secs": {k: round(v, 6) for k, v in p99.items()},
                "deadline_secs": {p: round(self.options.deadline(p99.get(p)), 3) for p in PHASES},
            },
            indent=1,
            sort_keys=True,
        )
        try:
            replace_file(Path(rt.logdir) / LEARNED_FILE, text + "\n")
        except OSError as exc:  # help for the next start, never a training's error
            log.warning("watchdog.unwritable", error=describe(exc))


def collective_options(logdir: str | os.PathLike[str], *, options: WatchdogOptions | None = None) -> Any:
    """``tf.distribute.experimental.CommunicationOptions`` whose ``timeout_seconds`` is the
    step deadline learned in ``logdir`` (``asupervisor-watchdog.json``), for a
    ``MultiWorkerMirroredStrategy(communication_options=...)``: a collective waiting on a
    stuck peer then fails instead of waiting forever. Nothing learned yet: no timeout.

    Args:
        logdir: the training's log directory.
        options: the watchdog's settings (the defaults by default).
    """
    import tensorflow as tf

    opts = WatchdogOptions() if options is None else options
    p99 = read_learned(logdir).get("step")
    timeout = None if p99 is None else opts.deadline(p99)
    return tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
