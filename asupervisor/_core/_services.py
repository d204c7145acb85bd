"""Services: async tasks that live beside the step loop in the supervisor's task group.

A :class:`Service` has a name, a failure policy and an ``async run(ctx, task_status=...)``
that calls ``task_status.started()`` once it is ready (``TaskGroup.start`` semantics), then
works until cancelled. The checkpoint, summary, step-counter and queue-runner services
plug in here, as do the user's looped services (``Supervisor.loop``).

Failure policy: by default a failing service *escalates*: the session stops and its
exception comes out of ``managed_session()`` as itself. With a :class:`RestartPolicy` it
is restarted after a backoff, at most ``max_restarts`` times within ``window_secs``; past
that it escalates with :class:`~asupervisor.ServiceError` (the last failure chained).

Services never raise into the task group (so errors keep their own type instead of being
wrapped in an ``ExceptionGroup``); they report to the session's stop control. They never
block the event loop: blocking work goes to a dedicated thread.

What a service sees is :class:`ServiceContext` (public, public types only: its threads are
:class:`WorkerThread`); :func:`supervise` hands each service a :class:`ServiceContextImpl`
over the engine's :class:`EngineContext`, which the stock services reach with
:func:`engine_context` for the engine's own threads and stop control.
"""

from __future__ import annotations

import collections
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import anyio
import structlog
from anyio.abc import TaskStatus

from .._exceptions import ServiceError
from .._logging import describe, get_logger
from ._clock import Clock, interval_ticks

if TYPE_CHECKING:
    from ._handoff import LoopHandle
    from ._stop import StopControl
    from ._threads import DedicatedThread

__all__ = [
    "EngineContext",
    "FailureWindow",
    "LoopedService",
    "RestartPolicy",
    "Service",
    "ServiceContext",
    "ServiceContextImpl",
    "WorkerThread",
    "engine_context",
]

T = TypeVar("T")

log = get_logger(__name__)

#: the stop reasons of a preemption notice that is not a signal: ``preempted:<source>``
PREEMPTED = "preempted:"


@dataclass(frozen=True, kw_only=True)
class RestartPolicy:
    """Restart a failed service, within limits (mode's "restart intensity").

    Attributes:
        max_restarts: restarts allowed within ``window_secs``; one more failure escalates.
        window_secs: the sliding window failures are counted in.
        backoff_secs: wait before the first restart; doubles for each further failure in
            the window, up to ``max_backoff_secs``.
        max_backoff_secs: the longest wait between restarts.
    """

    max_restarts: int = 3
    window_secs: float = 60.0
    backoff_secs: float = 1.0
    max_backoff_secs: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {self.max_restarts!r}")
        for name in ("window_secs", "backoff_secs", "max_backoff_secs"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0 and not math.isnan(value)):
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    def backoff_for(self, failures: int) -> float:
        """The wait before retrying after the ``failures``-th failure in the window."""
        return float(min(self.max_backoff_secs, self.backoff_secs * 2 ** (failures - 1)))


class FailureWindow:
    """The failures of one thing within a :class:`RestartPolicy`'s sliding window."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._times: collections.deque[float] = collections.deque()

    def record(self, now: float) -> int:
        """Count a failure at ``now``; returns the failures within the window, it included."""
        times = self._times
        times.append(now)
        while times and times[0] < now - self.policy.window_secs:
            times.popleft()
        return len(times)


class WorkerThread(Protocol):
    """A thread of a service's own for blocking work (:meth:`ServiceContext.new_thread`).

    Jobs run one at a time, in the order they were queued. The session joins the thread
    when it ends (bounded by ``stop_grace_secs``); :meth:`aclose` joins it sooner.
    """

    @property
    def name(self) -> str:
        """The thread's name (shown by debuggers and in ``thread.*`` log events)."""
        ...

    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        """Run ``fn(*args)`` on this thread and return its result (or raise its exception).

        A cancelled caller (the session stopping) does not interrupt ``fn``: the wait goes
        on for up to ``stop_grace_secs``, then ``fn`` is left to finish on its own
        (``thread.overrun`` is logged) and the cancellation propagates.
        """
        ...

    def submit_nowait(self, fn: Callable[..., object], /, *args: Any) -> None:
        """Queue ``fn(*args)`` and return at once (any thread). An exception ``fn`` raises
        stops the session and comes out of ``managed_session()`` as itself."""
        ...

    async def aclose(self) -> None:
        """Finish the queued jobs and join the thread, waiting at most ``stop_grace_secs``."""
        ...


