"""The stock hooks, in real sessions with real TensorFlow and real files."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf
from eventfiles import read_events, steps_of

import asupervisor as asv
from asupervisor._checkpoint.store._owner import OWNER_FILE
from asupervisor.testing import ManualClock, capture_logs

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_new_threads")]


def make_sv(hooks: list[Any], logdir: Path | None = None, **kwargs: Any) -> asv.Supervisor:
    kwargs.setdefault("state", {"w": tf.Variable(0.0)})
    return asv.Supervisor(logdir, hooks=hooks, handle_signals=False, save_summaries_secs=0, save_model_secs=0, **kwargs)


class CountingTensor:
    """A scalar stand-in for an eager tensor that counts host reads (``.numpy()``) and their threads."""

    shape = ()
    dtype = None  # set on first use (tf is imported lazily by asupervisor)

    def __init__(self, value: float, reads: list[str]) -> None:
        self.value = value
        self.reads = reads
        self.dtype = tf.float32

    def numpy(self) -> float:
        self.reads.append(threading.current_thread().name)
        return self.value


def ending_hook(ended: list[int]) -> type[asv.SessionRunHook]:
    """A hook class whose ``end`` records the global step into ``ended``."""

    class End(asv.SessionRunHook):
        def end(self, session: asv.Session) -> None:
            ended.append(session.global_step)

    return End


def nan_at_step_3(v: Any) -> Any:
    """A step adding 1 to ``v`` whose loss is ``v``, except NaN at step 3."""

    @tf.function
    def step() -> dict[str, tf.Tensor]:
        value = v.assign_add(1.0)
        return {"loss": tf.where(tf.equal(value, 3.0), tf.constant(math.nan), value)}

    return step


# -- StopAtStepHook ---------------------------------------------------------------------


async def test_stop_at_last_step_20_ends_at_20() -> None:
    """``StopAtStepHook(last_step=20)`` stops an unbounded ``run_loop`` at global step 20."""
    async with make_sv([asv.StopAtStepHook(last_step=20)]).managed_session() as sess:
        assert await sess.run_loop(lambda: None) == 20
    assert sess.global_step == 20
    assert sess.stop_reason == "hook"


async def test_stop_at_num_steps_counts_from_the_restored_step(tmp_path: Path) -> None:
    """``num_steps`` counts from the step restored from the logdir's checkpoint: a first
    session saves step 7, a second one restores it and stops at 7 + 5."""
    first_w = tf.Variable(0.0)
    async with make_sv([], tmp_path, state={"w": first_w}, save_model_steps=100).managed_session() as sess:
        await sess.run_loop(lambda: first_w.assign_add(1.0), max_steps=7)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-7")  # the final save

    w = tf.Variable(0.0)
    hook = asv.StopAtStepHook(num_steps=5)
    sv = make_sv([hook], tmp_path, state={"w": w}, save_model_steps=100)
    async with sv.managed_session() as sess:
        assert sess.global_step == 7 and float(w.numpy()) == 7.0  # restored, not initialised
        assert await sess.run_loop(lambda: w.assign_add(1.0)) == 5
    assert hook.last_step == 12
    assert sess.global_step == 12 and sess.stop_reason == "hook"
    assert float(w.numpy()) == 12.0
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-12")


async def test_stop_at_step_already_reached_runs_no_step() -> None:
    """A session that starts at or past ``last_step`` stops before its first step."""
    step_var = tf.Variable(30, dtype=tf.int64)
    ran = []
    async with make_sv([asv.StopAtStepHook(last_step=20)], global_step=step_var).managed_session() as sess:
        await sess.run_loop(lambda: ran.append(1))
    assert ran == []
    assert sess.global_step == 30


def test_stop_at_step_arguments() -> None:
    """Both or neither of ``num_steps``/``last_step`` is a ``ValueError``."""
    with pytest.raises(ValueError):
        asv.StopAtStepHook()
    with pytest.raises(ValueError):
        asv.StopAtStepHook(num_steps=1, last_step=2)
    with pytest.raises(ValueError):
        asv.StopAtStepHook(num_steps=-1)


# -- NanTensorHook ----------------------------------------------------------------------


@pytest.mark.parametrize("immediate", [False, True])
async def test_nan_tensor_hook_raises_on_nan_loss_without_end(immediate: bool) -> None:
    """A NaN loss raises ``NanLossDuringTrainingError`` naming its step; ``end`` hooks do not run.

    By default each batch of ``check_every_n_steps`` losses is stacked by one op and read
    one batch later, so the error comes at step 10 here and names the NaN step;
    ``immediate=True`` raises right after the NaN step.
    """
    v = tf.Variable(0.0)
    ended = []

    End = ending_hook(ended)
    step = nan_at_step_3(v)

    sv = make_sv([asv.NanTensorHook(immediate=immediate, check_every_n_steps=5), End()], state={"v": v})
    with pytest.raises(asv.NanLossDuringTrainingError, match="step 3"):
        async with sv.managed_session() as sess:
            await sess.run_loop(step)
    assert sv.global_step == (3 if immediate else 10)
    assert ended == []


async def test_nan_loss_at_the_last_step_skips_the_final_checkpoint(tmp_path: Path) -> None:
    """A NaN in the very last step is still caught (before the final save): no NaN checkpoint, no ``end``."""
    v = tf.Variable(0.0)
    listener = Listener()
    ended = []

    End = ending_hook(ended)
    step = nan_at_step_3(v)

    hooks = [asv.CheckpointSaverHook(tmp_path, save_steps=100, listeners=[listener]), asv.NanTensorHook(), End()]
    with pytest.raises(asv.NanLossDuringTrainingError, match="step 3"):
        async with make_sv(hooks, state={"v": v}).managed_session() as sess:
            await sess.run_loop(step, max_steps=3)
    assert [s for name, s in listener.calls if name == "after_save"] == [0]
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-0")
    assert ended == []


@pytest.mark.parametrize(("immediate", "stopped_at"), [(False, 4), (True, 3)])
async def test_nan_tensor_hook_can_stop_cleanly_instead(immediate: bool, stopped_at: int) -> None:
    """``fail_on_nan_loss=False`` stops the session cleanly once the NaN is seen."""
    losses = iter([1.0, 2.0, math.nan, 4.0, 5.0])
    hook = asv.NanTensorHook(loss_key="l", fail_on_nan_loss=False, immediate=immediate, check_every_n_steps=1)
    async with make_sv([hook]).managed_session() as sess:
        await sess.run_loop(lambda: {"l": tf.constant(next(losses))})
    assert sess.global_step == stopped_at
    assert sess.stop_reason == "hook"


async def test_nan_tensor_hook_checks_unread_losses_before_a_hook_checkpoint(tmp_path: Path) -> None:
    """A NaN not read yet is caught before ``CheckpointSaverHook`` saves: no NaN checkpoint.

    The hook saving comes first in the list, so only the pre-save check can catch it.
    """
    v = tf.Variable(0.0)

    @tf.function
    def step() -> dict[str, tf.Tensor]:
        value = v.assign_add(1.0)
        return {"loss": tf.where(tf.equal(value, 3.0), tf.constant(math.nan), value)}

    hooks = [asv.CheckpointSaverHook(tmp_path, save_steps=2), asv.NanTensorHook(check_every_n_steps=100)]
    with pytest.raises(asv.NanLossDuringTrainingError, match="step 3"):
        async with make_sv(hooks, state={"v": v}).managed_session() as sess:
            await sess.run_loop(step)
    assert sess.global_step == 4
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-2")


async def test_nan_tensor_hook_checks_unread_losses_before_a_service_checkpoint(tmp_path: Path) -> None:
    """A NaN not read yet stops ``save_now()``'s snapshot: the error comes out, no NaN checkpoint."""
    v = tf.Variable(0.0)

    @tf.function
    def step() -> dict[str, tf.Tensor]:
        value = v.assign_add(1.0)
        return {"loss": tf.where(tf.equal(value, 2.0), tf.constant(math.nan), value)}

    sv = make_sv([asv.NanTensorHook()], tmp_path, state={"v": v})
    with pytest.raises(asv.NanLossDuringTrainingError, match="step 2"):
        async with sv.managed_session() as sess:
            for _ in range(3):
                await sess.run(step)
            await sv.save_now()
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest is None or latest.endswith("-0")


