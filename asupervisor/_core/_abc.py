"""The narrow interface between the engine and the features: what a part may use and offer.

Features (checkpoints, summaries, input, the stock hooks) are written against these
types, never against the engine's ``Runtime``:

* :class:`~._services.ServiceContext` — what a running :class:`~asupervisor.Service` may
  use (public, public types only); the engine hands each service one over
  :class:`~._services.EngineContext` (the engine's own threads and stop control), which
  the stock services reach with :func:`~._services.engine_context` and
  :class:`SessionContext` extends.
* :class:`SessionContext` — what a session part may use: the step count, the clock, the
  step thread, stop requests, dedicated threads, the other parts' capabilities
  (:meth:`SessionContext.extra`).
* :class:`SessionPart` — a piece of a session; every method is an optional no-op, and
  the engine works out once which parts implement which phase (:mod:`._parts`), so a
  phase nobody implements costs nothing.
* :class:`SessionAttribute` — typed capabilities a part offers the others (the summary
  writer, checkpoint saving, ...), looked up with ``ctx.extra(SessionAttribute.x)``, as
  anyio's typed attributes are.

This module must not import TensorFlow nor any feature.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, overload

from anyio import TypedAttributeSet, typed_attribute

from ._services import EngineContext

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from pathlib import Path

    from .._cluster import ClusterInfo
    from ._clock import Clock
    from ._goodput import TimeAccount
    from ._services import Service
    from ._status import CheckpointInfo, Goodput, QueueStatistics, RemoteStatus, Status
    from ._watchdog import Mark, WatchdogOptions

__all__ = [
    "CheckpointSaving",
    "EngineConfig",
    "KerasFit",
    "SessionAttribute",
    "SessionContext",
    "SessionPart",
    "SummarySink",
    "context_of",
]

T = TypeVar("T")
D = TypeVar("D")


class SessionContext(EngineContext, Protocol):
    """What session parts (and the stock hooks, through ``context_of(session)``) may use.

    Everything an :class:`~._services.EngineContext` offers, and:
    """

    #: whether this process writes checkpoints and summaries
    is_chief: bool
    #: whether this is one worker of a multi-worker training (every worker steps together)
    multi_worker: bool
    #: this process's place in the cluster (``None`` outside a cluster)
    cluster: ClusterInfo | None
    #: the supervisor's log directory (``None``: none)
    logdir: Path | None

    @property
    def last_output(self) -> Any:
        """What the last step returned (read on the step thread, or at a boundary)."""
        ...

    @property
    def recovering(self) -> bool:
        """Whether a step raised ``AbortedError``/``UnavailableError`` and the session is
        about to restore: no snapshot of the half-done step may be taken."""
        ...

    def request_stop(self, exc: BaseException | None = None, *, reason: str | None = None) -> None:
        """Stop the session at the next step boundary; any thread (the first error wins)."""
        ...

    def status(self) -> Status:
        """A frozen snapshot of the session (what ``Supervisor.status()`` returns)."""
        ...

    def mark_state_suspect(self) -> None:
        """The model state must not be checkpointed any more (a NaN loss, a failed step)."""
        ...

    def run_on_step_thread(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]:
        """On the loop: run ``fn(*args)`` on the step thread and await its result."""
        ...

    def check_before_snapshot(self) -> None:
        """On the step thread: every part's ``before_snapshot``; raises what one raises."""
        ...

    def scalar_sources(self) -> tuple[Callable[[], Mapping[str, float]], ...]:
        """The parts' ``scalars`` methods, for the summary writer."""
        ...

    def current_metrics(self) -> dict[str, float]:
        """On the step thread: the metrics of the state as it is now, for a checkpoint
        taken at this step boundary: the last step's scalar outputs (one host read each)
        and the logs of an epoch that ended at this very step (``val_loss``, ...)."""
        ...

    def observe_save_secs(self, phase: str, secs: float) -> None:
        """Any thread: count one checkpoint phase's duration (``blocked``, ``write``,
        ``commit``, ``upload``) in ``status().save_seconds``."""
        ...

    def record_badput(self, cause: str, secs: float = 0.0, *, steps: int = 0) -> None:
        """Any thread: count ``secs`` of badput of ``cause`` (``"hang"``,
        ``"divergence_rollback"``, ...) in the goodput ledger; ``steps``: completed steps
        whose work is lost (their time moves out of productive time). See
        :mod:`._goodput`. Raises ``ValueError`` for a bad cause, ``secs`` or ``steps``."""
        ...

    @property
    def time_account(self) -> TimeAccount:
        """Where this session's time went so far (:mod:`._goodput`), for the ledger."""
        ...

    def watch_phase(self, phase: str) -> Mark:
        """Any thread: the hang watchdog times ``phase`` (``"save"``, ``"restore"``,
        ``"barrier"``) from now: ``mark.advance()`` at each progress (a chunk written),
        ``mark.end()`` when done (or ``with ctx.watch_phase(...)``). See :mod:`._watchdog`."""
        ...

    def sync_global_step(self) -> None:
        """On the step thread: make the ``global_step`` variable equal the step count."""
        ...

    def rearm(self) -> None:
        """On the step thread: ask every part's ``next_trigger`` again (one's changed)."""
        ...

    def notice_stop_step(self) -> int:
        """On the step thread: the step a cluster's agreed stop of a notice is at: the
        last step that fits the notice's deadline (its window open), else the next one."""
        ...

    def set_step(self, step: int) -> None:
        """On the step thread, after a restore: the step count restored."""
        ...

    @property
    def state(self) -> Any:
        """The ``tf.train.Checkpoint`` holding the model state and the global step."""
        ...

    @property
    def global_step_var(self) -> Any:
        """The ``global_step`` ``tf.Variable`` (``None`` before start-up built it)."""
        ...

    @overload
    def extra(self, attribute: T) -> T: ...

    @overload
    def extra(self, attribute: T, default: D) -> T | D: ...

    def extra(self, attribute: Any, default: Any = ...) -> Any:
        """A capability a part offers (``SessionAttribute.x``); ``default`` when none
        does (without a default: ``anyio.TypedAttributeLookupError``)."""
        ...