class ServiceContext(Protocol):
    """What the supervisor offers a running service (the ``ctx`` of :meth:`Service.run`).

    Every member is safe on the event loop, where ``run`` is; ``should_stop``,
    ``stop_reason``, ``request_stop`` and ``global_step`` from any thread.
    """

    @property
    def clock(self) -> Clock:
        """The session's time source (``Supervisor(clock=...)``): sleep with
        ``await ctx.clock.sleep_until(ctx.clock.now() + secs)`` so tests control time."""
        ...

    @property
    def stop_grace_secs(self) -> float:
        """How long the whole stop may take (``Supervisor(stop_grace_secs=...)``)."""
        ...

    @property
    def global_step(self) -> int:
        """The number of steps completed so far (a Python int, no device sync)."""
        ...

    def should_stop(self) -> bool:
        """Whether the session was asked to stop."""
        ...

    @property
    def stop_reason(self) -> str | None:
        """Why the session is stopping (``"requested"``, ``"signal:SIGTERM"``, ...), or ``None``."""
        ...

    def request_stop(
        self, exc: BaseException | None = None, *, reason: str | None = None, deadline_secs: float | None = None
    ) -> None:
        """Stop the session at the next step boundary; any thread, any number of times.

        Args:
            exc: an error to raise out of ``managed_session()`` (the first one wins).
            reason: the ``stop_reason``; ``"preempted:<source>"`` is a preemption
                notice (AWS's spot interruption, a scheduler's API): in a multi-worker
                training every worker agrees on the stop step and takes the final
                checkpoint, as for a stop signal, and ``exit_code`` is 143. Derived from
                ``exc`` by default, else ``"requested"``.
            deadline_secs: with a ``"preempted:<source>"`` reason, the seconds until
                the machine goes (else ``StopOptions.deadline_secs``'s for the source):
                with time to spare the training saves at once and trains on until its
                final save just fits (``docs/operations.md``).

        Raises:
            ValueError: ``deadline_secs`` without a ``preempted:`` reason, or not > 0.
        """
        ...

    async def run_on_step_thread(self, fn: Callable[..., T], /, *args: Any) -> T:
        """Run ``fn(*args)`` on the step thread at the next step boundary (between two
        steps, or at once when no step runs) and return its result: the only place to
        read or write model state. Keep ``fn`` short: the next step waits for it. A
        cancelled caller waits for ``fn`` as :meth:`WorkerThread.run` does."""
        ...

    def new_thread(self, name: str) -> WorkerThread:
        """A started :class:`WorkerThread` for blocking work, joined at session end."""
        ...

    def set_service_state(self, name: str, state: str) -> None:
        """Show ``state`` (``"running"``, ``"waiting"``, ...) as ``Supervisor.status()
        .services[name]``; the supervisor itself sets ``"starting"``, ``"stopped"``, ..."""
        ...


class EngineContext(Protocol):
    """What the engine (``Runtime``) offers the stock services and parts: the public
    :class:`ServiceContext`'s data, and the engine's own types."""

    clock: Clock
    loop: LoopHandle
    control: StopControl
    step_thread: DedicatedThread
    stop_grace_secs: float

    @property
    def global_step(self) -> int:
        """The number of steps completed so far (a Python int, no device sync)."""
        ...

    def new_thread(self, name: str) -> DedicatedThread:
        """A dedicated thread for blocking work; started, and joined at session end."""
        ...

    def set_service_state(self, name: str, state: str) -> None:
        """Record a service's state for ``Supervisor.status()``."""
        ...

    def notice_preemption(self, reason: str, deadline_secs: float | None = None) -> None:
        """A preemption notice that is not a signal (``reason``: ``preempted:<source>``):
        a stop like a first stop signal's, which every worker of a multi-worker training
        agrees on (so they all take the final checkpoint); with a deadline and time to
        spare, the notice window first (:mod:`._notice`)."""
        ...


