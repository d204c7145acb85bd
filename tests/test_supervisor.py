"""The engine: managed_session on the step thread, stop semantics, errors that propagate."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest
import tensorflow as tf
from _timing import scaled

import asupervisor as asv

pytestmark = pytest.mark.anyio

WAIT = scaled(30.0)  # a bound for waits that succeed at once unless the code is broken


def quiet_supervisor(**kwargs: Any) -> asv.Supervisor:
    kwargs.setdefault("handle_signals", False)
    return asv.Supervisor(kwargs.pop("logdir", None), **kwargs)


async def test_steps_run_on_one_dedicated_thread(no_new_threads: None) -> None:
    """sess.run and run_loop run every step on the same thread, not the loop's, not a pool's."""
    seen: set[int] = set()
    loop_thread = threading.get_ident()

    def step() -> int:
        seen.add(threading.get_ident())
        return 42

    sv = quiet_supervisor()
    async with sv.managed_session() as sess:
        assert await sess.run(step) == 42
        assert await sess.run(step) == 42
        await sess.run_loop(step, max_steps=10)
    assert len(seen) == 1
    assert loop_thread not in seen
    (ident,) = seen
    assert all(t.ident != ident for t in threading.enumerate())  # joined


async def test_run_passes_args_and_counts_steps() -> None:
    """sess.run(fn, *args, **kwargs) returns fn's result and counts one step each."""
    sv = quiet_supervisor()
    async with sv.managed_session() as sess:
        assert await sess.run(lambda a, b=0: a + b, 2, b=3) == 5
        assert await sess.run(pow, 2, 10) == 1024
        assert sess.global_step == 2
    assert sv.global_step == 2
    assert sess.stop_reason == "completed"


async def test_run_loop_with_tf_variable_step_and_max_steps(no_new_threads: None) -> None:
    """A @tf.function step runs max_steps times; the global step variable is synced."""
    v = tf.Variable(0.0)
    gs = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def step() -> None:
        v.assign_add(1.0)

    sv = quiet_supervisor(state={"v": v}, global_step=gs)
    async with sv.managed_session() as sess:
        n = await sess.run_loop(step, max_steps=25)
        assert n == 25
        assert sess.stop_reason == "max_steps"
        assert sess.should_stop()
    assert v.numpy() == 25.0
    assert int(gs.numpy()) == 25


async def test_max_steps_is_absolute() -> None:
    """max_steps counts from the global step the session starts at (a resumed run)."""
    gs = tf.Variable(15, dtype=tf.int64)
    sv = quiet_supervisor(global_step=gs)
    async with sv.managed_session() as sess:
        assert sess.global_step == 15
        assert await sess.run_loop(lambda: None, max_steps=20) == 5
    assert int(gs.numpy()) == 20


@pytest.mark.parametrize(
    "make_data",
    [
        lambda: [1, 2, 3, 4],
        lambda: (x for x in [1, 2, 3, 4]),
        lambda: tf.data.Dataset.range(1, 5),
    ],
    ids=["list", "generator", "dataset"],
)
async def test_end_of_data_is_a_clean_stop(make_data: Any, no_new_threads: None) -> None:
    """run_loop over finite data feeds each item to fn and ends cleanly at the end."""
    got: list[int] = []
    sv = quiet_supervisor()
    async with sv.managed_session() as sess:
        n = await sess.run_loop(lambda x: got.append(int(x)), data=make_data())
        assert n == 4
        assert sess.stop_reason == "end_of_data"
        await anyio.sleep(0)
        pytest.fail("the body goes on after the session stopped")
    assert got == [1, 2, 3, 4]


@pytest.mark.parametrize("error", [StopIteration, lambda: tf.errors.OutOfRangeError(None, None, "end")])
async def test_step_signalling_end_of_data_stops_cleanly(error: Any) -> None:
    """A step raising StopIteration or OutOfRangeError ends the session without an error."""
    calls = 0

    def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise error()

    sv = quiet_supervisor()
    async with sv.managed_session() as sess:
        await sess.run_loop(step)
    assert sv.status().stop_reason == "end_of_data"
    assert sv.global_step == 2


