"""``ProfilerHook``: TensorFlow profiler traces of some steps, published whole."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .._core._abc import SessionPart, context_of
from .._core._clock import Clock
from .._core._hooks import NEVER, Gate, SessionRunContext, SessionRunHook, SessionRunValues
from .._logging import describe, get_logger

if TYPE_CHECKING:
    from .._core._abc import SessionContext
    from .._core._session import Session
from ._common import _hook_timer, _timer_gate

__all__ = ["ProfilerHook"]

log = get_logger(__name__)


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
        clock: the time source, a :class:`~asupervisor.Clock` whose ``now()`` any thread may read
            (``asupervisor.testing.ManualClock``); ``time.monotonic`` by default.

    Raises:
        ValueError: both or neither of ``save_steps`` and ``save_secs`` were given.
    """

    def __init__(
        self,
        save_steps: int | None = None,
        save_secs: float | None = None,
        output_dir: str | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._timer = _hook_timer("save_secs", save_secs, "save_steps", save_steps, clock)
        self._output_dir = output_dir
        self._dir: str | None = None
        self._ctx: SessionContext | None = None
        self._tracing = False
        self._armed = False  # the session's first step armed the timer
        self._staging: str | None = None  # where the running trace is written

    def begin(self) -> None:
        """Reset the timer: the session's first step arms it again."""
        self._timer.reset()
        self._armed = False

    def after_create_session(self, session: Session) -> None:
        """Work out where traces go; make sure no trace outlives the session."""
        self._ctx = ctx = context_of(session)
        if self._output_dir is not None:
            self._dir = self._output_dir
        elif ctx.logdir is not None and ctx.is_chief:
            self._dir = str(ctx.logdir)
        if self._dir is not None:
            _remove_stale_staging(self._dir)

    def _asv_part(self) -> SessionPart:
        return _ProfilerClose(self)

    async def _aclose(self) -> None:
        """A session closer: a trace still open after an error is stopped (on the step thread)."""
        ctx = self._ctx
        if self._tracing and ctx is not None:
            await ctx.run_on_step_thread(self._stop, ctx.global_step)

    def _asv_gate(self) -> Gate:
        if self._dir is None and not self._tracing:
            return NEVER, math.inf, None
        if not self._armed:  # the first step arms the timer
            return -NEVER, math.inf, None
        return _timer_gate(self._timer)

    def before_run(self, run_context: SessionRunContext) -> None:
        """Start a trace if the coming step is one to trace (never the session's first)."""
        ctx = self._ctx
        timer = self._timer
        if ctx is None or self._dir is None or not self._armed:
            return
        step = ctx.global_step + 1
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
