"""TensorFlow's ``basic_session_run_hooks_test.py``, ported to asupervisor's stock hooks.

Each test names its origin (``basic_session_run_hooks_test.py::Class::method``). TF's tests
drive hooks through ``_HookedSession`` with a graph whose train op increments the global
step; here a real session runs steps (each step adds one to the global step). TF mocks
``time.time``; here the hooks get a :class:`~asupervisor.testing.ManualClock`. Cases that
have no meaning in eager TF2 are listed, with the reason, in ``tests/parity/README.md``.

Where TF's test calls ``hook.begin()`` but skips ``hook.after_create_session`` (so its
``CheckpointSaverHook`` never saves the starting state), the port runs a real session,
where both TF and asupervisor save the starting state at creation; the docstring says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf
from eventfiles import read_events, steps_of

import asupervisor as asv
from asupervisor.testing import ManualClock, capture_logs

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_new_threads")]

ORIGIN = "basic_session_run_hooks_test.py"


def make_sv(hooks: list[Any], logdir: Path | None = None, **kwargs: Any) -> asv.Supervisor:
    """A Supervisor with only the given hooks at work (no timed services, no signals)."""
    kwargs.setdefault("state", {"w": tf.Variable(0.0)})
    return asv.Supervisor(logdir, hooks=hooks, handle_signals=False, save_summaries_secs=0, save_model_secs=0, **kwargs)


def saved_step(directory: Path) -> int | None:
    """The global step stored in the latest checkpoint of ``directory`` (TF's ``load_variable``)."""
    latest = tf.train.latest_checkpoint(str(directory))
    if latest is None:
        return None
    return int(tf.train.load_variable(latest, "global_step/.ATTRIBUTES/VARIABLE_VALUE"))


def noop() -> None:
    """A step that does nothing but count."""


def logged(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``LoggingTensorHook`` lines among captured log events."""
    return [e for e in logs if e["event"] == "tensors.logged"]


class MockCheckpointSaverListener(asv.CheckpointSaverListener):
    """TF's ``MockCheckpointSaverListener``: counts calls; ``after_save`` may ask to stop."""

    def __init__(self) -> None:
        self.counts = {"begin": 0, "before_save": 0, "after_save": 0, "end": 0}
        self.ask_for_stop = False

    def begin(self) -> None:
        self.counts["begin"] += 1

    def before_save(self, session: asv.Session, global_step_value: int) -> None:
        self.counts["before_save"] += 1

    def after_save(self, session: asv.Session, global_step_value: int) -> bool:
        self.counts["after_save"] += 1
        return self.ask_for_stop

    def end(self, session: asv.Session, global_step_value: int) -> None:
        self.counts["end"] += 1


# -- SecondOrStepTimerTest --------------------------------------------------------------


def test_timer_raise_in_both_secs_and_steps() -> None:
    """basic_session_run_hooks_test.py::SecondOrStepTimerTest::test_raise_in_both_secs_and_steps:
    a timer given both a period in seconds and one in steps is a ValueError."""
    with pytest.raises(ValueError):
        asv.SecondOrStepTimer(every_secs=2.0, every_steps=10)


def test_timer_raise_in_none_secs_and_steps() -> None:
    """basic_session_run_hooks_test.py::SecondOrStepTimerTest::test_raise_in_none_secs_and_steps:
    a timer given no period is a ValueError."""
    with pytest.raises(ValueError):
        asv.SecondOrStepTimer()


def test_timer_every_secs() -> None:
    """basic_session_run_hooks_test.py::SecondOrStepTimerTest::test_every_secs: a seconds timer
    fires on the first step, never twice for a step, and again once the period passed."""
    clock = ManualClock(1484695987.209386)
    timer = asv.SecondOrStepTimer(every_secs=1.0, clock=clock)
    assert timer.should_trigger_for_step(1)
    timer.update_last_triggered_step(1)
    assert not timer.should_trigger_for_step(1)
    assert not timer.should_trigger_for_step(2)
    clock.advance(1.0)
    assert not timer.should_trigger_for_step(1)
    assert timer.should_trigger_for_step(2)


def test_timer_every_steps() -> None:
    """basic_session_run_hooks_test.py::SecondOrStepTimerTest::test_every_steps: a steps timer
    fires on the first step, then ``every_steps`` steps after its last firing."""
    timer = asv.SecondOrStepTimer(every_steps=3)
    assert timer.should_trigger_for_step(1)
    timer.update_last_triggered_step(1)
    assert not timer.should_trigger_for_step(1)
    assert not timer.should_trigger_for_step(2)
    assert not timer.should_trigger_for_step(3)
    assert timer.should_trigger_for_step(4)


def test_timer_update_last_triggered_step() -> None:
    """basic_session_run_hooks_test.py::SecondOrStepTimerTest::test_update_last_triggered_step:
    the first firing returns ``(None, None)``, later ones the seconds and steps since the last."""
    clock = ManualClock()
    timer = asv.SecondOrStepTimer(every_steps=1, clock=clock)
    assert timer.update_last_triggered_step(1) == (None, None)
    clock.advance(0.5)
    secs, steps = timer.update_last_triggered_step(5)
    assert secs is not None and secs > 0 and steps == 4
    clock.advance(0.25)
    secs, steps = timer.update_last_triggered_step(7)
    assert secs is not None and secs > 0 and steps == 2


# -- StopAtStepTest ---------------------------------------------------------------------


def test_stop_at_step_raise_in_both_last_step_and_num_steps() -> None:
    """basic_session_run_hooks_test.py::StopAtStepTest::test_raise_in_both_last_step_and_num_steps:
    giving both ``num_steps`` and ``last_step`` is a ValueError."""
    with pytest.raises(ValueError):
        asv.StopAtStepHook(num_steps=10, last_step=20)


class StopObserver(asv.SessionRunHook):
    """Records, after each step, (global step, whether a hook asked to stop after it): what
    TF's tests read with ``mon_sess.should_stop()`` after each run. (Here a stop ends the
    body at its next ``await``, so the body itself cannot look after the stopping step.)"""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool]] = []

    def after_run(self, run_context: asv.SessionRunContext, run_values: asv.SessionRunValues) -> None:
        self.seen.append((run_values.global_step, run_context.stop_requested))


