"""The hook protocol: TF's call order, stops from hooks and step functions, errors, end."""

from __future__ import annotations

import math
from typing import Any

import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor._hooks import HookRunner
from asupervisor.testing import ManualClock

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_new_threads")]


class Recorder(asv.SessionRunHook):
    """Records every hook call as (name, method, step) into a shared list."""

    def __init__(self, name: str, calls: list[tuple[Any, ...]]) -> None:
        self.name = name
        self.calls = calls

    def begin(self) -> None:
        self.calls.append((self.name, "begin"))

    def after_create_session(self, session: asv.Session) -> None:
        self.calls.append((self.name, "after_create_session", session.global_step))

    def before_run(self, run_context: asv.SessionRunContext) -> None:
        self.calls.append((self.name, "before_run", run_context.session.global_step))

    def after_run(self, run_context: asv.SessionRunContext, run_values: asv.SessionRunValues) -> None:
        self.calls.append((self.name, "after_run", run_values.global_step))

    def end(self, session: asv.Session) -> None:
        self.calls.append((self.name, "end", session.global_step))


def make_sv(hooks: list[Any], **kwargs: Any) -> asv.Supervisor:
    kwargs.setdefault("save_summaries_secs", 0)
    return asv.Supervisor(None, state={"v": tf.Variable(0.0)}, hooks=hooks, handle_signals=False, **kwargs)


async def test_hooks_are_called_in_monitored_session_order() -> None:
    """begin → init → after_create_session → (before_run, step, after_run)* → end, hooks in list order."""
    calls: list[tuple[Any, ...]] = []
    sv = make_sv([Recorder("a", calls), Recorder("b", calls)], init_fn=lambda: calls.append(("init",)))

    def step() -> None:
        calls.append(("step",))

    async with sv.managed_session() as sess:
        await sess.run_loop(step, max_steps=2)
    assert calls == [
        ("a", "begin"),
        ("b", "begin"),
        ("init",),
        ("a", "after_create_session", 0),
        ("b", "after_create_session", 0),
        ("a", "before_run", 0),
        ("b", "before_run", 0),
        ("step",),
        ("a", "after_run", 1),
        ("b", "after_run", 1),
        ("a", "before_run", 1),
        ("b", "before_run", 1),
        ("step",),
        ("a", "after_run", 2),
        ("b", "after_run", 2),
        ("a", "end", 2),
        ("b", "end", 2),
    ]


async def test_sess_run_calls_hooks_around_each_step() -> None:
    """``sess.run`` gives hooks the step's result and the step just completed."""
    seen: list[tuple[Any, int]] = []

    class Hook(asv.SessionRunHook):
        def after_run(self, run_context: asv.SessionRunContext, run_values: asv.SessionRunValues) -> None:
            seen.append((run_values.results, run_values.global_step))

    async with make_sv([Hook()]).managed_session() as sess:
        assert await sess.run(lambda x: x * 2, 21) == 42
        assert await sess.run(lambda: "r") == "r"
    assert seen == [(42, 1), ("r", 2)]


async def test_request_stop_in_after_run_stops_after_that_step() -> None:
    """A hook's ``run_context.request_stop()`` ends the loop after the current step; ``end`` runs."""
    calls: list[tuple[Any, ...]] = []

    class StopAt3(asv.SessionRunHook):
        def after_run(self, run_context: asv.SessionRunContext, run_values: asv.SessionRunValues) -> None:
            if run_values.global_step == 3:
                run_context.request_stop()

    sv = make_sv([StopAt3(), Recorder("r", calls)])
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: None)
    assert sess.global_step == 3
    assert sess.stop_reason == "hook"
    assert calls[-1] == ("r", "end", 3)


async def test_request_stop_in_before_run_still_runs_the_step() -> None:
    """As in TF, a stop requested in ``before_run`` lets that step (and its ``after_run``) run."""
    after: list[int] = []

    class StopBefore(asv.SessionRunHook):
        def before_run(self, run_context: asv.SessionRunContext) -> None:
            run_context.request_stop()

        def after_run(self, run_context: asv.SessionRunContext, run_values: asv.SessionRunValues) -> None:
            after.append(run_values.global_step)

    async with make_sv([StopBefore()]).managed_session() as sess:
        await sess.run_loop(lambda: None)
    assert after == [1]
    assert sess.global_step == 1


async def test_raising_hook_stops_training_and_propagates_without_end() -> None:
    """A hook that raises stops the session; the error comes out as itself; ``end`` is not called."""
    calls: list[tuple[Any, ...]] = []

    class Boom(asv.SessionRunHook):
        def after_run(self, run_context: asv.SessionRunContext, run_values: asv.SessionRunValues) -> None:
            if run_values.global_step == 2:
                raise ValueError("hook failed")

    sv = make_sv([Recorder("r", calls), Boom()])
    with pytest.raises(ValueError, match="hook failed"):
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda: None)
    assert sv.global_step == 2
    assert not [c for c in calls if c[1] == "end"]


