"""Parity: TensorFlow's ``tensorflow/python/training/supervisor_test.py`` on asupervisor.

Each test names the TF case it ports. ``prepare_or_wait_for_session``/``stop`` and
``with sv.managed_session(...)`` map to ``async with sv.managed_session()``; TF1 ops to
Python functions run as steps; ``init_op`` to the variables' own initial values (eager
variables are created initialised) or ``init_fn``; ``summary_op`` results to
``sv.summary_computed`` mappings. Cases without meaning in TF2 are listed in
``README.md``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor.testing import ManualClock

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_new_threads")]

C123 = {"c1": 1.0, "c2": 2.0, "c3": 3.0}


def make_sv(logdir: Path | str | None, **kwargs: Any) -> asv.Supervisor:
    kwargs.setdefault("handle_signals", False)
    kwargs.setdefault("clock", ManualClock())
    kwargs.setdefault("save_summaries_secs", 0)
    return asv.Supervisor(logdir, **kwargs)


def event_files(logdir: Path) -> list[Path]:
    return sorted(logdir.glob("events.out.tfevents.*"))


def read_event_file(path: Path) -> list[Any]:
    """Every ``Event`` record of one event file, in order."""
    from tensorboard.compat.proto import event_pb2

    return [event_pb2.Event.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]


def summaries(path: Path) -> list[tuple[int, dict[str, float]]]:
    """The summary events of one event file: (step, {tag: scalar value})."""
    out = []
    for ev in read_event_file(path):
        if ev.HasField("summary"):
            values = {
                v.tag: float(tf.make_ndarray(v.tensor)) if v.HasField("tensor") else v.simple_value
                for v in ev.summary.value
            }
            out.append((ev.step, values))
    return out


def checkpoints(logdir: Path) -> list[str]:
    return sorted(p.name[: -len(".index")] for p in logdir.glob("*.index"))


async def tick(clock: ManualClock, secs: float, sleepers: int) -> None:
    """Move the clock once ``sleepers`` services sleep on it; return once they sleep again."""
    await clock.wait_for_sleepers(sleepers)
    clock.advance(secs)
    while clock.sleepers >= sleepers:
        await anyio.lowlevel.checkpoint()
    await clock.wait_for_sleepers(sleepers)


async def test_basics(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testBasics —
    a session runs ten steps and stops cleanly."""
    sv = make_sv(tmp_path)
    async with sv.managed_session() as sess:
        for _ in range(10):
            await sess.run(lambda: tf.constant(1.0))
    assert sv.global_step == 10
    assert sess.stop_reason == "completed"