async def test_nan_tensor_hook_checks_every_element_of_a_vector_loss() -> None:
    """A per-example loss vector with one NaN is caught at the check, naming its step."""
    losses = iter([[1.0, 2.0], [3.0, math.nan], [5.0, 6.0], [7.0, 8.0], [9.0, 10.0]])
    with pytest.raises(asv.NanLossDuringTrainingError, match="step 2"):
        async with make_sv([asv.NanTensorHook(check_every_n_steps=2)]).managed_session() as sess:
            await sess.run_loop(lambda: {"loss": tf.constant(next(losses))})
    assert sess.global_step == 4


async def test_nan_tensor_hook_checks_the_last_losses_at_the_end_of_data() -> None:
    """Losses not checked when the data runs out are checked in ``end``: the NaN is raised."""
    losses = iter([1.0, math.nan, 3.0])
    with pytest.raises(asv.NanLossDuringTrainingError, match="step 2"):
        async with make_sv([asv.NanTensorHook()]).managed_session() as sess:
            await sess.run_loop(lambda: {"loss": tf.constant(next(losses))})


@pytest.mark.parametrize("mixed_dtypes", [False, True])
@pytest.mark.parametrize("nan_at", [1, 5, 6])
async def test_nan_tensor_hook_names_the_first_nan_step_of_a_batch(nan_at: int, mixed_dtypes: bool) -> None:
    """The hook names the NaN's own step, whether a batch is stacked (one dtype) or read one by one."""

    def loss(step: int) -> Any:
        value = math.nan if step == nan_at else float(step)
        dtype = tf.float64 if mixed_dtypes and step % 2 else tf.float32
        return tf.constant(value, dtype=dtype)

    counter = iter(range(1, 100))
    with pytest.raises(asv.NanLossDuringTrainingError, match=f"step {nan_at}, "):
        async with make_sv([asv.NanTensorHook(check_every_n_steps=3)]).managed_session() as sess:
            await sess.run_loop(lambda: {"loss": loss(next(counter))})
    assert sess.global_step == 3 * math.ceil(nan_at / 3) + 3  # its batch's verdict, one batch later