async def test_sess_run_end_of_data_stops_the_body() -> None:
    """sess.run of a step that hits the end of data cancels the rest of the body."""
    it = iter([1])
    sv = quiet_supervisor()
    async with sv.managed_session() as sess:
        await sess.run(lambda: next(it))
        await sess.run(lambda: next(it))
        pytest.fail("unreachable: the session stopped at the end of data")
    assert sv.status().stop_reason == "end_of_data"


async def test_step_error_surfaces_as_its_own_type(no_new_threads: None) -> None:
    """A step raising KeyError at step 7 makes managed_session() raise that KeyError."""
    error = KeyError("step seven")

    def step(x: int) -> None:
        if x == 7:
            raise error

    sv = quiet_supervisor()
    with pytest.raises(KeyError) as info:
        async with sv.managed_session() as sess:
            await sess.run_loop(step, data=range(1, 100))
    assert info.value is error
    assert sv.global_step == 6
    assert sv.status().stop_reason == "error:KeyError"


async def test_step_error_reaches_the_body_first() -> None:
    """The body sees the step's exception itself (catchable), and the session still ends."""
    sv = quiet_supervisor()
    caught = None
    with pytest.raises(ZeroDivisionError):
        async with sv.managed_session() as sess:
            try:
                await sess.run(lambda: 1 / 0)
            except ZeroDivisionError as exc:
                caught = exc
            assert sess.should_stop()
            await sess.run(lambda: None)  # the stopped session ends the body here
    assert isinstance(caught, ZeroDivisionError)


async def test_body_error_propagates_and_stops_services(no_new_threads: None) -> None:
    """An exception raised by the body itself comes out unchanged, services stopped."""
    sv = quiet_supervisor()
    sv.loop(3600, lambda: None)
    with pytest.raises(LookupError, match="body"):
        async with sv.managed_session():
            raise LookupError("body")
    assert set(sv.status().services.values()) <= {"stopped"}


async def test_looped_service_error_stops_within_one_step(no_new_threads: None) -> None:
    """A looped service raising ValueError ends the session with ValueError within one step."""
    stepping = threading.Event()
    failed_at: list[int] = []
    sv = quiet_supervisor()

    def failing_service() -> None:
        assert stepping.wait(WAIT)
        failed_at.append(sv.global_step)
        raise ValueError("service broke")

    def step() -> None:  # a step that takes a while, as real ones do
        stepping.set()
        time.sleep(0.002)

    sv.loop(60, failing_service)
    with pytest.raises(ValueError, match="service broke"):
        async with sv.managed_session() as sess:
            await sess.run_loop(step)
    assert sv.global_step <= failed_at[0] + 1
    assert (
        sv.status().stop_reason
        == "service:loop:test_looped_service_error_stops_within_one_step.<locals>.failing_service"
    )


async def test_async_service_error_propagates() -> None:
    """An async looped service that raises stops the session with its own exception."""
    sv = quiet_supervisor()

    async def broken() -> None:
        raise RuntimeError("async service broke")

    sv.loop(10, broken, name="broken")
    with pytest.raises(RuntimeError, match="async service broke"):
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda: None)
    assert sv.status().services["broken"] == "failed"


async def test_request_stop_from_a_plain_thread_ends_run_loop(no_new_threads: None) -> None:
    """request_stop() from a threading.Thread ends run_loop at the next step boundary."""
    started = threading.Event()
    sv = quiet_supervisor()

    def stopper() -> None:
        assert started.wait(WAIT)
        sv.request_stop()

    thread = threading.Thread(target=stopper)
    thread.start()
    async with sv.managed_session() as sess:
        assert await sess.run_loop(started.set) == sv.global_step  # returns its count
        await anyio.sleep(0)
        pytest.fail("after the stop, the body's next await is cancelled")
    thread.join()
    assert sv.status().stop_reason == "requested"
    assert sv.global_step >= 1


