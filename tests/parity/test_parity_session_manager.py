"""Parity: TensorFlow's ``tensorflow/python/training/session_manager_test.py`` on asupervisor.

Each test names the TF case it ports. TF1's graph ops map to functions: ``init_op`` and
``init_fn`` to ``init_fn``, ``local_init_op`` to ``local_init_fn``, ``ready_op`` (the names
of uninitialised variables) to ``ready_fn`` and ``ready_for_local_init_op`` to
``ready_for_local_init_fn``. Eager variables are never uninitialised, so "initialised"
is tracked by the functions that set them (``Model.initialised``). Cases without meaning
in TF2 are listed in ``README.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor.testing import ManualClock

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_new_threads")]


class Model:
    """A global variable ``v`` (checkpointed) and local variables ``w``, ``x`` (not
    checkpointed, set from ``v`` by ``local_init``), with the set of what is initialised."""

    def __init__(self, v: float = 0.0) -> None:
        self.v = tf.Variable(v, name="v")
        self.w = tf.Variable(0.0, name="w")
        self.x = tf.Variable(0.0, name="x")
        self.initialised: set[str] = set()
        self.local_inits = 0
        self.state: dict[str, Any] = {"v": self.v}

    def init(self, value: float = 1.0) -> None:
        self.v.assign(value)
        self.initialised.add("v")

    def restored(self) -> None:
        self.initialised.add("v")

    def local_init(self) -> None:
        self.local_inits += 1
        self.w.assign(self.v)
        self.x.assign(3 * self.v)
        self.initialised |= {"w", "x"}

    def not_ready(self, *names: str) -> list[str]:
        """The names among ``names`` (all by default) not initialised (TF's
        ``report_uninitialized_variables``)."""
        return [n for n in (names or ("v", "w", "x")) if n not in self.initialised]


def save_checkpoint(logdir: Path, v: float) -> str:
    """A checkpoint of ``v`` written by plain TensorFlow (``saver.save`` in the TF test)."""
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(v)), str(logdir), max_to_keep=None)
    return str(manager.save())


def tracking_restore(model: Model) -> Any:
    """A ``tf.train.Checkpoint`` of ``model`` that marks ``v`` initialised once restored."""

    class Ckpt(tf.train.Checkpoint):  # type: ignore[misc]
        def restore(self, *args: Any, **kwargs: Any) -> Any:
            status = super().restore(*args, **kwargs)
            model.restored()
            return status

    return Ckpt(v=model.v)


async def test_prepare_session_succeeds() -> None:
    """session_manager_test.py::SessionManagerTest::testPrepareSessionSucceeds —
    with nothing to restore, prepare_session runs the initialiser (here: the variables'
    own initial values count as initialised, as global_variables_initializer) and the
    model is ready."""
    m = Model(5.0)
    sm = asv.SessionManager(state=m.state, ready_fn=lambda: m.not_ready("v"))
    assert await sm.prepare_session(init_fn=lambda: m.initialised.add("v")) is m.state
    assert float(m.v) == 5.0


async def test_prepare_session_succeeds_with_init_fn() -> None:
    """session_manager_test.py::SessionManagerTest::testPrepareSessionSucceedsWithInitFn —
    init_fn alone initialises the model."""
    m = Model()
    sm = asv.SessionManager(state=m.state, ready_fn=lambda: m.not_ready("v"))
    await sm.prepare_session(init_fn=lambda: m.init(125.0))
    assert float(m.v) == 125.0


async def test_prepare_session_succeeds_with_local_init_only() -> None:
    """session_manager_test.py::SessionManagerTest::testPrepareSessionSucceedsWithLocalInitFeedDict —
    a local_init_fn alone (no init_fn, nothing to restore) is enough to prepare a session
    and sets the local values (the feed dict becomes the function's closure)."""
    m = Model(2.0)
    sm = asv.SessionManager(state=m.state, local_init_fn=m.local_init, ready_fn=lambda: m.not_ready("w"))
    await sm.prepare_session()
    assert (float(m.w), float(m.x)) == (2.0, 6.0)


async def test_prepare_session_fails_then_restores_when_a_checkpoint_appears(tmp_path: Path) -> None:
    """session_manager_test.py::SessionManagerTest::testPrepareSessionFails —
    waiting for a checkpoint that never comes, with nothing to initialise with, is a
    RuntimeError after max_wait_secs; once the checkpoint directory holds one, the same
    call restores it without waiting."""
    ckpt_dir = tmp_path / "prepare_session"
    ckpt_dir.mkdir()
    clock = ManualClock()
    m = Model(6.0)
    sm = asv.SessionManager(state=m.state, recovery_wait_secs=1, clock=clock)
    async with anyio.create_task_group() as tg:
        tg.start_soon(clock.advance_on_sleep, 1)
        with pytest.raises(RuntimeError, match="nothing to initialise"):
            await sm.prepare_session(ckpt_dir, wait_for_checkpoint=True, max_wait_secs=2)
        tg.cancel_scope.cancel()
    assert clock.now() == 2  # it waited the whole max_wait_secs
    save_checkpoint(ckpt_dir, 1.0)
    await sm.prepare_session(ckpt_dir, wait_for_checkpoint=True, max_wait_secs=2)
    assert float(m.v) == 1.0
    assert clock.now() == 2


async def test_recover_session(tmp_path: Path) -> None:
    """session_manager_test.py::SessionManagerTest::testRecoverSession —
    recover_session returns False with no checkpoint; after one is saved, a fresh model
    recovers it from the directory or from the file path; both at once is a ValueError."""
    m = Model()
    assert await asv.SessionManager(state=m.state).recover_session(tmp_path) is False
    path = save_checkpoint(tmp_path, 1.0)
    for kwargs in (
        {"checkpoint_dir": tmp_path},
        {"checkpoint_filename_with_path": tf.train.latest_checkpoint(str(tmp_path))},
    ):
        m2 = Model(2.0)
        assert await asv.SessionManager(state=m2.state).recover_session(**kwargs) is True
        assert float(m2.v) == 1.0
    with pytest.raises(ValueError):
        await asv.SessionManager(state=Model().state).recover_session(tmp_path, checkpoint_filename_with_path=path)


async def test_wait_for_session_times_out(tmp_path: Path) -> None:
    """session_manager_test.py::SessionManagerTest::testWaitForSessionReturnsNoneAfterTimeout —
    with recovery_wait_secs=1 and max_wait_secs=3 and no checkpoint ever,
    wait_for_session raises DeadlineExceededError (asv's, also a TimeoutError) after
    trying a few times."""
    clock = ManualClock()
    sm = asv.SessionManager(state=Model().state, recovery_wait_secs=1, clock=clock)
    async with anyio.create_task_group() as tg:
        tg.start_soon(clock.advance_on_sleep, 1)
        with pytest.raises(asv.DeadlineExceededError) as info:
            await sm.wait_for_session(tmp_path, max_wait_secs=3)
        tg.cancel_scope.cancel()
    assert isinstance(info.value, TimeoutError)
    assert clock.now() == 3


async def test_ready_for_local_init_fn_without_local_init_fn_is_an_error() -> None:
    """session_manager_test.py::SessionManagerTest::testInitWithNoneLocalInitOpError —
    a ready_for_local_init_fn without a local_init_fn is a ValueError."""
    m = Model()
    with pytest.raises(ValueError, match="local_init_fn"):
        asv.SessionManager(state=m.state, ready_for_local_init_fn=lambda: m.not_ready("v"), local_init_fn=None)


async def test_recover_session_with_ready_for_local_init(tmp_path: Path) -> None:
    """session_manager_test.py::SessionManagerTest::testRecoverSessionWithReadyForLocalInitOp —
    after a restore makes the global variable ready, local_init_fn runs (w takes v's
    restored value) and recover_session returns True."""
    save_checkpoint(tmp_path, 1.0)
    m = Model(2.0)
    sm = asv.SessionManager(
        state=tracking_restore(m),
        ready_fn=m.not_ready,
        ready_for_local_init_fn=lambda: m.not_ready("v"),
        local_init_fn=m.local_init,
    )
    assert await sm.recover_session(tmp_path) is True
    assert (float(m.v), float(m.w)) == (1.0, 1.0)
    assert m.local_inits == 1


async def test_recover_session_not_ready_for_local_init(tmp_path: Path) -> None:
    """session_manager_test.py::SessionManagerTest::testRecoverSessionWithReadyForLocalInitOpFailsToReadyLocal —
    a ready_for_local_init_fn that still reports something (here the local w itself)
    keeps local_init_fn from running: the global is restored, w is not set, and
    recover_session returns False."""
    save_checkpoint(tmp_path, 1.0)
    m = Model(2.0)
    sm = asv.SessionManager(
        state=tracking_restore(m), ready_fn=m.not_ready, ready_for_local_init_fn=m.not_ready, local_init_fn=m.local_init
    )
    assert await sm.recover_session(tmp_path) is False
    assert float(m.v) == 1.0
    assert m.local_inits == 0 and "w" not in m.initialised


async def test_recover_session_without_checkpoint_still_runs_local_init() -> None:
    """session_manager_test.py::SessionManagerTest::testRecoverSessionNoChkptStillRunsLocalInitOp —
    recover_session with no checkpoint directory returns False but runs local_init_fn,
    exactly once."""
    m = Model(1.0)
    sm = asv.SessionManager(state=m.state, ready_fn=m.not_ready, local_init_fn=m.local_init)
    assert await sm.recover_session(None) is False
    assert float(m.w) == 1.0
    assert m.local_inits == 1


async def test_recover_session_that_finds_nothing_still_runs_local_init(tmp_path: Path) -> None:
    """session_manager_test.py::SessionManagerTest::testRecoverSessionFailsStillRunsLocalInitOp —
    recover_session from an empty directory (not waiting) returns False, leaves the
    global variable as it was, and runs local_init_fn exactly once."""
    m = Model(2.0)
    m.w.assign(7.0)
    sm = asv.SessionManager(state=tracking_restore(m), ready_fn=m.not_ready, local_init_fn=m.local_init)
    assert await sm.recover_session(tmp_path, wait_for_checkpoint=False) is False
    assert float(m.v) == 2.0 and "v" not in m.initialised
    assert float(m.w) == 2.0
    assert m.local_inits == 1


async def test_wait_for_session_then_local_init(tmp_path: Path) -> None:
    """session_manager_test.py::SessionManagerTest::testWaitForSessionLocalInit —
    a worker waits until the chief has made the global variable ready, then runs its
    local_init_fn (w from v). DESIGN differs: the chief's state arrives as its first
    checkpoint in the directory (written here while the worker waits), not through a
    shared tf.train.Server."""
    clock = ManualClock()
    m = Model(0.0)
    sm = asv.SessionManager(
        state=tracking_restore(m),
        ready_fn=m.not_ready,
        ready_for_local_init_fn=lambda: m.not_ready("v"),
        local_init_fn=m.local_init,
        recovery_wait_secs=1,
        clock=clock,
    )

    async def chief() -> None:
        await clock.wait_for_sleepers(1)
        await anyio.to_thread.run_sync(save_checkpoint, tmp_path, 1.0)
        clock.advance(1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(chief)
        assert await sm.wait_for_session(tmp_path, max_wait_secs=3) is sm.state
    assert (float(m.v), float(m.w)) == (1.0, 1.0)
    assert m.local_inits == 1


async def test_wait_for_session_not_ready_for_local_init_times_out(tmp_path: Path) -> None:
    """session_manager_test.py::SessionManagerTest::testWaitForSessionWithReadyForLocalInitOpFailsToReadyLocal —
    an over-restrictive ready_for_local_init_fn (reporting the local variable itself)
    never lets local_init_fn run, so even with a checkpoint to restore wait_for_session
    raises DeadlineExceededError."""
    save_checkpoint(tmp_path, 1.0)
    clock = ManualClock()
    m = Model()
    sm = asv.SessionManager(
        state=tracking_restore(m),
        ready_fn=m.not_ready,
        ready_for_local_init_fn=m.not_ready,
        local_init_fn=m.local_init,
        recovery_wait_secs=1,
        clock=clock,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(clock.advance_on_sleep, 1)
        with pytest.raises(asv.DeadlineExceededError):
            await sm.wait_for_session(tmp_path, max_wait_secs=3)
        tg.cancel_scope.cancel()
    assert m.local_inits == 0


async def test_wait_for_session_without_ready_for_local_init_check_times_out(tmp_path: Path) -> None:
    """session_manager_test.py::SessionManagerTest::testWaitForSessionInsufficientReadyForLocalInitCheck —
    with local_init_fn but no ready_for_local_init_fn and nothing ever restored, the
    model never becomes ready: wait_for_session raises DeadlineExceededError (local
    init alone does not make a worker ready)."""
    clock = ManualClock()
    m = Model()
    sm = asv.SessionManager(
        state=tracking_restore(m), ready_fn=m.not_ready, local_init_fn=m.local_init, recovery_wait_secs=1, clock=clock
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(clock.advance_on_sleep, 1)
        with pytest.raises(asv.DeadlineExceededError):
            await sm.wait_for_session(tmp_path, max_wait_secs=3)
        tg.cancel_scope.cancel()
    assert "v" not in m.initialised


async def test_prepare_session_with_ready_for_local_init() -> None:
    """session_manager_test.py::SessionManagerTest::testPrepareSessionWithReadyForLocalInitOp —
    init_fn makes v ready, which lets local_init_fn run: w == v and x == 3 * v."""
    m = Model()
    sm = asv.SessionManager(
        state=m.state,
        ready_fn=m.not_ready,
        ready_for_local_init_fn=lambda: m.not_ready("v"),
        local_init_fn=m.local_init,
    )
    await sm.prepare_session(init_fn=m.init)
    assert (float(m.v), float(m.w), float(m.x)) == (1.0, 1.0, 3.0)
    assert m.initialised == {"v", "w", "x"}


async def test_prepare_session_with_local_init_only_leaves_globals_alone() -> None:
    """session_manager_test.py::SessionManagerTest::testPrepareSessionWithPartialInitOp —
    with only a local_init_fn (no init_fn, no ready checks), prepare_session runs it and
    does not initialise the global variables."""
    m = Model(1.0)
    sm = asv.SessionManager(state=m.state, local_init_fn=m.local_init)
    await sm.prepare_session(init_fn=None)
    assert "v" not in m.initialised
    assert (float(m.w), float(m.x)) == (1.0, 3.0)


async def test_prepare_session_did_not_init_local_variable() -> None:
    """session_manager_test.py::SessionManagerTest::testPrepareSessionDidNotInitLocalVariable —
    an init_fn that leaves the local variable uninitialised fails the ready_fn check:
    RuntimeError naming it."""
    m = Model()
    sm = asv.SessionManager(state=m.state, ready_fn=m.not_ready)
    with pytest.raises(RuntimeError, match=r"not ready.*w"):
        await sm.prepare_session(init_fn=m.init)


async def test_prepare_session_not_ready_for_local_init() -> None:
    """session_manager_test.py::SessionManagerTest::testPrepareSessionWithReadyNotReadyForLocal —
    no init_fn, so v stays uninitialised and ready_for_local_init_fn reports it: a
    RuntimeError about local init, and local_init_fn does not run."""
    m = Model()
    sm = asv.SessionManager(
        state=m.state,
        ready_fn=m.not_ready,
        ready_for_local_init_fn=lambda: m.not_ready("v"),
        local_init_fn=m.local_init,
    )
    with pytest.raises(RuntimeError, match=r"local_init.*v"):
        await sm.prepare_session(init_fn=None)
    assert m.local_inits == 0


async def test_prepare_session_without_ready_for_local_init_check() -> None:
    """session_manager_test.py::SessionManagerTest::testPrepareSessionWithInsufficientReadyForLocalInitCheck —
    with no ready_for_local_init_fn, local_init_fn runs over an uninitialised v, and
    the ready_fn check then fails: RuntimeError naming v."""
    m = Model()
    sm = asv.SessionManager(state=m.state, ready_fn=m.not_ready, local_init_fn=m.local_init)
    with pytest.raises(RuntimeError, match=r"not ready.*v"):
        await sm.prepare_session(init_fn=None)
    assert m.local_inits == 1