def test_nan_tensor_hook_checks_its_period() -> None:
    """``check_every_n_steps`` must be a positive int."""
    with pytest.raises(ValueError, match="check_every_n_steps"):
        asv.NanTensorHook(check_every_n_steps=0)


async def test_nan_tensor_hook_checks_python_floats_at_once() -> None:
    """A loss that is a Python number needs no device read: it is checked right away."""
    with pytest.raises(asv.NanLossDuringTrainingError, match="step 2"):
        async with make_sv([asv.NanTensorHook()]).managed_session() as sess:
            await sess.run_loop(lambda: {"loss": math.nan if sess.global_step == 1 else 1.0})


async def test_nan_tensor_hook_names_a_missing_key() -> None:
    """A step result without the loss key is a ``KeyError`` naming the keys it has."""
    with pytest.raises(KeyError, match="'acc'"):
        async with make_sv([asv.NanTensorHook()]).managed_session() as sess:
            await sess.run(lambda: {"acc": 1.0})


# -- LoggingTensorHook ------------------------------------------------------------------


async def test_logging_tensor_hook_logs_every_n_iter_and_reads_only_then() -> None:
    """Values are logged at iterations 0, 2, 4 and at the end; they are read only on those steps."""
    reads: list[str] = []
    v = tf.Variable(0.0)

    def step() -> dict[str, Any]:
        return {"loss": CountingTensor(float(v.assign_add(1.0).numpy()), reads), "other": 1}

    hook = asv.LoggingTensorHook(["loss"], every_n_iter=2, at_end=True)
    with capture_logs() as logs:
        async with make_sv([hook], state={"v": v}).managed_session() as sess:
            await sess.run_loop(step, max_steps=5)
    logged = [(e["global_step"], e["loss"]) for e in logs if e["event"] == "tensors.logged"]
    assert logged == [(1, 1.0), (3, 3.0), (5, 5.0), (5, 5.0)]
    assert len(reads) == 4


