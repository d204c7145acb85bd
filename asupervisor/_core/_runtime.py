"""The engine of one managed session: step thread, stop scope, parts, ordered shutdown.

``Supervisor.managed_session()`` returns a :class:`Runtime`, an async context manager.
Features are :class:`~._abc.SessionPart` objects the front door hands in; the runtime
is their :class:`~._abc.SessionContext` and runs their phases in this order.

Start-up: parts ``start`` (writers, threads) → ``hook.begin()`` → state built, restored by
the parts or initialised (``init_fn``) on the step thread → ``local_init_fn`` →
``ready_fn`` check → ``hook.after_create_session()`` → services started in the task
group, each reporting ready → the stop scope is entered and the session is yielded.

Shutdown, whatever the cause: stop requested → parts woken → the step in flight
finishes → services cancelled → every part's ``before_snapshot``, then every part's
``final`` (the final checkpoint; both unless a step or hook raised) → ``hook.end()``
(clean stops only) → every part's ``aclose`` (summaries flushed) → dedicated threads
joined → the cause re-raised. Every part's ``release`` (the logdir's lock) runs on the
step thread just before the threads are joined, also after a failed start. One :class:`~._stop.Deadline`, ``stop_grace_secs`` after
the stop began, bounds the whole of it: each phase gets what is left, a phase that
overruns is logged by name (``shutdown.overrun phase=...``; a final save overrunning is
abandoned), and phases not begun by then are skipped, except closing the parts, releasing
them and joining the threads, which together end at most ``_WIND_DOWN_SECS`` after the
grace (an abandoned final save's own wind-down included).

Only the step thread touches model state. Nothing here blocks the event loop: the only
waits are for the step thread and for services, all by awaiting. This module imports no
feature: what a feature offers reaches the engine through :mod:`._abc`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from .._logging import describe, get_logger
from .._tf import is_end_of_data, tf
from ._abc import SessionAttribute, SessionPart
from ._divergence import DivergenceWatch, RollbackCounts
from ._epochs import EpochCounter
from ._goodput import TimeAccount
from ._handoff import LoopHandle, waits_bounded_by
from ._hooks import HookRunner
from ._metrics import MetricsSampler
from ._notice import EXIT_SECS, WIND_DOWN_SECS, NoticeWindow
from ._outputs import float_entries, scalar_entries
from ._parts import PartRunner
from ._release import Retired
from ._services import Service, supervise
from ._session import Session
from ._signals import SignalHandlers
from ._status import ReadOnlyDict, Status
from ._step_errors import StepErrors, recovery_policy, retry_transient
from ._steps import Steps
from ._stop import Deadline, StopControl, error_reason
from ._threads import DedicatedThread
from ._timings import Timings
from ._watchdog import Mark, Watchdog

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from ._abc import EngineConfig
    from ._clock import Clock

__all__ = ["Runtime"]

T = TypeVar("T")

log = get_logger(__name__)

#: once the stop's grace has run out: the most closing the parts and joining the threads
#: get together (an abandoned save removing its files, event files flushed)
_WIND_DOWN_SECS = WIND_DOWN_SECS
#: the least a stop waits for a dedicated thread to end: one that is idle, once told, ends in
#: milliseconds (a deadline already spent must not report it abandoned)
_IDLE_JOIN_SECS = 0.05


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


class Runtime(anyio.AsyncContextManagerMixin):
    """One managed session (an async context manager yielding :class:`Session`).

    Args:
        config: the supervisor's settings.
        services: the user's services (looped services, queue runners).
        parts: the features of this session, in order (the front door's assembly).
    """

    def __init__(self, config: EngineConfig, services: Iterable[Service], parts: Iterable[SessionPart] = ()) -> None:
        self.config = config
        self.clock: Clock = config.clock
        self.stop_grace_secs = config.stop_grace_secs
        self.is_chief = bool(config.is_chief)
        self.multi_worker = config.multi_worker
        self.cluster = config.cluster
        self.logdir: Path | None = None if config.logdir is None else Path(config.logdir)
        self.hooks = HookRunner(config.hooks)
        self.epoch_counter = EpochCounter()  # run_loop(epochs=): where the loop is in them
        user_services = list(services)
        #: a stop notice's deadline, used to train on and save before it (:mod:`._notice`)
        self.notice = NoticeWindow(self, getattr(config, "stop_deadline_secs", None))
        # Stock hooks that take part in session phases (NanTensorHook's check before any
        # snapshot, ...) come first, through their ``_asv_part()``; then the features;
        # then services that are parts too (queue runners).
        self.parts = PartRunner(
            [
                *(hook._asv_part() for hook in config.hooks if callable(getattr(hook, "_asv_part", None))),
                *parts,
                *(service for service in user_services if isinstance(service, SessionPart)),
                MetricsSampler(self.sample_metrics),
                self.epoch_counter,
                self.notice,
            ]
        )
        self.step = 0  # steps completed; written only by the step thread
        self.last_output: Any = None  # the last step's return value (hooks, summaries)
        self.closed = False
        self.state: Any = None  # the tf.train.Checkpoint holding state + global_step
        self.global_step_var: Any = None
        self.errors = StepErrors(self)
        #: iterators run_loop finished with; released at shutdown, because destroying a
        #: tf.data iterator can block for seconds while its background work winds down
        self.spent_iterators: list[Any] = []
        #: ended passes' iterators, dropped off the step thread once nothing else holds them
        self.retired = Retired(self.new_thread, self._stopping)
        #: the ``max_steps`` of the ``run_loop`` running now (``_steps`` sets it)
        self.max_steps: int | None = None
        #: the divergence watch of the ``run_loop`` running now (``_steps`` installs it):
        #: every snapshot asks it first, so a diverged state is never checkpointed
        self.divergence: DivergenceWatch | None = None
        #: divergence rollbacks of this session: count, seconds, steps undone
        self.rollbacks = RollbackCounts()
        # for status(): when the session started, the latest step-output scalars
        self._started: tuple[float, float, int] | None = None  # (time.time(), monotonic, step)
        self._metrics: dict[str, float] = {}
        #: ``(step, logs)``: an epoch's metrics (``sess.fit``: ``loss``, ``val_loss``, ...),
        #: which describe the state at that step only
        self.epoch_logs: tuple[int, dict[str, float]] = (-1, {})
        #: set by ``Session.fit`` while it runs: its epochs done, the loop returns without
        #: stopping the session (a second fit, the code after it, run as with Keras)
        self.fit_continues = False
        #: the stop reason of a body that completes after such a loop: ``"epochs"``
        self.completed_reason: str | None = None
        self._restarts: dict[str, int] = {}
        self._save_secs = Timings()
        #: where this session's time goes (the goodput ledger's figures of this segment)
        self.times = TimeAccount()
        #: the hang watchdog (:mod:`._watchdog`); the step loop writes its ``beat``
        self.watchdog = Watchdog(self, config.watchdog, cluster=self.multi_worker)
        self.beat = self.watchdog.beat
        self._user_services = user_services
        self._service_states: dict[str, str] = {}
        self._extras: dict[Any, Callable[[], Any]] = {}
        self._threads: list[DedicatedThread] = []
        self._tg: TaskGroup | None = None
        self._late_tg: TaskGroup | None = None  # the services serving through the stop
        self._entered = False
        self._signals: SignalHandlers | None = None
        #: a second signal came: the stop's remaining work is abandoned
        self._hurried = False
        #: the first stop signal's name (``"SIGINT"``), once one came (read by the progress display)
        self.signalled: str | None = None
        self._deadline: Deadline | None = None  # the stop's, once it began
        self._phase_scope: anyio.CancelScope | None = None  # the shutdown phase running

    # -- SessionContext: what parts and services see -------------------------------------

    @property
    def global_step(self) -> int:
        """Steps completed so far."""
        return self.step

    @property
    def recovering(self) -> bool:
        """Whether a step error is being recovered from (no snapshot may be taken)."""
        return self.errors.recovering

    def new_thread(self, name: str) -> DedicatedThread:
        """Start a dedicated thread that is joined when the session ends."""
        thread = DedicatedThread(name, self.loop)
        thread.start()
        self._threads.append(thread)
        return thread

    def request_stop(self, exc: BaseException | None = None, *, reason: str | None = None) -> None:
        """Stop the session at the next step boundary; any thread."""
        self.control.request_stop(exc, reason=reason)

    @property
    def running(self) -> bool:
        """Whether the session's services run (start-up is over, the stop has not begun)."""
        return self._tg is not None

    def start_soon(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """On the loop, while :attr:`running`: run ``fn()`` in the session's task group
        (cancelled with the services at the stop)."""
        assert self._tg is not None
        self._tg.start_soon(fn)

    def stop_wait_secs(self) -> float:
        """How long a stop may wait for the step thread now: ``stop_grace_secs``, less
        when a notice's deadline is nearer: the process's exit and a quarter of the
        wind-down kept before it (the rest of the wind-down's reserve is the final save's
        slack: after a committed save the wind-down takes milliseconds)."""
        left = self.notice.time_left()
        return min(self.stop_grace_secs, max(0.0, left - EXIT_SECS - _WIND_DOWN_SECS / 4))

    def notice_stop_step(self) -> int:
        """On the step thread: the step an agreed stop of a notice is at (:mod:`._notice`)."""
        return self.notice.planned_stop_step()

    def request_notice(self, reason: str, deadline_secs: float | None = None) -> None:
        """On the loop: a preemption notice from a service or the application
        (``preempted:<source>``), with its own deadline or the configured one."""
        self.notice_preemption(reason, deadline_secs)

    def mark_state_suspect(self) -> None:
        """The model state must not be checkpointed any more."""
        self.control.state_suspect = True

    def run_on_step_thread(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]:
        """On the loop: run ``fn(*args)`` on the step thread and await its result."""
        result: Awaitable[T] = self.step_thread.call(fn, *args)
        return result

    def check_before_snapshot(self) -> None:
        """On the step thread: every part's ``before_snapshot``; raises what one raises.

        First, under ``run_loop(on_divergence=...)``, every loss not read yet is judged:
        a diverged state raises ``SnapshotRefused`` (:mod:`._divergence`)."""
        watch = self.divergence
        if watch is not None:
            watch.refuse()
        self.parts.check_before_snapshot()

    def scalar_sources(self) -> tuple[Callable[[], Mapping[str, float]], ...]:
        """The parts' scalar sources, for the summary writer."""
        return self.parts.scalar_sources

    def set_step(self, step: int) -> None:
        """On the step thread, after a restore: the step count restored."""
        self.step = step

    def extra(self, attribute: Any, default: Any = ...) -> Any:
        """A capability a part offers (``SessionAttribute.x``), else ``default``."""
        getter = self._extras.get(attribute)
        if getter is not None:
            return getter()
        if default is ...:
            raise anyio.TypedAttributeLookupError(f"no part of this session offers {attribute!r}")
        return default

    @property
    def hurried(self) -> bool:
        """Whether a second signal abandoned what was left of the stop's work."""
        return self._hurried

    def wake_step_thread(self) -> None:
        """Release waits for input on the step thread: a stop or a halted ``run_loop``."""
        self.parts.wake()

    def _stop_requested(self) -> None:
        """Any thread, at each stop request: its time noted (the first), step-thread waits released."""
        self.times.mark_stop()
        self.wake_step_thread()

    def set_service_state(self, name: str, state: str) -> None:
        """Record a service's state for ``status()`` (a restart is counted)."""
        self._service_states[name] = state
        if state == "restarting":
            self._restarts[name] = self._restarts.get(name, 0) + 1

    def status(self) -> Status:
        """A frozen snapshot of this session; any thread."""
        running = self._entered and not self.closed
        step = self.step
        checkpoints = self.extra(SessionAttribute.checkpoints, None)
        rate = self.extra(SessionAttribute.steps_per_sec, None)
        if rate is None and self._started is not None:  # before the step counter's first tick
            elapsed = time.monotonic() - self._started[1]  # not the session clock: any thread
            if elapsed > 0 and step > self._started[2]:
                rate = (step - self._started[2]) / elapsed
        max_steps = self.max_steps
        eta = None
        if max_steps is not None and rate:
            eta = max(0, max_steps - step) / rate
        remote = self.extra(SessionAttribute.remote, None)
        tiers = dict(checkpoints.tiers) if checkpoints is not None else {}
        if remote is not None and remote.uploaded_step is not None:
            tiers["remote"] = remote.uploaded_step
        return Status(
            running=running,
            global_step=step,
            steps_per_sec=rate,
            last_checkpoint=None if checkpoints is None else checkpoints.last,
            stop_reason=self.control.reason if self._entered else None,
            services=ReadOnlyDict(dict(self._service_states)),
            queues=ReadOnlyDict(self.parts.queues()),
            metrics=ReadOnlyDict(dict(self._metrics)),
            max_steps=max_steps,
            started_at=None if self._started is None else self._started[0],
            eta_secs=eta,
            restarts=ReadOnlyDict(dict(self._restarts)),
            remote=remote,
            save_seconds=self._save_secs.snapshot(),
            tiers=ReadOnlyDict(tiers),
            rollbacks=self.rollbacks.count,
            goodput=self.extra(SessionAttribute.goodput, None),
            **self._epoch_status(step),
        )

    def _epoch_status(self, step: int) -> dict[str, int | None]:
        """``status()``'s epoch fields (``None`` unless epochs were counted)."""
        counter = self.epoch_counter
        if not counter.active:
            return {}
        return {
            "epoch": counter.epoch,
            "epochs": counter.epochs,
            "epoch_step": max(0, step - counter.first_step),
            "steps_per_epoch": counter.steps_per_epoch,
        }

    def observe_save_secs(self, phase: str, secs: float) -> None:
        """Count one checkpoint phase's duration for ``status().save_seconds``; any thread."""
        self._save_secs.observe(phase, secs)

    def record_badput(self, cause: str, secs: float = 0.0, *, steps: int = 0) -> None:
        """Any thread: count badput of ``cause`` in the goodput ledger (:mod:`._goodput`)."""
        self.times.record(cause, secs, steps=steps)

    @property
    def time_account(self) -> TimeAccount:
        """Where this session's time went so far."""
        return self.times

    def watch_phase(self, phase: str) -> Mark:
        """Any thread: the hang watchdog times ``phase`` from now (:mod:`._watchdog`)."""
        if not self.config.watchdog.enabled:
            return Mark(None, phase, 0.0)
        return self.watchdog.begin(phase)

    def current_metrics(self) -> dict[str, float]:
        """On the step thread: the last step's scalars and the logs of an epoch that
        ended at this step (``epoch_logs``), for a checkpoint taken now."""
        metrics = float_entries(scalar_entries(self.last_output))
        logs_step, logs = self.epoch_logs
        if logs_step == self.step:
            metrics.update(logs)
        return metrics

    def sample_metrics(self) -> None:
        """On the step thread, at a boundary: one host read of each scalar of the last
        step's output, for ``status().metrics`` (:mod:`._metrics`: about once a second)."""
        try:
            self._metrics = float_entries(scalar_entries(self.last_output))
        except Exception as exc:  # never let a status read fail a step
            log.debug("status.metrics_failed", error=describe(exc))

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
        from ._services import FailureWindow

        await self.step_thread.call(self._begin_startup)
        restored: bool = await retry_transient(
            lambda: self.step_thread.call(self._restore_or_init),
            FailureWindow(recovery_policy(self.config.recovery_wait_secs)),
            self.clock,
            event="session.start_retrying",
            gave_up="session.start_gave_up",
        )
        await self.step_thread.call(self._finish_startup)
        return restored

    def _begin_startup(self) -> None:
        """On the step thread: ``hook.begin()``, then the state built."""
        self.hooks.begin()
        if self.config.watchdog.enabled:
            self.watchdog.load()  # the deadlines the last run learned, before the restore
        self._build_state()

    def _restore_or_init(self) -> bool:
        """On the step thread: the parts restore the latest good checkpoint, else ``init_fn``."""
        t0 = time.perf_counter()
        mark = self.watch_phase("restore")
        try:
            restored = self.parts.restore(self) is not None
        except BaseException:
            mark.drop()
            raise
        finally:
            self.times.restore += time.perf_counter() - t0
        if restored:  # learned from real restores only: nothing to restore is no measure
            mark.end()
        else:
            mark.drop()
        if not restored and self.config.init_fn is not None:
            self.config.init_fn()
        return restored

    def _finish_startup(self) -> None:
        """On the step thread: ``local_init_fn``, the ``ready_fn`` check, the step count,
        the parts' step triggers, ``hook.after_create_session()``."""
        config = self.config
        if config.local_init_fn is not None:
            config.local_init_fn()
        if config.ready_fn is not None:
            not_ready = [str(name) for name in (config.ready_fn() or ())]
            if not_ready:
                raise RuntimeError(f"the model is not ready after start-up: {', '.join(not_ready)}")
        self.step = self.times.start_step = int(self.global_step_var.numpy())
        self.parts.arm(self.step)
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
            self.state = tf_.train.Checkpoint(global_step=var)
        elif isinstance(state, dict):
            self.state = tf_.train.Checkpoint(**{**state, "global_step": var})
        else:
            if getattr(state, "global_step", None) is not var:
                state.global_step = var
            self.state = state

    def sync_global_step(self) -> None:
        """On the step thread: make the ``global_step`` variable equal the step count."""
        var = self.global_step_var
        if var is not None:
            var.assign(self.step)

    def rearm(self) -> None:
        """On the step thread: ask every part's ``next_trigger`` again (one's changed)."""
        self.parts.arm(self.step)

    def _stopping(self) -> bool:
        control: StopControl = self.control
        return control.stopping

    def _drop_iterators(self) -> None:
        """On the step thread, at the stop: the iterators ``run_loop`` ended with and the
        retired ones still held go."""
        self.spent_iterators.clear()
        self.retired.clear()

    def make_iterator(
        self, data: Iterable[Any], checkpoint_iterator: bool | None = None, *, fresh: bool = False
    ) -> Any:
        """On the step thread: an iterator over ``data``; a part's (the checkpoint part
        tracks a ``tf.data`` iterator's position) or ``iter(data)``. ``fresh``: a new
        pass over ``data`` (an epoch), not the iterator a last ``run_loop`` left off."""
        iterator = self.parts.iterator_for(self, data, checkpoint_iterator, fresh=fresh)
        return iter(data) if iterator is None else iterator

    # -- enter / exit ----------------------------------------------------------------

    def _services(self) -> list[Service]:
        services: list[Service] = list(self.parts.services(self))
        services.extend(self._user_services)
        return services

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[Session]:
        """The session's lifetime: start up, yield the session, stop in order, raise the cause.

        The body runs inside the stop scope: a stop from anywhere cancels it, and the
        scope swallows its own cancellation. Whatever ended the body (it returned, raised,
        was cancelled from outside, or the scope was cancelled) becomes the stop's reason;
        then :meth:`_shutdown` runs the phases; then the first error of the session is
        raised as itself (others attached as notes), or the body's own exception goes on.
        """
        restored = await self._start()
        scope = self.control.scope = anyio.CancelScope()
        ended: BaseException | None = None
        try:
            with scope:
                if self.control.stopping:  # a service failed or a stop came in during start-up
                    scope.cancel()
                log.info(
                    "session.started",
                    global_step=self.step,
                    restored=restored,
                    logdir=str(self.logdir) if self.logdir else None,
                )
                yield self.session
        except GeneratorExit:  # never exited (the context manager was dropped): nothing to run
            raise
        except BaseException as exc:  # what the body raised, less the scope's own cancellation
            ended = exc  # raised again below, unless it is the end of the data
        suppress = self._stop_for(ended)
        control = self.control
        try:
            await self._shutdown(clean=not control.errors and not control.state_suspect)
        finally:
            self._restore_signals()
        if control.errors:
            first = control.errors[0]
            for other in control.errors[1:]:
                _add_note(first, f"asupervisor: also raised during this session: {other!r}")
            raise first
        if ended is not None and not suppress:
            raise ended

    async def _start(self) -> bool:
        """Start-up up to the services (see the module docstring); returns whether it
        restored. A failure undoes what was started and propagates."""
        if self._entered:
            raise RuntimeError("a managed session can be entered only once")
        self._entered = True
        self.loop = LoopHandle()
        self.control = StopControl(self.loop, on_stop=self._stop_requested)
        if self.config.handle_signals:  # from now on, a signal is a graceful stop
            self._signals = SignalHandlers(
                self.loop, self._on_signal, self._on_signal_again, signals=tuple(self.config.stop_signals)
            )
            self._signals.install()
        self.session = Session._for(self)
        self.step_thread = self.new_thread("asv-step")
        self.steps = Steps(self)
        try:
            if self.config.watchdog.enabled:
                self.new_thread("asv-watchdog").submit_nowait(self.watchdog.run)
            self.parts.start(self)
            self._extras = self.parts.extra_attributes(self)
            checkpoints = self.extra(SessionAttribute.checkpoints, None)
            if checkpoints is not None and self.config.watchdog.enabled:
                checkpoints.on_commit(self.watchdog.committed)  # the learned deadlines kept with it
            restored = await self._start_up()
            self._started = (time.time(), time.monotonic(), self.step)
            # two task groups: the services that serve through the stop (entered first,
            # exited last), and the others, cancelled as the stop begins
            self._late_tg = anyio.create_task_group()
            await self._late_tg.__aenter__()
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
            for service in self._services():
                if service.name in self._service_states:
                    raise ValueError(f"two services are named {service.name!r}; names must be unique")
                self._service_states[service.name] = "starting"
                await (self._late_tg if service.through_stop else self._tg).start(supervise, service, self)
        except BaseException as exc:
            await self._abort_start(exc)
            raise
        return restored

    async def _abort_start(self, exc: BaseException) -> None:
        """Start-up failed: undo what was started; the caller re-raises ``exc``."""
        self.control.request_stop(exc if isinstance(exc, Exception) else None, reason=error_reason(exc))
        self.control.state_suspect = True
        with anyio.CancelScope(shield=True):
            await self._stop_services()
            await self._stop_services(late=True)
            deadline = Deadline(self.stop_grace_secs)
            if self.parts.releasers:
                with anyio.move_on_after(deadline.remaining()):
                    try:
                        await self.step_thread.submit(self.parts.release).wait_cancellable()
                    except Exception as release_exc:  # the start's own error is the one raised
                        log.error("session.release_failed", error=describe(release_exc))
            await self._close_threads(deadline)
        self.errors.note_peer_lost()
        self._restore_signals()
        self.closed = True
        log.error("session.start_failed", error=describe(exc))

    def _restore_signals(self) -> None:
        """The session's last act: the signal handlers it took go back, then the parts'
        ``ended`` (a signal can no longer reach the session)."""
        if self._signals is not None:
            self._signals.restore()
            self._signals = None
        self.parts.ended()

    def _on_signal(self, name: str) -> None:
        """On the loop, at the first SIGINT/SIGTERM: a graceful stop (one the cluster
        agrees on, when a part takes it over). The stop is requested before the event is
        logged: the parts it wakes (the progress display's Ctrl-C line) come first."""
        if self.notice.notice(f"signal:{name}", None):
            self.signalled = name
            log.warning("session.signal", signal=name, action="saving now, training on until the deadline")
            return
        if self.parts.take_signal(self, name):
            log.warning("session.signal", signal=name, action="stopping with the cluster")
            return
        self.signalled = name
        self.control.request_stop(reason=f"signal:{name}")
        log.warning("session.signal", signal=name)

    def notice_preemption(self, reason: str, deadline_secs: float | None = None) -> None:
        """On the loop: a preemption notice that is not a signal (``preempted:<source>``):
        with a deadline and time to spare, the notice window (:mod:`._notice`); else the
        stop a first signal starts, taken over by a part (the cluster's agreement) when
        one takes it, else requested here."""
        if self.notice.notice(reason, deadline_secs):
            log.warning("session.preemption_notice", reason=reason, action="saving now, training on until the deadline")
            return
        if self.parts.take_signal(self, reason):
            log.warning("session.preemption_notice", reason=reason, action="stopping with the cluster")
            return
        self.control.request_stop(reason=reason)

    def _on_signal_again(self, name: str) -> None:
        """On the loop, at a later signal: abandon what is left of the stop's work (the
        final checkpoint being written is abandoned; closing and joining still run)."""
        self._hurried = True
        if self.signalled is None:
            self.signalled = name
        self.control.request_stop(reason=f"signal:{name}")
        log.warning("session.signal", signal=name, action="abandon the final checkpoint and stop now")
        deadline = self._deadline
        if deadline is not None:
            deadline.at = min(deadline.at, anyio.current_time())
            if self._phase_scope is not None:
                self._phase_scope.deadline = deadline.at

    def _stop_for(self, ended: BaseException | None) -> bool:
        """Request the stop that ``ended`` (what ended the body) means; whether the body's
        exception is swallowed (the end of the data is a clean stop)."""
        control = self.control
        if ended is None:
            control.request_stop(reason=self.completed_reason or "completed")
        elif isinstance(ended, anyio.get_cancelled_exc_class()):
            control.request_stop(reason="cancelled")  # the caller's scope: app shutdown
        elif isinstance(ended, Exception) and is_end_of_data(ended):
            control.request_stop(reason="end_of_data")
            return True
        elif isinstance(ended, Exception):
            control.request_stop(ended)
        else:  # KeyboardInterrupt, SystemExit: stop without calling it clean
            control.request_stop(reason=f"error:{type(ended).__name__}")
            control.state_suspect = True
        return False

    async def _shutdown(self, *, clean: bool) -> None:
        """Stop everything in order, each phase bounded by what is left of one deadline."""
        control = self.control
        deadline = self._deadline = self._stop_deadline()
        # Services first: their task group is exited before any other scope is entered.
        assert self._tg is not None
        await self._stop_services()
        wind_down: list[Deadline] = []  # the deadline of closing and joining, once set
        abandoned: list[str] = []  # the phases a second signal cut short or skipped (not errors)
        skipped: list[str] = []  # the phases the grace's end left out (the overrun's one line says them)
        overran: list[str] = []  # the phases cut at the grace's end

        async def phase(name: str, fn: Callable[[], Awaitable[object]], *, winding_down: bool = False) -> None:
            # A phase is cut at ``limit``; the work it waits for (a final save on the step
            # thread) may still end within the first half of the wind-down (the closing
            # and joining keep the rest): the stop still ends by the grace and the wind-down.
            # A second signal (hurried) ends the waits at the deadline it cut.
            limit = deadline
            if winding_down:
                if not wind_down:  # counted from the grace's end, not from now: a bound
                    wind_down.append(deadline.extended_by(_WIND_DOWN_SECS))
                limit = wind_down[0]
            elif deadline.expired:
                if self._hurried:  # asked for: one mention in session.stopped, no error
                    abandoned.append(name)
                else:
                    skipped.append(name)
                return
            with (
                anyio.CancelScope(shield=True, deadline=limit.at) as scope,
                waits_bounded_by(lambda: limit.at if winding_down or self._hurried else limit.at + _WIND_DOWN_SECS / 2),
            ):
                if not winding_down:
                    self._phase_scope = scope  # a second signal cuts it short
                try:
                    await fn()
                except Exception as exc:
                    control.record_secondary(exc, where=name)
                finally:
                    self._phase_scope = None
            if scope.cancelled_caught:
                if self._hurried and not winding_down:
                    abandoned.append(name)
                else:
                    overran.append(name)

        parts = self.parts
        if not control.state_suspect and parts.before_snapshot:
            # the last checks of the state (NanTensorHook's unread losses) come before any
            # final checkpoint; one that raises makes the state suspect
            await phase("final_checkpoint", lambda: self.step_thread.call(self._final_check))
        for part in parts.finals:
            if control.state_suspect:
                break
            await phase("final_checkpoint", lambda part=part: part.final(self))  # type: ignore[misc]
        await phase("sync_global_step", lambda: self.step_thread.call(self.sync_global_step))
        if clean and not control.state_suspect:
            await phase("hooks_end", lambda: self.step_thread.call(self.hooks.end, self.session))
        if self.spent_iterators or self.retired.held:
            await phase("iterators", lambda: self.step_thread.call(self._drop_iterators))
        # the services serving through the stop: their task group is the current scope
        # again (cancelled and waited for here, shielded, not inside a phase's scope)
        await self._stop_services(late=True)
        for part in parts.closers:
            await phase("closers", lambda part=part: part.aclose(self), winding_down=True)  # type: ignore[misc]
        if parts.releasers:  # on the step thread: a lock on a hung disk must not block the loop
            await phase(
                "release", lambda: self.step_thread.submit_last(parts.release).wait_cancellable(), winding_down=True
            )
        await phase("threads", lambda: self._close_threads(wind_down[0] if wind_down else deadline), winding_down=True)
        self.errors.note_peer_lost()  # the writes settled: the checkpoint a restart resumes from
        if overran or skipped:  # one line: what overran, what it left out, what the next start uses
            last = self.status().last_checkpoint
            said: dict[str, Any] = {"also_overran": overran[1:], "skipped": sorted(set(skipped))}
            log.error(
                "shutdown.overrun",
                phase=(overran or skipped)[0],
                grace_secs=deadline.grace_secs,
                **{k: v for k, v in said.items() if v},
                next_start=last.path if last is not None else "no checkpoint: it initialises",
            )
        self.closed = True
        if abandoned:  # a second signal: what it cut short
            log.info("session.stopped", reason=control.reason, global_step=self.step, abandoned=sorted(set(abandoned)))
        else:
            log.info("session.stopped", reason=control.reason, global_step=self.step)

    def _stop_deadline(self) -> Deadline:
        """The stop's one deadline: ``stop_grace_secs`` from the stop's request (the wait
        for the step in flight took its share), nearer when a notice's deadline
        is; now, for a hurried stop (a second signal)."""
        if self._hurried:
            return Deadline(0.0)
        now = Deadline(self.stop_wait_secs())
        requested = self.control.requested_at
        if requested is None:
            return now
        began = anyio.current_time() - max(0.0, time.monotonic() - requested)  # on the loop's clock
        since_stop = Deadline(self.stop_grace_secs, began_at=began)
        return since_stop if since_stop.at < now.at else now

    def _final_check(self) -> None:
        """On the step thread: every ``before_snapshot``; one that raises makes the state suspect."""
        try:
            self.parts.check_before_snapshot()
        except Exception:
            self.control.state_suspect = True
            raise

    async def _stop_services(self, *, late: bool = False) -> None:
        """Cancel the services and wait for them: those cancelled as the stop begins, or
        (``late``) those serving through it (:attr:`.Service.through_stop`)."""
        if late:
            tg, self._late_tg = self._late_tg, None
        else:
            tg, self._tg = self._tg, None
        if tg is None:
            return
        tg.cancel_scope.shield = True  # an outer cancellation must not cut the wait short
        tg.cancel_scope.cancel()
        await tg.__aexit__(None, None, None)
        for name, state in self._service_states.items():
            if state not in ("failed", "finished"):
                self._service_states[name] = "stopped"

    async def _close_threads(self, deadline: Deadline) -> None:
        """Join the dedicated threads by ``deadline``."""
        self.watchdog.close()  # its loop ends (writing what it learned): its thread can join
        # Every thread told first, so that an idle one (the step thread, as a rule) ends at
        # once even when a stuck service thread uses up the deadline before its join.
        for thread in self._threads:
            thread.request_close()
        # Service threads first, the step thread (which owns the state) last.
        for thread in reversed(self._threads):  # (an idle thread, told, ends within milliseconds)
            await thread.aclose_within(max(_IDLE_JOIN_SECS, deadline.remaining()))
