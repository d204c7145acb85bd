"""TensorFlow's ``monitored_session_test.py``, ported to asupervisor's sessions.

Each test names its origin (``monitored_session_test.py::Class::method``). TF's
``MonitoredSession`` maps to a :class:`~asupervisor.MonitoredTrainingSession` (or a
``Supervisor``) session: ``session.run(do_step)`` becomes ``await sess.run(step)`` and the
global step is read from ``sess.global_step``; TF's ``SingularMonitoredSession`` (no
recovery) maps to a session without a checkpoint directory, where nothing can be restored.
The ``run_step_fn`` cases come from TF's current version of the file. Cases with no meaning
in eager TF2 are listed, with the reason, in ``tests/parity/README.md``.

A stop in asupervisor is cancellation: the body of ``async with`` ends at its next
``await`` once a stop is requested (DESIGN, "After a stop, the body's next ``await`` is
cancelled"), where TF's ``run()`` raised or returned; tests read what TF reads after the
stopping run from a hook, or after the block.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

import asupervisor as asv

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_new_threads")]


def mts(checkpoint_dir: Path | None = None, **kwargs: Any) -> asv.MonitoredTrainingSession:
    """A MonitoredTrainingSession with a tiny state, no signal handlers and no recovery wait."""
    kwargs.setdefault("state", {"w": tf.Variable(0.0)})
    kwargs.setdefault("recovery_wait_secs", 0)
    return asv.MonitoredTrainingSession(checkpoint_dir, handle_signals=False, **kwargs)


def singular(hooks: list[Any] | None = None, **kwargs: Any) -> asv.Supervisor:
    """TF's ``SingularMonitoredSession``: no checkpoint directory, so no recovery."""
    kwargs.setdefault("state", {"w": tf.Variable(0.0)})
    return asv.Supervisor(
        None, hooks=hooks or [], handle_signals=False, save_model_secs=0, save_summaries_secs=0, **kwargs
    )


def noop() -> None:
    """A step that does nothing but count (TF's ``do_step``: the global step + 1)."""


class FakeHook(asv.SessionRunHook):
    """TF's ``FakeHook``: counts calls, keeps the last context and values, may ask to stop."""

    def __init__(self) -> None:
        self.should_stop = False
        self.calls = {"begin": 0, "after_create_session": 0, "before_run": 0, "after_run": 0, "end": 0}
        self.last_run_context: asv.SessionRunContext | None = None
        self.last_results: Any = None

    def begin(self) -> None:
        self.calls["begin"] += 1

    def after_create_session(self, session: asv.Session) -> None:
        self.calls["after_create_session"] += 1

    def before_run(self, run_context: asv.SessionRunContext) -> None:
        self.calls["before_run"] += 1
        self.last_run_context = run_context

    def after_run(self, run_context: asv.SessionRunContext, run_values: asv.SessionRunValues) -> None:
        self.calls["after_run"] += 1
        self.last_results = run_values.results
        if self.should_stop:
            run_context.request_stop()

    def end(self, session: asv.Session) -> None:
        self.calls["end"] += 1


class RaiseOnceAtCountN(asv.SessionRunHook):
    """TF's ``RaiseOnceAtCountN``: raises ``ex`` in the ``n``-th ``before_run``, once."""

    def __init__(self, n: int, ex: BaseException) -> None:
        self.n = n
        self.ex = ex
        self.raised = False

    def before_run(self, run_context: asv.SessionRunContext) -> None:
        self.n -= 1
        if self.n == 0 and not self.raised:
            self.raised = True
            raise self.ex


class StepRecorder(asv.SessionRunHook):
    """Records (global step, stop requested) after each step, as TF reads ``should_stop()``."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool]] = []

    def after_run(self, run_context: asv.SessionRunContext, run_values: asv.SessionRunValues) -> None:
        self.seen.append((run_values.global_step, run_context.stop_requested))


def aborted() -> tf.errors.AbortedError:
    return tf.errors.AbortedError(None, None, "Abort")


# -- MonitoredTrainingSessionTest -------------------------------------------------------


async def test_saving_restoring_checkpoint(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredTrainingSessionTest::test_saving_restoring_checkpoint:
    a chief session steps to 2 (saved at its end); a restart finds the checkpoint and resumes
    at global step 2."""
    async with mts(tmp_path, is_chief=True) as sess:
        assert sess.global_step == 0
        await sess.run(noop)
        assert sess.global_step == 1
        await sess.run(noop)
        assert sess.global_step == 2
    async with mts(tmp_path, is_chief=True) as sess:
        assert sess.global_step == 2


