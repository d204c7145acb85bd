"""``Supervisor``: the one-line front door for a long-running TF2 training.

A ``Supervisor`` holds configuration and services; each ``managed_session()`` builds a
fresh :class:`~asupervisor._core._runtime.Runtime` from them. Methods that report or request
(``should_stop``, ``request_stop``, ``global_step``, ``status``) are safe from any thread.
This module must not import TensorFlow.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, TypedDict

from . import _overrides as overrides
from ._assembly import session_parts
from ._checkpoint.policy._policies import KeepPolicy, SavePolicy
from ._cluster import cluster_info
from ._config import SupervisorConfig
from ._core._abc import CheckpointSaving, SessionAttribute
from ._core._clock import Clock, MonotonicClock
from ._core._hooks import SessionRunHook
from ._core._runtime import Runtime
from ._core._services import LoopedService, RestartPolicy, Service, check_notice
from ._core._signals import catch_stop_signals
from ._core._status import CheckpointInfo, Status
from ._input._queue_runner import QueueRunner
from ._options import CheckpointOptions, StopOptions, SummaryOptions, flat_defaults, merge_options, options_only

if sys.version_info >= (3, 11):  # at run time too, so typing.get_type_hints() works
    from typing import Unpack
elif TYPE_CHECKING:
    from typing_extensions import Unpack

if TYPE_CHECKING:
    from ._core._session import Session

__all__ = ["Supervisor"]


class _FlatKeywords(TypedDict, total=False):
    """``Supervisor``'s ``**flat`` keywords: the flat spelling of each options field
    (``metadata["flat"]`` in :mod:`._options`) not in the signature, and ``clock``.
    ``tests/test_options.py`` keeps this list equal to the options' fields."""

    checkpoint_basename: str
    save_model_steps: int | None
    save_policy: SavePolicy | None
    max_to_keep: int | None
    keep_checkpoint_every_n_hours: float | None
    keep_policy: KeepPolicy | None
    checkpoint_when_busy: str
    checkpoint_staging: bool
    checkpoint_store: str | None
    local_dir: str | os.PathLike[str] | None
    upload_every: int
    upload_every_secs: float | None
    stop_grace_secs: float
    handle_signals: bool
    stop_signals: Sequence[str | int]
    clock: Clock | None


def _unexpected(name: str) -> TypeError:
    """The ``TypeError`` for an unknown keyword, naming it and the closest known one."""
    groups = {"checkpoint": CheckpointOptions, "summaries": SummaryOptions, "stop": StopOptions}
    fields_named = [
        f"{group}=asv.{kind.__name__}({name}=...)"
        if f.metadata.get("options_only")
        else f"{f.metadata['flat']}= or {group}=asv.{kind.__name__}({name}=...)"
        for group, kind in groups.items()
        for f in dataclasses.fields(kind)
        if f.name == name
    ]
    params = inspect.signature(Supervisor).parameters.values()
    only = options_only()
    known = [*(p.name for p in params if p.kind is not p.VAR_KEYWORD), *(n for n in flat_defaults() if n not in only)]
    known.append("clock")
    close = [repr(c) for c in difflib.get_close_matches(name, known, n=1)]
    hint = f"; did you mean {' or '.join(fields_named or close)}?" if fields_named or close else ""
    return TypeError(f"Supervisor() got an unexpected keyword argument {name!r}{hint}")


def _settings(flat: Mapping[str, Any], explicit: Mapping[str, Any], store: object) -> dict[str, Any]:
    """The flat keywords, every one given or defaulted, with a store's name folded in."""
    defaults = flat_defaults()
    only = options_only()
    for name in flat:
        if (name not in defaults or name in only) and name != "clock":
            raise _unexpected(name)
    settings = {**defaults, **explicit, **{k: v for k, v in flat.items() if k != "clock"}}
    if isinstance(store, str):
        given = settings["checkpoint_store"]
        if given is not None and given != store:
            raise ValueError(f"store={store!r} and checkpoint_store={given!r} disagree: give the store's name once")
        settings["checkpoint_store"] = store
    return settings


