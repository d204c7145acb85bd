"""The stock hooks: TF1's ``basic_session_run_hooks`` for eager TensorFlow 2.

Each hook keeps TF1's arguments where they still make sense. Differences that follow from
TF2: tensors are named by *keys* of the mapping a step returns (``{"loss": loss}``),
not graph tensors; summaries go to the session's event file (the chief's ``logdir``);
checkpoints are written through the session's checkpoint part (``save_on_step_thread``).

Per-step cost rules (the hooks run on the step thread around every step): the fire check
is an int compare (or one clock read for ``*_secs`` timers); nothing is allocated and no
tensor is read (no ``.numpy()``, no device sync) on steps where a hook does not fire.
Hooks that need the session get it in ``after_create_session``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._core._abc import SessionAttribute, SessionPart
from .._core._hooks import NEVER, Gate, SessionRunContext, SessionRunHook, SessionRunValues
from .._core._outputs import scalar_entries
from .._exceptions import NanLossDuringTrainingError
from .._logging import describe, get_logger
from ._timer import SecondOrStepTimer, ThreadSafeClock, check_every

if TYPE_CHECKING:
    from .._core._abc import SessionContext, SummarySink
    from .._core._runtime import Runtime
    from .._core._session import Session

__all__ = [
    "CheckpointSaverHook",
    "CheckpointSaverListener",
    "FinalOpsHook",
    "GlobalStepWaiterHook",
    "LoggingTensorHook",
    "NanTensorHook",
    "ProfilerHook",
    "StepCounterHook",
    "StopAtStepHook",
    "SummarySaverHook",
]

log = get_logger(__name__)


def _runtime(session: Session) -> Any:
    return session._rt


def _to_python(value: Any) -> Any:
    """A value for a log line: numbers and lists, read on the calling thread."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value


def _timer_gate(timer: SecondOrStepTimer) -> Gate:
    """The hook runner's gate of a hook that acts only when ``timer`` fires."""
    step, at = timer.due()
    return step, at, timer.clock


def _hook_timer(
    secs_name: str, secs: float | None, steps_name: str, steps: int | None, clock: ThreadSafeClock | None
) -> SecondOrStepTimer:
    """A hook's timer; a bad period is an error naming the hook's own argument."""
    if (secs is None) == (steps is None):
        raise ValueError(
            f"give exactly one of {steps_name} and {secs_name} "
            f"(got {steps_name}={steps!r}, {secs_name}={secs!r})"
        )
    check_every(steps_name, steps, kind="steps")
    check_every(secs_name, secs, kind="secs")
    return SecondOrStepTimer(every_secs=secs, every_steps=steps, clock=clock)


def _lookup(results: Any, key: str, hook: str) -> Any:
    if not isinstance(results, Mapping):
        raise TypeError(
            f"{hook} reads {key!r} from the step's result, which must be a mapping of named "
            f"tensors (e.g. return {{{key!r}: ...}} from the step); got {type(results).__name__}"
        )
    try:
        return results[key]
    except KeyError:
        raise KeyError(
            f"{hook}: the step's result has no {key!r} (it has {sorted(map(str, results))})"
        ) from None


