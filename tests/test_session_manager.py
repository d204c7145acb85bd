"""SessionManager: prepare/recover/wait_for_session, waiting on a manual clock, bad input."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor.testing import ManualClock

pytestmark = pytest.mark.usefixtures("no_new_threads")


def make_state(value: float = 0.0) -> dict[str, Any]:
    return {"w": tf.Variable(tf.fill([3], value), name="w")}


async def tick(clock: ManualClock, secs: float) -> None:
    """Once a task sleeps on ``clock``, move time by ``secs`` and let the sleeper wake up."""
    await clock.wait_for_sleepers(1)
    clock.advance(secs)
    while clock.sleepers:
        await anyio.sleep(0)


def write_checkpoint(logdir: Path, value: float, step: int = 5) -> str:
    """A checkpoint written by plain TensorFlow's CheckpointManager."""
    ckpt = tf.train.Checkpoint(**make_state(value))
    manager = tf.train.CheckpointManager(ckpt, str(logdir), max_to_keep=3)
    return str(manager.save(checkpoint_number=step))


@pytest.mark.anyio
async def test_prepare_session_restores_latest(tmp_path: Path) -> None:
    """prepare_session restores the newest checkpoint and runs local_init_fn, not init_fn."""
    write_checkpoint(tmp_path, 3.0)
    state = make_state()
    calls: list[str] = []
    sm = asv.SessionManager(state=state, local_init_fn=lambda: calls.append("local"))
    result = await sm.prepare_session(tmp_path, init_fn=lambda: calls.append("init"))
    assert result is state
    assert float(state["w"][0]) == 3.0
    assert calls == ["local"]


@pytest.mark.anyio
async def test_prepare_session_inits_when_nothing_to_restore(tmp_path: Path) -> None:
    """With no checkpoint, init_fn runs, then local_init_fn."""
    state = make_state()
    calls: list[str] = []
    sm = asv.SessionManager(state=state, local_init_fn=lambda: calls.append("local"))
    await sm.prepare_session(tmp_path, init_fn=lambda: calls.append("init"))
    assert calls == ["init", "local"]


@pytest.mark.anyio
async def test_prepare_session_restores_a_given_file(tmp_path: Path) -> None:
    """checkpoint_filename_with_path restores exactly that checkpoint."""
    path = write_checkpoint(tmp_path / "a", 4.0)
    write_checkpoint(tmp_path / "a", 9.0, step=6)
    state = make_state()
    await asv.SessionManager(state=state).prepare_session(checkpoint_filename_with_path=path)
    assert float(state["w"][0]) == 4.0


@pytest.mark.anyio
async def test_prepare_session_bad_arguments(tmp_path: Path) -> None:
    """Both a dir and a file is a ValueError (prepare and recover); nothing to restore or
    init is a RuntimeError."""
    sm = asv.SessionManager(state=make_state())
    with pytest.raises(ValueError, match="not both"):
        await sm.prepare_session(tmp_path, checkpoint_filename_with_path=str(tmp_path / "x"))
    with pytest.raises(RuntimeError, match="nothing to initialise"):
        await sm.prepare_session(tmp_path)
    with pytest.raises(ValueError, match="max_wait_secs"):
        await sm.prepare_session(tmp_path, max_wait_secs=-1, init_fn=lambda: None)
    with pytest.raises(ValueError, match="not both"):
        await sm.recover_session(tmp_path, checkpoint_filename_with_path=str(tmp_path / "x"))


@pytest.mark.anyio
async def test_prepare_session_unreadable_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    """A checkpoint_filename_with_path that is missing or damaged is a CheckpointError naming it."""
    sm = asv.SessionManager(state=make_state())
    missing = str(tmp_path / "nope-3")
    with pytest.raises(asv.CheckpointError, match="nope-3"):
        await sm.prepare_session(checkpoint_filename_with_path=missing, init_fn=lambda: None)
    path = write_checkpoint(tmp_path, 1.0)
    data = Path(path + ".data-00000-of-00001")
    os.truncate(data, data.stat().st_size - 8)
    with pytest.raises(asv.CheckpointError, match="cannot be restored"):
        await sm.prepare_session(checkpoint_filename_with_path=path)


