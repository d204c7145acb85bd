"""The summary service and ``summary_computed``: event files TensorBoard reads, written off the loop."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio.lowlevel
import numpy as np
import pytest
import tensorflow as tf
from eventfiles import SERVICES, read_events, steps_of, tick

import asupervisor as asv
from asupervisor._core._abc import SessionAttribute
from asupervisor.testing import ManualClock

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_new_threads")]


def make_sv(logdir: Path | None, clock: ManualClock, **kwargs: Any) -> asv.Supervisor:
    kwargs.setdefault("state", {"v": tf.Variable(0.0)})
    return asv.Supervisor(
        logdir, save_summaries_secs=60, save_model_secs=0, handle_signals=False, clock=clock, **kwargs
    )


class ThreadRecordingTensor:
    """A scalar tensor stand-in recording which thread reads it."""

    shape = ()

    def __init__(self, value: float, reads: list[str]) -> None:
        self.value, self.reads, self.dtype = value, reads, tf.float32

    def numpy(self) -> float:
        self.reads.append(threading.current_thread().name)
        return self.value


async def test_service_writes_step_scalars_and_global_step_per_sec(tmp_path: Path) -> None:
    """Each tick writes the last step's scalars and ``global_step/sec`` at the step reached."""
    clock = ManualClock()
    v = tf.Variable(0.0)

    @tf.function
    def step() -> dict[str, tf.Tensor]:
        value = v.assign_add(1.0)
        return {"loss": value * 2.0, "vec": tf.zeros([4]), "step_int": tf.cast(value, tf.int64)}

    async with make_sv(tmp_path, clock, state={"v": v}).managed_session() as sess:
        for _ in range(6):
            await sess.run(step)
        await tick(clock, 60)
        for _ in range(3):
            await sess.run(step)
        await tick(clock, 60)
        await tick(clock, 60)  # no step since: nothing new from the step outputs
    events = read_events(tmp_path)
    assert events["loss"] == [(6, 12.0), (9, 18.0)]
    assert [(s, int(x)) for s, x in events["step_int"]] == [(6, 6), (9, 9)]
    assert "vec" not in events
    assert events["global_step/sec"] == [
        (6, pytest.approx(0.1)),
        (9, pytest.approx(0.05)),
        (9, pytest.approx(0.0)),
    ]


async def test_service_reads_outputs_only_on_the_summary_thread_at_ticks(tmp_path: Path) -> None:
    """No device read on the loop or step thread, and none on steps without a tick."""
    clock = ManualClock()
    reads: list[str] = []
    async with make_sv(tmp_path, clock).managed_session() as sess:
        for _ in range(20):
            await sess.run(lambda: {"loss": ThreadRecordingTensor(1.0, reads)})
        assert reads == []
        await tick(clock, 60)
    assert reads == ["asv-summary"]


async def test_scalar_sources_are_written_each_tick(tmp_path: Path) -> None:
    """The ``scalars`` of every session part (queue runners' fill levels) are written at each tick."""
    from anyio.abc import TaskStatus

    from asupervisor._core._abc import SessionPart

    clock = ManualClock()
    levels = iter([0.25, 0.75])

    class Levels(asv.Service, SessionPart):
        name = "levels"

        def scalars(self) -> dict[str, float]:
            return {"queue/input/fraction_full": next(levels)}

        async def run(self, ctx: asv.ServiceContext, *, task_status: TaskStatus[None]) -> None:
            task_status.started()

    sv = make_sv(tmp_path, clock)
    sv.add_service(Levels())
    async with sv.managed_session() as sess:
        await sess.run(lambda: None)
        await tick(clock, 60)
        await sess.run(lambda: None)
        await tick(clock, 60)
    events = read_events(tmp_path)
    assert events["queue/input/fraction_full"] == [(1, 0.25), (2, 0.75)]


async def test_summary_computed_writes_scalars_arrays_tensors_and_text(tmp_path: Path) -> None:
    """``sv.summary_computed`` writes what it is given, at the given step or the current one."""
    clock = ManualClock()
    v = tf.Variable(5.0)
    sv = make_sv(tmp_path, clock, state={"v": v})
    async with sv.managed_session() as sess:
        for _ in range(3):
            await sess.run(lambda: None)
        sv.summary_computed({"eval/accuracy": 0.9, "eval/hist": np.arange(4.0), "note": "hello"})
        sv.summary_computed({"eval/loss": tf.constant(1.25), "weight": v}, global_step=2)
    events = read_events(tmp_path)
    assert events["eval/accuracy"] == [(3, pytest.approx(0.9))]
    assert steps_of(events, "eval/hist") == [3]
    assert events["note"][0][0] == 3 and events["note"][0][1].item() == b"hello"
    assert events["eval/loss"] == [(2, 1.25)]
    assert events["weight"] == [(2, 5.0)]


async def test_summary_computed_checks_its_arguments(tmp_path: Path) -> None:
    """Bad values are a ``TypeError``; no running session is a ``RuntimeError``."""
    clock = ManualClock()
    sv = make_sv(tmp_path, clock)
    with pytest.raises(RuntimeError):
        sv.summary_computed({"a": 1.0})
    async with sv.managed_session():
        with pytest.raises(TypeError):
            sv.summary_computed([("a", 1.0)])  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            sv.summary_computed({"a": 1.0}, global_step=1.5)  # type: ignore[arg-type]