class _WorkerThread:
    """A :class:`WorkerThread` over one of the engine's dedicated threads."""

    __slots__ = ("_engine", "_owner", "_thread")

    def __init__(self, thread: DedicatedThread, engine: EngineContext, owner: str) -> None:
        self._thread = thread
        self._engine = engine
        self._owner = owner

    @property
    def name(self) -> str:
        return self._thread.name

    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        result: T = await self._thread.submit(fn, *args).wait(grace_secs=self._engine.stop_grace_secs)
        return result

    def _guarded(self, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._engine.control.request_stop(exc, reason=f"service:{self._owner}")

    def submit_nowait(self, fn: Callable[..., object], /, *args: Any) -> None:
        self._thread.submit_nowait(self._guarded, fn, args)

    async def aclose(self) -> None:
        await self._thread.aclose_within(self._engine.stop_grace_secs)


class ServiceContextImpl:
    """The :class:`ServiceContext` a service's ``run`` gets: the engine behind public types."""

    __slots__ = ("_engine", "_owner")

    def __init__(self, engine: EngineContext, owner: str) -> None:
        self._engine = engine
        self._owner = owner

    @property
    def clock(self) -> Clock:
        return self._engine.clock

    @property
    def stop_grace_secs(self) -> float:
        return self._engine.stop_grace_secs

    @property
    def global_step(self) -> int:
        return self._engine.global_step

    def should_stop(self) -> bool:
        return self._engine.control.should_stop()

    @property
    def stop_reason(self) -> str | None:
        return self._engine.control.reason

    def request_stop(
        self, exc: BaseException | None = None, *, reason: str | None = None, deadline_secs: float | None = None
    ) -> None:
        check_notice(reason, deadline_secs)
        if exc is None and reason is not None and reason.startswith(PREEMPTED):
            engine = self._engine
            # agreed with the cluster, as a signal is; on the loop (the notice window's timer)
            engine.loop.call_if_running(lambda: engine.notice_preemption(reason, deadline_secs))
            return
        self._engine.control.request_stop(exc, reason=reason)

    async def run_on_step_thread(self, fn: Callable[..., T], /, *args: Any) -> T:
        waiter = self._engine.step_thread.submit_at_boundary(fn, *args)
        result: T = await waiter.wait(grace_secs=self._engine.stop_grace_secs)
        return result

    def new_thread(self, name: str) -> WorkerThread:
        return _WorkerThread(self._engine.new_thread(name), self._engine, self._owner)

    def set_service_state(self, name: str, state: str) -> None:
        self._engine.set_service_state(name, state)


def check_notice(reason: str | None, deadline_secs: object) -> None:
    """``request_stop``'s ``deadline_secs``: only with a ``preempted:<source>`` reason, > 0."""
    if deadline_secs is None:
        return
    if reason is None or not reason.startswith(PREEMPTED):
        raise ValueError(
            f"request_stop(deadline_secs={deadline_secs!r}) needs reason='preempted:<source>', got reason={reason!r}"
        )
    if isinstance(deadline_secs, bool) or not isinstance(deadline_secs, (int, float)) or not deadline_secs > 0:
        raise ValueError(f"request_stop: deadline_secs must be a number of seconds > 0, got {deadline_secs!r}")


def engine_context(ctx: ServiceContext) -> EngineContext:
    """The engine behind a service's ``ctx``: for the stock services, which work with the
    engine's own threads and stop control (a test's stand-in context is itself)."""
    if isinstance(ctx, ServiceContextImpl):
        return ctx._engine
    return cast("EngineContext", ctx)


class Service:
    """Base class of services; subclasses implement :meth:`run`.

    Attributes:
        name: unique within a supervisor; shown in logs and ``status()``.
        restart: ``None`` to escalate on the first failure, else a :class:`RestartPolicy`.
        through_stop: keep running through the stop (the final checkpoint, the hooks'
            ends), cancelled as the session winds down (the metrics endpoint: it serves
            the stop reason while the stop runs); ``False``: cancelled as the stop begins.
    """

    name: str = "service"
    restart: RestartPolicy | None = None
    through_stop: bool = False

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Do the service's work until cancelled; call ``task_status.started()`` when ready."""
        raise NotImplementedError


class _StartedFlag:
    """Forwards ``started()`` once and remembers that it was called."""

    def __init__(self, inner: TaskStatus[None]) -> None:
        self._inner = inner
        self.called = False

    def started(self, value: None = None) -> None:
        if not self.called:
            self.called = True
            self._inner.started(value)


async def supervise(
    service: Service, ctx: EngineContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Run ``service`` under its failure policy (the task the supervisor starts for it)."""
    started = _StartedFlag(task_status)
    window = FailureWindow(service.restart) if service.restart is not None else None
    name = service.name
    public = ServiceContextImpl(ctx, name)
    with structlog.contextvars.bound_contextvars(service=name):
        while True:
            ctx.set_service_state(name, "starting" if not started.called else "restarting")
            try:
                await service.run(public, task_status=started)
            except Exception as exc:
                policy = service.restart
                failed = window.record(ctx.clock.now()) if window is not None else 1
                if policy is None or failed > policy.max_restarts:
                    ctx.set_service_state(name, "failed")
                    log.error("service.failed", service=name, error=describe(exc), action="stop")
                    cause: BaseException = exc
                    if policy is not None:
                        cause = ServiceError(
                            f"service {name!r} failed {failed} times within "
                            f"{policy.window_secs} s (max_restarts={policy.max_restarts}); "
                            f"last error: {exc!r}"
                        )
                        cause.__cause__ = exc
                    own = getattr(cause, "stop_reason", None)  # LeaseLostError: lease_lost
                    ctx.control.request_stop(cause, reason=own if isinstance(own, str) else f"service:{name}")
                    started.started()  # let a start-up that waits on us go on to stop
                    return
                backoff = policy.backoff_for(failed)
                log.warning("service.failed", service=name, error=describe(exc), action="restart", backoff_secs=backoff)
                ctx.set_service_state(name, "backoff")
                await ctx.clock.sleep_until(ctx.clock.now() + backoff)
                continue
            ctx.set_service_state(name, "finished")
            started.started()
            return


def _is_async_callable(fn: Callable[..., Any]) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


class LoopedService(Service):
    """Calls ``target(*args, **kwargs)`` every ``interval_secs`` (see ``Supervisor.loop``).

    The first call is made at start, then at a fixed rate; calls that would pile up
    behind a slow target are skipped, not burst. An async target is awaited on the event
    loop; a sync target runs on a dedicated thread of its own, never on the loop thread.
    """

    def __init__(
        self,
        interval_secs: float,
        target: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        restart: RestartPolicy | None = None,
    ) -> None:
        if isinstance(interval_secs, bool) or not isinstance(interval_secs, (int, float)):
            raise TypeError(f"interval_secs must be a number of seconds, got {interval_secs!r}")
        if not (interval_secs > 0 and math.isfinite(interval_secs)):
            raise ValueError(f"interval_secs must be a positive number of seconds, got {interval_secs!r}")
        if not callable(target):
            raise TypeError(f"target must be callable, got {target!r}")
        self.interval_secs = float(interval_secs)
        self.target = target
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.name = name or f"loop:{getattr(target, '__qualname__', None) or type(target).__name__}"
        self.restart = restart
        self.is_async = _is_async_callable(target)

    def _call_sync(self, control: StopControl) -> None:
        # On the service's thread. An error that will escalate raises the stop flag at
        # once, so the step loop stops at its next boundary, not after the hand-off.
        try:
            self.target(*self.args, **self.kwargs)
        except Exception as exc:
            if self.restart is None:
                control.record_error(exc, reason=f"service:{self.name}")
            raise

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Call the target at every tick until cancelled."""
        if self.is_async:
            task_status.started()
            async for _ in interval_ticks(ctx.clock, self.interval_secs):
                ctx.set_service_state(self.name, "running")
                await self.target(*self.args, **self.kwargs)
            return
        engine = engine_context(ctx)
        thread = engine.new_thread(f"asv-{self.name}")
        task_status.started()
        waiter = None
        try:
            async for _ in interval_ticks(ctx.clock, self.interval_secs):
                ctx.set_service_state(self.name, "running")
                waiter = thread.submit(self._call_sync, engine.control)
                await waiter.wait(grace_secs=ctx.stop_grace_secs)
        finally:
            # A call that already overran its grace is not waited for a second time.
            stuck = waiter is not None and not waiter.done
            await thread.aclose_within(0 if stuck else ctx.stop_grace_secs)