async def test_logging_tensor_hook_formatter_and_secs() -> None:
    """``every_n_secs`` uses the injected clock; a formatter makes the message."""
    clock = ManualClock()
    hook = asv.LoggingTensorHook({"L": "loss"}, every_n_secs=10, formatter=lambda d: f"L={d['L']}", clock=clock)
    with capture_logs() as logs:
        async with make_sv([hook]).managed_session() as sess:
            for i in range(4):
                await sess.run(lambda i=i: {"loss": tf.constant(i)})
                clock.advance(6)
    assert [e["message"] for e in logs if e["event"] == "tensors.logged"] == ["L=0", "L=2"]


def test_logging_tensor_hook_arguments() -> None:
    """No period without ``at_end``, or both periods, is a ``ValueError``; so are empty keys."""
    with pytest.raises(ValueError):
        asv.LoggingTensorHook(["loss"])
    with pytest.raises(ValueError):
        asv.LoggingTensorHook(["loss"], every_n_iter=1, every_n_secs=1)
    with pytest.raises(ValueError):
        asv.LoggingTensorHook([], every_n_iter=1)
    asv.LoggingTensorHook("loss", at_end=True)


# -- StepCounterHook and SummarySaverHook -------------------------------------------------


async def test_step_counter_hook_writes_global_step_per_sec(tmp_path: Path) -> None:
    """Every 2 steps the rate (steps / clock seconds) is kept, logged and written as ``global_step/sec``."""
    clock = ManualClock()
    hook = asv.StepCounterHook(every_n_steps=2, clock=clock)
    async with make_sv([hook], tmp_path).managed_session() as sess:
        for _ in range(5):
            await sess.run(lambda: None)
            clock.advance(0.5)
    assert hook.steps_per_sec == pytest.approx(2.0)
    events = read_events(tmp_path)
    assert events["global_step/sec"] == [(3, pytest.approx(2.0)), (5, pytest.approx(2.0))]


def test_step_counter_hook_needs_exactly_one_period() -> None:
    """TF1's rule: ``every_n_secs`` needs ``every_n_steps=None``."""
    with pytest.raises(ValueError):
        asv.StepCounterHook(every_n_secs=5)
    asv.StepCounterHook(every_n_steps=None, every_n_secs=5)


async def test_summary_saver_hook_writes_step_scalars_every_n_steps(tmp_path: Path) -> None:
    """Scalars of the step's result land in the event file at steps 1, 3, 5; non-scalars are skipped."""
    reads: list[str] = []
    v = tf.Variable(0.0)

    def step() -> dict[str, Any]:
        value = float(v.assign_add(1.0).numpy())
        return {"loss": CountingTensor(value, reads), "vec": tf.zeros([3]), "lr": 0.1}

    async with make_sv([asv.SummarySaverHook(save_steps=2)], tmp_path, state={"v": v}).managed_session() as sess:
        await sess.run_loop(step, max_steps=6)
    events = read_events(tmp_path)
    assert events["loss"] == [(1, 1.0), (3, 3.0), (5, 5.0)]
    assert steps_of(events, "lr") == [1, 3, 5]
    assert "vec" not in events
    assert reads == ["asv-summary"] * 3  # read on the summary thread, only when written


async def test_summary_saver_hook_is_inactive_without_logdir() -> None:
    """Without a logdir (or off the chief) the hook writes nothing and reads nothing."""
    reads: list[str] = []
    async with make_sv([asv.SummarySaverHook(save_steps=1)]).managed_session() as sess:
        await sess.run_loop(lambda: {"loss": CountingTensor(1.0, reads)}, max_steps=3)
    assert reads == []