async def test_request_stop_from_the_step_thread() -> None:
    """A step may ask to stop; the loop ends right after that step."""
    sv = quiet_supervisor()

    def step() -> None:
        if sv.global_step == 4:
            sv.request_stop()

    async with sv.managed_session() as sess:
        await sess.run_loop(step)
    assert sv.global_step == 5


async def test_request_stop_with_an_error_raises_it() -> None:
    """request_stop(exc) ends the session and managed_session() raises exc."""
    sv = quiet_supervisor()
    with pytest.raises(OSError, match="disk gone"):
        async with sv.managed_session() as sess:
            sess.request_stop(OSError("disk gone"))
            await sess.run_loop(lambda: None)


async def test_outer_cancellation_is_a_graceful_stop(no_new_threads: None) -> None:
    """An anyio.move_on_after around the session ends it cleanly, as a stop request."""
    v = tf.Variable(0)
    sv = quiet_supervisor(state={"v": v})
    with anyio.move_on_after(0.5) as scope:
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda: v.assign_add(1))
    assert scope.cancelled_caught
    assert sv.status().stop_reason == "cancelled"
    assert int(v.numpy()) == sv.global_step > 0


async def test_step_in_flight_is_never_interrupted(no_new_threads: None) -> None:
    """A stop during a step lets the step finish; the loop ends at that boundary."""
    in_step = threading.Event()
    release = threading.Event()
    finished: list[int] = []
    sv = quiet_supervisor()

    def step() -> None:
        in_step.set()
        assert release.wait(WAIT)
        finished.append(1)

    async def stop_then_release() -> None:
        await anyio.to_thread.run_sync(in_step.wait, WAIT)
        sv.request_stop()
        release.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_then_release)
        async with sv.managed_session() as sess:
            await sess.run_loop(step)
    assert finished == [1]
    assert sv.global_step == 1


async def test_cancelling_run_loop_alone_keeps_the_session() -> None:
    """Cancelling a run_loop call from an inner scope ends that loop, not the session."""
    sv = quiet_supervisor()
    async with sv.managed_session() as sess:
        with anyio.move_on_after(0.2):
            await sess.run_loop(lambda: None)
        assert not sess.should_stop()
        before = sess.global_step
        await sess.run(lambda: None)
        assert sess.global_step == before + 1


async def test_event_loop_stays_responsive_during_steps() -> None:
    """While a step runs on the step thread, other tasks on the event loop keep running."""
    loop_ran = threading.Event()
    sv = quiet_supervisor()

    def step() -> None:
        assert loop_ran.wait(WAIT), "the event loop was blocked while a step ran"

    async def other_task() -> None:
        await anyio.sleep(0.01)
        loop_ran.set()

    async with sv.managed_session() as sess:
        async with anyio.create_task_group() as tg:
            tg.start_soon(other_task)
            await sess.run(step)


async def test_concurrent_errors_first_raised_others_noted() -> None:
    """With a service error and then a step error, the first is raised, the second noted."""
    sv = quiet_supervisor()
    stepping = threading.Event()

    def failing_service() -> None:
        assert stepping.wait(WAIT)
        raise KeyError("first")

    def step() -> None:
        stepping.set()
        deadline = threading.Event()
        for _ in range(int(WAIT * 1000)):
            if sv.should_stop():
                break
            deadline.wait(0.001)
        raise ValueError("second")

    sv.loop(60, failing_service, name="failing")
    with pytest.raises(KeyError) as info:
        async with sv.managed_session() as sess:
            await sess.run_loop(step)
    notes = getattr(info.value, "__notes__", [])
    assert any("ValueError('second')" in note for note in notes), notes