async def test_raising_begin_fails_start_up() -> None:
    """An error in ``begin`` fails start-up with that error and runs no step."""

    class BadBegin(asv.SessionRunHook):
        def begin(self) -> None:
            raise RuntimeError("no begin")

    with pytest.raises(RuntimeError, match="no begin"):
        async with make_sv([BadBegin()]).managed_session():
            pytest.fail("the body must not run")


async def test_out_of_range_in_run_loop_ends_cleanly_with_end() -> None:
    """A step raising ``tf.errors.OutOfRangeError`` ends the session cleanly and ``end`` runs."""
    calls: list[tuple[Any, ...]] = []
    v = tf.Variable(0)

    def step() -> dict[str, Any]:
        if int(v.numpy()) == 4:
            raise tf.errors.OutOfRangeError(None, None, "end of sequence")
        return {"v": v.assign_add(1)}

    sv = asv.Supervisor(None, state={"v": v}, hooks=[Recorder("r", calls)], handle_signals=False, save_summaries_secs=0)
    async with sv.managed_session() as sess:
        await sess.run_loop(step)
    assert sess.stop_reason == "end_of_data"
    assert sess.global_step == 4
    assert calls[-1] == ("r", "end", 4)


async def test_out_of_range_in_sess_run_ends_cleanly_with_end() -> None:
    """``OutOfRangeError`` from ``sess.run`` (a TF1-style loop) also ends cleanly with ``end``."""
    calls: list[tuple[Any, ...]] = []
    it = iter(tf.data.Dataset.range(3))

    def step() -> Any:
        return next(it)

    sv = make_sv([Recorder("r", calls)])
    async with sv.managed_session() as sess:
        while not sess.should_stop():
            await sess.run(step)
    assert sess.stop_reason == "end_of_data"
    assert calls[-1] == ("r", "end", 3)


async def test_dataset_end_calls_end() -> None:
    """The end of ``data`` in ``run_loop`` is a clean stop: ``end`` runs."""
    calls: list[tuple[Any, ...]] = []
    async with make_sv([Recorder("r", calls)]).managed_session() as sess:
        assert await sess.run_loop(lambda batch: batch, data=tf.data.Dataset.range(5)) == 5
    assert calls[-1] == ("r", "end", 5)


async def test_run_step_fn_request_stop_ends_the_loop() -> None:
    """A ``step_fn`` calling ``step_context.request_stop()`` ends a ``while not should_stop()`` loop."""
    calls: list[tuple[Any, ...]] = []
    v = tf.Variable(0)

    def step_fn(ctx: asv.StepContext) -> int:
        value = int(ctx.run_with_hooks(lambda: v.assign_add(1)).numpy())
        if value >= 3:
            ctx.request_stop()
        return value

    sv = asv.Supervisor(None, state={"v": v}, hooks=[Recorder("r", calls)], handle_signals=False, save_summaries_secs=0)
    results: list[int] = []
    async with sv.managed_session() as sess:
        while not sess.should_stop():
            results.append(await sess.run_step_fn(step_fn))
    assert results == [1, 2, 3]
    assert sess.global_step == 3
    assert [c[2] for c in calls if c[1] == "after_run"] == [1, 2, 3]
    assert calls[-1] == ("r", "end", 3)


async def test_run_step_fn_context_and_run_without_hooks() -> None:
    """``StepContext`` exposes the session and step; ``run_without_hooks`` counts no step."""
    calls: list[tuple[Any, ...]] = []

    def step_fn(ctx: asv.StepContext) -> tuple[Any, ...]:
        assert ctx.session.global_step == ctx.global_step == 0
        raw = ctx.run_without_hooks(lambda: "raw")
        hooked = ctx.run_with_hooks(lambda a, b=0: a + b, 1, b=2)
        return raw, hooked, ctx.global_step

    async with make_sv([Recorder("r", calls)]).managed_session() as sess:
        assert await sess.run_step_fn(step_fn) == ("raw", 3, 1)
    assert [c[1] for c in calls].count("before_run") == 1


async def test_hook_request_stop_inside_run_step_fn() -> None:
    """A hook's stop request during ``run_with_hooks`` stops the session after ``step_fn``."""

    class StopNow(asv.SessionRunHook):
        def after_run(self, run_context: asv.SessionRunContext, run_values: asv.SessionRunValues) -> None:
            run_context.request_stop()

    async with make_sv([StopNow()]).managed_session() as sess:
        while not sess.should_stop():
            await sess.run_step_fn(lambda ctx: ctx.run_with_hooks(lambda: 1))
    assert sess.global_step == 1
    assert sess.stop_reason == "hook"


