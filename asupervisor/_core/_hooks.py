"""The per-step hook protocol (``SessionRunHook``) and the runner that calls hooks.

Hooks are objects with optional no-op methods, called in the order TF's
``MonitoredSession`` documents::

    begin()                          before the state is restored or initialised
    after_create_session(session)    once the state is ready, before the first step
    before_run(run_context)          before every step
    after_run(run_context, values)   after every step that returned
    end(session)                     at a clean stop (not after an error)

The runner works out once which hooks override which method, so a hook method nobody
implements costs nothing per step (trio's instrumentation and torchtnt's callback handler
do the same). All hook methods run on the step thread. A hook that raises stops training
and its exception propagates.

Gated hooks. A hook whose ``before_run``/``after_run`` act only from some global step or
some time on (a periodic hook between firings) may say so with a method
``_asv_gate() -> (step, time, clock)``: neither method does anything while the global
step is below ``step`` and ``clock()`` is below ``time``. The runner asks every gated hook
after ``begin``, after ``after_create_session`` and after each step it called them, keeps
the earliest step and time, and on other steps calls only the ungated hooks, so a hook
waiting for its next firing costs one int compare (and one clock read per clock) per
step, not a call. When the gate is open every hook is called, in the order given. The
stock hooks with a timer are gated; a hook without ``_asv_gate`` is called every step.

Hooks with a part in the session. A hook that must act in a session phase beyond the
hook protocol (NanTensorHook checks unread losses before any snapshot; ProfilerHook
stops an open trace at the end) has a method ``_asv_part() -> SessionPart``; the engine
adds that part to the session's parts (:mod:`._parts`), ahead of the features. The
hooks' public methods stay the hook protocol's.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._session import Session
    from ._stop import StopControl

__all__ = ["Gate", "HookRunner", "SessionRunContext", "SessionRunHook", "SessionRunValues"]

#: what a gated hook's ``_asv_gate()`` returns: the earliest global step and the earliest
#: time on ``clock`` (``None`` when the time is ``math.inf``) at which it may act
Gate = tuple[int, float, "Callable[[], float] | None"]

NEVER = sys.maxsize  # a gate step no training reaches


class SessionRunHook:
    """Base class for per-step hooks; override only the methods you need."""

    def begin(self) -> None:
        """Called once on the step thread, before the state is restored or initialised."""

    def after_create_session(self, session: Session) -> None:
        """Called once the state is restored or initialised, before the first step."""

    def before_run(self, run_context: SessionRunContext) -> None:
        """Called before each step."""

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Called after each step that returned; ``run_values.results`` is its result."""

    def end(self, session: Session) -> None:
        """Called at a clean stop (including end of data), never after an error."""


class SessionRunContext:
    """What a hook sees of the step being run."""

    __slots__ = ("_stop_requested", "original_args", "session")

    def __init__(self, original_args: tuple[Any, ...], session: Session) -> None:
        self.original_args = original_args
        self.session = session
        self._stop_requested = False

    @property
    def stop_requested(self) -> bool:
        """Whether a hook asked to stop after this step."""
        return self._stop_requested

    def request_stop(self) -> None:
        """Stop the session after the current step."""
        self._stop_requested = True


class SessionRunValues:
    """The outcome of a step, as given to ``after_run``."""

    __slots__ = ("global_step", "results")

    def __init__(self, results: Any, global_step: int) -> None:
        self.results = results
        self.global_step = global_step

    def __repr__(self) -> str:
        return f"SessionRunValues(results={self.results!r}, global_step={self.global_step})"


def _overrides(hook: object, name: str) -> bool:
    base = getattr(SessionRunHook, name)
    impl = getattr(type(hook), name, None)
    if impl is None:  # duck-typed hook without the base class: only bound attributes count
        return callable(getattr(hook, name, None))
    return impl is not base