class Supervisor:
    """Runs a training: restore or init, services beside the step loop, clean stops.

    A feature's settings are one options object each: ``checkpoint=asv.CheckpointOptions(
    save_steps=1000, max_to_keep=3)``, ``summaries=asv.SummaryOptions(...)``,
    ``stop=asv.StopOptions(...)``; their docstrings say what each field means. Each field
    also has a flat keyword, TF1's name where TF1 had one (``save_model_steps=1000,
    max_to_keep=3``): the most used are in the signature, the others come through
    ``**flat``. A flat keyword left at its default yields to its group's field; both given
    with different values (``save_model_secs=60`` and
    ``checkpoint=asv.CheckpointOptions(save_secs=300)``) is a ``ValueError`` naming both.

    Args:
        logdir: where checkpoints and summaries go: a directory, or a URL of object
            storage (``s3://bucket/run``, ``gs://bucket/run``, any fsspec URL; see
            ``docs/storage.md``); ``None`` disables both services.
        checkpoint: the checkpoint settings, an ``asv.CheckpointOptions``.
        summaries: the summary settings, an ``asv.SummaryOptions``.
        stop: the stop settings, an ``asv.StopOptions``.
        store: a store name or a store object: where checkpoint bytes go through. A name
            (``"auto"``, ``"fast"``, ``"plain"``) is ``CheckpointOptions.store``.
        state: a ``tf.train.Checkpoint`` or a dict of trackables (models, optimizers,
            variables, ``tf.random.Generator``); ``global_step`` is added to it.
        global_step: a scalar integer ``tf.Variable``; created when not given. The
            supervisor counts steps in Python and assigns the count to this variable at
            step boundaries where state is read (checkpoints, end of ``run_loop``, stop).
        is_chief: ``None`` derives it from ``TF_CONFIG``. When ``TF_CONFIG`` names several
            workers, every worker takes part in every save at the same steps and only
            the chief writes ``logdir`` (see ``docs/checkpoints.md``).
        init_fn: called (no arguments, on the step thread) when nothing was restored.
        local_init_fn: called after restore or init, always.
        ready_fn: returns the names of what is not ready; a non-empty answer fails
            start-up with ``RuntimeError``.
        save_model_secs: ``CheckpointOptions.save_secs``: seconds between checkpoints
            (0: none), or ``"auto"`` (by overhead budget).
        save_summaries_secs: ``SummaryOptions.save_secs``: seconds between summaries and
            step-rate measurements; 0 disables both.
        recovery_wait_secs: seconds between checks while waiting for a checkpoint.
        hooks: per-step ``SessionRunHook`` objects.
        progress: a live progress display on stderr: one line updated in place on a
            terminal (step, steps/sec, loss and other scalars, ETA, last checkpoint),
            plain lines every 10 s otherwise.
        metrics_port: serve ``metrics_text()`` at ``http://127.0.0.1:<port>/metrics``
            while a session lives (a port already taken fails the start, naming it);
            ``"host:port"`` listens on ``host`` (``"0.0.0.0:9100"``: a pod's scrape).
        queue_runners: input queue runners started with the session.
        **flat: the other options fields by their flat keyword:
            ``checkpoint_basename``, ``save_model_steps``, ``save_policy``,
            ``max_to_keep``, ``keep_checkpoint_every_n_hours``, ``keep_policy``,
            ``checkpoint_when_busy``, ``checkpoint_staging``, ``checkpoint_store``,
            ``local_dir``, ``upload_every``, ``upload_every_secs``
            (``CheckpointOptions``); ``stop_grace_secs``, ``stop_signals``,
            ``handle_signals`` (``StopOptions``); and ``clock``, the time source of
            timers and services (tests pass a ``testing.ManualClock``).

    Raises:
        ValueError: a setting is out of range (the message names it), ``logdir`` exists
            and is not a directory, ``logdir`` is a URL nothing serves (an unknown
            scheme, or its library not installed), ``TF_CONFIG`` is malformed, or ``TF_CONFIG`` names
            several workers and saving is enabled by ``save_model_secs`` alone.
        TypeError: a setting has the wrong type, a group is not its options type, or a
            keyword is unknown (the message names it, and the closest known one).
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str] | None = None,
        *,
        checkpoint: CheckpointOptions | None = None,
        summaries: SummaryOptions | None = None,
        stop: StopOptions | None = None,
        store: str | object | None = None,
        state: Any = None,
        global_step: Any = None,
        is_chief: bool | None = None,
        init_fn: Callable[[], Any] | None = None,
        local_init_fn: Callable[[], Any] | None = None,
        ready_fn: Callable[[], Iterable[str]] | None = None,
        save_model_secs: float | str = 600,
        save_summaries_secs: float = 120,
        recovery_wait_secs: float = 30,
        hooks: Sequence[SessionRunHook] = (),
        progress: bool = False,
        metrics_port: int | str | None = None,
        queue_runners: Sequence[QueueRunner] = (),
        **flat: Unpack[_FlatKeywords],
    ) -> None:
        explicit = {"save_model_secs": save_model_secs, "save_summaries_secs": save_summaries_secs}
        settings = _settings(flat, explicit, store)
        if checkpoint is not None or summaries is not None or stop is not None:
            settings = merge_options(settings, flat_defaults(), checkpoint=checkpoint, summaries=summaries, stop=stop)
        settings = overrides.save_settings(settings)  # ASUPERVISOR_* (docs/cli.md): verify-resume's runs
        cluster = cluster_info()
        self.config = SupervisorConfig(
            logdir=overrides.logdir(logdir),  # normalised to a Path
            state=state,
            global_step=global_step,
            is_chief=cluster.is_chief if is_chief is None else is_chief,
            init_fn=init_fn,
            local_init_fn=local_init_fn,
            ready_fn=ready_fn,
            recovery_wait_secs=recovery_wait_secs,
            hooks=(*hooks, *overrides.stop_hooks()),
            progress=progress,
            metrics_port=metrics_port,
            queue_runners=queue_runners,
            clock=flat.get("clock") or MonotonicClock(),
            store=None if store is None or isinstance(store, str) else store,  # a name went into the settings
            cluster=cluster,
            **settings,
        )
        if self.config.handle_signals:  # from now on, a stop signal is kept for the session
            catch_stop_signals(self.config.stop_signals)
        self._services: list[Service] = []
        self._runtime: Runtime | None = None
        for qr in self.config.queue_runners:
            self.add_queue_runner(qr)
        self._metrics_service: Service | None = None
        self._metrics_held = False  # serve_metrics() holds the endpoint: sessions start none
        if self.config.metrics_port is not None:
            from ._prometheus import MetricsServer

            self._metrics_service = MetricsServer(self.config.metrics_port, self.status)
            self._services.append(self._metrics_service)

    @property
    def is_chief(self) -> bool:
        """Whether this process writes checkpoints and summaries."""
        return bool(self.config.is_chief)

    @property
    def logdir(self) -> str | None:
        """The log directory (a URL logdir's URL), or ``None``."""
        if self.config.remote_url is not None:
            return self.config.remote_url
        return None if self.config.logdir is None else str(self.config.logdir)

    def managed_session(self) -> AbstractAsyncContextManager[Session]:
        """An async context manager: restore-or-init, start services, yield a session.

        On exit, whatever the cause, everything stops in order (see DESIGN "Start-up and
        shutdown order") and the exception that caused the stop is re-raised as itself.
        A supervisor runs one session at a time.

        Raises:
            RuntimeError: a session of this supervisor is already running.
        """
        if self._runtime is not None and not self._runtime.closed:
            raise RuntimeError("this Supervisor already has a running managed session")
        services = [s for s in self._services if not (self._metrics_held and s is self._metrics_service)]
        self._runtime = Runtime(self.config, services, session_parts(self.config))
        return self._runtime

    @asynccontextmanager
    async def serve_metrics(self, address: int | str | None = None, *, linger_secs: float = 0.0) -> AsyncIterator[None]:
        """Serve ``metrics_text()`` at ``http://<host>:<port>/metrics`` for as long as the
        caller holds this (around its whole ``main``: before, between and after sessions,
        the last one's ``stop_reason`` included), on the caller's event loop. While it is
        held, a session starts no endpoint of its own.

        Args:
            address: a port on 127.0.0.1 or ``"host:port"`` (``"0.0.0.0:9100"`` in a pod);
                ``None``: ``metrics_port``'s.
            linger_secs: on the way out (not a cancellation), wait up to this long for one
                more scrape, so the final status is read (a scrape interval, e.g. 15).

        Raises:
            ValueError: no address and no ``metrics_port``, a bad address, or a negative
                ``linger_secs``; the message names the value.
            OSError: the port is taken (naming it).
        """
        from ._prometheus import MetricsServer, held_endpoint

        address = self.config.metrics_port if address is None else address
        if address is None:
            raise ValueError("serve_metrics() needs an address: serve_metrics(9100), or Supervisor(metrics_port=...)")
        if isinstance(linger_secs, bool) or not isinstance(linger_secs, (int, float)) or not linger_secs >= 0:
            raise ValueError(f"linger_secs must be a number of seconds >= 0, got {linger_secs!r}")
        if self._metrics_held:
            raise RuntimeError("serve_metrics() is already held for this Supervisor")
        server = MetricsServer(address, self.status)
        self._metrics_held = True
        try:
            async with held_endpoint(server, float(linger_secs)):
                yield
        finally:
            self._metrics_held = False

    def loop(
        self,
        interval_secs: float,
        target: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        restart: RestartPolicy | None = None,
    ) -> LoopedService:
        """Add a looped service: ``target(*args, **kwargs)`` every ``interval_secs``.

        The first call is at session start. An async ``target`` is awaited on the event
        loop; a sync one runs on a dedicated thread, never on the loop thread. By default
        an exception stops the session and propagates; give ``restart`` to restart the
        service within limits instead. Added services start with the next session.

        Args:
            interval_secs: seconds between calls (> 0).
            target: the function to call.
            args: positional arguments for ``target``.
            kwargs: keyword arguments for ``target``.
            name: the service's name in logs and ``status()``; derived from ``target``.
            restart: failure policy; ``None`` escalates on the first failure.

        Returns:
            The service (already registered).
        """
        service = LoopedService(interval_secs, target, tuple(args), kwargs, name=name, restart=restart)
        self.add_service(service)
        return service

    def add_service(self, service: Service) -> None:
        """Register a custom :class:`Service`, started with every later session."""
        if not isinstance(service, Service):
            raise TypeError(f"expected an asupervisor Service, got {service!r}")
        if any(s.name == service.name for s in self._services):
            raise ValueError(f"a service named {service.name!r} is already registered")
        self._services.append(service)

    def add_queue_runner(self, qr: QueueRunner) -> None:
        """Register a :class:`QueueRunner`; its producers start with every later session.

        Raises:
            TypeError: ``qr`` is not a ``QueueRunner``.
            ValueError: a queue runner of the same name is already registered.
        """
        if not isinstance(qr, QueueRunner):
            raise TypeError(f"expected an asupervisor QueueRunner, got {qr!r}")
        self.add_service(qr.service)

    def should_stop(self) -> bool:
        """Whether the running session was asked to stop (``False`` with no session)."""
        rt = self._runtime
        return rt is not None and rt._entered and rt.control.should_stop()

    def request_stop(
        self, exc: BaseException | None = None, *, reason: str | None = None, deadline_secs: float | None = None
    ) -> None:
        """Ask the running session to stop; callable from any thread.

        Idempotent, like TF1's ``Coordinator.request_stop``: after the session has
        ended it does nothing.

        Args:
            exc: an error to raise out of ``managed_session()`` (the first one wins).
            reason: the ``stop_reason``; ``"preempted:<source>"`` is a preemption notice
                (as :meth:`ServiceContext.request_stop` takes it).
            deadline_secs: with a ``"preempted:<source>"`` reason, the seconds until the
                machine goes: the notice window (``docs/operations.md``).

        Raises:
            RuntimeError: no session was ever started.
            ValueError: ``deadline_secs`` without a ``preempted:`` reason, or not > 0.
        """
        rt = self._runtime
        if rt is None or not rt._entered:
            raise RuntimeError("request_stop() needs a running managed_session()")
        check_notice(reason, deadline_secs)
        if exc is None and reason is not None and reason.startswith("preempted:"):
            rt.loop.call_if_running(lambda: rt.notice_preemption(reason, deadline_secs))
            return
        rt.control.request_stop(exc, reason=reason)

    def summary_computed(self, values: Mapping[str, Any], global_step: int | None = None) -> None:
        """Write ``values`` (name -> scalar, array, tensor or string) to the event file.

        Callable from any thread while a session runs. The write happens on the summary
        thread; tensors are read there, variables at the next step boundary. Only the
        chief with a ``logdir`` writes summaries; elsewhere this does nothing.

        Args:
            values: a mapping of summary tag to value.
            global_step: the step to record the values at; the current step by default.

        Raises:
            RuntimeError: no session is running.
            TypeError: ``values`` is not a mapping of strings to values.
        """
        from ._summary._writer import summary_computed

        rt = self._runtime
        summary_computed(rt if rt is not None and rt._entered and not rt.closed else None, values, global_step)

    @property
    def global_step(self) -> int:
        """The last completed step (a Python int; 0 before the first session)."""
        return 0 if self._runtime is None else self._runtime.step

    async def save_now(self) -> CheckpointInfo:
        """Take a checkpoint at the next step boundary; return once it is committed.

        A save still being written is waited for first; if the current step is already
        saved, that checkpoint is returned.

        Raises:
            RuntimeError: no session is running, this process does not write checkpoints
                (no ``logdir``, or not the chief), or the training is multi-worker.
            Exception: the error of a failed background write, or of this write.
        """
        rt = self._runtime
        if rt is None or not rt._entered or rt.closed:
            raise RuntimeError("save_now() needs a running managed_session()")
        checkpoints: CheckpointSaving = rt.extra(SessionAttribute.checkpoints)
        return await checkpoints.save_now()

    async def export(
        self, model: Any, path: str | os.PathLike[str], *, best: str | None = None, mode: str = "min"
    ) -> str | None:
        """Export a trained Keras model once the session has ended: ``path`` ending in
        ``.keras`` gets Keras's format (``keras.models.load_model`` reads it), any other
        path a SavedModel directory (``tf.saved_model.load``, TF Serving). Written beside
        its final name and renamed into place once complete and synced, so a crash never
        leaves a torn export; a URL ``path`` is uploaded (a SavedModel's
        ``saved_model.pb`` last). Only the chief exports.

        Args:
            model: the Keras model (in this supervisor's ``state`` when ``best`` is given).
            path: a file or directory path, or a URL (``s3://bucket/model.keras``).
            best: export the logdir's committed checkpoint with the best recorded value of
                this metric (``"val_loss"``: see :class:`~asupervisor.KeepBest`) instead of
                the model's current weights, which are put back afterwards.
            mode: ``"min"`` or ``"max"``: which value of ``best`` is best.

        Returns:
            What was written (``path``, a URL normalised), or ``None`` when this process
            is not the chief.

        Raises:
            RuntimeError: the session is still running.
            ValueError: an HDF5 path, a bad ``mode``/``best``, or no checkpoint recorded
                ``best``.
            TypeError: ``model`` is not a Keras model, or ``path`` is not a path.
        """
        from ._export import export

        return await export(self, model, path, best=best, mode=mode)

    def metrics_text(self) -> str:
        """``status()`` as Prometheus text (the exposition format, version 0.0.4), for an
        application's own ``/metrics`` route; what ``metrics_port`` serves. Any thread."""
        from ._prometheus import render

        return render(self.status())

    def status(self) -> Status:
        """A frozen snapshot: step, steps/sec, last checkpoint, stop reason, services."""
        if self._runtime is None or not self._runtime._entered:
            return Status(running=False, global_step=self.global_step)
        return self._runtime.status()
