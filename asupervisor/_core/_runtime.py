"""The engine of one managed session: step thread, stop scope, services, ordered shutdown.

``Supervisor.managed_session()`` returns a :class:`Runtime`, an async context manager.

Start-up: ``hook.begin()`` → state built, restored or initialised (``init_fn``) on the
step thread → ``local_init_fn`` → ``ready_fn`` check → ``hook.after_create_session()`` →
services started in the task group, each reporting ready → the stop scope is entered and
the session is yielded.

Shutdown, whatever the cause: stop requested → the step in flight finishes → services
cancelled → final checkpoint (unless a step or hook raised) → ``hook.end()`` (clean stops
only) → closers (summaries flushed) → dedicated threads joined → the cause re-raised. One
deadline, ``stop_grace_secs`` after the stop began, bounds the whole of it: each phase
gets what is left, a phase that overruns is logged by name (``shutdown.overrun
phase=...``; a final save overrunning is abandoned, see :mod:`._checkpoint_service`), and
phases not begun by then are skipped, except closing the writers and joining the
threads, which together get at most ``_WIND_DOWN_SECS`` more.

Only the step thread touches model state. Nothing here blocks the event loop: the only
waits are for the step thread and for services, all by awaiting.
"""

from __future__ import annotations

import math
import os
from collections.abc import Awaitable, Callable, Iterable
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from .._checkpoint import _saver as _checkpoint_service
from .._logging import describe, get_logger
from .._summary._step_counter import StepCounterService
from .._summary._writer import SummaryService, SummaryWriter
from .._tf import is_end_of_data, is_recoverable, tf
from . import _step_errors as _recovery
from ._handoff import LoopHandle
from ._hooks import HookRunner
from ._services import FailureWindow, Service, supervise
from ._session import Session
from ._signals import SignalService
from ._status import CheckpointInfo, Status
from ._stop import StopControl
from ._threads import DedicatedThread

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from .._checkpoint._manager import Checkpointer
    from .._config import SupervisorConfig
    from .._input._queue_runner import QueueStatistics
    from ._clock import Clock

__all__ = ["Runtime"]

log = get_logger(__name__)

#: once the stop's grace has run out: the most the closers and thread joins get together
#: (an abandoned save removing its files, event files flushed)
_WIND_DOWN_SECS = 1.0


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