async def test_managed_session(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testManagedSession —
    after the managed session's block ends, the supervisor reports should_stop()."""
    sv = make_sv(tmp_path)
    async with sv.managed_session() as sess:
        for _ in range(10):
            await sess.run(lambda: tf.constant(1.0))
        assert not sv.should_stop()
    assert sv.should_stop()


async def test_managed_session_user_error(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testManagedSessionUserError —
    an error raised in the body propagates out of managed_session as itself, and the
    supervisor is stopped."""
    sv = make_sv(tmp_path)
    last_step = None
    with pytest.raises(RuntimeError, match="failing here"):
        async with sv.managed_session() as sess:
            for step in range(10):
                last_step = step
                if step == 1:
                    raise RuntimeError("failing here")
                await sess.run(lambda: tf.constant(1.0))
    assert sv.should_stop()
    assert last_step == 1


async def test_managed_session_ignores_out_of_range_from_the_body(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testManagedSessionIgnoreOutOfRangeError —
    OutOfRangeError raised in the body (as the TF test does) ends the session cleanly:
    no error out of managed_session, the supervisor is stopped."""
    sv = make_sv(tmp_path)
    last_step = None
    async with sv.managed_session() as sess:
        for step in range(10):
            last_step = step
            if step == 3:
                raise tf.errors.OutOfRangeError(None, None, "all done")
            await sess.run(lambda: tf.constant(1.0))
    assert sv.should_stop()
    assert last_step == 3
    assert sess.stop_reason == "end_of_data"


async def test_managed_session_ignores_out_of_range_from_a_step(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testManagedSessionIgnoreOutOfRangeError —
    the TF2 form of the same case: a step raising OutOfRangeError (TF1's sess.run at the
    end of input) ends the session cleanly and the body goes no further."""
    sv = make_sv(tmp_path)
    last_step = None

    def step(i: int) -> Any:
        if i == 3:
            raise tf.errors.OutOfRangeError(None, None, "all done")
        return tf.constant(1.0)

    async with sv.managed_session() as sess:
        for i in range(10):
            last_step = i
            await sess.run(step, i)
    assert sv.should_stop()
    assert last_step == 3
    assert sess.stop_reason == "end_of_data"


async def test_managed_session_do_not_keep_summary_writer(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testManagedSessionDoNotKeepSummaryWriter —
    two sessions without standard services (no timed summaries or checkpoints), each
    writing one summary_computed, give two event files, each a valid event file
    holding that summary exactly once."""
    sv = make_sv(tmp_path, save_model_secs=0)
    for _ in range(2):
        async with sv.managed_session():
            sv.summary_computed(C123)
    paths = event_files(tmp_path)
    assert len(paths) == 2
    for path in paths:
        assert read_event_file(path)[0].file_version == "brain.Event:2"
        assert summaries(path) == [(0, C123)]


async def test_managed_session_keep_summary_writer(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testManagedSessionKeepSummaryWriter —
    summaries from two sessions of one supervisor are all kept, in order. DESIGN
    differs: there is no close_summary_writer=False; each session writes (and closes)
    its own event file, which TensorBoard reads as one run."""
    sv = make_sv(tmp_path, save_model_secs=0)
    for step in (0, 1):
        async with sv.managed_session():
            sv.summary_computed(C123, global_step=step)
    written = [s for path in event_files(tmp_path) for s in summaries(path)]
    assert written == [(0, C123), (1, C123)]


def csv_data(logdir: Path) -> str:
    """A small data file with 3 CSV records."""
    logdir.mkdir(parents=True, exist_ok=True)
    path = logdir / "data.csv"
    path.write_text("1,2,3\n4,5,6\n7,8,9\n")
    return str(path)


def csv_records(path: str, epochs: int) -> Any:
    return tf.data.TextLineDataset(path).repeat(epochs).map(lambda line: tf.io.decode_csv(line, [[1], [1], [1]]))


async def test_managed_end_of_input_one_queue(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testManagedEndOfInputOneQueue —
    reading a file for a fixed number of epochs (3 x 3 records) ends the session
    without an error when the input ends."""
    data = csv_records(csv_data(tmp_path), 3)
    rows: list[list[int]] = []
    sv = make_sv(tmp_path)
    async with sv.managed_session() as sess:
        n = await sess.run_loop(lambda rec: rows.append([int(x) for x in rec]), data=data)
    assert n == 9 and sess.stop_reason == "end_of_data"
    assert rows == [[1, 2, 3], [4, 5, 6], [7, 8, 9]] * 3


async def test_managed_end_of_input_two_queues(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testManagedEndOfInputTwoQueues —
    a second stage (a shuffled batch fed by a queue runner from the first) also ends
    the session cleanly when the input ends."""
    data = csv_records(csv_data(tmp_path), 3).shuffle(6, seed=4).batch(1)
    qr = asv.QueueRunner(data, capacity=4)
    seen: list[int] = []
    sv = make_sv(tmp_path, queue_runners=[qr])
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda batch: seen.append(int(batch[0][0])), data=qr)
    assert sess.stop_reason == "end_of_data"
    assert sorted(seen) == [1, 1, 1, 4, 4, 4, 7, 7, 7]


async def test_managed_main_error_two_queues(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testManagedMainErrorTwoQueues —
    an error in the main loop propagates even while queue runners feed the input."""
    data = csv_records(csv_data(tmp_path), 3).shuffle(6, seed=4).batch(1)
    qr = asv.QueueRunner(data, capacity=4)
    sv = make_sv(tmp_path, queue_runners=[qr])
    with pytest.raises(RuntimeError, match="fail at step 3"):
        async with sv.managed_session() as sess:
            batches = iter(qr)
            for step in range(9):
                if sv.should_stop():
                    break
                if step == 3:
                    raise RuntimeError("fail at step 3")
                await sess.run(lambda: next(batches))


async def test_chief_can_write_events(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testChiefCanWriteEvents —
    the chief's summary_computed values land in its event file after the version
    record."""
    sv = make_sv(tmp_path, is_chief=True, save_model_secs=0)
    async with sv.managed_session():
        sv.summary_computed(C123)
    (path,) = event_files(tmp_path)
    assert read_event_file(path)[0].file_version == "brain.Event:2"
    assert summaries(path) == [(0, C123)]


async def test_non_chief_cannot_write_events(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testNonChiefCannotWriteEvents —
    a non-chief writes no events and runs no standard (checkpoint) service. DESIGN
    differs: its summary_computed is a no-op rather than a RuntimeError (one training
    script runs on every worker)."""
    sv = make_sv(tmp_path, is_chief=False, save_summaries_secs=60)
    async with sv.managed_session() as sess:
        await sess.run(lambda: {"loss": tf.constant(1.0)})
        sv.summary_computed({"c1": 1.0, "c2": 2.0})
    assert event_files(tmp_path) == []
    assert checkpoints(tmp_path) == []


async def test_no_logdir_but_want_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """supervisor_test.py::SupervisorTest::testNoLogdirButWantSummary —
    without a logdir there is no summary writer. DESIGN differs (logdir=None: no
    summary services): summary_computed then writes nothing, anywhere, instead of
    raising "requires a summary writer"."""
    monkeypatch.chdir(tmp_path)
    sv = make_sv(None)
    async with sv.managed_session():
        sv.summary_computed(C123)
    assert os.listdir(tmp_path) == []


async def test_logdir_but_no_summaries_still_checkpoints(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testLogdirButExplicitlyNoSummaryWriter —
    with summaries disabled (save_summaries_secs=0; there is no summary_writer=None) a
    checkpoint is still generated."""
    v = tf.Variable([1.0], name="foo")
    sv = make_sv(tmp_path, state={"foo": v}, save_summaries_secs=0)
    async with sv.managed_session():
        await sv.save_now()
        assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-0")


async def test_no_logdir_succeeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """supervisor_test.py::SupervisorTest::testNoLogdirSucceeds —
    a supervisor without a logdir starts and stops, and writes no file anywhere."""
    monkeypatch.chdir(tmp_path)
    v = tf.Variable([1.0, 2.0, 3.0])
    async with make_sv(None, state={"v": v}).managed_session() as sess:
        await sess.run(lambda: v.assign_add([1.0, 1.0, 1.0]))
    assert os.listdir(tmp_path) == []


async def test_init_op(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testInitOp —
    with no checkpoint and no init_fn, the state starts from its variables' initial
    values (the default init_op)."""
    v = tf.Variable([1.0, 2.0, 3.0])
    async with make_sv(tmp_path, state={"v": v}).managed_session() as sess:
        assert sess.global_step == 0
        assert v.numpy().tolist() == [1.0, 2.0, 3.0]


async def test_init_fn(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testInitFn —
    init_fn initialises the state when nothing was restored."""
    v = tf.Variable([0.0, 0.0, 0.0])
    sv = make_sv(tmp_path, state={"v": v}, init_fn=lambda: v.assign([1.0, 2.0, 3.0]))
    async with sv.managed_session():
        assert v.numpy().tolist() == [1.0, 2.0, 3.0]


async def test_local_init_after_restore_chief_and_non_chief(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testReadyForLocalInitOpRestoreFromCheckpoint —
    a checkpoint of v=10 exists; a chief and a non-chief session both restore it, then
    their local_init_fn sets the local w from v (10); each then updates its own v.
    (TF's two sessions share v through a tf.train.Server; here each process has its own.)"""
    sv = make_sv(tmp_path, state={"v": tf.Variable(10.0)})
    async with sv.managed_session():
        await sv.save_now()

    async def session(is_chief: bool) -> tuple[float, float]:
        v, w = tf.Variable(1.0), tf.Variable(0.0)
        sv = make_sv(tmp_path, state={"v": v}, is_chief=is_chief, local_init_fn=lambda: w.assign(v))
        async with sv.managed_session() as sess:
            added = await sess.run(lambda: float(v.assign_add(1.0)))
        return float(w), added

    assert await session(False) == (10.0, 11.0)  # a non-chief writes no checkpoint
    assert await session(True) == (10.0, 11.0)


async def test_local_init_op(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testLocalInitOp —
    local_init_fn initialises what is not checkpointed (a local variable, a table-like
    variable), with no init_fn; the local variables are not in the checkpoint."""
    local = tf.Variable([0.0, 0.0, 0.0])
    table = tf.Variable([0, 0, 0])

    def local_init() -> None:
        local.assign([1.0, 2.0, 3.0])
        table.assign([4, 5, 6])

    sv = make_sv(tmp_path, state={}, local_init_fn=local_init)
    async with sv.managed_session():
        await sv.save_now()
        assert local.numpy().tolist() == [1.0, 2.0, 3.0]
        assert table.numpy().tolist() == [4, 5, 6]
    names = [name for name, _ in tf.train.list_variables(str(tmp_path))]
    assert not [n for n in names if n.startswith(("local", "table"))]


async def test_local_init_op_for_non_chief(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testLocalInitOpForNonChief —
    a non-chief runs local_init_fn too."""
    local = tf.Variable([0.0, 0.0, 0.0])
    sv = make_sv(tmp_path, state={}, is_chief=False, local_init_fn=lambda: local.assign([1.0, 2.0, 3.0]))
    async with sv.managed_session():
        assert local.numpy().tolist() == [1.0, 2.0, 3.0]


async def test_init_op_fails(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testInitOpFails —
    an init that leaves w uninitialised fails start-up with a RuntimeError naming w."""
    initialised: set[str] = set()
    sv = make_sv(
        tmp_path,
        state={"v": tf.Variable([1.0, 2.0, 3.0]), "w": tf.Variable([4.0, 5.0, 6.0])},
        init_fn=lambda: initialised.add("v"),
        ready_fn=lambda: [n for n in ("v", "w") if n not in initialised],
    )
    with pytest.raises(RuntimeError, match=r"not ready.*: w$"):
        async with sv.managed_session():
            pytest.fail("a session that is not ready was yielded")


async def test_init_op_fails_for_transient_variable(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testInitOpFailsForTransientVariable —
    a local_init_fn that leaves the local w uninitialised fails start-up with a
    RuntimeError naming w."""
    initialised: set[str] = set()
    sv = make_sv(
        tmp_path,
        state={},
        local_init_fn=lambda: initialised.add("v"),
        ready_fn=lambda: [n for n in ("v", "w") if n not in initialised],
    )
    with pytest.raises(RuntimeError, match=r"not ready.*: w$"):
        async with sv.managed_session():
            pytest.fail("a session that is not ready was yielded")


async def test_default_global_step(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testDefaultGlobalStep —
    a global step variable at 287 is the session's step from the start."""
    gs = tf.Variable(287, dtype=tf.int64, name="global_step")
    sv = make_sv(tmp_path, global_step=gs)
    async with sv.managed_session() as sess:
        assert sess.global_step == 287
        assert sv.global_step == 287
    assert int(gs.numpy()) == 287


async def test_standard_services_without_global_step(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testStandardServicesWithoutGlobalStep —
    the standard services write a checkpoint at start-up (plain TF restores "foo" from
    it) and summaries of the steps' scalars to the event file."""
    clock = ManualClock()
    v = tf.Variable([1.0], name="foo")
    sv = make_sv(tmp_path, state={"foo": v}, clock=clock, save_summaries_secs=60, save_model_secs=600)
    async with sv.managed_session() as sess:
        await sv.save_now()
        assert (tmp_path / "model.ckpt-0.index").exists()
        await sess.run(lambda: {"v": v[0]})
        await tick(clock, 60, sleepers=3)
        sess.request_stop()
    (path,) = event_files(tmp_path)
    assert read_event_file(path)[0].file_version == "brain.Event:2"
    assert [(s, vals["v"]) for s, vals in summaries(path) if "v" in vals] == [(1, 1.0)]
    foo = tf.Variable([10.1])
    tf.train.Checkpoint(foo=foo).restore(str(tmp_path / "model.ckpt-0")).expect_partial()
    assert float(foo[0]) == 1.0


async def test_standard_services_with_global_step(tmp_path: Path) -> None:
    """supervisor_test.py::SupervisorTest::testStandardServicesWithGlobalStep —
    with a global step at 123, the start-up checkpoint is model.ckpt-123 (plain TF
    restores 123 from it) and the step counter writes global_step/sec at step 123."""
    clock = ManualClock()
    gs = tf.Variable(123, dtype=tf.int64, name="global_step")
    sv = make_sv(tmp_path, global_step=gs, clock=clock, save_summaries_secs=60, save_model_secs=600)
    async with sv.managed_session():
        await sv.save_now()
        assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-123")
        await tick(clock, 60, sleepers=3)
    (path,) = event_files(tmp_path)
    rates = [(s, vals["global_step/sec"]) for s, vals in summaries(path) if "global_step/sec" in vals]
    assert rates[0] == (123, 0.0)
    restored = tf.Variable(-12, dtype=tf.int64)
    tf.train.Checkpoint(global_step=restored).restore(str(tmp_path / "model.ckpt-123")).expect_partial()
    assert int(restored) == 123


@pytest.mark.parametrize("is_chief", [True, False], ids=["chief", "non_chief"])
async def test_new_session_after_stop(tmp_path: Path, is_chief: bool) -> None:
    """supervisor_test.py::SupervisorTest::testPrepareSessionAfterStopForChief and
    ::testPrepareSessionAfterStopForNonChief —
    after a stopped session the supervisor reports should_stop(); a second session of
    the same supervisor starts not stopped, until it is asked to stop again."""
    sv = make_sv(tmp_path, is_chief=is_chief)
    async with sv.managed_session() as sess:
        sv.request_stop()
    assert sv.should_stop()
    async with sv.managed_session() as sess2:
        assert not sv.should_stop()
        assert not sess2.should_stop()
        sv.request_stop()
    assert sv.should_stop()
    assert sess.stop_reason is not None