class EngineConfig(Protocol):
    """The settings the engine reads (``SupervisorConfig`` has them all)."""

    @property
    def clock(self) -> Clock:
        """The session's clock."""
        ...

    @property
    def stop_grace_secs(self) -> float:
        """How long a stop may take."""
        ...

    @property
    def recovery_wait_secs(self) -> float:
        """The longest backoff before a recovery."""
        ...

    @property
    def handle_signals(self) -> bool:
        """Whether SIGINT/SIGTERM stop the session."""
        ...

    @property
    def stop_signals(self) -> Sequence[Any]:
        """The signals that request a graceful stop (``signal.Signals``)."""
        ...

    @property
    def hooks(self) -> Sequence[Any]:
        """The per-step hooks."""
        ...

    @property
    def state(self) -> Any:
        """The model state (a ``tf.train.Checkpoint`` or a dict)."""
        ...

    @property
    def global_step(self) -> Any:
        """The ``global_step`` variable, if given."""
        ...

    @property
    def init_fn(self) -> Callable[[], Any] | None:
        """Initialises a state not restored."""
        ...

    @property
    def local_init_fn(self) -> Callable[[], Any] | None:
        """Runs after restore-or-init."""
        ...

    @property
    def ready_fn(self) -> Callable[[], Iterable[str]] | None:
        """Names what is not ready."""
        ...

    @property
    def logdir(self) -> Any:
        """The log directory, or ``None``."""
        ...

    @property
    def is_chief(self) -> bool | None:
        """Whether this process writes checkpoints and summaries."""
        ...

    @property
    def cluster(self) -> ClusterInfo | None:
        """The cluster from ``TF_CONFIG``."""
        ...

    @property
    def multi_worker(self) -> bool:
        """Whether this process is one of several training workers."""
        ...

    @property
    def watchdog(self) -> WatchdogOptions:
        """The hang watchdog's settings."""
        ...

    @property
    def stop_deadline_secs(self) -> float | Mapping[str, float] | None:
        """The seconds from a stop notice to its deadline, per source (:mod:`._notice`)."""
        ...


def context_of(session: Any) -> SessionContext:
    """The :class:`SessionContext` behind a ``Session`` (what a stock hook may use of it)."""
    ctx: SessionContext = session._rt
    return ctx