async def test_non_chief_and_no_logdir_write_nothing(tmp_path: Path) -> None:
    """Only the chief with a logdir writes event files; ``summary_computed`` is a no-op elsewhere."""
    clock = ManualClock()
    sv = make_sv(tmp_path, clock, is_chief=False)
    async with sv.managed_session() as sess:
        await sess.run(lambda: {"loss": 1.0})
        sv.summary_computed({"a": 1.0})
        await clock.wait_for_sleepers(1)  # only the step counter runs
        clock.advance(60)
        while sv.status().steps_per_sec is None:
            await anyio.lowlevel.checkpoint()
    assert not list(tmp_path.glob("events.out.tfevents.*"))
    assert sv.status().steps_per_sec == pytest.approx(1 / 60)


async def test_write_error_stops_the_session(tmp_path: Path) -> None:
    """A value that cannot be written stops the session with that error."""
    clock = ManualClock()
    sv = make_sv(tmp_path, clock)
    with pytest.raises(TypeError, match="cannot write summary"):
        async with sv.managed_session() as sess:
            sv.summary_computed({"bad": np.array([1j])})
            await clock.wait_for_sleepers(SERVICES)
            while not sess.should_stop():
                await anyio.lowlevel.checkpoint()
            await sess.run(lambda: None)


async def test_post_error_stops_the_session(tmp_path: Path) -> None:
    """A value posted without a waiter (as the stock hooks do) that cannot be written still stops the session."""
    clock = ManualClock()
    sv = make_sv(tmp_path, clock)
    with pytest.raises(TypeError, match="cannot write summary"):
        async with sv.managed_session() as sess:
            assert sv._runtime is not None and sv._runtime.extra(SessionAttribute.summary_writer, None) is not None
            sv._runtime.extra(SessionAttribute.summary_writer, None).post(1, {"bad": np.array([1j])})
            while not sess.should_stop():
                await anyio.lowlevel.checkpoint()
            await sess.run(lambda: None)


async def test_posts_reach_the_summary_thread_in_batches_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``post`` wakes the summary thread once per batch, not per call; order is kept; close writes the rest."""
    from asupervisor._summary import _writer as _summary

    monkeypatch.setattr(_summary, "POST_BATCH_SECS", float("inf"))
    monkeypatch.setattr(_summary, "POST_BATCH_SIZE", 4)
    clock = ManualClock()
    sv = make_sv(tmp_path, clock)
    reads: list[str] = []
    fourth_read = threading.Event()

    class Fourth(ThreadRecordingTensor):
        def numpy(self) -> float:
            value = super().numpy()
            fourth_read.set()
            return value

    async with sv.managed_session():
        assert sv._runtime is not None and sv._runtime.extra(SessionAttribute.summary_writer, None) is not None
        writer = sv._runtime.extra(SessionAttribute.summary_writer, None)
        writer._handed_at = 0.0  # as if just handed over: with no time limit, only size counts
        for step in range(1, 4):
            writer.post(step, {"x": ThreadRecordingTensor(float(step), reads)})
        assert reads == [] and len(writer._posted) == 3  # nothing handed over: nothing can read them
        writer.post(4, {"x": Fourth(4.0, reads)})  # the fourth: a batch
        assert await anyio.to_thread.run_sync(fourth_read.wait, 10.0)
        assert reads == ["asv-summary"] * 4
        writer.post(5, {"x": ThreadRecordingTensor(5.0, reads)})  # waits; written at close
        sv.summary_computed({"y": 1.0}, global_step=6)
    assert steps_of(read_events(tmp_path), "x") == [1, 2, 3, 4, 5]
    assert steps_of(read_events(tmp_path), "y") == [6]


async def test_event_file_is_flushed_and_closed_on_stop(tmp_path: Path) -> None:
    """What was queued before the stop is in the event file once the session has exited."""
    clock = ManualClock()
    sv = make_sv(tmp_path, clock)
    async with sv.managed_session():
        for i in range(20):
            sv.summary_computed({"x": float(i)}, global_step=i)
    assert steps_of(read_events(tmp_path), "x") == list(range(20))
    assert sv._runtime is not None and sv._runtime.extra(SessionAttribute.summary_writer, None) is not None
    assert sv._runtime.extra(SessionAttribute.summary_writer, None).closed


async def test_steps_after_the_last_tick_are_summarised_at_stop(tmp_path: Path) -> None:
    """The last step's scalars are written at stop when steps ran since the last tick."""
    clock = ManualClock()
    async with make_sv(tmp_path, clock).managed_session() as sess:
        await sess.run(lambda: {"loss": tf.constant(3.0)})
        await tick(clock, 60)
        await sess.run(lambda: {"loss": tf.constant(2.0)})
        await sess.run(lambda: {"loss": tf.constant(1.0)})
    assert read_events(tmp_path)["loss"] == [(1, 3.0), (3, 1.0)]


async def test_no_final_summary_when_nothing_ran_since_the_tick(tmp_path: Path) -> None:
    """A stop right after a tick writes nothing twice."""
    clock = ManualClock()
    async with make_sv(tmp_path, clock).managed_session() as sess:
        await sess.run(lambda: {"loss": tf.constant(3.0)})
        await tick(clock, 60)
    assert read_events(tmp_path)["loss"] == [(1, 3.0)]


@pytest.mark.parametrize("value", [0.0, 0.1, -3.5, 1e30, 7, float("nan"), float("inf")])
def test_scalar_summaries_are_the_protos_tensorboard_builds(value: float) -> None:
    """The scalar ``Summary`` built directly equals TensorBoard's ``scalar_pb`` byte for byte."""
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb

    from asupervisor._summary._writer import _scalar_summary

    ours = _scalar_summary("loss", float(value)).SerializeToString()
    assert ours == scalar_pb("loss", float(value)).SerializeToString()