def test_runner_precomputes_the_methods_each_hook_implements() -> None:
    """Hooks without ``before_run``/``after_run`` leave the step loop on its no-hook fast path."""

    class OnlyEnd(asv.SessionRunHook):
        def end(self, session: asv.Session) -> None:
            pass

    class OnlyAfter(asv.SessionRunHook):
        def after_run(self, run_context: asv.SessionRunContext, run_values: asv.SessionRunValues) -> None:
            pass

    assert not HookRunner([OnlyEnd()]).per_step
    runner = HookRunner([OnlyEnd(), OnlyAfter()])
    assert runner.per_step
    assert len(runner._before) == 0 and len(runner._after) == 1 and len(runner._end) == 1


class Gated(Recorder):
    """A Recorder whose ``after_run`` acts every ``period`` steps and says so with ``_asv_gate``."""

    def __init__(self, name: str, calls: list[tuple[Any, ...]], period: int, clock: Any = None) -> None:
        super().__init__(name, calls)
        self.period = period
        self.clock = clock
        self.due_step = 1
        self.due_time = math.inf

    def _asv_gate(self) -> tuple[int, float, Any]:
        return self.due_step, self.due_time, None if self.clock is None else self.clock.now

    def after_run(self, run_context: asv.SessionRunContext, run_values: asv.SessionRunValues) -> None:
        super().after_run(run_context, run_values)
        if run_values.global_step >= self.due_step:
            self.due_step = run_values.global_step + self.period
        if self.clock is not None and self.clock.now() >= self.due_time:
            self.due_time = math.inf  # fired: no next time


async def test_gated_hooks_are_called_only_when_due_and_in_list_order() -> None:
    """A gated hook's after_run runs only from its gate step on; then every hook runs, in order."""
    calls: list[tuple[Any, ...]] = []
    sv = make_sv([Gated("g", calls, period=4), Recorder("r", calls)])
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: None, max_steps=10)
    after = [(c[0], c[2]) for c in calls if c[1] == "after_run"]
    assert [s for name, s in after if name == "g"] == [1, 5, 9]
    assert [s for name, s in after if name == "r"] == list(range(1, 11))
    assert after[:2] == [("g", 1), ("r", 1)] and after[5:7] == [("g", 5), ("r", 5)]


async def test_time_gated_hook_runs_once_its_clock_reaches_the_gate() -> None:
    """A gate time on an injected clock opens the gate in the step where the clock gets there."""
    calls: list[tuple[Any, ...]] = []
    clock = ManualClock()
    hook = Gated("g", calls, period=10**9, clock=clock)
    hook.due_step = 10**9
    hook.due_time = clock.now() + 30

    def step() -> None:
        clock.advance(10)

    async with make_sv([hook]).managed_session() as sess:
        await sess.run_loop(step, max_steps=5)
    assert [c[2] for c in calls if c[1] == "after_run"] == [3]  # the clock reached +30 in step 3


async def test_stock_hooks_between_firings_cost_no_call() -> None:
    """StepCounterHook(every_n_steps=3) and StopAtStepHook are called only on their steps."""
    counter, stop = asv.StepCounterHook(every_n_steps=3), asv.StopAtStepHook(last_step=10)
    seen: list[tuple[str, int]] = []
    for name, hook in (("counter", counter), ("stop", stop)):
        inner = hook.after_run

        def counting(ctx: Any, values: Any, name: str = name, inner: Any = inner) -> None:
            seen.append((name, values.global_step))
            inner(ctx, values)

        hook.after_run = counting  # type: ignore[method-assign]
    async with make_sv([counter, stop]).managed_session() as sess:
        await sess.run_loop(lambda: None)
    assert sess.global_step == 10
    assert [s for n, s in seen if n == "counter"] == [1, 4, 7, 10]
    assert [s for n, s in seen if n == "stop"] == [1, 4, 7, 10]  # called when the gate opens for any hook


def test_runner_rejects_non_hooks() -> None:
    """An object with no hook method is a ``TypeError``."""
    with pytest.raises(TypeError):
        HookRunner([object()])  # type: ignore[list-item]


def test_hook_names_are_exported_and_import_stays_cheap() -> None:
    """The hook, summary and MonitoredTrainingSession names are public; ``__all__`` is sorted."""
    import subprocess
    import sys

    for name in (
        "CheckpointSaverHook",
        "CheckpointSaverListener",
        "FinalOpsHook",
        "GlobalStepWaiterHook",
        "LoggingTensorHook",
        "MonitoredTrainingSession",
        "NanTensorHook",
        "ProfilerHook",
        "SecondOrStepTimer",
        "StepCounterHook",
        "StopAtStepHook",
        "SummarySaverHook",
    ):
        assert name in asv.__all__ and hasattr(asv, name)
    assert asv.__all__ == sorted(asv.__all__)
    code = "import sys, asupervisor; assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
