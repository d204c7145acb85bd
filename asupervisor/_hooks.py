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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._session import Session
    from ._stop import StopControl

__all__ = ["HookRunner", "SessionRunContext", "SessionRunHook", "SessionRunValues"]


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

    __slots__ = ("original_args", "session", "_stop_requested")

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

    __slots__ = ("results", "global_step")

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
        self._before: Sequence[Callable[[SessionRunContext], Any]] = self._implementing("before_run")
        self._after: Sequence[Callable[[SessionRunContext, SessionRunValues], Any]] = (
            self._implementing("after_run")
        )
        self._end = self._implementing("end")
        #: whether any hook runs around steps (the step loop's fast path checks this once)
        self.per_step = bool(self._before or self._after)
        self._ctx: SessionRunContext | None = None
        self._values = SessionRunValues(None, 0)

    def _implementing(self, name: str) -> list[Callable[..., Any]]:
        return [getattr(h, name) for h in self.hooks if _overrides(h, name)]

    def begin(self) -> None:
        """Call every ``begin``."""
        for fn in self._begin:
            fn()

    def after_create_session(self, session: Session) -> None:
        """Call every ``after_create_session``."""
        for fn in self._after_create:
            fn(session)

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
        for before in self._before:
            before(ctx)
        results = fn(*args, **kwargs)
        values = self._values
        values.results = results
        values.global_step = step_done(results)
        for after in self._after:
            after(ctx, values)
        values.results = None  # keep no reference to the step's tensors
        if ctx._stop_requested:
            control.request_stop(reason="hook")
        return results


_METHODS = ("begin", "after_create_session", "before_run", "after_run", "end")
