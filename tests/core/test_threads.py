"""The dedicated thread and the thread-to-loop hand-off."""

from __future__ import annotations

import threading

import anyio
import pytest
from _timing import scaled

from asupervisor._core._handoff import LoopHandle
from asupervisor._core._threads import DedicatedThread, ThreadClosedError

pytestmark = pytest.mark.anyio


async def test_jobs_run_in_order_on_one_thread(no_new_threads: None) -> None:
    """Submitted callables run FIFO on the same named thread; results come back."""
    thread = DedicatedThread("asv-test", LoopHandle())
    thread.start()
    order: list[int] = []
    idents: set[int] = set()

    def job(i: int) -> int:
        order.append(i)
        idents.add(threading.get_ident())
        return i * i

    waiters = [thread.submit(job, i) for i in range(20)]
    results = [await w.wait() for w in waiters]
    await thread.aclose()
    assert order == list(range(20))
    assert results == [i * i for i in range(20)]
    assert idents == {thread.ident}
    assert not thread.is_alive()


async def test_nowait_jobs_run_in_order_with_the_others(no_new_threads: None) -> None:
    """``submit_nowait`` jobs take their turn in the FIFO; nothing is handed back for them."""
    thread = DedicatedThread("asv-test", LoopHandle())
    thread.start()
    order: list[int] = []
    for i in range(5):
        thread.submit_nowait(order.append, i)
    await thread.call(order.append, 5)
    await thread.aclose()
    assert order == list(range(6))
    with pytest.raises(ThreadClosedError):
        thread.submit_nowait(order.append, 6)


async def test_errors_cross_the_hand_off_as_themselves() -> None:
    """An exception in a job is raised to the awaiting task unchanged."""
    thread = DedicatedThread("asv-test", LoopHandle())
    thread.start()
    error = ValueError("in the thread")

    def fail() -> None:
        raise error

    with pytest.raises(ValueError) as info:
        await thread.call(fail)
    assert info.value is error
    await thread.aclose()


async def test_boundary_jobs_jump_the_queue() -> None:
    """A boundary job runs before ordinary jobs queued earlier but not yet started."""
    thread = DedicatedThread("asv-test", LoopHandle())
    thread.start()
    gate, running = threading.Event(), threading.Event()
    order: list[str] = []
    first = thread.submit(lambda: (running.set(), gate.wait(scaled(10)), order.append("running")))
    queued = thread.submit(order.append, "queued")
    await anyio.to_thread.run_sync(running.wait, 10)
    boundary = thread.submit_at_boundary(order.append, "boundary")
    gate.set()
    await first.wait()
    await queued.wait()
    await boundary.wait()
    await thread.aclose()
    assert order == ["running", "boundary", "queued"]


async def test_cancelled_wait_lets_the_job_finish() -> None:
    """Cancelling the awaiting task does not abandon the job: the wait goes on, shielded."""
    thread = DedicatedThread("asv-test", LoopHandle())
    thread.start()
    started, release = threading.Event(), threading.Event()
    done: list[bool] = []
    halted: list[bool] = []

    def job() -> None:
        started.set()
        release.wait(scaled(10))
        done.append(True)

    async def release_soon() -> None:
        await anyio.to_thread.run_sync(started.wait, 10)
        scope.cancel()
        await anyio.sleep(0.05)
        release.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(release_soon)
        with anyio.CancelScope() as scope:
            await thread.submit(job).wait(lambda: halted.append(True))
    assert done == [True]
    assert halted == [True]
    await thread.aclose()


async def test_closed_thread_refuses_work() -> None:
    """Submitting to a closed thread raises ThreadClosedError."""
    thread = DedicatedThread("asv-test", LoopHandle())
    thread.start()
    await thread.aclose()
    with pytest.raises(ThreadClosedError, match="asv-test"):
        thread.submit(print)


async def test_loop_handle_runs_callbacks_from_other_threads() -> None:
    """call_from_any_thread runs inline on the loop thread and is scheduled from others."""
    handle = LoopHandle()
    assert handle.in_loop_thread()
    seen: list[int] = []
    handle.call_from_any_thread(lambda: seen.append(threading.get_ident()))
    assert seen == [threading.get_ident()]
    waiter = handle.waiter()
    threading.Thread(
        target=lambda: handle.call_from_any_thread(lambda: waiter.set_result(threading.get_ident()))
    ).start()
    assert await waiter.wait() == threading.get_ident()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_thread_abandoned_past_its_loop_ends_quietly(backend: str) -> None:
    """A dedicated thread stuck in a job when its session gave up on it (the stop grace)
    and its event loop ended: when the job returns at last, the thread exits without an
    error (nobody waits for it any more), instead of raising "Event loop is closed" /
    ``RunFinishedError`` into ``threading.excepthook``."""
    release = threading.Event()
    threads: list[DedicatedThread] = []

    async def main() -> None:
        thread = DedicatedThread("asv-test-abandoned", LoopHandle())
        thread.start()
        thread.submit(release.wait)  # its waiter is left behind too
        threads.append(thread)
        assert not await thread.aclose_within(0.05)  # abandoned, as a stop grace does

    errors: list[BaseException | None] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)
    try:
        anyio.run(main, backend=backend)
        release.set()
        threads[0]._thread.join(timeout=scaled(10))
    finally:
        threading.excepthook = previous
    assert not threads[0].is_alive()
    assert errors == []


_FRAMES_UNDER_COLLECTIONS = """
import gc, sys, threading
from asupervisor._core._threads import current_frames

stop = threading.Event()


def f(n):
    return n + 1


def spin():  # always in a fresh Python frame: the read makes its frame object, which allocates
    while not stop.is_set():
        for i in range(1000):
            f(i)


for _ in range(2):
    threading.Thread(target=spin, daemon=True).start()
sys.setswitchinterval(1e-5)
for i in range(20000):
    holder = type("Holder", (), {})()
    holder.local, holder.self = threading.local(), holder  # garbage holding a threading.local
    del holder
    gc.set_threshold(1)  # the read's first allocation starts a collection
    frames = current_frames()
    gc.set_threshold(700)
assert gc.isenabled()
print("read", i + 1, flush=True)
"""


def test_reading_the_threads_frames_while_garbage_holds_a_thread_local_does_not_deadlock() -> None:
    """The watchdog reads every thread's frame (``current_frames``) while steps run. On
    the CPython releases without gh-106883's fix (this machine's 3.11.7 among them), a
    garbage collection that starts inside ``sys._current_frames()`` and frees a
    ``threading.local`` deadlocks the process (a Keras training froze so in the suite,
    the watchdog's thread holding the GIL). Here every read is made to start such a
    collection, 20,000 times, beside threads running Python: they all complete."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _FRAMES_UNDER_COLLECTIONS], capture_output=True, text=True, timeout=scaled(60)
    )
    assert (proc.returncode, proc.stdout.split()) == (0, ["read", "20000"]), proc.stderr[-3000:]


def test_reading_the_threads_frames_puts_the_collector_back_as_it_was() -> None:
    """A program that turned the garbage collector off keeps it off; on stays on."""
    import gc

    from asupervisor._core._threads import current_frames

    was = gc.isenabled()
    try:
        gc.enable()
        assert threading.get_ident() in current_frames() and gc.isenabled()
        gc.disable()
        assert threading.get_ident() in current_frames() and not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