def _same_dir(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name the same directory, however each is spelled."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet): compare where they would resolve
        return os.path.realpath(a) == os.path.realpath(b)


class Runtime:
    """One managed session (an async context manager yielding :class:`Session`)."""

    def __init__(self, config: SupervisorConfig, services: Iterable[Service]) -> None:
        self.config = config
        self.clock: Clock = config.clock
        self.stop_grace_secs = config.stop_grace_secs
        self.hooks = HookRunner(config.hooks)
        self.step = 0  # steps completed; written only by the step thread
        self.last_output: Any = None  # the last step's return value (hooks, summaries)
        self.steps_per_sec: float | None = None
        self.last_checkpoint: CheckpointInfo | None = None
        self.restored_from: str | None = None
        self.closed = False
        self.checkpoint: Any = None  # the tf.train.Checkpoint holding state + global_step
        self.global_step_var: Any = None
        #: the event-file writer (chief with a logdir only), created on entering
        self.summary_writer: SummaryWriter | None = None
        # checkpoints (see _checkpoint_service): set up by _restore() when there is a logdir
        self.checkpointer: Checkpointer | None = None
        self.saver: _checkpoint_service.CheckpointSaver | None = None
        self.next_trigger_step: float = math.inf  # the step loop calls saver.on_step() here
        self.recovering = False  # a step raised AbortedError/UnavailableError; see _recovery
        self._recovery = FailureWindow(_recovery.recovery_policy(config.recovery_wait_secs))
        #: step-thread callables run before any checkpoint of the state is taken (hook
        #: saves, the checkpoint service's snapshots); one that raises stops that save
        #: (NanTensorHook checks the losses it has not read yet here)
        self.before_snapshot: list[Callable[[], None]] = []
        #: async callables run, in order, in the "final_checkpoint" phase of a stop
        self.final_save: list[Callable[[], Awaitable[None]]] = []
        #: async callables run, in order, in the "closers" phase (summaries flushed, ...)
        self.closers: list[Callable[[], Awaitable[None]]] = []
        #: callables returning ``{tag: scalar}`` that the summary service writes each tick
        #: (queue runners register their ``queue/<name>/fraction_full`` here)
        self.scalar_sources: list[Callable[[], dict[str, float]]] = []
        #: iterators run_loop finished with; released at shutdown, because destroying a
        #: tf.data iterator can block for seconds while its background work winds down
        self._spent_iterators: list[Any] = []
        #: queue name → its ``statistics()`` callable, for ``status().queues``
        self.queue_stats: dict[str, Callable[[], QueueStatistics]] = {}
        #: callables releasing a step-thread wait for input; see :meth:`wake_step_thread`
        self.step_wakers: list[Callable[[], None]] = []
        self._user_services = list(services)
        self._service_states: dict[str, str] = {}
        self._threads: list[DedicatedThread] = []
        self._tg: TaskGroup | None = None
        self._scope: anyio.CancelScope | None = None
        self._entered = False

    # -- what services see (ServiceContext) -------------------------------------------

    @property
    def global_step(self) -> int:
        """Steps completed so far."""
        return self.step

    def new_thread(self, name: str) -> DedicatedThread:
        """Start a dedicated thread that is joined when the session ends."""
        thread = DedicatedThread(name, self.loop)
        thread.start()
        self._threads.append(thread)
        return thread

    def wake_step_thread(self) -> None:
        """Release waits for input on the step thread: a stop or a halted ``run_loop``."""
        for wake in tuple(self.step_wakers):
            wake()

    def set_service_state(self, name: str, state: str) -> None:
        """Record a service's state for ``status()``."""
        self._service_states[name] = state

    def status(self) -> Status:
        """A frozen snapshot of this session."""
        return Status(
            running=self._entered and not self.closed,
            global_step=self.step,
            steps_per_sec=self.steps_per_sec,
            last_checkpoint=self.last_checkpoint,
            stop_reason=self.control.reason if self._entered else None,
            services=MappingProxyType(dict(self._service_states)),
            queues=MappingProxyType({name: stats() for name, stats in self.queue_stats.items()}),
        )

    # -- step thread work ------------------------------------------------------------

    async def _start_up(self) -> bool:
        """On the loop: start-up's step-thread work; returns whether it restored.

        ``tf.errors.AbortedError``/``UnavailableError`` while restoring or initialising
        (a flaky filesystem, a peer restarting) are transient, as TF's ``MonitoredSession``
        treated them when creating its session: the restore-or-init is retried under the
        recovery policy (bounded count, backoff from ``recovery_wait_secs`` on the
        session's clock); past it, the error propagates as itself. Nothing is set aside
        for a transient error.
        """
        await self.step_thread.call(self._begin_startup)
        restored: bool = await _recovery.retry_transient(
            lambda: self.step_thread.call(self._restore_or_init),
            FailureWindow(_recovery.recovery_policy(self.config.recovery_wait_secs)),
            self.clock,
            event="session.start_retrying",
            gave_up="session.start_gave_up",
        )
        await self.step_thread.call(self._finish_startup)
        return restored

    def _begin_startup(self) -> None:
        """On the step thread: ``hook.begin()``, then the state built."""
        self.hooks.begin()
        self._build_state()

    def _restore_or_init(self) -> bool:
        """On the step thread: restore the latest good checkpoint, else ``init_fn``."""
        restored = self._restore()
        if not restored and self.config.init_fn is not None:
            self.config.init_fn()
        return restored

    def _finish_startup(self) -> None:
        """On the step thread: ``local_init_fn``, the ``ready_fn`` check, the step count,
        ``hook.after_create_session()``."""
        config = self.config
        if config.local_init_fn is not None:
            config.local_init_fn()
        if config.ready_fn is not None:
            not_ready = [str(name) for name in (config.ready_fn() or ())]
            if not_ready:
                raise RuntimeError(f"the model is not ready after start-up: {', '.join(not_ready)}")
        self.step = int(self.global_step_var.numpy())
        self.hooks.after_create_session(self.session)

    def _build_state(self) -> None:
        """Create the global step variable if needed and the checkpoint holding it all."""
        tf_ = tf()
        config = self.config
        state = config.state
        var = config.global_step
        if var is None and state is not None and not isinstance(state, dict):
            candidate = getattr(state, "global_step", None)
            if isinstance(candidate, tf_.Variable):
                var = candidate
        if var is None and isinstance(state, dict) and isinstance(state.get("global_step"), tf_.Variable):
            var = state["global_step"]
        if var is None:
            var = tf_.Variable(0, dtype=tf_.int64, trainable=False, name="global_step")
        if not isinstance(var, tf_.Variable) or not var.dtype.is_integer or var.shape.rank != 0:
            raise TypeError(f"global_step must be a scalar integer tf.Variable, got {var!r}")
        self.global_step_var = var
        if state is None:
            self.checkpoint = tf_.train.Checkpoint(global_step=var)
        elif isinstance(state, dict):
            self.checkpoint = tf_.train.Checkpoint(**{**state, "global_step": var})
        else:
            if getattr(state, "global_step", None) is not var:
                state.global_step = var
            self.checkpoint = state

    def _restore(self) -> bool:
        """Restore the latest good checkpoint; ``False`` when there is none."""
        return _checkpoint_service.restore_on_startup(self)

    def save_checkpoint_from_step_thread(self, directory: str | None = None, basename: str | None = None) -> str:
        """On the step thread: checkpoint the state now and make it the latest; its path.

        What ``CheckpointSaverHook`` saves through. Into the session's own logdir it goes
        through the session's checkpointer (same commit protocol and retention, and a step
        already saved is not written twice), however ``directory`` spells it (relative,
        through ``..`` or a symlink); elsewhere, a one-off checkpointer for that
        directory with the same protocol.
        """
        from .._checkpoint._manager import write_checkpoint_now

        config = self.config
        target = directory if directory is not None else config.logdir
        if target is None:
            raise ValueError("no checkpoint directory: the Supervisor has no logdir")
        name = basename or config.checkpoint_basename
        for check in self.before_snapshot:
            check()
        self.sync_global_step()
        own = self.checkpointer
        if own is not None and name == config.checkpoint_basename and _same_dir(target, own.logdir):
            snap = own.snapshot(self.step)
            if snap is None:  # this step is already saved (or being written)
                return str(own.logdir / f"{name}-{self.step}")
            info = own.write(snap)
            self.last_checkpoint = info
            return info.path
        return write_checkpoint_now(
            self.checkpoint,
            target,
            name,
            self.step,
            max_to_keep=config.max_to_keep,
            keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
        )

    def sync_global_step(self) -> None:
        """On the step thread: make the ``global_step`` variable equal the step count."""
        var = self.global_step_var
        if var is not None:
            var.assign(self.step)

    def _count(self, results: Any) -> int:
        self.last_output = results
        self.step += 1
        return self.step

    def run_one_step(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """On the step thread: one step, with hooks, counted."""
        if self.step_thread.has_boundary_jobs:
            self.step_thread.run_boundary_jobs()
        try:
            if self.hooks.per_step:
                results = self.hooks.run_step(self.control, self.session, fn, args, kwargs, self._count)
            else:
                results = fn(*args, **kwargs)
                self.last_output = results
                self.step += 1
        except Exception as exc:
            self._note_step_error(exc)
            raise
        if self.step >= self.next_trigger_step:
            self.saver.on_step()  # type: ignore[union-attr]
        return results

    def loop_job(
        self,
        fn: Callable[..., Any],
        data: Iterable[Any] | None,
        max_steps: int | None,
        halt: Any,
        checkpoint_iterator: bool | None = None,
    ) -> tuple[int, str | None]:
        """On the step thread: the step loop of ``Session.run_loop``.

        Returns ``(steps run, stop reason or None)``. Checks, at every boundary, the stop
        flag, this loop's halt flag, boundary jobs (snapshots) and ``max_steps``.
        """
        control = self.control
        boundary = self.step_thread._boundary
        run_boundary = self.step_thread.run_boundary_jobs
        hooks = self.hooks
        per_step = hooks.per_step
        session = self.session
        count = self._count
        n = 0
        reason: str | None = None
        iterator = None
        if data is not None:
            try:
                iterator = self.make_iterator(data, checkpoint_iterator)
            except Exception as exc:
                # No step ran: the state is sound (the final checkpoint is still taken),
                # but the error stops the session.
                if not is_end_of_data(exc):
                    control.record_error(exc)
                raise
        try:
            while not (control.stopping or halt.halted):
                if boundary:
                    run_boundary()
                if max_steps is not None and self.step >= max_steps:
                    reason = "max_steps"
                    break
                if iterator is None:
                    if per_step:
                        hooks.run_step(control, session, fn, (), {}, count)
                    else:
                        self.last_output = fn()
                        self.step += 1
                else:
                    batch = next(iterator)
                    if per_step:
                        hooks.run_step(control, session, fn, (batch,), {}, count)
                    else:
                        self.last_output = fn(batch)
                        self.step += 1
                n += 1
                if self.step >= self.next_trigger_step:
                    self.saver.on_step()  # type: ignore[union-attr]
        except Exception as exc:
            if not is_end_of_data(exc):
                self._note_step_error(exc)
                raise
            reason = "end_of_data"
        finally:
            halt.steps_run = n  # read by run_loop when this leg fails and is recovered
            self.sync_global_step()
            if iterator is not None:
                self._spent_iterators.append(iterator)
        halt.finished = True  # ended at a step boundary, without an error
        return n, reason

    def make_iterator(self, data: Iterable[Any], checkpoint_iterator: bool | None = None) -> Any:
        """On the step thread: an iterator over ``data`` (``iter(data)``).

        The iterator of a ``tf.data.Dataset`` is tracked in the checkpoint (and resumes
        from it) when there is a logdir, as ``checkpoint_iterator`` says (see
        ``Session.run_loop`` and :meth:`Checkpointer.track_iterator`).

        Raises:
            CheckpointError: ``checkpoint_iterator=True`` and the position of ``data``
                cannot be checkpointed.
        """
        from .._checkpoint._iterator_state import serialisation_problem, untrackable_error

        if not isinstance(data, tf().data.Dataset):
            if checkpoint_iterator:
                raise untrackable_error(f"data is a {type(data).__name__}, not a tf.data.Dataset")
            return iter(data)
        if self.checkpointer is not None:
            return self.checkpointer.track_iterator(data, checkpoint_iterator)
        iterator = iter(data)
        if checkpoint_iterator:  # no checkpoints here, but the same pipeline fails with them
            problem = serialisation_problem(iterator)
            if problem is not None:
                raise untrackable_error(problem)
        return iterator

    def _note_step_error(self, exc: BaseException, *, recoverable: bool = True) -> None:
        # On the step thread: keep the error (never lost), mark the state suspect and
        # raise the stop flag so nothing else runs; the awaiting task cancels the scope.
        if is_end_of_data(exc):  # the data ran out: a clean stop (TF1 calls hook.end too)
            return
        control = self.control
        if recoverable and self.checkpointer is not None and is_recoverable(exc) and not control.stopping:
            self.recovering = True  # Session awaits recover(): restore and retry, or give up
            return
        control.state_suspect = True
        control.record_error(exc)

    def step_fn_failed(self, exc: BaseException) -> None:
        """On the step thread: a ``run_step_fn`` step function raised ``exc`` itself.

        The same as a step raising it: the state is suspect and the error kept, or, for
        ``AbortedError``/``UnavailableError``, the session recovers; end of data stays
        a clean stop.
        """
        if is_end_of_data(exc):
            return  # step_failed() stops cleanly (or not, if a swallowed error left us recovering)
        # A recoverable error that step_fn caught and replaced with this one is not
        # recovered from: this error decides.
        self.recovering = False
        self._note_step_error(exc)

    async def recover(self, exc: BaseException) -> bool:
        """On the loop thread: after a step error, restore and return whether to retry."""
        if not self.recovering:
            return False
        try:
            retry = await _recovery.recover(self, self._recovery, exc)
        except Exception as err:
            _add_note(exc, f"asupervisor: recovery failed: {err!r}")
            retry = False
        if not retry:
            self.recovering = False
            self._note_step_error(exc, recoverable=False)
        return retry

    def step_failed(self, exc: BaseException) -> bool:
        """On the loop thread: a step raised ``exc``; stop. Returns whether it was end of data."""
        if self.recovering:  # a caller that does not recover: the error stops the session
            self.recovering = False
            self.control.state_suspect = True
        if is_end_of_data(exc):
            self.control.request_stop(reason="end_of_data")
            return True
        self.control.request_stop(exc)
        return False

    # -- enter / exit ----------------------------------------------------------------

    def _services(self) -> list[Service]:
        config = self.config
        services: list[Service] = []
        if config.handle_signals:
            services.append(SignalService())
        if config.save_summaries_secs > 0:
            services.append(StepCounterService(config.save_summaries_secs, self._on_rate))
            if self.summary_writer is not None:
                services.append(SummaryService(config.save_summaries_secs, self.summary_writer, self))
        services.extend(_checkpoint_service.services_for(self))
        services.extend(self._user_services)
        return services

    def _on_rate(self, step: int, rate: float) -> None:
        self.steps_per_sec = rate
        if self.summary_writer is not None:
            self.summary_writer.write(step, {"global_step/sec": rate})

    async def __aenter__(self) -> Session:
        if self._entered:
            raise RuntimeError("a managed session can be entered only once")
        self._entered = True
        self.loop = LoopHandle()
        self.control = StopControl(self.loop, on_stop=self.wake_step_thread)
        self.session = Session(self)
        self.step_thread = self.new_thread("asv-step")
        self.summary_writer = SummaryWriter.open(self)
        try:
            restored = await self._start_up()
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
            for service in self._services():
                if service.name in self._service_states:
                    raise ValueError(f"two services are named {service.name!r}; names must be unique")
                self._service_states[service.name] = "starting"
                await self._tg.start(supervise, service, self)
            self._scope = anyio.CancelScope()
            self.control.scope = self._scope
            self._scope.__enter__()
        except BaseException as exc:
            await self._abort_start(exc)
            raise
        if self.control.stopping:  # a service failed or a stop came in during start-up
            self._scope.cancel()
        log.info(
            "session.started",
            global_step=self.step,
            restored=restored,
            logdir=str(self.config.logdir) if self.config.logdir else None,
        )
        return self.session

    async def _abort_start(self, exc: BaseException) -> None:
        """Start-up failed: undo what was started; the caller re-raises ``exc``."""
        self.control.request_stop(exc if isinstance(exc, Exception) else None, reason=f"error:{type(exc).__name__}")
        self.control.state_suspect = True
        with anyio.CancelScope(shield=True):
            if self._tg is not None:
                await self._stop_services()
            await self._close_threads()
        self.closed = True
        log.error("session.start_failed", error=describe(exc))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        control = self.control
        assert self._scope is not None
        # The stop scope swallows its own cancellation: then the body's exception (a
        # cancellation) must be suppressed by returning True.
        try:
            suppress = bool(self._scope.__exit__(exc_type, exc, tb))
        except BaseException as remaining:  # trio: the body's group minus the scope's Cancelled
            suppress, exc = False, remaining
        if suppress:
            exc = None
        if exc is None:
            control.request_stop(reason="completed")
        elif isinstance(exc, anyio.get_cancelled_exc_class()):
            control.request_stop(reason="cancelled")  # the caller's scope: app shutdown
        elif isinstance(exc, Exception) and is_end_of_data(exc):
            control.request_stop(reason="end_of_data")
            suppress = True
        elif isinstance(exc, Exception):
            control.request_stop(exc)
        else:  # KeyboardInterrupt, SystemExit: stop without calling it clean
            control.request_stop(reason=f"error:{type(exc).__name__}")
            control.state_suspect = True
        await self._shutdown(clean=not control.errors and not control.state_suspect)
        if control.errors:
            first = control.errors[0]
            for other in control.errors[1:]:
                _add_note(first, f"asupervisor: also raised during this session: {other!r}")
            if first is exc:
                return False
            raise first
        return suppress

    async def _shutdown(self, *, clean: bool) -> None:
        """Stop everything in order, each phase bounded by the rest of the grace period."""
        control = self.control
        grace = self.stop_grace_secs
        deadline = anyio.current_time() + grace if math.isfinite(grace) else math.inf
        # Services first: their task group is exited before any other scope is entered.
        assert self._tg is not None
        await self._stop_services()

        wind_down: list[float] = []  # the deadline of the closers and joins, once set

        async def phase(name: str, fn: Callable[[], Awaitable[object]], *, winding_down: bool = False) -> None:
            limit = deadline
            now = anyio.current_time()
            if winding_down:
                if not wind_down:
                    wind_down.append(max(deadline, now + _WIND_DOWN_SECS))
                limit = wind_down[0]
            elif now >= deadline:
                log.error("shutdown.overrun", phase=name, grace_secs=grace, skipped=True)
                return
            with anyio.CancelScope(shield=True, deadline=limit) as scope:
                try:
                    await fn()
                except Exception as exc:
                    control.record_secondary(exc, where=name)
            if scope.cancelled_caught:
                log.error("shutdown.overrun", phase=name, grace_secs=grace)

        for save in self.final_save:
            if control.state_suspect:  # also set by a final check (NanTensorHook's last loss)
                break
            await phase("final_checkpoint", save)
        await phase("sync_global_step", lambda: self.step_thread.call(self.sync_global_step))
        if clean and not control.state_suspect:
            await phase("hooks_end", lambda: self.step_thread.call(self.hooks.end, self.session))
        if self._spent_iterators:
            await phase("iterators", lambda: self.step_thread.call(self._spent_iterators.clear))
        for closer in self.closers:
            await phase("closers", closer, winding_down=True)
        await phase("threads", lambda: self._close_threads(wind_down[0] if wind_down else deadline), winding_down=True)
        self.closed = True
        log.info("session.stopped", reason=control.reason, global_step=self.step)

    async def _stop_services(self) -> None:
        tg = self._tg
        if tg is None:
            return
        self._tg = None
        tg.cancel_scope.shield = True  # an outer cancellation must not cut the wait short
        tg.cancel_scope.cancel()
        await tg.__aexit__(None, None, None)
        for name, state in self._service_states.items():
            if state not in ("failed", "finished"):
                self._service_states[name] = "stopped"

    async def _close_threads(self, deadline: float | None = None) -> None:
        """Join the dedicated threads by ``deadline`` (loop time; default: the grace from now)."""
        if deadline is None:
            grace = self.stop_grace_secs
            deadline = anyio.current_time() + grace if math.isfinite(grace) else math.inf
        # Service threads first, the step thread (which owns the state) last.
        for thread in reversed(self._threads):
            await thread.aclose_within(max(0.0, deadline - anyio.current_time()))