@pytest.mark.anyio
async def test_prepare_session_not_ready_is_a_runtime_error(tmp_path: Path) -> None:
    """A ready_fn that names something is a RuntimeError naming it."""
    sm = asv.SessionManager(state=make_state(), ready_fn=lambda: ["embedding_table"])
    with pytest.raises(RuntimeError, match="embedding_table"):
        await sm.prepare_session(tmp_path, init_fn=lambda: None)
    sm = asv.SessionManager(state=make_state(), local_init_fn=lambda: None, ready_for_local_init_fn=lambda: ["vocab"])
    with pytest.raises(RuntimeError, match="vocab"):
        await sm.prepare_session(tmp_path, init_fn=lambda: None)


@pytest.mark.anyio
async def test_prepare_session_waits_for_a_checkpoint_written_later(tmp_path: Path) -> None:
    """wait_for_checkpoint polls every recovery_wait_secs until another task writes one."""
    clock = ManualClock()
    state = make_state()
    sm = asv.SessionManager(state=state, recovery_wait_secs=30, clock=clock)
    inits: list[int] = []
    async with anyio.create_task_group() as tg:

        async def chief() -> None:
            await tick(clock, 30)
            await clock.wait_for_sleepers(1)
            write_checkpoint(tmp_path, 7.0)
            await tick(clock, 30)

        tg.start_soon(chief)
        await sm.prepare_session(tmp_path, wait_for_checkpoint=True, init_fn=lambda: inits.append(1))
    assert float(state["w"][0]) == 7.0 and inits == []
    assert clock.now() == 60


@pytest.mark.anyio
async def test_prepare_session_gives_up_waiting_and_inits(tmp_path: Path) -> None:
    """Once max_wait_secs pass without a checkpoint, prepare_session initialises (TF1 parity)."""
    clock = ManualClock()
    sm = asv.SessionManager(state=make_state(), recovery_wait_secs=30, clock=clock)
    inits: list[int] = []
    async with anyio.create_task_group() as tg:

        async def time_passes() -> None:
            for _ in range(3):
                await tick(clock, 30)

        tg.start_soon(time_passes)
        await sm.prepare_session(tmp_path, wait_for_checkpoint=True, max_wait_secs=75, init_fn=lambda: inits.append(1))
    assert inits == [1] and clock.now() == 90


@pytest.mark.anyio
async def test_recover_session_reports_whether_it_restored(tmp_path: Path) -> None:
    """recover_session never initialises: False without a checkpoint or when not ready."""
    state = make_state()
    assert await asv.SessionManager(state=state).recover_session(tmp_path) is False
    write_checkpoint(tmp_path, 2.0)
    assert await asv.SessionManager(state=state).recover_session(tmp_path) is True
    assert float(state["w"][0]) == 2.0
    not_ready = asv.SessionManager(state=state, ready_fn=lambda: ["w"])
    assert await not_ready.recover_session(tmp_path) is False


@pytest.mark.anyio
async def test_wait_for_session_restores_the_chiefs_first_checkpoint(tmp_path: Path) -> None:
    """A non-chief waits for a checkpoint that the chief (a Supervisor) writes later."""
    clock = ManualClock()
    worker_state = make_state()
    sm = asv.SessionManager(state=worker_state, recovery_wait_secs=10, clock=clock)

    async def chief() -> None:
        await clock.wait_for_sleepers(1)
        chief_state = make_state(5.0)
        sv = asv.Supervisor(tmp_path, state=chief_state, save_summaries_secs=0, handle_signals=False)
        async with sv.managed_session():
            await sv.save_now()
        await tick(clock, 10)

    async with anyio.create_task_group() as tg:
        tg.start_soon(chief)
        result = await sm.wait_for_session(tmp_path)
    assert result is worker_state and float(worker_state["w"][0]) == 5.0


@pytest.mark.anyio
async def test_wait_for_session_times_out(tmp_path: Path) -> None:
    """With no checkpoint before max_wait_secs, wait_for_session raises DeadlineExceededError."""
    clock = ManualClock()
    sm = asv.SessionManager(state=make_state(), recovery_wait_secs=10, clock=clock)
    async with anyio.create_task_group() as tg:

        async def time_passes() -> None:
            while True:
                await tick(clock, 10)

        tg.start_soon(time_passes)
        with pytest.raises(asv.DeadlineExceededError) as info:
            await sm.wait_for_session(tmp_path, max_wait_secs=25)
        tg.cancel_scope.cancel()
    assert isinstance(info.value, TimeoutError)
    assert clock.now() == 30  # checks at 0, 10, 20 and at the deadline (25)