class SummarySink(Protocol):
    """The event-file writer, as other parts and hooks use it (any thread)."""

    def write(self, step: int, values: Mapping[str, Any]) -> object:
        """Queue ``values`` for ``step``; returns a waiter (or ``None`` once closed)."""
        ...

    def post(self, step: int, values: Mapping[str, Any]) -> None:
        """Queue ``values`` for ``step`` cheaply, written in batches (the step thread's way)."""
        ...


#: why a checkpoint of the logdir is taken (the ``reason`` of its log lines): at start-up,
#: every ``save_model_steps``, a tick of ``save_model_secs``, ``save_now()``, the end of a
#: ``fit`` epoch, the stop, a stop notice with time to spare. Whether one is due is the save policy's decision alone
#: (:class:`~asupervisor.SaveMoment`); the reason says which moment asked.
SaveReason = Literal["startup", "steps", "timer", "save_now", "epoch", "final", "ram", "notice"]


class CheckpointSaving(Protocol):
    """Checkpoint saving, as the front doors and ``CheckpointSaverHook`` use it."""

    @property
    def last(self) -> CheckpointInfo | None:
        """The latest committed checkpoint of the session's logdir, or ``None``."""
        ...

    @property
    def restored_from(self) -> str | None:
        """The checkpoint this session started from, or ``None``."""
        ...

    @property
    def commits(self) -> int:
        """How many checkpoints this session committed into its logdir so far."""
        ...

    @property
    def tiers(self) -> Mapping[str, int]:
        """Each local tier's newest committed step: ``disk``, and ``ram`` with a RAM tier."""
        ...

    def on_commit(self, listener: Callable[[], None]) -> None:
        """Any thread: call ``listener()`` after each commit to the logdir, on the
        committing thread (it must not block: it wakes a task, as the upload's)."""
        ...

    def recorded_metrics(self, path: str) -> Mapping[str, float] | None:
        """The metrics the checkpoint ``path`` recorded, as this session wrote them, or
        ``None`` (not known here without reading it)."""
        ...

    def pinned(self, path: str) -> AbstractContextManager[bool]:
        """Any thread: keep the committed checkpoint ``path`` from retention while the
        block runs; yields whether it is still there."""
        ...

    def save_on_step_thread(self, directory: str | None = None, basename: str | None = None) -> str:
        """On the step thread: checkpoint the state now and make it the latest; its path."""
        ...

    def save_in_background(self, reason: SaveReason, *, agreed: bool = False) -> int | None:
        """On the step thread: snapshot now, write in the background; the step or ``None``
        (``agreed``: every worker of a cluster saves at this step, so one may)."""
        ...

    async def save_now(self) -> CheckpointInfo:
        """On the loop: a checkpoint at the next step boundary, once it is committed."""
        ...


class KerasFit(Protocol):
    """``Session.fit``'s body, which the Keras front door offers the session (the engine
    imports no front door): ``await fit(session, model, x, y, epochs=..., ...)`` with
    ``Session.fit``'s keywords."""

    async def __call__(self, session: Any, model: Any, x: Any, y: Any, **kwargs: Any) -> dict[str, list[float]]:
        """Train ``model`` in ``session``; Keras's ``History.history``."""
        ...


class SessionAttribute(TypedAttributeSet):
    """Typed capabilities a part offers the others (see :meth:`SessionContext.extra`)."""

    #: the event-file writer (the chief with a logdir only)
    summary_writer: SummarySink = typed_attribute()
    #: checkpoint saving (always offered; without a logdir only other directories)
    checkpoints: CheckpointSaving = typed_attribute()
    #: the latest steps/sec measured (``None`` before the first measurement)
    steps_per_sec: float | None = typed_attribute()
    #: the remote tier of a URL logdir
    remote: RemoteStatus = typed_attribute()
    #: ``Session.fit`` (the Keras front door)
    keras_fit: KerasFit = typed_attribute()
    #: the run's goodput ledger across restarts, for ``status().goodput``
    goodput: Goodput = typed_attribute()


