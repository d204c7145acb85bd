"""Looped services and failure policies, on an injectable clock (no wall time spent)."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _timing import scaled

import asupervisor as asv
from asupervisor.testing import ManualClock, capture_logs

pytestmark = pytest.mark.anyio


def supervisor(clock: ManualClock, **kwargs: Any) -> asv.Supervisor:
    kwargs.setdefault("save_summaries_secs", 0)
    return asv.Supervisor(None, handle_signals=False, clock=clock, **kwargs)


async def settle() -> None:
    """Let every task on the loop run until all are blocked again."""
    await anyio.wait_all_tasks_blocked()


async def test_async_target_runs_at_start_then_every_interval() -> None:
    """An async target is awaited on the loop at start, then at each 600 s tick."""
    clock = ManualClock()
    calls: list[tuple[float, int]] = []
    loop_thread = threading.get_ident()

    async def target(tag: str, *, times: int) -> None:
        calls.append((clock.now(), threading.get_ident()))
        assert tag == "x" and times == 2

    sv = supervisor(clock)
    sv.loop(600, target, args=("x",), kwargs={"times": 2})
    async with sv.managed_session():
        await settle()
        assert [t for t, _ in calls] == [0.0]
        clock.advance(599)
        await settle()
        assert len(calls) == 1
        clock.advance(1)
        await settle()
        clock.advance(600)
        await settle()
    assert [t for t, _ in calls] == [0.0, 600.0, 1200.0]
    assert {ident for _, ident in calls} == {loop_thread}


async def test_sync_target_runs_on_its_own_thread(no_new_threads: None) -> None:
    """A sync target runs on a dedicated thread (never the loop's), joined at the end."""
    clock = ManualClock()
    ran = threading.Event()
    threads: list[str] = []

    def target() -> None:
        threads.append(threading.current_thread().name)
        ran.set()

    sv = supervisor(clock)
    sv.loop(10, target, name="sync-target")
    async with sv.managed_session():
        await anyio.to_thread.run_sync(ran.wait, 30)
    assert threads and threads[0] == "asv-sync-target"
    assert threading.current_thread().name not in threads


async def test_missed_ticks_are_skipped_not_burst() -> None:
    """A clock jump over several intervals makes one call, not one per missed tick."""
    clock = ManualClock()
    calls: list[float] = []

    async def target() -> None:
        calls.append(clock.now())

    sv = supervisor(clock)
    sv.loop(10, target)
    async with sv.managed_session():
        await settle()
        clock.advance(35)
        await settle()
        clock.advance(5)  # the next tick is at 40, phase kept
        await settle()
    assert calls == [0.0, 35.0, 40.0]


async def test_restart_policy_restarts_then_escalates() -> None:
    """A service failing within its restart budget is restarted; one more failure escalates."""
    clock = ManualClock()
    attempts: list[float] = []

    async def flaky() -> None:
        attempts.append(clock.now())
        raise ConnectionError(f"attempt {len(attempts)}")

    policy = asv.RestartPolicy(max_restarts=2, window_secs=100, backoff_secs=1, max_backoff_secs=10)
    sv = supervisor(clock)
    sv.loop(50, flaky, name="flaky", restart=policy)
    with pytest.raises(asv.ServiceError, match="flaky") as info:
        async with sv.managed_session():
            await settle()
            assert sv.status().services["flaky"] == "backoff"
            clock.advance(1)  # first backoff: 1 s
            await settle()
            assert not sv.should_stop()
            clock.advance(2)  # second backoff doubles
            await settle()
            await anyio.sleep_forever()
    assert attempts == [0.0, 1.0, 3.0]
    assert isinstance(info.value.__cause__, ConnectionError)
    assert sv.status().services["flaky"] == "failed"


async def test_failures_outside_the_window_are_forgotten() -> None:
    """Failures older than window_secs do not count towards max_restarts."""
    clock = ManualClock()
    attempts = 0

    async def fails_each_time() -> None:
        nonlocal attempts
        attempts += 1
        raise ConnectionError("again")

    policy = asv.RestartPolicy(max_restarts=1, window_secs=10, backoff_secs=20)
    sv = supervisor(clock)
    sv.loop(1000, fails_each_time, restart=policy)
    async with sv.managed_session() as sess:
        for _ in range(4):
            await settle()
            clock.advance(20)
        await settle()
        assert not sess.should_stop()
    assert attempts == 5


async def test_custom_service_reports_ready_before_the_body() -> None:
    """A Service subclass's start-up finishes (task_status.started) before the body runs."""
    order: list[str] = []

    class Warmup(asv.Service):
        name = "warmup"

        async def run(self, ctx: asv.ServiceContext, *, task_status: Any) -> None:
            await anyio.lowlevel.checkpoint()
            order.append("ready")
            task_status.started()
            await anyio.sleep_forever()

    sv = supervisor(ManualClock())
    sv.add_service(Warmup())
    async with sv.managed_session():
        order.append("body")
    assert order == ["ready", "body"]
    with pytest.raises(ValueError, match="already registered"):
        sv.add_service(Warmup())


async def test_service_failing_before_ready_fails_start_up(no_new_threads: None) -> None:
    """A service that raises before reporting ready makes managed_session() raise it."""

    class Broken(asv.Service):
        name = "broken"

        async def run(self, ctx: asv.ServiceContext, *, task_status: Any) -> None:
            raise PermissionError("no access")

    sv = supervisor(ManualClock())
    sv.add_service(Broken())
    with pytest.raises(PermissionError):
        async with sv.managed_session():
            await anyio.sleep_forever()


async def test_stuck_sync_service_is_bounded_by_stop_grace(no_new_threads: None) -> None:
    """A sync target that ignores the stop delays shutdown at most about stop_grace_secs;
    its thread is abandoned, the idle step thread is not (it is told to stop before the
    stuck thread's join uses up what is left of the deadline)."""
    release = threading.Event()
    entered = threading.Event()

    def stuck() -> None:
        entered.set()
        release.wait(scaled(30))

    sv = asv.Supervisor(None, handle_signals=False, save_summaries_secs=0, stop_grace_secs=0.2)
    sv.loop(1000, stuck, name="stuck")
    start = anyio.current_time()
    with capture_logs() as events:
        async with sv.managed_session():
            await anyio.to_thread.run_sync(entered.wait, 30)
    elapsed = anyio.current_time() - start
    abandoned = {e["thread"] for e in events if e["event"] == "thread.abandoned"}
    assert "asv-stuck" in abandoned and "asv-step" not in abandoned
    release.set()  # let the abandoned call finish so the thread can end
    for thread in threading.enumerate():
        if thread.name == "asv-stuck":
            thread.join(scaled(30))
    assert elapsed < 20


def test_loop_rejects_bad_intervals() -> None:
    """sv.loop names the bad interval in a ValueError/TypeError."""
    sv = asv.Supervisor(None)
    with pytest.raises(ValueError, match="-1"):
        sv.loop(-1, print)
    with pytest.raises(ValueError, match="interval_secs"):
        sv.loop(0, print)
    with pytest.raises(TypeError, match="interval_secs"):
        sv.loop("10", print)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        sv.loop(10, "print")  # type: ignore[arg-type]


def test_restart_policy_validates() -> None:
    """RestartPolicy names the bad field."""
    with pytest.raises(ValueError, match="max_restarts"):
        asv.RestartPolicy(max_restarts=-1)
    with pytest.raises(ValueError, match="window_secs"):
        asv.RestartPolicy(window_secs=-5)