# -- CheckpointSaverHook ----------------------------------------------------------------


class Listener(asv.CheckpointSaverListener):
    """Records listener calls; asks to stop after the save at ``stop_at``."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.calls: list[tuple[str, int | None]] = []
        self.stop_at = stop_at

    def begin(self) -> None:
        self.calls.append(("begin", None))

    def before_save(self, session: asv.Session, global_step_value: int) -> None:
        self.calls.append(("before_save", global_step_value))

    def after_save(self, session: asv.Session, global_step_value: int) -> bool:
        self.calls.append(("after_save", global_step_value))
        return global_step_value == self.stop_at

    def end(self, session: asv.Session, global_step_value: int) -> None:
        self.calls.append(("end", global_step_value))


async def test_checkpoint_saver_hook_saves_at_start_every_n_and_at_end(tmp_path: Path) -> None:
    """Saves at the start step, every 3 steps and at the clean end; listeners see, in order,
    ``begin``, then ``before_save`` (checkpoint not there yet) and ``after_save`` (it is the
    latest) around each save, then ``end``."""
    v = tf.Variable(0.0)

    class SeeingListener(Listener):
        """Also records the latest checkpoint on disk when each save callback runs."""

        def __init__(self) -> None:
            super().__init__()
            self.latest: list[tuple[str, int, str | None]] = []

        def before_save(self, session: asv.Session, global_step_value: int) -> None:
            super().before_save(session, global_step_value)
            self.latest.append(("before_save", global_step_value, tf.train.latest_checkpoint(str(tmp_path))))

        def after_save(self, session: asv.Session, global_step_value: int) -> bool:
            self.latest.append(("after_save", global_step_value, tf.train.latest_checkpoint(str(tmp_path))))
            return super().after_save(session, global_step_value)

    listener = SeeingListener()
    hook = asv.CheckpointSaverHook(str(tmp_path), save_steps=3, listeners=[listener])
    async with make_sv([hook], state={"v": v}).managed_session() as sess:
        await sess.run_loop(lambda: v.assign_add(1.0), max_steps=7)
    assert listener.calls == [
        ("begin", None),
        ("before_save", 0),
        ("after_save", 0),
        ("before_save", 3),
        ("after_save", 3),
        ("before_save", 6),
        ("after_save", 6),
        ("before_save", 7),
        ("after_save", 7),
        ("end", 7),
    ]
    ckpt = str(tmp_path / "model.ckpt")
    assert listener.latest == [
        ("before_save", 0, None),
        ("after_save", 0, f"{ckpt}-0"),
        ("before_save", 3, f"{ckpt}-0"),
        ("after_save", 3, f"{ckpt}-3"),
        ("before_save", 6, f"{ckpt}-3"),
        ("after_save", 6, f"{ckpt}-6"),
        ("before_save", 7, f"{ckpt}-6"),
        ("after_save", 7, f"{ckpt}-7"),
    ]
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest is not None and latest.endswith("model.ckpt-7")
    restored_v, restored_step = tf.Variable(0.0), tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(v=restored_v, global_step=restored_step).read(latest).expect_partial()
    assert float(restored_v.numpy()) == 7.0 and int(restored_step.numpy()) == 7


@pytest.mark.parametrize("spelling", ["relative", "dotdot", "symlink"])
async def test_checkpoint_saver_hook_into_the_logdir_spelled_differently_saves_each_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    """A hook directory naming the Supervisor's logdir another way (relative, through ``..``
    or a symlink) is the same directory: the hook saves through the session's checkpointer,
    so each step is written once and one state file lists each checkpoint once."""
    logdir = tmp_path / "run"
    logdir.mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(logdir, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    hook_dir = {"relative": "run", "dotdot": "other/../run", "symlink": "link"}[spelling]
    v = tf.Variable(0.0)
    hook = asv.CheckpointSaverHook(hook_dir, save_steps=2)
    sv = make_sv([hook], logdir, state={"v": v}, save_model_steps=2)
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda: v.assign_add(1.0), max_steps=5)
    saved = sorted(e["step"] for e in logs if e["event"] == "checkpoint.saved")
    assert saved == [0, 2, 4, 5]
    state = tf.train.get_checkpoint_state(str(logdir))
    names = [Path(p).name for p in state.all_model_checkpoint_paths]
    assert sorted(names) == [f"model.ckpt-{s}" for s in (0, 2, 4, 5)]
    assert Path(state.model_checkpoint_path).name == "model.ckpt-5"
    assert sorted(p.name for p in logdir.glob("*.index")) == [f"model.ckpt-{s}.index" for s in (0, 2, 4, 5)]


async def test_checkpoint_listener_after_save_true_stops_training(tmp_path: Path) -> None:
    """A listener whose ``after_save`` returns True stops training after that save."""
    listener = Listener(stop_at=4)
    hook = asv.CheckpointSaverHook(tmp_path, save_steps=2, listeners=[listener])
    async with make_sv([hook]).managed_session() as sess:
        await sess.run_loop(lambda: None)
    assert sess.global_step == 4
    assert sess.stop_reason == "hook"


async def test_checkpoint_saver_hook_secs_with_manual_clock(tmp_path: Path) -> None:
    """``save_secs`` saves once the injected clock passed the interval, at that step."""
    clock = ManualClock()
    listener = Listener()
    hook = asv.CheckpointSaverHook(tmp_path, save_secs=60, listeners=[listener], clock=clock)
    async with make_sv([hook]).managed_session() as sess:
        for _ in range(5):  # steps 1..5 run at t = 0, 25, 50, 75, 100
            await sess.run(lambda: None)
            clock.advance(25)
    assert [s for name, s in listener.calls if name == "after_save"] == [0, 4, 5]  # 5: the end


# -- GlobalStepWaiterHook, FinalOpsHook, ProfilerHook -----------------------------------


async def test_global_step_waiter_hook_waits_before_the_first_step() -> None:
    """The first step waits until the global step source reaches ``wait_until_step``; later ones do not."""
    readings = iter([0, 3, 9, 10, 11])
    sleeps: list[float] = []
    hook = asv.GlobalStepWaiterHook(10, global_step_fn=lambda: next(readings), poll_secs=0.25, sleep=sleeps.append)
    async with make_sv([hook]).managed_session() as sess:
        await sess.run_loop(lambda: None, max_steps=3)
    assert sleeps == [0.25, 0.25, 0.25]
    assert next(readings) == 11


async def test_global_step_waiter_hook_gives_up_on_stop() -> None:
    """A stop request ends the wait."""
    sessions: list[asv.Session] = []
    hook = asv.GlobalStepWaiterHook(10, global_step_fn=lambda: 0, sleep=lambda s: sessions[0].request_stop())

    class Keep(asv.SessionRunHook):
        def after_create_session(self, session: asv.Session) -> None:
            sessions.append(session)

    async with make_sv([Keep(), hook]).managed_session() as sess:
        await sess.run_loop(lambda: None)
    assert sess.global_step <= 1


async def test_final_ops_hook_reads_values_at_the_end() -> None:
    """``FinalOpsHook`` evaluates its function at the clean end, as NumPy values."""
    v = tf.Variable(0.0)
    hook = asv.FinalOpsHook(lambda: {"v": v.read_value(), "twice": v * 2})
    async with make_sv([hook], state={"v": v}).managed_session() as sess:
        await sess.run_loop(lambda: v.assign_add(1.5), max_steps=2)
    assert hook.final_ops_values == {"v": 3.0, "twice": 6.0}


async def test_profiler_hook_writes_a_trace_tensorboard_reads(tmp_path: Path) -> None:
    """A trace of step 2 (the first step only arms the timer, as in TF1) lands in
    ``<logdir>/plugins/profile/<run>_step_2/*.xplane.pb`` (where TensorBoard's profile plugin
    looks), an XSpace whose host plane holds the step's function and ops; nothing is left
    of the staging directory it was written into."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    v = tf.Variable(0.0)

    @tf.function
    def profiled_step() -> tf.Tensor:
        return v.assign_add(1.0)

    async with make_sv([asv.ProfilerHook(save_steps=100)], tmp_path, state={"v": v}).managed_session() as sess:
        await sess.run_loop(profiled_step, max_steps=3)
    assert not list((tmp_path / "plugins" / "profile").glob("*/*.xplane.pb"))  # 2..3 < 0 + 100
    async with make_sv([asv.ProfilerHook(save_steps=2)], tmp_path, state={"v": v}).managed_session() as sess:
        await sess.run_loop(profiled_step, max_steps=3)
    traces = list((tmp_path / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].parent.name.endswith("_step_2")
    # no staging directory left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["asupervisor-goodput.json", OWNER_FILE, "plugins"]
    space = xplane_pb2.XSpace()
    space.ParseFromString(traces[0].read_bytes())
    host = [p for p in space.planes if p.name.startswith("/host:CPU")]
    assert host and sum(len(line.events) for line in host[0].lines) > 0
    names = {m.name for m in host[0].event_metadata.values()}
    assert "profiled_step" in names and any(n.startswith("AssignAddVariableOp") for n in names)


async def test_profiler_hook_closes_a_trace_left_open_by_an_error(tmp_path: Path) -> None:
    """A step that raises while traced does not leave the profiler running."""

    def boom() -> None:
        raise ValueError("step failed")

    with pytest.raises(ValueError):
        async with make_sv([asv.ProfilerHook(save_steps=1)], tmp_path).managed_session() as sess:
            await sess.run(lambda: None)  # step 1 arms the timer
            await sess.run(boom)  # step 2 is traced
    tf.profiler.experimental.start(str(tmp_path / "again"))  # raises if a session were still open
    tf.profiler.experimental.stop()


async def test_profiler_hook_two_traces_within_one_second_get_their_own_directories(tmp_path: Path) -> None:
    """Traces of steps 2, 3 and 4 taken within the same second (``tf.profiler`` names its run
    directory after the second) land in three directories, one per traced step, each with
    its own trace: none overwrites another."""
    async with make_sv([asv.ProfilerHook(save_steps=1)], tmp_path).managed_session() as sess:
        await sess.run_loop(lambda: None, max_steps=4)
    runs = sorted((tmp_path / "plugins" / "profile").iterdir())
    assert sorted(r.name.rsplit("_step_", 1)[1] for r in runs) == ["2", "3", "4"]
    assert all(len(list(r.glob("*.xplane.pb"))) == 1 for r in runs)


async def test_profiler_hook_traces_from_the_restored_step(tmp_path: Path) -> None:
    """A session starting at global step 10 arms the timer there: ``save_steps=2`` traces 12
    and 14, not 11 (TF1 arms at the step the first run started from)."""
    hook = asv.ProfilerHook(save_steps=2, output_dir=str(tmp_path))
    sv = make_sv([hook], global_step=tf.Variable(10, dtype=tf.int64))
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: None, max_steps=15)
    runs = sorted(r.name.rsplit("_step_", 1)[1] for r in (tmp_path / "plugins" / "profile").iterdir())
    assert runs == ["12", "14"]


async def test_profiler_hook_removes_staging_left_by_a_dead_process(tmp_path: Path) -> None:
    """A staging directory left by a process killed while tracing is removed at the next
    session's start; one of a live process (or of this one) is left alone."""
    import subprocess
    import sys

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    stale = tmp_path / f".asv-profile-{int(dead.stdout)}-x" / "plugins" / "profile" / "run"
    stale.mkdir(parents=True)
    live = tmp_path / f".asv-profile-{os.getppid()}-y"
    live.mkdir()
    async with make_sv([asv.ProfilerHook(save_steps=100, output_dir=str(tmp_path))]).managed_session() as sess:
        await sess.run(lambda: None)
    assert not stale.parent.parent.parent.exists() and live.exists()