def test_constructor_rejects_bad_values() -> None:
    """Bad constructor arguments are clear errors naming the value."""
    with pytest.raises(TypeError, match="state"):
        asv.SessionManager(state=42)
    with pytest.raises(ValueError, match="recovery_wait_secs"):
        asv.SessionManager(state=make_state(), recovery_wait_secs=0)
    with pytest.raises(TypeError, match="ready_fn"):
        asv.SessionManager(state=make_state(), ready_fn="yes")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_recover_session_runs_local_init_fn_once_even_without_a_restore(tmp_path: Path) -> None:
    """recover_session runs local_init_fn exactly once whether or not it restored (TF1's
    recover_session always runs local_init_op), gated by ready_for_local_init_fn."""
    calls: list[str] = []
    sm = asv.SessionManager(state=make_state(), local_init_fn=lambda: calls.append("local"))
    assert await sm.recover_session(tmp_path) is False
    assert calls == ["local"]
    assert await sm.recover_session() is False
    assert calls == ["local", "local"]
    write_checkpoint(tmp_path, 2.0)
    assert await sm.recover_session(tmp_path) is True
    assert calls == ["local"] * 3
    gated = asv.SessionManager(
        state=make_state(), local_init_fn=lambda: calls.append("gated"), ready_for_local_init_fn=lambda: ["w"]
    )
    assert await gated.recover_session(tmp_path / "empty") is False
    assert "gated" not in calls


def test_ready_for_local_init_fn_needs_local_init_fn() -> None:
    """ready_for_local_init_fn without local_init_fn is a ValueError naming both."""
    with pytest.raises(ValueError, match=r"ready_for_local_init_fn.*local_init_fn"):
        asv.SessionManager(state=make_state(), ready_for_local_init_fn=lambda: [])


@pytest.fixture
def caught_sigterm() -> Iterator[None]:
    """SIGTERM caught as a script's ``asv.catch_stop_signals()`` catches it; afterwards the
    handler before it is back and nothing is left pending."""
    from asupervisor._core._signals import _EARLY

    before = signal.getsignal(signal.SIGTERM)
    assert asv.catch_stop_signals(["SIGTERM"])
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
        _EARLY.previous.pop(signal.SIGTERM, None)
        _EARLY.take()


@pytest.mark.anyio
@pytest.mark.usefixtures("caught_sigterm")
@pytest.mark.parametrize("how", ["wait_for_session", "prepare_session"])
async def test_a_stop_signal_ends_a_wait_for_a_checkpoint(tmp_path: Path, how: str) -> None:
    """A SIGTERM while waiting for the chief's checkpoint ends the wait at once, on the
    clock's first sleep: StopRequestedError naming the signal, exit status 143, nothing
    restored or initialised; the signal stays pending for the next session."""
    from asupervisor._core._signals import pending_stop_signal

    clock = ManualClock()
    state = make_state(1.0)
    calls: list[str] = []
    sm = asv.SessionManager(state=state, recovery_wait_secs=30, clock=clock)

    async def signal_during_the_wait() -> None:
        await clock.wait_for_sleepers(1)
        signal.raise_signal(signal.SIGTERM)

    async with anyio.create_task_group() as tg:
        tg.start_soon(signal_during_the_wait)
        with pytest.raises(asv.StopRequestedError, match="SIGTERM came while waiting") as info:
            if how == "wait_for_session":
                await sm.wait_for_session(tmp_path)
            else:
                await sm.prepare_session(tmp_path, wait_for_checkpoint=True, init_fn=lambda: calls.append("init"))
    assert (info.value.signal, info.value.stop_reason, info.value.exit_status) == ("SIGTERM", "signal:SIGTERM", 143)
    assert clock.now() == 0 and calls == [] and float(state["w"][0]) == 1.0
    assert pending_stop_signal() == "SIGTERM"
    with pytest.raises(asv.StopRequestedError):  # a signal that came before a wait ends it too
        await sm.recover_session(tmp_path, wait_for_checkpoint=True)