async def test_stop_based_on_last_step() -> None:
    """basic_session_run_hooks_test.py::StopAtStepTest::test_stop_based_on_last_step: from
    global step 5, ``last_step=10`` does not stop at steps 6-9 and stops at step 10. (TF then
    sets the step to 11 and clears the stop flag; a stopped asupervisor session runs no more
    steps, so that part has no equivalent.)"""
    observer = StopObserver()
    sv = make_sv([asv.StopAtStepHook(last_step=10), observer], global_step=tf.Variable(5, dtype=tf.int64))
    async with sv.managed_session() as sess:
        assert sess.global_step == 5
        while True:
            await sess.run(noop)
    assert observer.seen == [(6, False), (7, False), (8, False), (9, False), (10, True)]
    assert sess.should_stop() and sess.stop_reason == "hook" and sess.global_step == 10


async def test_stop_based_on_num_step() -> None:
    """basic_session_run_hooks_test.py::StopAtStepTest::test_stop_based_on_num_step: from global
    step 5, ``num_steps=10`` counts from the step the session started at and stops at 15."""
    hook, observer = asv.StopAtStepHook(num_steps=10), StopObserver()
    sv = make_sv([hook, observer], global_step=tf.Variable(5, dtype=tf.int64))
    async with sv.managed_session() as sess:
        while True:
            await sess.run(noop)
    assert observer.seen == [(s, s == 15) for s in range(6, 16)]
    assert hook.last_step == 15 and sess.global_step == 15


async def test_stop_based_with_multiple_steps() -> None:
    """basic_session_run_hooks_test.py::StopAtStepTest::test_stop_based_with_multiple_steps: a
    run that moves the global step from 5 past the last step (15) asks to stop. asupervisor
    counts one step per run, so the hook is handed a run ending at global step 15 directly."""
    hook = asv.StopAtStepHook(num_steps=10)
    sv = make_sv([hook], global_step=tf.Variable(5, dtype=tf.int64))
    async with sv.managed_session() as sess:
        ctx = asv.SessionRunContext((), sess)
        hook.after_run(ctx, asv.SessionRunValues(None, 6))
        assert not ctx.stop_requested
        hook.after_run(ctx, asv.SessionRunValues(None, 15))
        assert ctx.stop_requested


# -- LoggingTensorHookTest --------------------------------------------------------------


def test_logging_tensor_hook_illegal_args() -> None:
    """basic_session_run_hooks_test.py::LoggingTensorHookTest::test_illegal_args: a period of 0
    or -10 iterations is a ValueError naming ``every_n_iter``; both periods, or none without
    ``at_end``, is a ValueError asking for exactly one."""
    for bad in (0, -10):
        with pytest.raises(ValueError, match="every_n_iter"):
            asv.LoggingTensorHook(["t"], every_n_iter=bad)
    with pytest.raises(ValueError, match="xactly one of"):
        asv.LoggingTensorHook(["t"], every_n_iter=5, every_n_secs=5)
    with pytest.raises(ValueError, match="xactly one of"):
        asv.LoggingTensorHook(["t"])


