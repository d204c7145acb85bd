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
"""

from __future__ import annotations

import collections
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import structlog
from anyio.abc import TaskStatus

from .._exceptions import ServiceError
from .._logging import describe, get_logger
from ._clock import interval_ticks

if TYPE_CHECKING:
    from ._clock import Clock
    from ._handoff import LoopHandle
    from ._stop import StopControl
    from ._threads import DedicatedThread

__all__ = ["FailureWindow", "LoopedService", "RestartPolicy", "Service", "ServiceContext"]

log = get_logger(__name__)


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


class ServiceContext(Protocol):
    """What the supervisor offers a running service."""

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


class Service:
    """Base class of services; subclasses implement :meth:`run`.

    Attributes:
        name: unique within a supervisor; shown in logs and ``status()``.
        restart: ``None`` to escalate on the first failure, else a :class:`RestartPolicy`.
    """

    name: str = "service"
    restart: RestartPolicy | None = None

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
    service: Service, ctx: ServiceContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Run ``service`` under its failure policy (the task the supervisor starts for it)."""
    started = _StartedFlag(task_status)
    window = FailureWindow(service.restart) if service.restart is not None else None
    name = service.name
    with structlog.contextvars.bound_contextvars(service=name):
        while True:
            ctx.set_service_state(name, "starting" if not started.called else "restarting")
            try:
                await service.run(ctx, task_status=started)
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
                    ctx.control.request_stop(cause, reason=f"service:{name}")
                    started.started()  # let a start-up that waits on us go on to stop
                    return
                backoff = policy.backoff_for(failed)
                log.warning(
                    "service.failed", service=name, error=describe(exc), action="restart", backoff_secs=backoff
                )
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
        thread = ctx.new_thread(f"asv-{self.name}")
        task_status.started()
        waiter = None
        try:
            async for _ in interval_ticks(ctx.clock, self.interval_secs):
                ctx.set_service_state(self.name, "running")
                waiter = thread.submit(self._call_sync, ctx.control)
                await waiter.wait(grace_secs=ctx.stop_grace_secs)
        finally:
            # A call that already overran its grace is not waited for a second time.
            stuck = waiter is not None and not waiter.done
            await thread.aclose_within(0 if stuck else ctx.stop_grace_secs)