class HookRunner:
    """Calls hooks; built once per session with the hooks that implement each method."""

    def __init__(self, hooks: Iterable[SessionRunHook]) -> None:
        self.hooks: tuple[SessionRunHook, ...] = tuple(hooks)
        for hook in self.hooks:
            if not any(callable(getattr(hook, m, None)) for m in _METHODS):
                raise TypeError(f"{hook!r} is not a SessionRunHook (it has none of {_METHODS})")
        self._begin = self._implementing("begin")
        self._after_create = self._implementing("after_create_session")
        self._end = self._implementing("end")
        # every hook's before_run/after_run (called when the gate is open), and those of
        # the ungated hooks only (called on every other step)
        self._before_all: Sequence[Callable[[SessionRunContext], Any]] = self._implementing("before_run")
        self._after_all: Sequence[Callable[[SessionRunContext, SessionRunValues], Any]] = self._implementing(
            "after_run"
        )
        self._before = self._implementing("before_run", gated=False)
        self._after = self._implementing("after_run", gated=False)
        self._gated_before = len(self._before) < len(self._before_all)
        self._gates: list[Callable[[], Gate]] = [
            h._asv_gate  # type: ignore[attr-defined]
            for h in self.hooks
            if callable(getattr(h, "_asv_gate", None))
        ]
        self._gate_step = NEVER  # the gate is open from this global step on ...
        self._gate_times: tuple[tuple[Callable[[], float], float], ...] = ()  # ... or from these times
        #: whether any hook runs around steps (the step loop's fast path checks this once)
        self.per_step = bool(self._before_all or self._after_all)
        self._ctx: SessionRunContext | None = None
        self._values = SessionRunValues(None, 0)
        self._regate()

    def _implementing(self, name: str, *, gated: bool | None = None) -> list[Callable[..., Any]]:
        return [
            getattr(h, name)
            for h in self.hooks
            if _overrides(h, name) and (gated is None or callable(getattr(h, "_asv_gate", None)) == gated)
        ]

    def _regate(self) -> None:
        """Ask the gated hooks when they next act; keep the earliest step and times."""
        step = NEVER
        times: dict[Callable[[], float], float] = {}
        for gate in self._gates:
            due_step, due_time, clock = gate()
            step = min(step, due_step)
            if due_time != math.inf:
                if clock is None:  # a time without a clock: open at once
                    step = -NEVER
                else:
                    times[clock] = min(times.get(clock, math.inf), due_time)
        self._gate_step = step
        self._gate_times = tuple(times.items())

    def _time_due(self) -> bool:
        for clock, due in self._gate_times:
            if clock() >= due:
                return True
        return False

    def begin(self) -> None:
        """Call every ``begin``."""
        for fn in self._begin:
            fn()
        self._regate()

    def after_create_session(self, session: Session) -> None:
        """Call every ``after_create_session``."""
        for fn in self._after_create:
            fn(session)
        self._regate()

    def end(self, session: Session) -> None:
        """Call every ``end``."""
        for fn in self._end:
            fn(session)

    def run_step(
        self,
        control: StopControl,
        session: Session,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        step_done: Callable[[Any], int],
    ) -> Any:
        """One step with ``before_run``/``after_run`` around it.

        ``step_done(result)`` counts the step and returns the new global step.
        """
        # One context and one values object, reused step after step (no allocation per
        # step); hooks copy what they keep beyond the step.
        ctx = self._ctx
        if ctx is None or ctx.session is not session:
            ctx = self._ctx = SessionRunContext(args, session)
        else:
            ctx.original_args = args
            ctx._stop_requested = False
        # The gate is checked before the step (for gated before_run) and after it; once
        # open, it stays open for the step's after_run.
        opened = False
        if self._gated_before:
            opened = session.global_step + 1 >= self._gate_step or bool(self._gate_times and self._time_due())
        for before in self._before_all if opened else self._before:
            before(ctx)
        results = fn(*args, **kwargs)
        values = self._values
        values.results = results
        values.global_step = step = step_done(results)
        if opened or step >= self._gate_step or (self._gate_times and self._time_due()):
            try:
                for after in self._after_all:
                    after(ctx, values)
            finally:
                self._regate()
        else:
            for after in self._after:
                after(ctx, values)
        values.results = None  # keep no reference to the step's tensors
        if ctx._stop_requested:
            control.request_stop(reason="hook")
        return results


_METHODS = ("begin", "after_create_session", "before_run", "after_run", "end")