def foo_step() -> dict[str, tf.Tensor]:
    """A step returning the tensor TF's tests log (``foo`` = 42.0)."""
    return {"foo": tf.constant(42.0)}


async def test_logging_tensor_hook_print_at_end_only() -> None:
    """basic_session_run_hooks_test.py::LoggingTensorHookTest::test_print_at_end_only: with only
    ``at_end``, nothing is logged during the steps and the value is logged at the end."""
    hook = asv.LoggingTensorHook(["foo"], at_end=True)
    with capture_logs() as logs:
        async with make_sv([hook]).managed_session() as sess:
            for _ in range(3):
                await sess.run(foo_step)
                assert logged(logs) == []
    assert [(e["global_step"], e["foo"]) for e in logged(logs)] == [(3, 42.0)]


@pytest.mark.parametrize("at_end", [False, True])
async def test_logging_tensor_hook_print_every_n_steps(at_end: bool) -> None:
    """basic_session_run_hooks_test.py::LoggingTensorHookTest::test_print_every_n_steps and
    ``::test_print_every_n_steps_and_end``: ``every_n_iter=10`` logs the first step, then every
    10th (never the 9 between), not the step after; at the end only with ``at_end``. Run
    twice with fresh hooks, as TF does to check the reset."""
    for _ in range(2):
        hook = asv.LoggingTensorHook(["foo"], every_n_iter=10, at_end=at_end)
        with capture_logs() as logs:
            async with make_sv([hook]).managed_session() as sess:
                await sess.run(foo_step)
                assert len(logged(logs)) == 1
                for _ in range(3):
                    logs.clear()
                    for _ in range(9):
                        await sess.run(foo_step)
                        assert logged(logs) == []
                    await sess.run(foo_step)
                    assert len(logged(logs)) == 1 and logged(logs)[0]["foo"] == 42.0
                logs.clear()
                await sess.run(foo_step)
                assert logged(logs) == []
        assert len(logged(logs)) == (1 if at_end else 0)


async def test_logging_tensor_hook_print_first_step() -> None:
    """basic_session_run_hooks_test.py::LoggingTensorHookTest::test_print_first_step: with
    ``every_n_iter=1`` and a mapping of names, the first step is logged without a duration."""
    hook = asv.LoggingTensorHook({"foo": "foo"}, every_n_iter=1)
    with capture_logs() as logs:
        async with make_sv([hook]).managed_session() as sess:
            await sess.run(foo_step)
    (line,) = logged(logs)
    assert line["foo"] == 42.0 and "secs" not in line


@pytest.mark.parametrize("at_end", [False, True])
async def test_logging_tensor_hook_print_every_n_secs(at_end: bool) -> None:
    """basic_session_run_hooks_test.py::LoggingTensorHookTest::test_print_every_n_secs and
    ``::test_print_every_n_secs_and_end``: ``every_n_secs=1`` logs the first step, not the next
    one in the same second, then the one after the clock moved 1 s; at the end only with
    ``at_end``. Twice, for the reset."""
    for _ in range(2):
        clock = ManualClock(1484695987.209386)
        hook = asv.LoggingTensorHook(["foo"], every_n_secs=1.0, at_end=at_end, clock=clock)
        with capture_logs() as logs:
            async with make_sv([hook]).managed_session() as sess:
                await sess.run(foo_step)
                assert len(logged(logs)) == 1
                logs.clear()
                await sess.run(foo_step)
                assert logged(logs) == []
                clock.advance(1.0)
                await sess.run(foo_step)
                assert len(logged(logs)) == 1
                logs.clear()
        assert len(logged(logs)) == (1 if at_end else 0)


async def test_logging_tensor_hook_print_formatter() -> None:
    """basic_session_run_hooks_test.py::LoggingTensorHookTest::test_print_formatter: a formatter
    makes the logged line, from the values by name."""
    hook = asv.LoggingTensorHook(["foo"], every_n_iter=10, formatter=lambda items: f"qqq={items['foo']}")
    with capture_logs() as logs:
        async with make_sv([hook]).managed_session() as sess:
            await sess.run(foo_step)
    assert [e["message"] for e in logged(logs)] == ["qqq=42.0"]


# -- CheckpointSaverHookTest ------------------------------------------------------------


