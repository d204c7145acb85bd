"""The hook protocol: TF's call order, stops from hooks and step functions, errors, end."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor._core._hooks import HookRunner
from asupervisor.testing import ManualClock, capture_logs

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


async def test_restore_happens_between_begin_and_after_create_session(tmp_path: Any) -> None:
    """With a checkpoint on disk, ``begin`` sees the state before the restore and
    ``after_create_session`` after it; the first step runs from the restored step."""
    v = tf.Variable(0.0)
    sv = asv.Supervisor(tmp_path, state={"v": v}, save_summaries_secs=0, handle_signals=False)
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: v.assign_add(1.0), max_steps=3)  # final checkpoint at step 3
    seen: list[tuple[Any, ...]] = []
    v2 = tf.Variable(0.0)

    class Probe(asv.SessionRunHook):
        def begin(self) -> None:
            seen.append(("begin", float(v2.numpy())))

        def after_create_session(self, session: asv.Session) -> None:
            seen.append(("after_create_session", float(v2.numpy()), session.global_step))

        def before_run(self, run_context: asv.SessionRunContext) -> None:
            seen.append(("before_run", run_context.session.global_step))

    sv = asv.Supervisor(tmp_path, state={"v": v2}, hooks=[Probe()], save_summaries_secs=0, handle_signals=False)
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: v2.assign_add(1.0), max_steps=4)
    assert seen == [("begin", 0.0), ("after_create_session", 3.0, 3), ("before_run", 3)]


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


def checkpointed_sv(logdir: Path, v: Any, hooks: list[Any], **kwargs: Any) -> asv.Supervisor:
    """A Supervisor saving ``{"v": v}`` to ``logdir`` at start-up and at a clean stop only."""
    return asv.Supervisor(
        logdir,
        state={"v": v},
        hooks=hooks,
        handle_signals=False,
        save_summaries_secs=0,
        save_model_secs=600,
        clock=ManualClock(),
        **kwargs,
    )


def saved_v(path: str) -> tuple[float, int]:
    """``v`` and the global step stored in the checkpoint at ``path``, as plain TF reads them."""
    v, step = tf.Variable(0.0), tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(v=v, global_step=step).read(path).expect_partial()
    return float(v.numpy()), int(step.numpy())


def all_saved(logdir: Path) -> list[tuple[float, int]]:
    """``(v, step)`` of every checkpoint the state file of ``logdir`` names, oldest first."""
    state = tf.train.get_checkpoint_state(str(logdir))
    return [saved_v(p) for p in state.all_model_checkpoint_paths]


async def test_run_step_fn_error_outside_run_with_hooks_skips_the_final_checkpoint(tmp_path: Path) -> None:
    """``step_fn`` raising after it changed the state, outside ``run_with_hooks``, is a step
    error: the state is not saved at stop, ``end`` is not called, the error comes out as itself."""
    calls: list[tuple[Any, ...]] = []
    v = tf.Variable(0.0)
    error = ValueError("step_fn failed after assigning")

    def good(ctx: asv.StepContext) -> None:
        ctx.run_with_hooks(lambda: v.assign_add(1.0))

    def bad(ctx: asv.StepContext) -> None:
        ctx.run_with_hooks(lambda: v.assign_add(1.0))
        v.assign(999.0)
        raise error

    sv = checkpointed_sv(tmp_path, v, [Recorder("r", calls)])
    with pytest.raises(ValueError) as raised:
        async with sv.managed_session() as sess:
            await sess.run_step_fn(good)
            await sess.run_step_fn(good)
            await sess.run_step_fn(bad)
    assert raised.value is error
    assert sess.stop_reason == "error:ValueError"
    assert sess.global_step == 3
    assert not any(c[1] == "end" for c in calls)
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest is not None and latest.endswith("model.ckpt-0")  # the start-up save only
    assert all_saved(tmp_path) == [(0.0, 0)]


async def test_run_step_fn_aborted_outside_run_with_hooks_recovers(tmp_path: Path) -> None:
    """``AbortedError`` raised by ``step_fn`` itself restores the latest checkpoint and calls
    ``step_fn`` again, as for a step; the session then ends cleanly with a good final save."""
    v = tf.Variable(0.0)
    seen: list[tuple[int, float]] = []

    def step(ctx: asv.StepContext) -> None:
        ctx.run_with_hooks(lambda: v.assign_add(1.0))

    def flaky(ctx: asv.StepContext) -> str:
        seen.append((ctx.global_step, float(v.numpy())))
        ctx.run_with_hooks(lambda: v.assign_add(1.0))
        if len(seen) == 1:
            v.assign(999.0)
            raise tf.errors.AbortedError(None, None, "worker restarted")
        return "done"

    sv = checkpointed_sv(tmp_path, v, [], recovery_wait_secs=0)
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            await sess.run_step_fn(step)
            await sess.run_step_fn(step)
            await sv.save_now()  # model.ckpt-2, v=2
            await sess.run_step_fn(step)
            assert await sess.run_step_fn(flaky) == "done"
    assert seen == [(3, 3.0), (2, 2.0)]  # called again from the restored checkpoint
    assert [e["event"] for e in logs if e["event"].startswith("session.recover")] == [
        "session.recovering",
        "session.recovered",
    ]
    assert sess.stop_reason == "completed" and sess.global_step == 3
    assert all_saved(tmp_path) == [(0.0, 0), (2.0, 2), (3.0, 3)]  # 3: the final save, v restored + 1


async def test_run_step_fn_unavailable_past_the_bound_skips_the_final_checkpoint(tmp_path: Path) -> None:
    """A ``step_fn`` that keeps raising ``UnavailableError`` outside ``run_with_hooks`` is retried
    a bounded number of times, then raised as itself, and its state is never saved."""
    v = tf.Variable(0.0)
    calls: list[int] = []

    def broken(ctx: asv.StepContext) -> None:
        calls.append(ctx.global_step)
        ctx.run_with_hooks(lambda: v.assign_add(1.0))
        v.assign(999.0)
        raise tf.errors.UnavailableError(None, None, "ps down")

    sv = checkpointed_sv(tmp_path, v, [], recovery_wait_secs=0)
    with pytest.raises(tf.errors.UnavailableError):
        async with sv.managed_session() as sess:
            await sess.run_step_fn(broken)
    assert calls == [0, 0, 0, 0]  # the first call and three retries, each from the restored step 0
    assert sess.stop_reason == "error:UnavailableError"
    assert all_saved(tmp_path) == [(0.0, 0)]


async def test_run_step_fn_replacing_an_aborted_step_with_its_own_error_is_not_recovered(tmp_path: Path) -> None:
    """A ``step_fn`` that catches a step's ``AbortedError`` and raises another error is not
    retried: its error comes out, nothing is restored, and the state is not saved at stop."""
    v = tf.Variable(0.0)
    calls: list[int] = []
    error = RuntimeError("gave up on the aborted step")

    def aborting() -> None:
        v.assign(999.0)
        raise tf.errors.AbortedError(None, None, "worker restarted")

    def step_fn(ctx: asv.StepContext) -> None:
        calls.append(ctx.global_step)
        ctx.run_with_hooks(lambda: v.assign_add(1.0))
        try:
            ctx.run_with_hooks(aborting)
        except tf.errors.AbortedError as exc:
            raise error from exc

    sv = checkpointed_sv(tmp_path, v, [], recovery_wait_secs=0)
    with pytest.raises(RuntimeError) as raised:
        async with sv.managed_session() as sess:
            await sess.run_step_fn(step_fn)
    assert raised.value is error
    assert calls == [0] and float(v.numpy()) == 999.0  # called once, never restored
    assert sess.stop_reason == "error:RuntimeError"
    assert all_saved(tmp_path) == [(0.0, 0)]


@pytest.mark.parametrize("make_error", [lambda: StopIteration(), lambda: tf.errors.OutOfRangeError(None, None, "end")])
async def test_run_step_fn_end_of_data_outside_run_with_hooks_is_a_clean_stop(tmp_path: Path, make_error: Any) -> None:
    """End of data raised by ``step_fn`` itself stops cleanly: no error, ``end`` called, final save."""
    calls: list[tuple[Any, ...]] = []
    v = tf.Variable(0.0)

    def step_fn(ctx: asv.StepContext) -> None:
        ctx.run_with_hooks(lambda: v.assign_add(1.0))
        if ctx.global_step == 2:
            raise make_error()

    async with checkpointed_sv(tmp_path, v, [Recorder("r", calls)]).managed_session() as sess:
        while True:
            await sess.run_step_fn(step_fn)
    assert sess.stop_reason == "end_of_data"
    assert calls[-1] == ("r", "end", 2)
    assert all_saved(tmp_path) == [(0.0, 0), (2.0, 2)]


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