async def test_summaries_steps(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredTrainingSessionTest::test_summaries_steps: with
    ``save_summaries_steps=100`` and ``log_step_count_steps=10``, 101 steps write the step's
    scalar and ``global_step/sec``."""
    from eventfiles import read_events

    async with mts(tmp_path, save_summaries_steps=100, log_step_count_steps=10) as sess:
        for _ in range(101):
            await sess.run(lambda: {"my_summary_tag": float(2 * (sess.global_step + 1))})
    tags = read_events(tmp_path)
    assert "my_summary_tag" in tags and "global_step/sec" in tags


async def test_summaries_secs(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredTrainingSessionTest::test_summaries_secs: with
    ``save_summaries_secs=0.1``, a step, 0.2 s, then 101 steps write the step's scalar and
    ``global_step/sec`` (time moves on an injected clock instead of ``time.sleep``)."""
    from eventfiles import read_events

    from asupervisor.testing import ManualClock

    clock = ManualClock()
    async with mts(
        tmp_path, save_summaries_steps=None, save_summaries_secs=0.1, log_step_count_steps=10, clock=clock
    ) as sess:
        await sess.run(lambda: {"my_summary_tag": 2.0})
        clock.advance(0.2)
        for _ in range(101):
            await sess.run(lambda: {"my_summary_tag": float(2 * (sess.global_step + 1))})
            clock.advance(0.01)
    tags = read_events(tmp_path)
    assert "my_summary_tag" in tags and "global_step/sec" in tags


async def test_save_checkpoint_steps(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredTrainingSessionTest::test_save_checkpoint_steps (TF's
    current file): with ``save_checkpoint_steps=100``, 100 steps; a restart resumes at 100."""
    async with mts(tmp_path, is_chief=True, save_checkpoint_steps=100, log_step_count_steps=10) as sess:
        for _ in range(100):
            await sess.run(noop)
    async with mts(tmp_path, is_chief=True) as sess:
        assert sess.global_step == 100


async def test_save_checkpoint_secs(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredTrainingSessionTest::test_save_checkpoint_secs (TF's
    current file): with ``save_checkpoint_secs=0.1``, a step, 0.2 s (an injected clock), 10
    more steps; a restart resumes at 11."""
    from asupervisor.testing import ManualClock

    clock = ManualClock()
    async with mts(tmp_path, is_chief=True, save_checkpoint_secs=0.1, log_step_count_steps=10, clock=clock) as sess:
        await sess.run(noop)
        clock.advance(0.2)
        for _ in range(10):
            await sess.run(noop)
    async with mts(tmp_path, is_chief=True) as sess:
        assert sess.global_step == 11


async def test_custom_saving(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredTrainingSessionTest::test_custom_saving: with
    ``save_checkpoint_secs=0`` no checkpoint is written; a chief-only hook is begun once; a
    restart finds no checkpoint and starts at global step 0."""
    fake_hook = FakeHook()
    async with mts(tmp_path, is_chief=True, chief_only_hooks=[fake_hook], save_checkpoint_secs=0) as sess:
        await sess.run(noop)
        await sess.run(noop)
        assert sess.global_step == 2
    assert fake_hook.calls["begin"] == 1
    assert tf.train.latest_checkpoint(str(tmp_path)) is None
    async with mts(tmp_path, is_chief=True) as sess:
        assert sess.global_step == 0


# -- WrappedSessionTest / CoordinatedSessionTest ----------------------------------------


async def test_should_stop_on_close() -> None:
    """monitored_session_test.py::WrappedSessionTest::test_should_stop_on_close and
    ``CoordinatedSessionTest::test_should_stop_on_close``: ``should_stop()`` is false while the
    session runs and true once it is closed (the ``async with`` block ended)."""
    async with singular().managed_session() as sess:
        assert not sess.should_stop()
    assert sess.should_stop()


async def test_coordinated_should_stop_on_coord_stop() -> None:
    """monitored_session_test.py::CoordinatedSessionTest::test_should_stop_on_coord_stop: a
    stop requested from another thread (TF: ``coord.request_stop()``) makes ``should_stop()``
    true; the with block ends cleanly."""
    async with singular().managed_session() as sess:
        assert not sess.should_stop()
        thread = threading.Thread(target=sess.request_stop)
        thread.start()
        thread.join()
        assert sess.should_stop()
    assert sess.stop_reason == "requested"


async def test_coordinated_dont_request_stop_on_exception_in_main_thread() -> None:
    """monitored_session_test.py::CoordinatedSessionTest::test_dont_request_stop_on_exception_in_main_thread:
    in TF a ``run()`` whose arguments are rejected leaves the coordinator running. DESIGN
    differs: an exception raised by a step stops the session ("a hook that raises stops
    training"; errors propagate) and comes out of the with block as itself."""
    error = TypeError("None has invalid type")

    def bad_step() -> None:
        raise error

    with pytest.raises(TypeError) as raised:
        async with singular().managed_session() as sess:
            await sess.run(noop)
            await sess.run(bad_step)
    assert raised.value is error
    assert sess.should_stop() and sess.stop_reason == "error:TypeError"


@pytest.mark.parametrize("after_exception", [False, True])
async def test_coordinated_stop_threads_on_close(after_exception: bool) -> None:
    """monitored_session_test.py::CoordinatedSessionTest::test_stop_threads_on_close and
    ``::test_stop_threads_on_close_after_exception``: work running beside training (TF:
    threads registered with the coordinator; here looped services, run in worker threads)
    is stopped and joined when the session closes, cleanly or after a step error; the
    ``no_new_threads`` fixture checks no thread outlives the session."""
    ran = threading.Event()
    sv = singular()
    sv.loop(0.001, ran.set)
    with pytest.raises(ValueError) if after_exception else contextlib.nullcontext():
        async with sv.managed_session() as sess:
            from anyio import to_thread

            await to_thread.run_sync(ran.wait)
            await sess.run(noop)
            if after_exception:
                await sess.run(_raise_value_error)
    assert sess.should_stop()


def _raise_value_error() -> None:
    raise ValueError("step failed")


# -- RecoverableSessionTest -------------------------------------------------------------


async def test_recoverable_recovery(tmp_path: Path) -> None:
    """monitored_session_test.py::RecoverableSessionTest::test_recovery: steps that abort are
    recovered (restore the latest checkpoint, retry) and return their value; TF retries until
    its session creator fails. DESIGN differs: recovery is bounded (3 within the window), so
    the fourth abort in a row propagates as itself."""
    plan = [2, 3, 0]  # good steps before the next abort, session after session (TF: 1, 2, 3)

    class AbortAtN(asv.SessionRunHook):
        def __init__(self) -> None:
            self.left = 1

        def before_run(self, run_context: asv.SessionRunContext) -> None:
            if self.left == 0:
                self.left = plan.pop(0) if plan else 10**9
                raise aborted()
            self.left -= 1

    with pytest.raises(tf.errors.AbortedError):
        async with mts(tmp_path, hooks=[AbortAtN()], save_checkpoint_steps=1) as sess:
            assert await sess.run(lambda: 51) == 51
            assert await sess.run(lambda: 42) == 42  # aborted, recovered, retried
            assert await sess.run(lambda: 33) == 33
            assert await sess.run(lambda: 24) == 24  # aborted, recovered, retried
            assert await sess.run(lambda: 11) == 11
            assert await sess.run(lambda: 0) == 0
            await sess.run(lambda: -12)  # aborted, recovered, aborted again: the bound
            pytest.fail("the session should have ended with the error")
    assert sess.stop_reason == "error:AbortedError"


async def test_recovery_from_coordinator_exception() -> None:
    """monitored_session_test.py::RecoverableSessionTest::test_recovery_from_coordinator_exception
    (TF's current file): a thread started by a hook reports ``AbortedError`` to the
    coordinator and TF recreates the session. DESIGN differs: ``request_stop(exc)`` from any
    thread is a stop with that error, raised out of the session as itself (recovery is for
    errors raised by a step)."""
    error = aborted()
    started = threading.Event()

    class StopWithException(asv.SessionRunHook):
        def after_create_session(self, session: asv.Session) -> None:
            self.thread = threading.Thread(target=lambda: (session.request_stop(error), started.set()))
            self.thread.start()

    hook = StopWithException()
    with pytest.raises(tf.errors.AbortedError) as raised:
        async with singular([hook]).managed_session() as sess:
            from anyio import to_thread

            await to_thread.run_sync(started.wait)
            await sess.run(noop)
    hook.thread.join()
    assert raised.value is error and sess.should_stop()


async def test_recovery_from_non_preemption_in_coordinator() -> None:
    """monitored_session_test.py::RecoverableSessionTest::test_recovery_from_non_preemption_in_coordinator
    (TF's current file): an ``UnknownError`` reported from another thread stops training, no
    new session is made, and the error is raised when the session closes."""
    error = tf.errors.UnknownError(None, None, "Some fatal exception inside the coordinator.")
    starts: list[int] = []

    class Count(asv.SessionRunHook):
        def after_create_session(self, session: asv.Session) -> None:
            starts.append(session.global_step)

    recorder = StepRecorder()
    with pytest.raises(tf.errors.UnknownError) as raised:
        async with singular([Count(), recorder]).managed_session() as sess:
            assert await sess.run(lambda: 51) == 51
            assert not sess.should_stop()
            thread = threading.Thread(target=sess.request_stop, args=(error,))
            thread.start()
            thread.join()
            assert sess.should_stop()
            await sess.run(lambda: 42)
            pytest.fail("the body went on after the stop")
    assert raised.value is error and starts == [0] and recorder.seen == [(1, False)]


# -- HookedSessionTest ------------------------------------------------------------------


async def test_hooked_run_passes_all_arguments() -> None:
    """monitored_session_test.py::HookedSessionTest::testRunPassesAllArguments: ``run`` hands
    every argument to the step unchanged (TF: fetches, feed_dict, options, run_metadata)."""
    seen: dict[str, Any] = {}

    def step(fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> list[int]:
        seen.update(feed_dict=feed_dict, options=options, run_metadata=run_metadata)
        return [int(fetches.numpy()[0])]

    async with singular().managed_session() as sess:
        output = await sess.run(
            step, tf.constant([0]), feed_dict="a_feed", options="an_option", run_metadata="a_metadata"
        )
    assert output == [0]
    assert seen == {"feed_dict": "a_feed", "options": "an_option", "run_metadata": "a_metadata"}


async def test_hooked_calls_hooks_begin_end() -> None:
    """monitored_session_test.py::HookedSessionTest::testCallsHooksBeginEnd: one run calls each
    hook's ``before_run`` and ``after_run`` once, with the run's arguments and session. DESIGN
    differs: ``run_values.results`` is the step's return value (TF: what the hook fetched,
    None here). (TF's ``_HookedSession`` alone does not call ``begin``; a session does, once,
    as TF's ``MonitoredSession`` does.)"""
    hooks = [FakeHook(), FakeHook()]
    a_tensor = tf.constant([0])
    async with singular(hooks).managed_session() as sess:
        await sess.run(lambda t: t, a_tensor)
        for hook in hooks:
            assert hook.last_results is a_tensor  # DESIGN: the step's result (TF: the hook's fetches)
            assert hook.last_run_context is not None
            assert hook.last_run_context.original_args == (a_tensor,)
            assert hook.last_run_context.session is sess
            assert hook.calls == {"begin": 1, "after_create_session": 1, "before_run": 1, "after_run": 1, "end": 0}


async def test_hooked_should_stop() -> None:
    """monitored_session_test.py::HookedSessionTest::testShouldStop: a run after which a hook
    asks to stop makes ``should_stop()`` true; before it, false."""
    first, second = FakeHook(), FakeHook()
    recorder = StepRecorder()
    async with singular([first, second, recorder]).managed_session() as sess:
        await sess.run(noop)
        assert not sess.should_stop()
        first.should_stop = True
        await sess.run(noop)
        pytest.fail("the body went on after the stop")
    assert recorder.seen == [(1, False), (2, True)]
    assert sess.should_stop() and sess.stop_reason == "hook"


# -- MonitoredSessionTest ---------------------------------------------------------------


async def test_defaults() -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_defaults: a session with default
    arguments initialises the state; a variable reads its initial value."""
    a_var = tf.Variable(0)
    async with mts(state={"a": a_var}) as sess:
        assert await sess.run(lambda: int(a_var.numpy())) == 0


async def steps_with_stop_hook(hook: asv.StopAtStepHook, **kwargs: Any) -> tuple[asv.Session, list[tuple[int, bool]]]:
    """Runs steps until ``hook`` stops the session; returns the session and what each step saw."""
    recorder = StepRecorder()
    async with singular([hook, recorder], **kwargs).managed_session() as sess:
        while True:
            await sess.run(noop)
    return sess, recorder.seen


def load_from(path: str, global_step: tf.Variable) -> Any:
    """TF's ``load_ckpt`` init_fn: restore ``global_step`` from a checkpoint written by hand."""

    def init_fn() -> None:
        tf.train.Checkpoint(global_step=global_step).read(path).assert_consumed()

    return init_fn


async def test_last_step(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_last_step: ``last_step=3`` stops
    at 3; after saving by hand and restoring through ``init_fn``, ``last_step=5`` runs from 3
    and stops at 5."""
    gstep = tf.Variable(0, dtype=tf.int64)
    _, seen = await steps_with_stop_hook(asv.StopAtStepHook(last_step=3), global_step=gstep)
    assert seen == [(1, False), (2, False), (3, True)]
    save_path = tf.train.Checkpoint(global_step=gstep).write(str(tmp_path / "step-3"))
    gstep2 = tf.Variable(0, dtype=tf.int64)
    starts: list[int] = []

    class Start(asv.SessionRunHook):
        def after_create_session(self, session: asv.Session) -> None:
            starts.append(session.global_step)

    recorder = StepRecorder()
    hooks = [Start(), asv.StopAtStepHook(last_step=5), recorder]
    async with singular(hooks, global_step=gstep2, init_fn=load_from(save_path, gstep2)).managed_session() as sess:
        while True:
            await sess.run(noop)
    assert starts == [3] and recorder.seen == [(4, False), (5, True)]


async def test_num_steps(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_num_steps: ``num_steps=3`` stops
    after 3 steps; restored at 3, ``num_steps=4`` runs 4, 5, 6, 7 and stops at 7."""
    gstep = tf.Variable(0, dtype=tf.int64)
    _, seen = await steps_with_stop_hook(asv.StopAtStepHook(num_steps=3), global_step=gstep)
    assert seen == [(1, False), (2, False), (3, True)]
    save_path = tf.train.Checkpoint(global_step=gstep).write(str(tmp_path / "step-3"))
    gstep2 = tf.Variable(0, dtype=tf.int64)
    _, seen = await steps_with_stop_hook(
        asv.StopAtStepHook(num_steps=4), global_step=gstep2, init_fn=load_from(save_path, gstep2)
    )
    assert seen == [(4, False), (5, False), (6, False), (7, True)]


async def test_recovery(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_recovery: a session saving every
    step reaches 2; a restart from the directory resumes at 2; so does a session restoring
    ``checkpoint_filename_with_path=latest_checkpoint(dir)`` (a SessionManager)."""
    hooks = [asv.CheckpointSaverHook(str(tmp_path), save_steps=1)]
    async with asv.Supervisor(
        tmp_path,
        hooks=hooks,
        handle_signals=False,
        save_model_secs=0,
        save_summaries_secs=0,
        state={"w": tf.Variable(0.0)},
    ).managed_session() as sess:
        assert sess.global_step == 0
        await sess.run(noop)
        await sess.run(noop)
        assert sess.global_step == 2
    async with mts(tmp_path) as sess:
        assert sess.global_step == 2
    latest = tf.train.latest_checkpoint(str(tmp_path))
    gstep = tf.Variable(0, dtype=tf.int64)
    manager = asv.SessionManager(state={"w": tf.Variable(0.0), "global_step": gstep})
    await manager.prepare_session(checkpoint_filename_with_path=latest)
    assert int(gstep.numpy()) == 2


async def test_retry_initialization_on_aborted_error(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_retry_initialization_on_aborted_error:
    an ``AbortedError`` raised by ``init_fn`` is retried silently at start-up (DESIGN,
    "Transient is not corrupt"); the session then runs from step 0."""
    raised: list[bool] = []

    def init_fn() -> None:
        if not raised:
            raised.append(True)
            raise aborted()

    async with mts(tmp_path, init_fn=init_fn) as sess:
        assert not sess.should_stop()
        assert sess.global_step == 0
    assert raised == [True]


@pytest.mark.parametrize(
    "make_error",
    [aborted, lambda: tf.errors.UnavailableError(None, None, "Unavailable")],
    ids=["aborted", "unavailable"],
)
async def test_retry_on_error(tmp_path: Path, make_error: Any) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_retry_on_aborted_error and
    ``::test_retry_on_unavailable_error`` (``_retry_test``): the third step raises; the session
    retries from the state it started with (TF: a freshly initialised session; here the
    checkpoint saved at creation, step 0), so the retried step makes the global step 1, then 2."""
    hook = RaiseOnceAtCountN(3, make_error())
    async with mts(tmp_path, hooks=[hook]) as sess:
        assert sess.global_step == 0
        await sess.run(noop)
        await sess.run(noop)
        assert sess.global_step == 2 and not sess.should_stop()
        await sess.run(noop)
        assert sess.global_step == 1 and not sess.should_stop() and hook.raised
        await sess.run(noop)
        assert sess.global_step == 2 and not sess.should_stop()


async def test_retry_without_checkpoint_directory_propagates() -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_retry_on_aborted_error without a
    checkpoint directory: TF re-initialises a new session. DESIGN differs: recovery restores
    the latest checkpoint; with nothing to restore the error propagates as itself."""
    error = aborted()
    with pytest.raises(tf.errors.AbortedError) as raised:
        async with mts(None, hooks=[RaiseOnceAtCountN(3, error)]) as sess:
            for _ in range(3):
                await sess.run(noop)
    assert raised.value is error and sess.global_step == 2


async def test_recover_and_retry_on_aborted_error(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_recover_and_retry_on_aborted_error:
    with a checkpoint after every step, the aborted third step restores step 2 and is retried:
    the global step goes 1, 2, 3, 4."""
    abort_hook = RaiseOnceAtCountN(3, aborted())
    ckpt_hook = asv.CheckpointSaverHook(str(tmp_path), save_steps=1)
    async with mts(tmp_path, hooks=[abort_hook, ckpt_hook], save_checkpoint_secs=0) as sess:
        assert sess.global_step == 0
        await sess.run(noop)
        await sess.run(noop)
        assert sess.global_step == 2 and not sess.should_stop()
        await sess.run(noop)
        assert sess.global_step == 3 and abort_hook.raised and not sess.should_stop()
        await sess.run(noop)
        assert sess.global_step == 4 and not sess.should_stop()


@pytest.mark.parametrize(
    "make_error",
    [lambda: tf.errors.OutOfRangeError(None, None, "EOI"), StopIteration],
    ids=["out_of_range", "stop_iteration"],
)
@pytest.mark.parametrize("recovering", [True, False], ids=["monitored", "singular"])
async def test_exit_cleanly_on_end_of_data(tmp_path: Path, make_error: Any, recovering: bool) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_exit_cleanly_on_out_of_range_exception,
    ``::test_exit_cleanly_on_stop_iteration_exception`` and
    ``SingularMonitoredSessionTest::test_exit_cleanly_on_out_of_range_exception``: a hook raising
    ``OutOfRangeError``/``StopIteration`` at the first step ends the session cleanly: the with
    block exits without error, the body does not go on, ``should_stop()`` is true."""
    hook = RaiseOnceAtCountN(1, make_error())
    session = mts(tmp_path if recovering else None, hooks=[hook])
    async with session as sess:
        assert sess.global_step == 0 and not sess.should_stop()
        await sess.run(noop)
        pytest.fail("the body went on after the end of data")
    assert sess.should_stop() and sess.stop_reason == "end_of_data"


async def test_regular_exception_pass_through_run(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_regular_exception_pass_through_run:
    a ``RuntimeError`` raised by a hook at the third step comes out of the with block; the
    session is stopped."""
    hook = RaiseOnceAtCountN(3, RuntimeError("regular exception"))
    with pytest.raises(RuntimeError, match="regular exception"):
        async with mts(tmp_path, hooks=[hook]) as sess:
            await sess.run(noop)
            await sess.run(noop)
            assert sess.global_step == 2 and not sess.should_stop()
            await sess.run(noop)
            pytest.fail("the body went on after the error")
    assert hook.raised and sess.should_stop()


@pytest.mark.parametrize("recovering", [True, False], ids=["monitored", "singular"])
async def test_regular_exception_reported_to_coord_pass_through_run(tmp_path: Path, recovering: bool) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_regular_exception_reported_to_coord_pass_through_run
    and ``SingularMonitoredSessionTest::`` the same: an error reported through
    ``request_stop(exc)`` comes out of the with block. TF then runs one more step normally.
    DESIGN differs: after a stop the body's next ``await`` is cancelled, so no step runs."""
    error = RuntimeError("a thread wants to stop")
    recorder = StepRecorder()
    with pytest.raises(RuntimeError, match="a thread wants to stop") as raised:
        async with mts(tmp_path if recovering else None, hooks=[recorder]) as sess:
            assert sess.global_step == 0
            sess.request_stop(error)
            await sess.run(noop)
            pytest.fail("a step ran after the stop")
    assert raised.value is error and recorder.seen == []


async def test_regular_exception_reported_to_coord_pass_through_return(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_regular_exception_reported_to_coord_pass_through_return:
    an error reported through ``request_stop(exc)`` makes ``should_stop()`` true and comes out
    when the with block returns."""
    error = RuntimeError("a thread wants to stop")
    with pytest.raises(RuntimeError) as raised:
        async with mts(tmp_path) as sess:
            sess.request_stop(error)
            assert sess.should_stop()
    assert raised.value is error


@pytest.mark.parametrize("recovering", [True, False], ids=["monitored", "singular"])
async def test_stop_cleanly_when_no_exception_in_with_body(tmp_path: Path, recovering: bool) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_stop_cleanly_when_no_exception_in_with_body
    and ``SingularMonitoredSessionTest::`` the same: a body that returns closes the session,
    after which ``should_stop()`` is true and no step can run."""
    async with mts(tmp_path if recovering else None) as sess:
        await sess.run(noop)
        await sess.run(noop)
        assert sess.global_step == 2 and not sess.should_stop()
    assert sess.should_stop()
    with pytest.raises(RuntimeError, match="stopped"):
        await sess.run(noop)


async def test_raises_regular_exceptions_in_with_body(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_raises_regular_exceptions_in_with_body:
    an exception raised by the body is seen outside; the session is closed and stopped."""
    with pytest.raises(RuntimeError, match="regular exception"):
        async with mts(tmp_path) as sess:
            await sess.run(noop)
            await sess.run(noop)
            assert not sess.should_stop()
            raise RuntimeError("regular exception")
    assert sess.should_stop()


# -- MonitoredSessionTest: run_step_fn (TF's current file) ------------------------------


async def test_step_fn_example() -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_step_fn_example: ``run_step_fn``
    returns what ``step_fn`` returns, here a step run with hooks."""

    def step_fn(step_context: asv.StepContext) -> Any:
        return step_context.run_with_hooks(lambda c: tf.identity(c), tf.constant(3.2))

    async with mts() as sess:
        assert float(await sess.run_step_fn(step_fn)) == pytest.approx(3.2)


async def test_step_function_stops() -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_step_function_stops:
    ``step_context.request_stop()`` stops the session; ``run_step_fn`` returns None."""

    def step_fn(step_context: asv.StepContext) -> None:
        step_context.request_stop()

    async with mts() as sess:
        assert await sess.run_step_fn(step_fn) is None
        assert sess.should_stop()


async def test_step_request_stop_in_a_loop() -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_step_request_stop_in_a_loop:
    ``while not should_stop(): run_step_fn(step_fn)`` with a stopping ``step_fn`` runs it once.
    TF raises out of ``run_step_fn``; DESIGN differs: it returns, the loop sees
    ``should_stop()`` and the body's next ``await`` would be cancelled."""
    calls: list[int] = []

    def step_fn(step_context: asv.StepContext) -> None:
        calls.append(step_context.global_step)
        step_context.request_stop()

    async with mts() as sess:
        while not sess.should_stop():
            await sess.run_step_fn(step_fn)
    assert calls == [0]


async def test_step_request_stop_with_returning_a_type() -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_step_request_stop_with_returning_a_type:
    whatever ``step_fn`` returns comes back."""
    async with mts() as sess:
        assert await sess.run_step_fn(lambda step_context: "a type") == "a type"


@pytest.mark.parametrize("bound", [False, True], ids=["function", "method"])
async def test_step_with_extra_arguments(bound: bool) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_step_with_extra_arguments and
    ``::test_step_fn_belongs_to_a_class_and_has_extra_methods``: a ``step_fn`` (function or
    method) needing more than ``step_context`` is a ValueError saying so, and the session goes
    on."""

    def step_fn(step_context: asv.StepContext, extra_foo: Any) -> None:
        del step_context, extra_foo

    class Model:
        def step_fn(self, step_context: asv.StepContext, extra_foo: Any) -> None:
            del step_context, extra_foo

    async with mts() as sess:
        with pytest.raises(ValueError, match="step_context"):
            await sess.run_step_fn(Model().step_fn if bound else step_fn)  # type: ignore[arg-type]
        assert not sess.should_stop()


async def test_step_fn_belongs_to_a_class() -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_step_fn_belongs_to_a_class: a bound
    method taking ``step_context`` is a valid ``step_fn``."""

    class Model:
        def step_fn(self, step_context: asv.StepContext) -> Any:
            return step_context.run_with_hooks(lambda: tf.constant(3.2))

    async with mts() as sess:
        assert float(await sess.run_step_fn(Model().step_fn)) == pytest.approx(3.2)


@pytest.mark.parametrize("recovering", [True, False], ids=["monitored", "singular"])
async def test_step_fn_with_hooks(recovering: bool, tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_step_fn_with_hooks and
    ``::test_step_fn_has_the_same_hooks_behavior_without_recovery``: work before
    ``run_with_hooks`` runs before the hooks (+0.3), ``before_run`` runs before the step (+0.7),
    the step (+0.5), then ``after_run`` sees 1.5 and adds 1.1; ``run_step_fn`` returns the
    step's value, 1.5."""
    var = tf.Variable(0.0)
    seen: list[float] = []

    class Hook(asv.SessionRunHook):
        def before_run(self, run_context: asv.SessionRunContext) -> None:
            var.assign_add(0.7)

        def after_run(self, run_context: asv.SessionRunContext, run_values: asv.SessionRunValues) -> None:
            seen.append(float(var.numpy()))
            var.assign_add(1.1)
            seen.append(float(var.numpy()))

    def step_fn(step_context: asv.StepContext) -> float:
        var.assign_add(0.3)
        seen.append(float(var.numpy()))
        return step_context.run_with_hooks(lambda: float(var.assign_add(0.5).numpy()))

    async with mts(tmp_path if recovering else None, hooks=[Hook()]) as sess:
        assert await sess.run_step_fn(step_fn) == pytest.approx(1.5)
    assert seen == pytest.approx([0.3, 1.5, 2.6])


async def test_step_fn_with_hooks_and_request_stop() -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_step_fn_with_hooks_and_request_stop:
    a ``step_fn`` that only asks to stop runs no hook; the session stops."""
    hook = FakeHook()

    def step_fn(step_context: asv.StepContext) -> None:
        step_context.request_stop()

    async with mts(hooks=[hook]) as sess:
        assert await sess.run_step_fn(step_fn) is None
        assert sess.should_stop()
    assert hook.calls["before_run"] == 0 and hook.calls["after_run"] == 0


async def test_recovers_from_an_exception_in_step_fn(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_recovers_from_an_exception_in_step_fn:
    an ``AbortedError`` raised by ``step_fn`` is recovered and ``step_fn`` called again; its
    value comes back."""
    calls: list[int] = []

    def step_fn(step_context: asv.StepContext) -> Any:
        calls.append(step_context.global_step)
        if len(calls) == 1:
            raise aborted()
        return step_context.run_with_hooks(lambda: 3.2)

    async with mts(tmp_path) as sess:
        assert await sess.run_step_fn(step_fn) == pytest.approx(3.2)
    assert calls == [0, 0]


async def test_recovers_from_an_exception_in_step_fn_after_hooks(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_recovers_from_an_exception_in_step_fn_after_hooks:
    a ``step_fn`` raising ``AbortedError`` after its hooked step is called again from the
    start: its side effects outside the checkpointed state happen twice (0.62)."""
    side_effects = {"count": 0}
    graph_state = tf.Variable(0.0)  # not in the checkpointed state: not restored

    def step_fn(step_context: asv.StepContext) -> Any:
        side_effects["count"] += 1
        graph_state.assign_add(0.31)
        value = step_context.run_with_hooks(lambda: 3.2)
        if side_effects["count"] == 1:
            raise aborted()
        return value

    async with mts(tmp_path) as sess:
        assert await sess.run_step_fn(step_fn) == pytest.approx(3.2)
        assert side_effects["count"] == 2
        assert float(graph_state.numpy()) == pytest.approx(0.62)


async def test_step_fn_doesnt_recover_when_it_wasnt_asked_to() -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_step_fn_doesnt_recover_when_it_wasnt_asked_to:
    without recovery (TF: ``SingularMonitoredSession``; here no checkpoint directory) an
    ``AbortedError`` raised by ``step_fn`` propagates."""
    calls: list[int] = []

    def step_fn(step_context: asv.StepContext) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise aborted()
        return step_context.run_with_hooks(lambda: 3.2)

    with pytest.raises(tf.errors.AbortedError, match="Abort"):
        async with singular().managed_session() as sess:
            await sess.run_step_fn(step_fn)
            pytest.fail("the body went on after the error")
    assert calls == [1]


async def test_step_fn_exception_from_before_run(tmp_path: Path) -> None:
    """monitored_session_test.py::MonitoredSessionTest::test_step_fn_exception_from_before_run:
    an ``AbortedError`` raised by a hook's ``before_run`` inside ``run_with_hooks`` is recovered
    and ``step_fn`` called again from the start; its value comes back."""
    side_effects = {"count": 0}
    graph_state = tf.Variable(0.0)

    class Hook(asv.SessionRunHook):
        def __init__(self) -> None:
            self.raised = False

        def before_run(self, run_context: asv.SessionRunContext) -> None:
            if not self.raised:
                self.raised = True
                raise aborted()

    def step_fn(step_context: asv.StepContext) -> Any:
        side_effects["count"] += 1
        graph_state.assign_add(0.31)
        return step_context.run_with_hooks(lambda: 1.3)

    async with mts(tmp_path, hooks=[Hook()]) as sess:
        assert await sess.run_step_fn(step_fn) == pytest.approx(1.3)
        assert side_effects["count"] == 2
        assert float(graph_state.numpy()) == pytest.approx(0.62)


# -- SingularMonitoredSessionTest -------------------------------------------------------


async def test_singular_handles_initialization() -> None:
    """monitored_session_test.py::SingularMonitoredSessionTest::test_handles_initialization: the
    state is usable in the first step."""
    a_var = tf.Variable(0)
    async with singular(state={"a": a_var}).managed_session() as sess:
        assert await sess.run(lambda: int(a_var.numpy())) == 0


async def test_singular_do_not_handle_aborted_error() -> None:
    """monitored_session_test.py::SingularMonitoredSessionTest::test_do_not_handle_aborted_error:
    without recovery, an ``AbortedError`` raised by a hook comes out of ``run`` and out of the
    with block."""

    class RaiseAborted(asv.SessionRunHook):
        def before_run(self, run_context: asv.SessionRunContext) -> None:
            raise aborted()

    with pytest.raises(tf.errors.AbortedError):
        async with singular([RaiseAborted()]).managed_session() as sess:
            await sess.run(noop)
    assert sess.global_step == 0


async def test_singular_do_not_handle_aborted_error_caught_in_body() -> None:
    """monitored_session_test.py::SingularMonitoredSessionTest::test_do_not_handle_aborted_error,
    first part: the ``AbortedError`` comes out of ``run``, where the body catches it. TF's
    session then closes quietly. DESIGN differs: the error that stopped the session comes out
    of the with block as itself even when the body caught it ("Errors propagate")."""

    class RaiseAborted(asv.SessionRunHook):
        def before_run(self, run_context: asv.SessionRunContext) -> None:
            raise aborted()

    caught: list[BaseException] = []
    with pytest.raises(tf.errors.AbortedError) as raised:
        async with singular([RaiseAborted()]).managed_session() as sess:
            try:
                await sess.run(noop)
            except tf.errors.AbortedError as exc:
                caught.append(exc)
    assert caught == [raised.value] and sess.should_stop()