async def test_checkpoint_saves_when_saver_and_scaffold_both_missing(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_saves_when_saver_and_scaffold_both_missing:
    a hook given only a directory and ``save_steps=1`` saves the state after the first step
    (global step 1), readable with TF's own checkpoint reader."""
    hook = asv.CheckpointSaverHook(str(tmp_path), save_steps=1)
    async with make_sv([hook]).managed_session() as sess:
        await sess.run(noop)
        assert saved_step(tmp_path) == 1


def test_checkpoint_raise_in_both_secs_and_steps(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_raise_in_both_secs_and_steps."""
    with pytest.raises(ValueError):
        asv.CheckpointSaverHook(str(tmp_path), save_secs=10, save_steps=20)


def test_checkpoint_raise_in_none_secs_and_steps(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_raise_in_none_secs_and_steps."""
    with pytest.raises(ValueError):
        asv.CheckpointSaverHook(str(tmp_path))


async def test_checkpoint_save_secs_saves_in_first_step(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_save_secs_saves_in_first_step:
    with ``save_secs`` the first save does not wait for the period. TF's test skips
    ``after_create_session``, so its first save is at step 1; in a real session (TF's and
    this one) the first save is the starting state, at creation: step 0 is on disk before any
    step, and the first step, within the period, is not saved again."""
    clock = ManualClock()
    hook = asv.CheckpointSaverHook(str(tmp_path), save_secs=2, clock=clock)
    async with make_sv([hook]).managed_session() as sess:
        assert saved_step(tmp_path) == 0
        await sess.run(noop)
        assert saved_step(tmp_path) == 0


async def test_checkpoint_save_secs_calls_listeners_at_begin_and_end(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_save_secs_calls_listeners_at_begin_and_end:
    one save at the start, none for the second step (within the period), one at the end:
    begin 1, before_save 2, after_save 2, end 1."""
    listener = MockCheckpointSaverListener()
    hook = asv.CheckpointSaverHook(str(tmp_path), save_secs=2, listeners=[listener], clock=ManualClock())
    async with make_sv([hook]).managed_session() as sess:
        await sess.run(noop)
        await sess.run(noop)
    assert listener.counts == {"begin": 1, "before_save": 2, "after_save": 2, "end": 1}


async def listener_session(tmp_path: Path, listeners: list[MockCheckpointSaverListener]) -> int:
    """Two steps with a ``save_steps=1`` hook in a session restoring from ``tmp_path``."""
    hook = asv.CheckpointSaverHook(str(tmp_path), save_steps=1, listeners=listeners)
    async with make_sv([hook], tmp_path).managed_session() as sess:
        await sess.run(noop)
        await sess.run(noop)
    return sess.global_step


async def restored_step(tmp_path: Path) -> int:
    """The global step a new session restores from ``tmp_path``."""
    async with make_sv([], tmp_path).managed_session() as sess:
        return sess.global_step


async def test_checkpoint_listener_with_monitored_session(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_listener_with_monitored_session:
    in a full session with ``save_steps=1`` and two steps, the listener sees three saves
    (start, step 1, step 2; the end does not save step 2 again)."""
    listener = MockCheckpointSaverListener()
    assert await listener_session(tmp_path, [listener]) == 2
    assert listener.counts == {"begin": 1, "before_save": 3, "after_save": 3, "end": 1}


async def test_checkpoint_listener_stops_training_in_after_save(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_listener_stops_training_in_after_save:
    a listener whose ``after_save`` returns True stops training after that step."""
    listener = MockCheckpointSaverListener()
    hook = asv.CheckpointSaverHook(str(tmp_path), save_steps=1, listeners=[listener])
    observer = StopObserver()
    async with make_sv([hook, observer]).managed_session() as sess:
        await sess.run(noop)
        assert not sess.should_stop()
        await sess.run(noop)
        assert not sess.should_stop()
        listener.ask_for_stop = True
        await sess.run(noop)  # the stop ends the body here
        pytest.fail("the body went on after the stop")
    assert observer.seen == [(1, False), (2, False), (3, True)]
    assert sess.should_stop() and sess.stop_reason == "hook"


async def test_checkpoint_listener_with_default_saver(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_listener_with_default_saver:
    three saves seen by the listener, and a new session restores global step 2."""
    listener = MockCheckpointSaverListener()
    assert await listener_session(tmp_path, [listener]) == 2
    assert listener.counts == {"begin": 1, "before_save": 3, "after_save": 3, "end": 1}
    assert await restored_step(tmp_path) == 2


async def test_checkpoint_two_listeners_with_default_saver(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_two_listeners_with_default_saver:
    two listeners see the same calls; a new session restores global step 2."""
    first, second = MockCheckpointSaverListener(), MockCheckpointSaverListener()
    assert await listener_session(tmp_path, [first, second]) == 2
    assert first.counts == {"begin": 1, "before_save": 3, "after_save": 3, "end": 1}
    assert second.counts == first.counts
    assert await restored_step(tmp_path) == 2


async def test_checkpoint_save_secs_saves_periodically(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_save_secs_saves_periodically:
    ``save_secs=2``: steps at +0.5 s are not saved, the step at +2.5 s is (3), those at +2.6
    and +2.7 s are not, the step at +10 s is (6). TF's test skips the save at creation, so
    its first step is saved instead (1); here the creation save (0) takes that place."""
    clock = ManualClock(1484695987.209386)
    start = clock.now()
    hook = asv.CheckpointSaverHook(str(tmp_path), save_secs=2, clock=clock)

    async def step_at(offset: float) -> None:
        clock.advance(start + offset - clock.now())
        await sess.run(noop)

    async with make_sv([hook]).managed_session() as sess:
        await step_at(0)
        await step_at(0.5)
        assert saved_step(tmp_path) == 0
        await step_at(2.5)
        await step_at(2.6)
        await step_at(2.7)
        assert saved_step(tmp_path) == 3
        await step_at(10)
        assert saved_step(tmp_path) == 6


async def test_checkpoint_save_secs_calls_listeners_periodically(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_save_secs_calls_listeners_periodically:
    steps at +0.5, +0.5, +3.0, +3.5, +4.0, +6.5, +7.0 s with ``save_secs=2`` and the end at
    +7.5 s: four saves (TF: steps 1, 3, 6 and the end; here the start, 3, 6 and the end)."""
    clock = ManualClock(1484695987.209386)
    start = clock.now()
    listener = MockCheckpointSaverListener()
    hook = asv.CheckpointSaverHook(str(tmp_path), save_secs=2, listeners=[listener], clock=clock)
    async with make_sv([hook]).managed_session() as sess:
        for offset in (0.5, 0.5, 3.0, 3.5, 4.0, 6.5, 7.0):
            clock.advance(start + offset - clock.now())
            await sess.run(noop)
        clock.advance(0.5)
    assert listener.counts == {"begin": 1, "before_save": 4, "after_save": 4, "end": 1}


async def test_checkpoint_save_steps_saves_in_first_step(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_save_steps_saves_in_first_step:
    with ``save_steps=2`` the first save does not wait for the period: TF's test (no
    ``after_create_session``) saves step 1; a real session saves the starting state (0) at
    creation, as TF's own ``test_save_checkpoint_before_first_train_step`` shows."""
    hook = asv.CheckpointSaverHook(str(tmp_path), save_steps=2)
    async with make_sv([hook]).managed_session() as sess:
        await sess.run(noop)
        assert saved_step(tmp_path) == 0


async def check_save_steps_periodically(tmp_path: Path) -> None:
    hook = asv.CheckpointSaverHook(str(tmp_path), save_steps=2)
    seen = []
    async with make_sv([hook]).managed_session() as sess:
        for _ in range(5):
            await sess.run(noop)
            seen.append(saved_step(tmp_path))
    assert seen == [0, 2, 2, 4, 4]


async def test_checkpoint_save_steps_saves_periodically(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_save_steps_saves_periodically:
    ``save_steps=2`` saves every second step after the first save. TF's test, without the
    save at creation, sees 1, 1, 3, 3, 5; a real session saves 0 at creation, then 2 and 4."""
    await check_save_steps_periodically(tmp_path)


async def test_resource_checkpoint_save_steps_saves_periodically(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::ResourceCheckpointSaverHookTest::test_save_steps_saves_periodically:
    the same with a resource-variable global step (every TF2 variable is one)."""
    await check_save_steps_periodically(tmp_path)


async def test_checkpoint_save_saves_at_end(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_save_saves_at_end: the last
    step (2, within the ``save_secs`` period) is saved at the end."""
    hook = asv.CheckpointSaverHook(str(tmp_path), save_secs=2, clock=ManualClock())
    async with make_sv([hook]).managed_session() as sess:
        await sess.run(noop)
        await sess.run(noop)
    assert saved_step(tmp_path) == 2


async def test_checkpoint_save_checkpoint_before_first_train_step(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::CheckpointSaverHookTest::test_save_checkpoint_before_first_train_step:
    step 0 is saved at creation, step 1 is not saved, step 2 (``save_steps=2``) is."""
    hook = asv.CheckpointSaverHook(str(tmp_path), save_steps=2)
    async with make_sv([hook]).managed_session() as sess:
        assert saved_step(tmp_path) == 0
        await sess.run(noop)
        assert saved_step(tmp_path) == 0
        await sess.run(noop)
        assert saved_step(tmp_path) == 2


# -- StepCounterHookTest ----------------------------------------------------------------


async def test_step_counter_every_n_steps(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::StepCounterHookTest::test_step_counter_every_n_steps:
    30 steps 0.01 s apart with ``every_n_steps=10`` write a positive ``global_step/sec`` at
    steps 11 and 21 (the first firing, step 1, only starts the measure), and log no warning."""
    clock = ManualClock(1484695987.209386)
    hook = asv.StepCounterHook(every_n_steps=10, clock=clock)
    with capture_logs() as logs:
        async with make_sv([hook], tmp_path).managed_session() as sess:
            for _ in range(30):
                clock.advance(0.01)
                await sess.run(noop)
    assert not [e for e in logs if e["log_level"] in ("warning", "error")]
    events = read_events(tmp_path)
    assert steps_of(events, "global_step/sec") == [11, 21]
    assert all(rate > 0 for _, rate in events["global_step/sec"])


async def test_step_counter_every_n_secs(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::StepCounterHookTest::test_step_counter_every_n_secs: with
    ``every_n_secs=0.1`` and 0.2 s between three steps, rates are written at steps 2 and 3."""
    clock = ManualClock(1484695987.209386)
    hook = asv.StepCounterHook(every_n_steps=None, every_n_secs=0.1, clock=clock)
    async with make_sv([hook], tmp_path).managed_session() as sess:
        await sess.run(noop)
        clock.advance(0.2)
        await sess.run(noop)
        clock.advance(0.2)
        await sess.run(noop)
    events = read_events(tmp_path)
    assert steps_of(events, "global_step/sec") == [2, 3]
    assert all(rate > 0 for _, rate in events["global_step/sec"])


async def test_step_counter_global_step_name(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::StepCounterHookTest::test_global_step_name: TF tags the
    rate after the global step tensor's name (``bar/foo/sec``). DESIGN differs: the rate is
    always written as ``global_step/sec`` (the supervisor owns the step count, whatever the
    variable is called); here at step 2 with ``every_n_steps=1``."""
    clock = ManualClock()
    hook = asv.StepCounterHook(every_n_steps=1, every_n_secs=None, clock=clock)
    step_var = tf.Variable(0, dtype=tf.int64, name="bar/foo")
    async with make_sv([hook], tmp_path, global_step=step_var).managed_session() as sess:
        for _ in range(2):
            clock.advance(0.5)
            await sess.run(noop)
    events = read_events(tmp_path)
    assert steps_of(events, "global_step/sec") == [2]
    assert not [tag for tag in events if tag.endswith("foo/sec")]


# -- SummarySaverHookTest ---------------------------------------------------------------


def test_summary_raise_in_both_secs_and_steps() -> None:
    """basic_session_run_hooks_test.py::SummarySaverHookTest::test_raise_in_both_secs_and_steps."""
    with pytest.raises(ValueError):
        asv.SummarySaverHook(save_secs=10, save_steps=20)


def test_summary_raise_in_none_secs_and_steps() -> None:
    """basic_session_run_hooks_test.py::SummarySaverHookTest::test_raise_in_none_secs_and_steps."""
    with pytest.raises(ValueError):
        asv.SummarySaverHook(save_secs=None, save_steps=None)


def summary_step(sess_box: list[asv.Session]) -> Any:
    """A step whose result holds ``my_summary`` = the global step it completes and twice that."""

    def step() -> dict[str, float]:
        value = float(sess_box[0].global_step + 1)
        return {"my_summary": value, "my_summary2": 2 * value}

    return step


async def summaries(
    tmp_path: Path, hook: asv.SummarySaverHook, steps: int, clock: ManualClock | None = None, advance: float = 0.0
) -> dict[str, list[tuple[int, Any]]]:
    """Runs ``steps`` steps (moving ``clock`` ``advance`` s after each) and reads the event file."""
    box: list[asv.Session] = []
    async with make_sv([hook], tmp_path).managed_session() as sess:
        box.append(sess)
        step = summary_step(box)
        for _ in range(steps):
            await sess.run(step)
            if clock is not None:
                clock.advance(advance)
    return read_events(tmp_path)


async def test_summary_save_steps(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::SummarySaverHookTest::test_save_steps: ``save_steps=8``
    over 30 steps writes at steps 1, 9, 17 and 25. (TF's summary op itself increments the
    variable it reports, so its values are 1-4; here the value is what each step returned.)"""
    events = await summaries(tmp_path, asv.SummarySaverHook(save_steps=8, keys=["my_summary"]), 30)
    assert events["my_summary"] == [(1, 1.0), (9, 9.0), (17, 17.0), (25, 25.0)]
    assert "my_summary2" not in events


async def test_resource_summary_save_steps(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::ResourceSummarySaverHookTest::test_save_steps: the same,
    with resource variables (every TF2 variable is one)."""
    events = await summaries(tmp_path, asv.SummarySaverHook(save_steps=8, keys=["my_summary"]), 30)
    assert steps_of(events, "my_summary") == [1, 9, 17, 25]


async def test_summary_multiple_summaries(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::SummarySaverHookTest::test_multiple_summaries: two
    scalars are both written at steps 1 and 9 of 10."""
    events = await summaries(tmp_path, asv.SummarySaverHook(save_steps=8), 10)
    assert events["my_summary"] == [(1, 1.0), (9, 9.0)]
    assert events["my_summary2"] == [(1, 2.0), (9, 18.0)]


async def test_summary_save_secs_saving_once_every_step(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::SummarySaverHookTest::test_save_secs_saving_once_every_step:
    ``save_secs=0.5`` with 0.5 s between steps writes every one of 4 steps."""
    clock = ManualClock(1484695987.209386)
    hook = asv.SummarySaverHook(save_secs=0.5, keys=["my_summary"], clock=clock)
    events = await summaries(tmp_path, hook, 4, clock, 0.5)
    assert events["my_summary"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]


async def test_summary_save_secs_saving_once_every_three_steps(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::SummarySaverHookTest::test_save_secs_saving_once_every_three_steps:
    ``save_secs=9`` with 3.1 s between 8 steps writes at steps 1, 4 and 7."""
    clock = ManualClock(1484695987.209386)
    hook = asv.SummarySaverHook(save_secs=9.0, keys=["my_summary"], clock=clock)
    events = await summaries(tmp_path, hook, 8, clock, 3.1)
    assert steps_of(events, "my_summary") == [1, 4, 7]


# -- GlobalStepWaiterHookTest -----------------------------------------------------------


async def test_global_step_waiter_not_wait_for_step_zero() -> None:
    """basic_session_run_hooks_test.py::GlobalStepWaiterHookTest::test_not_wait_for_step_zero:
    ``wait_until_step=0`` lets the first step run without waiting."""

    def no_sleep(secs: float) -> None:
        raise AssertionError("the hook waited")

    hook = asv.GlobalStepWaiterHook(wait_until_step=0, global_step_fn=lambda: 0, sleep=no_sleep)
    async with make_sv([hook]).managed_session() as sess:
        await sess.run(noop)
    assert sess.global_step == 1


async def test_global_step_waiter_wait_for_step() -> None:
    """basic_session_run_hooks_test.py::GlobalStepWaiterHookTest::test_wait_for_step: the first
    step waits for global step 1000; each wait moves the (shared) global step, to 500 then
    1100, and the hook lets the step run after exactly two waits."""
    shared = {"step": 0}
    sleeps: list[float] = []

    def sleep(secs: float) -> None:
        sleeps.append(secs)
        if len(sleeps) == 1:
            shared["step"] = 500
        elif len(sleeps) == 2:
            shared["step"] = 1100
        else:
            raise AssertionError("expected the wait to end after the second sleep")

    hook = asv.GlobalStepWaiterHook(wait_until_step=1000, global_step_fn=lambda: shared["step"], sleep=sleep)
    async with make_sv([hook]).managed_session() as sess:
        await sess.run(noop)
    assert len(sleeps) == 2


# -- FinalOpsHookTest -------------------------------------------------------------------


async def test_final_ops_is_scalar_tensor() -> None:
    """basic_session_run_hooks_test.py::FinalOpsHookTest::test_final_ops_is_scalar_tensor: a
    scalar tensor is read at the end."""
    hook = asv.FinalOpsHook(tf.constant(4))
    async with make_sv([hook]).managed_session():
        pass
    assert hook.final_ops_values == 4


async def test_final_ops_is_tensor() -> None:
    """basic_session_run_hooks_test.py::FinalOpsHookTest::test_final_ops_is_tensor: a vector
    tensor is read at the end, as a NumPy array."""
    expected = [1, 6, 3, 5, 2, 4]
    hook = asv.FinalOpsHook(tf.constant(expected))
    async with make_sv([hook]).managed_session():
        pass
    assert hook.final_ops_values.tolist() == expected


async def test_final_ops_triggers_out_of_range_error() -> None:
    """basic_session_run_hooks_test.py::FinalOpsHookTest::test_final_ops_triggers_out_of_range_error:
    final ops that read an exhausted input raise ``OutOfRangeError`` out of the session's end
    (TF also logs a warning that the final ops depend on an input source)."""
    iterator = iter(tf.data.Dataset.range(1))
    next(iterator)

    def final() -> Any:
        return iterator.get_next()

    hook = asv.FinalOpsHook(final)
    with pytest.raises(tf.errors.OutOfRangeError, match="End of sequence"):
        async with make_sv([hook]).managed_session():
            pass


# -- ProfilerHookTest -------------------------------------------------------------------


def trace_count(output_dir: Path) -> int:
    """Traces written (TF counts ``timeline-*.json``; TF2's profiler writes ``*.xplane.pb``)."""
    return len(list((output_dir / "plugins" / "profile").glob("*/*.xplane.pb")))


def test_profiler_raise_in_both_secs_and_steps() -> None:
    """basic_session_run_hooks_test.py::ProfilerHookTest::test_raise_in_both_secs_and_steps."""
    with pytest.raises(ValueError):
        asv.ProfilerHook(save_secs=10, save_steps=20)


def test_profiler_raise_in_none_secs_and_steps() -> None:
    """basic_session_run_hooks_test.py::ProfilerHookTest::test_raise_in_none_secs_and_steps."""
    with pytest.raises(ValueError):
        asv.ProfilerHook(save_secs=None, save_steps=None)


async def test_profiler_save_secs_does_not_save_in_first_step(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::ProfilerHookTest::test_save_secs_does_not_save_in_first_step:
    the first step arms the timer and is not traced."""
    hook = asv.ProfilerHook(save_secs=2, output_dir=str(tmp_path), clock=ManualClock())
    async with make_sv([hook]).managed_session() as sess:
        await sess.run(noop)
        assert trace_count(tmp_path) == 0


async def test_profiler_save_secs_saves_periodically(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::ProfilerHookTest::test_save_secs_saves_periodically:
    with ``save_secs=2``: the first step is not traced, the step at +2.5 s is, those at +2.6
    and +4.4 s are not (under 2 s since the last trace), the one at +4.5 s is."""
    clock = ManualClock(1484695987.209386)
    start = clock.now()
    hook = asv.ProfilerHook(save_secs=2, output_dir=str(tmp_path), clock=clock)
    async with make_sv([hook]).managed_session() as sess:
        counts = []
        for offset in (0, 2.5, 2.6, 4.4, 4.5):
            clock.advance(start + offset - clock.now())
            await sess.run(noop)
            counts.append(trace_count(tmp_path))
    assert counts == [0, 1, 1, 1, 2]


async def test_profiler_save_steps_does_not_save_in_first_step(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::ProfilerHookTest::test_save_steps_does_not_save_in_first_step:
    even with ``save_steps=1`` the first step only arms the timer."""
    hook = asv.ProfilerHook(save_steps=1, output_dir=str(tmp_path))
    async with make_sv([hook]).managed_session() as sess:
        await sess.run(noop)
        assert trace_count(tmp_path) == 0


async def test_profiler_save_steps_saves_periodically(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::ProfilerHookTest::test_save_steps_saves_periodically:
    ``save_steps=2`` traces steps 2 and 4 of 5, not 1, 3 or 5."""
    hook = asv.ProfilerHook(save_steps=2, output_dir=str(tmp_path))
    async with make_sv([hook]).managed_session() as sess:
        counts = [trace_count(tmp_path)]
        for _ in range(5):
            await sess.run(noop)
            counts.append(trace_count(tmp_path))
    assert counts == [0, 0, 1, 1, 2, 2]
    runs = sorted(p.name.rsplit("_step_", 1)[1] for p in (tmp_path / "plugins" / "profile").iterdir())
    assert runs == ["2", "4"]


async def test_profiler_run_metadata_saves(tmp_path: Path) -> None:
    """basic_session_run_hooks_test.py::ProfilerHookTest::test_run_metadata_saves: with
    ``save_steps=1`` and two steps, only step 2 is traced, under a name carrying the step (TF:
    run metadata tagged ``step_2``; TF2 has no run metadata, the trace directory is named)."""
    hook = asv.ProfilerHook(save_steps=1, output_dir=str(tmp_path))
    async with make_sv([hook]).managed_session() as sess:
        await sess.run(noop)
        await sess.run(noop)
    (run,) = (tmp_path / "plugins" / "profile").iterdir()
    assert run.name.endswith("_step_2") and trace_count(tmp_path) == 1