class StopAtStepHook(SessionRunHook):
    """Requests a stop once the global step reaches a given step.

    Args:
        num_steps: steps to run from the step the session started at (the restored
            step, read in ``after_create_session``).
        last_step: the global step to stop at.

    Raises:
        ValueError: both or neither of ``num_steps`` and ``last_step`` were given.
    """

    def __init__(self, num_steps: int | None = None, last_step: int | None = None) -> None:
        if (num_steps is None) == (last_step is None):
            raise ValueError("give exactly one of num_steps and last_step")
        for name, value in (("num_steps", num_steps), ("last_step", last_step)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self._num_steps = num_steps
        self._given_last_step = last_step
        self._last_step = last_step if last_step is not None else 0

    @property
    def last_step(self) -> int | None:
        """The step this hook stops at (known once the session is created)."""
        return self._last_step

    def begin(self) -> None:
        """Reset ``last_step`` for a new session (``num_steps`` counts from its start)."""
        self._last_step = self._given_last_step if self._given_last_step is not None else 0

    def after_create_session(self, session: Session) -> None:
        """Work out the last step; stop before the first step if it is already reached."""
        if self._num_steps is not None:
            self._last_step = session.global_step + self._num_steps
        if session.global_step >= self._last_step:
            _runtime(session).control.request_stop(reason="hook")

    def _asv_gate(self) -> Gate:
        return self._last_step, math.inf, None

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Request a stop once the step just completed is the last one."""
        if run_values.global_step >= self._last_step:
            run_context.request_stop()


class StepCounterHook(SessionRunHook):
    """Measures steps per second and writes ``global_step/sec`` every N steps or secs.

    The rate is logged (``step_counter_hook.rate``) and, on the chief with a ``logdir``,
    written to the event file.

    Args:
        every_n_steps: steps between measurements (TF1's default, 100).
        every_n_secs: seconds between measurements; pass ``every_n_steps=None`` with it.
        clock: the time source (any thread may read it); ``time.monotonic`` by default.

    Raises:
        ValueError: both or neither of ``every_n_steps`` and ``every_n_secs`` were given.
    """

    steps_per_sec: float | None = None
    """The last measured rate, ``None`` before the first measurement."""

    def __init__(
        self,
        every_n_steps: int | None = 100,
        every_n_secs: float | None = None,
        *,
        clock: ThreadSafeClock | None = None,
    ) -> None:
        self._timer = _hook_timer("every_n_secs", every_n_secs, "every_n_steps", every_n_steps, clock)
        self._writer: SummarySink | None = None
        self.steps_per_sec: float | None = None

    def begin(self) -> None:
        """Start a new measurement."""
        self._timer.reset()

    def after_create_session(self, session: Session) -> None:
        """Find the session's summary writer (none on a worker or without logdir)."""
        self._writer = _runtime(session).extra(SessionAttribute.summary_writer, None)

    def _asv_gate(self) -> Gate:
        return _timer_gate(self._timer)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Measure and report the rate when the timer fires."""
        step = run_values.global_step
        timer = self._timer
        if step >= timer.next_step and timer.should_trigger_for_step(step):
            secs, steps = timer.update_last_triggered_step(step)
            if secs and steps is not None and secs > 0:
                rate = steps / secs
                self.steps_per_sec = rate
                log.info("step_counter_hook.rate", global_step=step, steps_per_sec=round(rate, 3))
                if self._writer is not None:
                    self._writer.post(step, {"global_step/sec": rate})


class LoggingTensorHook(SessionRunHook):
    """Logs named entries of the step's result every N steps or secs, and/or at the end.

    Args:
        keys: names in the mapping the step returns; a sequence of keys, or a mapping
            of log name -> key.
        every_n_iter: log every this many steps of the session, counted from its first
            step (TF1 counted the hook's calls: one per step).
        every_n_secs: log every this many seconds.
        at_end: also log the last step's values at the end.
        formatter: ``formatter(values) -> str``; the line is logged as ``message=``.
        clock: the time source (any thread may read it); ``time.monotonic`` by default.

    Raises:
        ValueError: no timing given without ``at_end``, or both were given.
    """

    def __init__(
        self,
        keys: Sequence[str] | Mapping[str, str],
        every_n_iter: int | None = None,
        every_n_secs: float | None = None,
        at_end: bool = False,
        formatter: Callable[[dict[str, Any]], str] | None = None,
        *,
        clock: ThreadSafeClock | None = None,
    ) -> None:
        if isinstance(keys, str):
            keys = [keys]
        names = dict(keys) if isinstance(keys, Mapping) else {k: k for k in keys}
        if not names or not all(isinstance(k, str) for k in (*names, *names.values())):
            raise ValueError(f"keys must be a non-empty sequence (or mapping) of strings, got {keys!r}")
        self._names = names
        self._only_at_end = at_end and every_n_iter is None and every_n_secs is None
        self._timer = (
            None
            if self._only_at_end
            else _hook_timer("every_n_secs", every_n_secs, "every_n_iter", every_n_iter, clock)
        )
        self._at_end = at_end
        self._formatter = formatter
        self._first = 0  # the global step of this session's first step: its iteration 0
        self._rt: Runtime | None = None

    def begin(self) -> None:
        """Reset the timer."""
        if self._timer is not None:
            self._timer.reset()

    def after_create_session(self, session: Session) -> None:
        """Keep the session (``at_end`` reads its last output); count iterations from here."""
        self._rt = _runtime(session)
        self._first = session.global_step + 1

    def _asv_gate(self) -> Gate:
        if self._timer is None:
            return NEVER, math.inf, None
        step, at = self._timer.due()  # the timer counts iterations: global step - _first
        return step + self._first, at, self._timer.clock

    def _log(self, results: Any, step: int, secs: float | None) -> None:
        values = {name: _to_python(_lookup(results, key, "LoggingTensorHook")) for name, key in self._names.items()}
        if self._formatter is not None:
            log.info("tensors.logged", global_step=step, message=self._formatter(values))
        elif secs is None:
            log.info("tensors.logged", global_step=step, **values)
        else:
            log.info("tensors.logged", global_step=step, secs=round(secs, 3), **values)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Log when the timer fires (reads the values only then)."""
        timer = self._timer
        if timer is not None:
            it = run_values.global_step - self._first  # this session's steps before this one
            if it >= timer.next_step and timer.should_trigger_for_step(it):
                secs, _ = timer.update_last_triggered_step(it)
                self._log(run_values.results, run_values.global_step, secs)

    def end(self, session: Session) -> None:
        """With ``at_end``, log the last step's values."""
        if self._at_end and self._rt is not None and self._rt.last_output is not None:
            self._log(self._rt.last_output, session.global_step, None)


class NanTensorHook(SessionRunHook):
    """Checks the step's loss for NaN; raises (or stops) when it is.

    A host read of a step's loss costs 3-7 µs on the step thread (on a CPU; a device
    sync elsewhere), more than all other per-step hook work together, and a TF op per
    step (``tf.math.is_nan``) costs more still. So by default the losses are kept
    (references, no read), and every ``check_every_n_steps`` steps the batch is stacked
    into one tensor by one op (dispatched, not waited for), while the batch stacked the
    time before, long computed, is read in one go: the step thread never waits for the
    device and no other thread is involved. The losses not read yet are all checked at
    once before any checkpoint of the state (hook saves, the checkpoint service, the
    final checkpoint: a NaN is never saved) and at the end. A NaN is raised on the step
    thread, naming the first step that produced one, up to ``2 * check_every_n_steps - 1``
    steps after it. ``immediate=True`` reads every loss right after its step (TF1's
    timing).

    Args:
        loss_key: the name of the loss in the mapping the step returns.
        fail_on_nan_loss: raise :class:`~asupervisor.NanLossDuringTrainingError` (stopping
            training, without a final checkpoint); else log a warning and stop cleanly.
        immediate: check each loss right after its step.
        check_every_n_steps: without ``immediate``, steps between reads.
    """

    def __init__(
        self,
        loss_key: str = "loss",
        fail_on_nan_loss: bool = True,
        *,
        immediate: bool = False,
        check_every_n_steps: int = 100,
    ) -> None:
        if not isinstance(loss_key, str) or not loss_key:
            raise ValueError(f"loss_key must be a non-empty string, got {loss_key!r}")
        check_every("check_every_n_steps", check_every_n_steps, kind="steps")
        self._key = loss_key
        self._fail = bool(fail_on_nan_loss)
        self._immediate = bool(immediate)
        self._every = check_every_n_steps
        self._pending: list[Any] = []  # losses not stacked yet (tensors), consecutive
        self._first_step = 0  # the step of _pending[0]
        self._stacked: tuple[int, Any] | None = None  # (first step, stacked batch) not read yet
        self._rt: Runtime | None = None

    def begin(self) -> None:
        """Forget losses left from an earlier session."""
        self._pending = []
        self._stacked = None

    def after_create_session(self, session: Session) -> None:
        """Check the unread losses before any checkpoint of the state."""
        self._rt = _runtime(session)

    def _asv_part(self) -> SessionPart:
        return _NanCheck(self)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Keep the loss; stack a full batch and read the one before (or check now: ``immediate``)."""
        results = run_values.results
        try:
            loss = results[self._key]
        except (KeyError, TypeError, IndexError):
            loss = _lookup(results, self._key, "NanTensorHook")
        if self._immediate or not hasattr(loss, "numpy"):
            self._check_all(run_context)  # keep the order of steps
            self._check(loss, run_values.global_step, run_context)
            return
        pending = self._pending
        if not pending:
            self._first_step = run_values.global_step
        pending.append(loss)
        if len(pending) >= self._every:
            self._collect(run_context)  # the previous batch, computed long ago
            self._pending = []
            self._stacked = (self._first_step, _stack(pending))

    def _collect(self, run_context: SessionRunContext | None) -> None:
        """On the step thread: read the stacked batch; raise (or stop) on a NaN."""
        stacked = self._stacked
        if stacked is None:
            return
        self._stacked = None
        step = _first_nan(*stacked)
        if step is not None:
            self._nan(step, run_context)

    def _check_all(self, run_context: SessionRunContext | None = None) -> None:
        """On the step thread: every loss not checked yet, in step order."""
        self._collect(run_context)
        pending = self._pending
        if pending:
            self._pending = []
            step = _first_nan(self._first_step, _stack(pending))
            if step is not None:
                self._nan(step, run_context)

    def _check(self, loss: Any, step: int, run_context: SessionRunContext | None) -> None:
        value = loss.numpy() if hasattr(loss, "numpy") else loss
        if value == value:  # not NaN (also for a NaN inside a numpy scalar)
            return
        self._nan(step, run_context)

    def _nan(self, step: int, run_context: SessionRunContext | None) -> None:
        self._pending = []
        self._stacked = None
        message = f"NaN loss during training (step {step}, key {self._key!r})."
        if self._fail:
            log.error("nan_loss.detected", global_step=step, action="raise")
            if self._rt is not None:
                self._rt.control.state_suspect = True  # no checkpoint of NaN weights
            raise NanLossDuringTrainingError(message)
        log.warning("nan_loss.detected", global_step=step, action="stop")
        if run_context is not None:
            run_context.request_stop()
        elif self._rt is not None:
            self._rt.control.request_stop(reason="hook")

    def end(self, session: Session) -> None:
        """Check the losses not checked yet."""
        self._check_all()


class _NanCheck(SessionPart):
    """NanTensorHook's part in the session: before any checkpoint of the state (and
    before the final one) the losses not read yet are checked; a NaN stops that save."""

    name = "nan_check"

    def __init__(self, hook: NanTensorHook) -> None:
        self._hook = hook

    def before_snapshot(self) -> None:
        self._hook._check_all()


def _has_nan(value: Any) -> bool:
    import numpy as np

    return not bool(np.all(value == value))  # numpy scalars and arrays, Python numbers


def _stack(losses: list[Any]) -> Any:
    """The losses (of consecutive steps) as one tensor, by one op; the list if they differ.

    The op is dispatched, not waited for: on a device, its result is read a batch later.
    """
    from tensorflow.python.ops import gen_array_ops  # tf.stack's own op, without its Python checks

    try:
        return gen_array_ops.pack(losses, axis=0)
    except Exception:  # mixed shapes, dtypes or devices: read them one by one
        return losses


def _first_nan(first_step: int, losses: Any) -> int | None:
    """The step of the first loss with a NaN.

    Args:
        first_step: the step of the first loss.
        losses: a stacked tensor (one loss per row, read at once) or a list of losses
            (tensors or numbers, read one by one).
    """
    if not isinstance(losses, list):
        values = losses.numpy()
        if not _has_nan(values):
            return None
        losses = list(values)
    for i, loss in enumerate(losses):
        if _has_nan(loss.numpy() if hasattr(loss, "numpy") else loss):
            return first_step + i
    return None


class SummarySaverHook(SessionRunHook):
    """Writes the scalar entries of the step's result every N steps or secs.

    Writes go to the session's event file (the chief's ``logdir``); elsewhere the hook
    does nothing. Values are handed over as tensors and read on the summary thread.

    Args:
        save_steps: steps between summaries.
        save_secs: seconds between summaries.
        keys: only these names of the step's result (default: every scalar entry).
        clock: the time source (any thread may read it); ``time.monotonic`` by default.

    Raises:
        ValueError: both or neither of ``save_steps`` and ``save_secs`` were given.
    """

    def __init__(
        self,
        save_steps: int | None = None,
        save_secs: float | None = None,
        *,
        keys: Sequence[str] | None = None,
        clock: ThreadSafeClock | None = None,
    ) -> None:
        self._timer = _hook_timer("save_secs", save_secs, "save_steps", save_steps, clock)
        self._keys = None if keys is None else tuple(keys)
        self._writer: SummarySink | None = None

    def begin(self) -> None:
        """Reset the timer."""
        self._timer.reset()

    def after_create_session(self, session: Session) -> None:
        """Find the session's summary writer."""
        self._writer = _runtime(session).extra(SessionAttribute.summary_writer, None)
        if self._writer is None:
            log.debug("summary_saver_hook.inactive", reason="no summary writer (no logdir, or not the chief)")

    def _asv_gate(self) -> Gate:
        return _timer_gate(self._timer) if self._writer is not None else (NEVER, math.inf, None)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Queue the step's scalars when the timer fires."""
        writer = self._writer
        step = run_values.global_step
        timer = self._timer
        if step >= timer.next_step and writer is not None and timer.should_trigger_for_step(step):
            timer.update_last_triggered_step(step)
            scalars = scalar_entries(run_values.results)
            if self._keys is not None:
                scalars = {k: v for k, v in scalars.items() if k in self._keys}
            if scalars:
                writer.post(step, scalars)


class GlobalStepWaiterHook(SessionRunHook):
    """Delays the first step until the global step reaches ``wait_until_step``.

    TF1 used it to start non-chief workers after the chief had made progress.

    Args:
        wait_until_step: the global step to wait for (<= 0: no wait).
        global_step_fn: reads the current global step (on the step thread); by default
            the session's ``global_step`` variable (a shared variable in
            parameter-server training) or its step count, whichever is larger.
        poll_secs: seconds between reads.
        sleep: how to wait between reads (tests pass a fake).
    """

    def __init__(
        self,
        wait_until_step: int,
        *,
        global_step_fn: Callable[[], int] | None = None,
        poll_secs: float = 0.5,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        if isinstance(wait_until_step, bool) or not isinstance(wait_until_step, int):
            raise TypeError(f"wait_until_step must be an int, got {wait_until_step!r}")
        check_every("poll_secs", poll_secs, kind="secs")
        self._wait_until = wait_until_step
        self._fn = global_step_fn
        self._poll = poll_secs
        self._sleep = sleep
        self._started = False

    def begin(self) -> None:
        """Wait again in a new session."""
        self._started = self._wait_until <= 0

    def _read(self, session: Session) -> int:
        if self._fn is not None:
            return int(self._fn())
        var = _runtime(session).global_step_var
        return max(session.global_step, int(var.numpy()) if var is not None else 0)

    def _asv_gate(self) -> Gate:
        return (NEVER if self._started else -NEVER), math.inf, None

    def before_run(self, run_context: SessionRunContext) -> None:
        """Block (on the step thread) until the global step is reached or a stop comes."""
        if self._started:
            return
        session = run_context.session
        control = _runtime(session).control
        logged = -math.inf
        while not control.stopping:
            current = self._read(session)
            if current >= self._wait_until:
                self._started = True
                return
            if current - logged >= 1000 or logged == -math.inf:
                log.info("global_step_waiter.waiting", global_step=current, wait_until_step=self._wait_until)
                logged = current
            self._sleep(self._poll)


class FinalOpsHook(SessionRunHook):
    """Evaluates ``fn()`` at the end of a clean session; keeps the values.

    Args:
        fn: called with no arguments on the step thread in ``end``; tensors in what it
            returns are converted to NumPy values. A (nested) structure of tensors or
            variables is accepted instead of a function and read the same way.
    """

    def __init__(self, fn: Callable[[], Any] | Any) -> None:
        self._fn = fn
        self._values: Any = None

    @property
    def final_ops_values(self) -> Any:
        """What ``fn`` returned at the end (``None`` before it ran)."""
        return self._values

    def end(self, session: Session) -> None:
        """Evaluate and keep the final values."""
        from .._tf import tf

        result = self._fn() if callable(self._fn) else self._fn
        self._values = tf().nest.map_structure(
            lambda t: t.numpy() if hasattr(t, "numpy") else t, result
        )


class ProfilerHook(SessionRunHook):
    """Traces one step every N steps or secs with ``tf.profiler`` (TensorBoard's Profile tab).

    TF1's timing: the session's first step arms the timer (it is never traced); then the
    steps that complete global step ``first + N``, ``first + 2N``, ... (``save_steps``) or
    the first step at least ``save_secs`` after the previous trace (or the arming step)
    are traced, ``first`` being the global step the session started from. With
    ``save_steps=2`` from step 0 that is steps 2, 4, 6, ...

    Each trace gets its own directory, ``<output_dir>/plugins/profile/<time>_step_<N>/``
    (``output_dir`` defaults to the session's ``logdir``; without either, the hook does
    nothing), where TensorBoard's profile plugin finds it; two traces within one second
    never share (and overwrite) a directory. Tracing costs far more than a step: use a
    large period.

    Args:
        save_steps: steps between traced steps.
        save_secs: seconds between traced steps.
        output_dir: where traces go.
        clock: the time source (any thread may read it); ``time.monotonic`` by default.

    Raises:
        ValueError: both or neither of ``save_steps`` and ``save_secs`` were given.
    """

    def __init__(
        self,
        save_steps: int | None = None,
        save_secs: float | None = None,
        output_dir: str | None = None,
        *,
        clock: ThreadSafeClock | None = None,
    ) -> None:
        self._timer = _hook_timer("save_secs", save_secs, "save_steps", save_steps, clock)
        self._output_dir = output_dir
        self._dir: str | None = None
        self._rt: Runtime | None = None
        self._tracing = False
        self._armed = False  # the session's first step armed the timer
        self._staging: str | None = None  # where the running trace is written

    def begin(self) -> None:
        """Reset the timer: the session's first step arms it again."""
        self._timer.reset()
        self._armed = False

    def after_create_session(self, session: Session) -> None:
        """Work out where traces go; make sure no trace outlives the session."""
        self._rt = rt = _runtime(session)
        if self._output_dir is not None:
            self._dir = self._output_dir
        elif rt.config.logdir is not None and rt.config.is_chief:
            self._dir = str(rt.config.logdir)
        if self._dir is not None:
            _remove_stale_staging(self._dir)

    def _asv_part(self) -> SessionPart:
        return _ProfilerClose(self)

    async def _aclose(self) -> None:
        """A session closer: a trace still open after an error is stopped (on the step thread)."""
        rt = self._rt
        if self._tracing and rt is not None:
            await rt.step_thread.call(self._stop, rt.step)

    def _asv_gate(self) -> Gate:
        if self._dir is None and not self._tracing:
            return NEVER, math.inf, None
        if not self._armed:  # the first step arms the timer
            return -NEVER, math.inf, None
        return _timer_gate(self._timer)

    def before_run(self, run_context: SessionRunContext) -> None:
        """Start a trace if the coming step is one to trace (never the session's first)."""
        rt = self._rt
        timer = self._timer
        if rt is None or self._dir is None or not self._armed:
            return
        step = rt.step + 1
        if step < timer.next_step or not timer.should_trigger_for_step(step):
            return
        import os
        import tempfile

        from .._tf import tf

        try:
            os.makedirs(self._dir, exist_ok=True)
            staging = tempfile.mkdtemp(prefix=f"{_STAGING}{os.getpid()}-", dir=self._dir)
        except OSError as exc:
            log.warning("profiler_hook.skipped", global_step=step, error=describe(exc))
            timer.update_last_triggered_step(step)
            return
        try:
            tf().profiler.experimental.start(staging)
        except Exception as exc:  # another profiler session is running: skip this one
            log.warning("profiler_hook.skipped", global_step=step, error=describe(exc))
            _remove_tree(staging)
            timer.update_last_triggered_step(step)
            return
        self._staging = staging
        self._tracing = True

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Arm the timer after the first step; stop the trace of a traced step and write it."""
        if self._tracing:
            self._stop(run_values.global_step)
        elif not self._armed:
            self._armed = True
            # TF1 arms at the global step the first step started from
            self._timer.update_last_triggered_step(run_values.global_step - 1)

    def _stop(self, step: int) -> None:
        from .._tf import tf

        self._tracing = False
        self._timer.update_last_triggered_step(step)
        staging, self._staging = self._staging, None
        tf().profiler.experimental.stop()
        assert staging is not None
        assert self._dir is not None
        path = _publish_trace(staging, self._dir, step)
        log.info("profiler_hook.saved", global_step=step, path=path)

    def end(self, session: Session) -> None:
        """Close a trace still open."""
        if self._tracing:
            self._stop(session.global_step)


_STAGING = ".asv-profile-"  # + "<pid>-<random>": where a trace is written before it is published


class _ProfilerClose(SessionPart):
    """ProfilerHook's part in the session: at the end, a trace still open is stopped."""

    name = "profiler"

    def __init__(self, hook: ProfilerHook) -> None:
        self._hook = hook

    async def aclose(self, ctx: SessionContext) -> None:
        await self._hook._aclose()


def _remove_stale_staging(output_dir: str) -> None:
    """Remove staging directories left by processes that died while tracing (SIGKILL)."""
    import os

    try:
        entries = os.listdir(output_dir)
    except OSError:
        return
    for entry in entries:
        pid = entry[len(_STAGING) :].split("-", 1)[0] if entry.startswith(_STAGING) else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            log.info("profiler_hook.stale_trace_removed", path=os.path.join(output_dir, entry))
            _remove_tree(os.path.join(output_dir, entry))
        except OSError:
            pass  # alive (another user's process), or cannot tell: leave it


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _publish_trace(staging: str, output_dir: str, step: int) -> str | None:
    """Move the trace the profiler wrote under ``staging`` to its own directory.

    ``tf.profiler`` writes ``<logdir>/plugins/profile/<time to the second>/``; each trace
    is written into a fresh staging logdir, then its run directory is renamed to
    ``<output_dir>/plugins/profile/<time>_step_<step>/`` (a suffix is added if that exists).
    Returns that path, or ``None`` when the profiler wrote nothing.
    """
    import os

    root = os.path.join(staging, "plugins", "profile")
    try:
        runs = sorted(os.listdir(root))
    except OSError:
        runs = []
    target_root = os.path.join(output_dir, "plugins", "profile")
    published: str | None = None
    try:
        for run in runs:
            os.makedirs(target_root, exist_ok=True)
            target = os.path.join(target_root, f"{run}_step_{step}")
            n = 1
            while os.path.exists(target):
                target = os.path.join(target_root, f"{run}_step_{step}.{n}")
                n += 1
            os.rename(os.path.join(root, run), target)
            published = target
    except OSError as exc:
        log.warning("profiler_hook.not_published", global_step=step, error=describe(exc))
    finally:
        _remove_tree(staging)
    return published


class CheckpointSaverListener:
    """Called around the saves of :class:`CheckpointSaverHook`; override what you need.

    All methods run on the step thread, with the state at a step boundary.
    """

    def begin(self) -> None:
        """Called once, in the hook's ``begin``."""

    def before_save(self, session: Session, global_step_value: int) -> None:
        """Called before each checkpoint is written."""

    def after_save(self, session: Session, global_step_value: int) -> bool | None:
        """Called after each checkpoint is written; return ``True`` to stop training."""
        return None

    def end(self, session: Session, global_step_value: int) -> None:
        """Called at the end of a clean session, after the last checkpoint."""


class CheckpointSaverHook(SessionRunHook):
    """Saves a checkpoint every N steps or secs, at the start, and at a clean end.

    Saves run on the step thread at a step boundary through the session's checkpoint
    writer (the checkpoint part's ``save_on_step_thread``), so they are consistent.

    Args:
        checkpoint_dir: where checkpoints go.
        save_secs: seconds between checkpoints.
        save_steps: steps between checkpoints.
        checkpoint_basename: files are ``<checkpoint_dir>/<basename>-<step>.*``.
        listeners: :class:`CheckpointSaverListener` objects.
        clock: the time source (any thread may read it); ``time.monotonic`` by default.

    Raises:
        ValueError: both or neither of ``save_secs`` and ``save_steps`` were given.
    """

    def __init__(
        self,
        checkpoint_dir: str,
        save_secs: float | None = None,
        save_steps: int | None = None,
        checkpoint_basename: str = "model.ckpt",
        listeners: Sequence[CheckpointSaverListener] | None = None,
        *,
        clock: ThreadSafeClock | None = None,
    ) -> None:
        import os

        if not isinstance(checkpoint_dir, (str, os.PathLike)):
            raise TypeError(f"checkpoint_dir must be a path, got {checkpoint_dir!r}")
        self._timer = _hook_timer("save_secs", save_secs, "save_steps", save_steps, clock)
        self._dir = os.fspath(checkpoint_dir)
        self._basename = checkpoint_basename
        self._listeners = tuple(listeners or ())
        self._rt: Runtime | None = None
        self.last_saved_path: str | None = None

    def begin(self) -> None:
        """Reset the timer; call the listeners' ``begin``."""
        self._timer.reset()
        for listener in self._listeners:
            listener.begin()

    def after_create_session(self, session: Session) -> None:
        """Save the state the session starts from (TF1 does the same).

        Raises:
            ValueError: in multi-worker training, where every worker must take part in
                every save at the same steps (the checkpoint service does that; this hook
                runs on one worker only).
        """
        self._rt = _runtime(session)
        cluster = self._rt.config.cluster
        if self._rt.config.multi_worker and cluster is not None:
            raise ValueError(
                f"CheckpointSaverHook cannot save in multi-worker training (TF_CONFIG names "
                f"{cluster.num_workers} workers): every worker must take part in every save "
                "at the same steps; use Supervisor(logdir, save_model_steps=...) instead"
            )
        step = session.global_step
        self._timer.update_last_triggered_step(step)
        if self._save(session, step):
            self._rt.control.request_stop(reason="hook")

    def _asv_gate(self) -> Gate:
        return _timer_gate(self._timer)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Save when the timer fires."""
        step = run_values.global_step
        timer = self._timer
        if step >= timer.next_step and timer.should_trigger_for_step(step):
            timer.update_last_triggered_step(step)
            if self._save(run_context.session, step):
                run_context.request_stop()

    def end(self, session: Session) -> None:
        """Save the last step unless it was just saved; call the listeners' ``end``."""
        step = session.global_step
        if step != self._timer.last_triggered_step() and not _runtime(session).control.state_suspect:
            self._save(session, step)
        for listener in self._listeners:
            listener.end(session, step)

    def _save(self, session: Session, step: int) -> bool:
        """Save at ``step``; returns whether a listener asked to stop."""
        rt = _runtime(session)
        for listener in self._listeners:
            listener.before_save(session, step)
        started = time.monotonic()
        self.last_saved_path = rt.extra(SessionAttribute.checkpoints).save_on_step_thread(self._dir, self._basename)
        log.info(
            "checkpoint_hook.saved",
            global_step=step,
            path=self.last_saved_path,
            secs=round(time.monotonic() - started, 3),
        )
        stop = False
        for listener in self._listeners:
            if listener.after_save(session, step):
                log.info("checkpoint_hook.stop_requested", listener=type(listener).__name__)
                stop = True
        return stop