async def test_run_after_stop_is_refused() -> None:
    """A stopped session refuses to run more steps (outside the cancelled body)."""
    sv = quiet_supervisor()
    async with sv.managed_session() as sess:
        pass
    with pytest.raises(RuntimeError, match="stopped"):
        await sess.run(lambda: None)


async def test_one_session_at_a_time() -> None:
    """A supervisor refuses a second concurrent managed session, then allows a new one."""
    sv = quiet_supervisor()
    async with sv.managed_session():
        with pytest.raises(RuntimeError, match="already has a running"):
            sv.managed_session()
    async with sv.managed_session() as sess:
        await sess.run(lambda: None)


async def test_init_local_init_and_ready_fn_order() -> None:
    """init_fn (nothing restored), then local_init_fn, then ready_fn, all on the step thread."""
    calls: list[tuple[str, int]] = []
    sv = quiet_supervisor(
        init_fn=lambda: calls.append(("init", threading.get_ident())),
        local_init_fn=lambda: calls.append(("local_init", threading.get_ident())),
        ready_fn=lambda: calls.append(("ready", threading.get_ident())) or [],
    )
    step_thread: list[int] = []
    async with sv.managed_session() as sess:
        await sess.run(lambda: step_thread.append(threading.get_ident()))
    assert [name for name, _ in calls] == ["init", "local_init", "ready"]
    assert {ident for _, ident in calls} == set(step_thread)


async def test_after_a_restore_local_init_fn_runs_and_init_fn_does_not(tmp_path: Any) -> None:
    """Restored state: init_fn is skipped, local_init_fn and ready_fn run and see the restored values."""
    v = tf.Variable(0.0)
    sv = asv.Supervisor(tmp_path, state={"v": v}, save_summaries_secs=0, handle_signals=False)
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: v.assign_add(1.0), max_steps=2)  # final checkpoint at step 2
    v2 = tf.Variable(0.0)
    calls: list[tuple[str, float]] = []
    sv = asv.Supervisor(
        tmp_path,
        state={"v": v2},
        init_fn=lambda: calls.append(("init", float(v2.numpy()))),
        local_init_fn=lambda: calls.append(("local_init", float(v2.numpy()))),
        ready_fn=lambda: calls.append(("ready", float(v2.numpy()))) or [],
        save_summaries_secs=0,
        handle_signals=False,
    )
    async with sv.managed_session() as sess:
        assert sess.global_step == 2
    assert calls == [("local_init", 2.0), ("ready", 2.0)]


async def test_not_ready_fails_start_up(no_new_threads: None) -> None:
    """A ready_fn naming what is not ready fails start-up with a RuntimeError naming it."""
    sv = quiet_supervisor(ready_fn=lambda: ["embedding_table"])
    with pytest.raises(RuntimeError, match="embedding_table"):
        async with sv.managed_session():
            pytest.fail("the body must not run")


async def test_global_step_variable_joins_a_checkpoint_state() -> None:
    """Without a global_step argument, one is created and attached to the state checkpoint."""
    model_var = tf.Variable(1.0)
    ckpt = tf.train.Checkpoint(w=model_var)
    sv = quiet_supervisor(state=ckpt)
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: None, max_steps=3)
    assert isinstance(ckpt.global_step, tf.Variable)
    assert int(ckpt.global_step.numpy()) == 3


async def test_status_is_a_frozen_snapshot() -> None:
    """status() reports step, services and stop reason, and cannot be modified."""
    sv = quiet_supervisor(save_summaries_secs=30)
    assert sv.status().running is False
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: None, max_steps=2)
        status = sv.status()
        assert status.global_step == 2
        assert status.services["step_counter"] in {"starting", "running"}
    with pytest.raises(AttributeError):
        status.global_step = 5  # type: ignore[misc]
    assert sv.status().stop_reason == "max_steps"
    assert sv.status().running is False