class SessionPart:
    """A piece of a session; override only what the part does (all methods are no-ops).

    Which part implements which method is worked out once per session, so a method no
    part overrides costs nothing. The engine calls them in its phase order, never in
    the order of a list: ``start`` and ``extra_attributes`` as the session is entered; at
    start-up ``restore`` (step thread); then ``services`` are
    started; while running ``on_step`` when the global step reaches the part's
    ``next_trigger`` and ``iterator_for`` for ``run_loop``'s data; at a stop ``wake``
    (any thread), then, unless the state is suspect, every ``before_snapshot`` and then
    every ``final``; then ``aclose``; then, on the step thread just before the
    session's threads are joined, ``release`` (also when the start failed).

    Attributes:
        name: shown in logs.
    """

    name: str = "part"

    @property
    def restorable(self) -> bool:
        """Whether :meth:`restore` can bring back a saved state now (a step raising
        ``AbortedError``/``UnavailableError`` is then recovered from)."""
        return False

    def start(self, ctx: SessionContext) -> None:
        """On the loop, as the session is entered, before start-up: open what the part
        needs for the whole session (its threads, writers)."""

    def services(self, ctx: SessionContext) -> Iterable[Service]:
        """The services to start in the session's task group (after start-up)."""
        return ()

    def extra_attributes(self, ctx: SessionContext) -> Mapping[Any, Callable[[], Any]]:
        """The capabilities this part offers: ``{SessionAttribute.x: getter}``."""
        return {}

    def restore(self, ctx: SessionContext, *, recovering: bool = False) -> str | None:
        """On the step thread: restore the state; the path restored, or ``None``.

        At start-up (``recovering=False``), and again after a step raised
        ``AbortedError``/``UnavailableError`` (``recovering=True``: no checks that
        would set checkpoints aside).
        """
        return None

    async def settle(self, ctx: SessionContext) -> None:
        """On the loop, before a recovery's restore: let work in flight finish."""

    def next_trigger(self, step: int) -> float:
        """On the step thread: the global step at which :meth:`on_step` runs next
        (``math.inf``: never); asked after start-up, a restore and each ``on_step``."""
        return float("inf")

    def on_step(self, ctx: SessionContext) -> None:
        """On the step thread, at the step boundary :meth:`next_trigger` named."""

    def on_signal(self, ctx: SessionContext, name: str) -> bool:
        """On the loop, at the first SIGINT/SIGTERM: whether this part takes the stop over
        (a cluster-wide agreed stop); otherwise the session stops at the next boundary."""
        return False

    def iterator_for(
        self, ctx: SessionContext, data: Any, checkpoint_iterator: bool | None, *, fresh: bool = False
    ) -> Iterator[Any] | None:
        """On the step thread: an iterator over ``data`` (a ``tf.data.Dataset``) tracked
        by this part, or ``None`` to leave it to the next part (``iter(data)`` at last).
        ``fresh``: a new pass over ``data`` (an epoch), never the one a last ``run_loop``
        over the same dataset left off."""
        return None

    def before_snapshot(self) -> None:
        """On the step thread, before any snapshot of the state; raising stops that save
        (and, at a stop, the final checkpoint)."""

    def scalars(self) -> Mapping[str, float]:
        """Scalars for the summary writer's ticks (``{tag: value}``)."""
        return {}

    def queues(self) -> Mapping[str, QueueStatistics]:
        """Queue statistics for ``status().queues``."""
        return {}

    def wake(self) -> None:
        """Any thread, at a stop or a halted ``run_loop``: release a step-thread wait."""

    async def final(self, ctx: SessionContext) -> None:
        """The stop's "final checkpoint" phase (skipped when the state is suspect)."""

    async def aclose(self, ctx: SessionContext) -> None:
        """The stop's "closers" phase (flush and close what the part opened)."""

    def release(self) -> None:
        """On the step thread, the session's last job before its threads are joined, on
        every way out, a failed start included: let go of what the part held for the
        whole session (a lock). Bounded by the stop's wind-down (a close on a hung disk
        may block: the stop goes on without it)."""

    def ended(self) -> None:
        """On the loop, the session's very last act, after it gave the signal handlers it
        took back (also after a failed start): let go of what had to outlast the threads
        (the progress display's claim on the session's own events, which a last signal
        may still log). Must not block."""
