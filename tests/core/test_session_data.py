"""Data pipelines of every kind in ``run_loop``, and the session's parity points.

``run_loop(fn, data, checkpoint_iterator=None|True|False)``: a pipeline TensorFlow cannot
serialise (``from_generator``, ``py_function``, stateful ops) is found before the first
step and left out of checkpoints (auto) or refused (``True``); the iterator's share of a
checkpoint is logged once. Also: ``run_loop`` returns its count whatever stop ended it,
``request_stop()`` after the session is a no-op, bad ``data`` and state values that TF
would silently not save are clear errors.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import tensorflow as tf
from _timing import scaled

import asupervisor as asv
from asupervisor.testing import capture_logs

ITERATOR_KEY = "asv_data_iterator/.ATTRIBUTES/ITERATOR_STATE"


def _supervisor(logdir: Path | None, state: Any, **kwargs: Any) -> asv.Supervisor:
    kwargs.setdefault("save_summaries_secs", 0)
    kwargs.setdefault("save_model_secs", 0)
    kwargs.setdefault("save_model_steps", 10_000)  # saving on: the start-up and final checkpoints
    return asv.Supervisor(logdir, state=state, handle_signals=False, **kwargs)


def _generator_dataset(n: int) -> tf.data.Dataset:
    def gen() -> Iterator[np.int64]:
        for i in range(n):
            yield np.int64(i)

    return tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec((), tf.int64))


def _checkpoints(logdir: Path) -> list[str]:
    """Paths of the checkpoints named in the state file, oldest first."""
    state = tf.train.get_checkpoint_state(str(logdir))
    assert state is not None
    return list(state.all_model_checkpoint_paths)


def _keys(path: str) -> set[str]:
    return {name for name, _ in tf.train.list_variables(path)}


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


# -- checkpoint_iterator ----------------------------------------------------------------


@pytest.mark.anyio
async def test_from_generator_trains_through_periodic_checkpoints(tmp_path: Path) -> None:
    """Auto: a from_generator pipeline is left out of checkpoints (logged once, with TF's
    reason) and training goes on through every periodic checkpoint to the end of data."""
    total = tf.Variable(0, dtype=tf.int64)
    # periodic saves by the checkpoint service, and synchronous ones at every 5th step
    # (never skipped as busy) through the same checkpointer
    saver = asv.CheckpointSaverHook(str(tmp_path), save_steps=5)
    sv = _supervisor(tmp_path, {"total": total}, save_model_steps=2, max_to_keep=20, hooks=[saver])
    seen: list[int] = []

    def step(batch: tf.Tensor) -> None:
        seen.append(int(batch))
        total.assign_add(batch)

    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            ran = await sess.run_loop(step, data=_generator_dataset(23))
    assert ran == 23 and seen == list(range(23))
    assert sess.stop_reason == "end_of_data"
    skipped = _events(logs, "checkpoint.iterator_skipped")
    assert len(skipped) == 1 and "PyFunc is stateful" in skipped[0]["reason"]
    assert skipped[0]["log_level"] == "warning"
    steps = [int(p.rsplit("-", 1)[1]) for p in _checkpoints(tmp_path)]
    assert {5, 10, 15, 20, 23} <= set(steps)
    for path in _checkpoints(tmp_path):
        assert ITERATOR_KEY not in _keys(path)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("py_function", "EagerPyFunc is stateful"),
        ("numpy_function", "PyFunc is stateful"),
        ("random_uniform", "RandomUniform is stateful"),
    ],
)
async def test_stateful_map_functions_are_left_out_before_the_first_step(
    tmp_path: Path, kind: str, reason: str
) -> None:
    """Auto: py_function, numpy_function and a stateful random op in a map are found
    before the first step (the skip is logged before it runs) and left out."""
    base = tf.data.Dataset.range(6)
    if kind == "py_function":
        data = base.map(lambda x: tf.py_function(lambda y: y + 1, [x], tf.int64))
    elif kind == "numpy_function":
        data = base.map(lambda x: tf.numpy_function(lambda y: y + 1, [x], tf.int64))
    else:
        data = base.map(lambda x: x + tf.cast(tf.random.uniform(()) < 2.0, tf.int64))
    sv = _supervisor(tmp_path, {"v": tf.Variable(0, dtype=tf.int64)}, save_model_steps=2)
    skips_seen_by_steps: list[int] = []

    def step(batch: tf.Tensor) -> None:
        skips_seen_by_steps.append(len(_events(logs, "checkpoint.iterator_skipped")))

    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            assert await sess.run_loop(step, data=data) == 6
    skipped = _events(logs, "checkpoint.iterator_skipped")
    assert len(skipped) == 1 and reason in skipped[0]["reason"]
    assert skips_seen_by_steps == [1] * 6  # logged before the first step
    assert all(ITERATOR_KEY not in _keys(p) for p in _checkpoints(tmp_path))


@pytest.mark.anyio
async def test_checkpoint_iterator_true_refuses_an_unserialisable_pipeline_before_the_first_step(
    tmp_path: Path,
) -> None:
    """``checkpoint_iterator=True`` with from_generator: a CheckpointError naming TF's
    reason and the option, before any step ran; the state is not suspect (the final
    checkpoint of the step before is taken)."""
    v = tf.Variable(0, dtype=tf.int64)
    sv = _supervisor(tmp_path, {"v": v})
    calls: list[Any] = []
    with pytest.raises(asv.CheckpointError, match=r"checkpoint_iterator=True.*PyFunc is stateful"):
        async with sv.managed_session() as sess:
            await sess.run(lambda: v.assign_add(1))
            await sess.run_loop(calls.append, data=_generator_dataset(5), checkpoint_iterator=True)
    assert calls == []
    assert sess.global_step == 1
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("-1")


@pytest.mark.anyio
async def test_checkpoint_iterator_true_refuses_data_that_is_not_a_dataset() -> None:
    """``checkpoint_iterator=True`` with a Python iterable: its position cannot be
    checkpointed, a CheckpointError before the first step."""
    sv = _supervisor(None, {"v": tf.Variable(0)})
    calls: list[Any] = []
    with pytest.raises(asv.CheckpointError, match=r"list, not a tf\.data\.Dataset"):
        async with sv.managed_session() as sess:
            await sess.run_loop(calls.append, data=[1, 2, 3], checkpoint_iterator=True)
    assert calls == []


@pytest.mark.anyio
async def test_checkpoint_iterator_true_keeps_a_serialisable_iterator(tmp_path: Path) -> None:
    """``checkpoint_iterator=True`` with a serialisable pipeline: its position is saved."""
    sv = _supervisor(tmp_path, {"v": tf.Variable(0)})
    async with sv.managed_session() as sess:
        assert await sess.run_loop(lambda b: None, data=tf.data.Dataset.range(4), checkpoint_iterator=True) == 4
    assert ITERATOR_KEY in _keys(tf.train.latest_checkpoint(str(tmp_path)))


@pytest.mark.anyio
async def test_an_external_state_policy_of_ignore_makes_a_generator_pipeline_checkpointed(tmp_path: Path) -> None:
    """A dataset whose options say ``experimental_external_state_policy=IGNORE`` serialises
    (TF leaves the generator's state out itself): auto and True keep its iterator."""
    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    data = _generator_dataset(4).with_options(options)
    sv = _supervisor(tmp_path, {"v": tf.Variable(0)})
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            assert await sess.run_loop(lambda b: None, data=data, checkpoint_iterator=True) == 4
    assert not _events(logs, "checkpoint.iterator_skipped")
    assert ITERATOR_KEY in _keys(tf.train.latest_checkpoint(str(tmp_path)))


@pytest.mark.anyio
async def test_checkpoint_iterator_false_restarts_the_data_on_resume(tmp_path: Path) -> None:
    """``checkpoint_iterator=False``: a serialisable iterator stays out of checkpoints,
    and a resumed run goes on from the saved step with the data from its start."""
    data = tf.data.Dataset.range(100)
    seen: list[int] = []
    for _ in range(2):
        v = tf.Variable(0, dtype=tf.int64)
        sv = _supervisor(tmp_path, {"v": v}, save_model_steps=2)
        async with sv.managed_session() as sess:
            await sess.run_loop(
                lambda b: seen.append(int(b)), data=data, max_steps=sess.global_step + 3, checkpoint_iterator=False
            )
        assert all(ITERATOR_KEY not in _keys(p) for p in _checkpoints(tmp_path))
    assert seen == [0, 1, 2, 0, 1, 2]
    assert sess.global_step == 6


@pytest.mark.anyio
async def test_auto_resumes_from_a_checkpoint_without_an_iterator(tmp_path: Path) -> None:
    """A checkpoint written with the iterator left out restores fine under auto, both for
    the same unserialisable pipeline and for a serialisable one: the step goes on, the
    data restarts (the serialisable one is then tracked again)."""
    v = tf.Variable(0, dtype=tf.int64)
    async with _supervisor(tmp_path, {"v": v}).managed_session() as sess:
        await sess.run_loop(lambda b: v.assign_add(b), data=_generator_dataset(4))
    assert sess.global_step == 4
    seen: list[int] = []
    for data in (_generator_dataset(3), tf.data.Dataset.range(2)):
        v = tf.Variable(0, dtype=tf.int64)
        async with _supervisor(tmp_path, {"v": v}).managed_session() as sess:
            start = sess.global_step
            await sess.run_loop(lambda b: seen.append(int(b)), data=data)
        assert sess.global_step == start + (3 if start == 4 else 2)
    assert seen == [0, 1, 2, 0, 1]
    assert sess.global_step == 9
    assert ITERATOR_KEY in _keys(tf.train.latest_checkpoint(str(tmp_path)))


@pytest.mark.anyio
async def test_a_changed_pipeline_is_a_clear_error_and_false_resumes_it(tmp_path: Path) -> None:
    """A checkpoint's iterator position that does not fit the pipeline given now (its
    definition changed) is a CheckpointError naming the checkpoint and
    ``checkpoint_iterator=False``, before any step; with False the run resumes, the data
    from its start."""
    v = tf.Variable(0, dtype=tf.int64)
    async with _supervisor(tmp_path, {"v": v}).managed_session() as sess:
        await sess.run_loop(lambda b: None, data=tf.data.Dataset.range(10).batch(2), max_steps=2)
    changed = tf.data.Dataset.range(10).shuffle(4, seed=1).batch(3)
    calls: list[Any] = []
    with pytest.raises(asv.CheckpointError, match=r"model\.ckpt-2.*checkpoint_iterator=False") as info:
        async with _supervisor(tmp_path, {"v": tf.Variable(0, dtype=tf.int64)}).managed_session() as sess:
            await sess.run_loop(calls.append, data=changed)
    assert calls == [] and "it was Range" in str(info.value) and "Shuffle" in str(info.value)
    seen: list[list[int]] = []
    async with _supervisor(tmp_path, {"v": tf.Variable(0, dtype=tf.int64)}).managed_session() as sess:
        assert sess.global_step == 2
        await sess.run_loop(
            lambda b: seen.append(b.numpy().tolist()), data=tf.data.Dataset.range(3).batch(3), checkpoint_iterator=False
        )
    assert seen == [[0, 1, 2]] and sess.global_step == 3


@pytest.mark.anyio
@pytest.mark.parametrize("value", ["yes", 1, 0, "auto"])
async def test_a_bad_checkpoint_iterator_is_a_value_error_naming_it(value: object) -> None:
    """``checkpoint_iterator`` accepts None, True and False only."""
    sv = _supervisor(None, {"v": tf.Variable(0)})
    with pytest.raises(ValueError, match="checkpoint_iterator"):
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda b: None, data=[1], checkpoint_iterator=value)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_the_iterator_share_of_a_checkpoint_is_logged_once(tmp_path: Path) -> None:
    """A shuffle buffer dominating the checkpoint: ``checkpoint.iterator_state`` is logged
    once per session, a warning, with the bytes the index gives the iterator."""
    images = np.random.default_rng(0).random((600, 16, 16, 3), dtype=np.float32)  # 1.5 MB buffered
    data = tf.data.Dataset.from_tensor_slices(images).shuffle(500, seed=1).batch(4).repeat()
    v = tf.Variable(tf.zeros((16, 16, 3)))
    # synchronous saves at 3, 6, 9 (through the session's checkpointer), then the final one
    saver = asv.CheckpointSaverHook(str(tmp_path), save_steps=3)
    sv = _supervisor(tmp_path, {"v": v}, max_to_keep=10, hooks=[saver])
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda b: v.assign(tf.reduce_mean(b, 0)), data=data, max_steps=10)
    from asupervisor._checkpoint.snapshot._iterator_state import entry_sizes

    reports = _events(logs, "checkpoint.iterator_state")
    assert len(reports) == 1, reports
    report = reports[0]
    assert report["log_level"] == "warning" and report["share"] > 0.9
    sizes = entry_sizes(report["path"])
    assert report["bytes"] == sizes[ITERATOR_KEY]
    assert report["checkpoint_bytes"] == sum(sizes.values())
    assert len([p for p in _checkpoints(tmp_path) if ITERATOR_KEY in _keys(p)]) >= 3


@pytest.mark.anyio
async def test_a_small_iterator_share_is_information(tmp_path: Path) -> None:
    """A small iterator (a few hundred bytes) in a tiny model's checkpoint is reported as
    information, not a warning, whatever its share."""
    sv = _supervisor(tmp_path, {"v": tf.Variable(0, dtype=tf.int64)})
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda b: None, data=tf.data.Dataset.range(5))
    (report,) = _events(logs, "checkpoint.iterator_state")
    assert report["log_level"] == "info" and report["bytes"] < 4096


def test_entry_sizes_reads_every_key_of_a_plain_tf_checkpoint(tmp_path: Path) -> None:
    """The index reader gives every key of a checkpoint written by plain TF, with the
    byte sizes of its values."""
    from asupervisor._checkpoint.snapshot._iterator_state import entry_sizes

    ckpt = tf.train.Checkpoint(a=tf.Variable(tf.zeros((10, 3))), b=tf.Variable(1, dtype=tf.int64))
    path = ckpt.save(str(tmp_path / "c"))
    sizes = entry_sizes(path)
    assert set(sizes) == _keys(path)
    assert sizes["a/.ATTRIBUTES/VARIABLE_VALUE"] == 120
    assert sizes["b/.ATTRIBUTES/VARIABLE_VALUE"] == 8


# -- run_loop's return value ----------------------------------------------------------


@pytest.mark.anyio
async def test_run_loop_returns_its_count_when_another_thread_requests_a_stop() -> None:
    """A ``request_stop()`` from a plain thread ends ``run_loop`` at the next boundary and
    it returns its count; the body's next await is cancelled."""
    sv = _supervisor(None, {"v": tf.Variable(0)})
    reached, released = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def step() -> None:
        if sv.global_step == 4:  # the 5th step waits for the stop request
            reached.set()
            assert released.wait(scaled(30))

    def stopper(sess: Any) -> None:
        assert reached.wait(scaled(30))
        sess.request_stop()
        released.set()

    async with sv.managed_session() as sess:
        thread = threading.Thread(target=stopper, args=(sess,))
        thread.start()
        try:
            result["ran"] = await sess.run_loop(step)
            await anyio.sleep(0)
            result["after"] = True  # not reached: stopping is cancellation
        finally:
            with anyio.CancelScope(shield=True):  # the stop has cancelled the body: join all the same
                await anyio.to_thread.run_sync(thread.join)
    assert not thread.is_alive()
    assert result == {"ran": 5}
    assert sess.global_step == 5 and sess.stop_reason == "requested"


@pytest.mark.anyio
async def test_run_loop_returns_its_count_when_a_hook_requests_a_stop() -> None:
    """``run_context.request_stop()`` in a hook: ``run_loop`` returns the steps it ran."""

    class StopAt3(asv.SessionRunHook):
        def after_run(self, run_context: Any, run_values: Any) -> None:
            if run_values.global_step == 3:
                run_context.request_stop()

    sv = _supervisor(None, {"v": tf.Variable(0)}, hooks=[StopAt3()])
    result: dict[str, int] = {}
    async with sv.managed_session() as sess:
        result["ran"] = await sess.run_loop(lambda: None)
    assert result == {"ran": 3} and sess.stop_reason == "hook"


@pytest.mark.anyio
async def test_run_loop_returns_its_count_when_a_task_on_the_loop_requests_a_stop() -> None:
    """A ``request_stop()`` from another task on the event loop (the stop cancels the scope
    at once): ``run_loop`` still returns its count."""
    sv = _supervisor(None, {"v": tf.Variable(0)})
    reached, released = threading.Event(), threading.Event()
    result: dict[str, int] = {}

    def step() -> None:
        if sv.global_step == 3:
            reached.set()
            assert released.wait(scaled(30))

    async def stopper(sess: Any) -> None:
        assert await anyio.to_thread.run_sync(reached.wait, 30)
        sess.request_stop()
        released.set()

    async with sv.managed_session() as sess:
        async with anyio.create_task_group() as tg:
            tg.start_soon(stopper, sess)
            result["ran"] = await sess.run_loop(step)
    assert result == {"ran": 4} and sess.stop_reason == "requested"


@pytest.mark.anyio
async def test_a_scope_around_run_loop_still_cancels_it() -> None:
    """A cancel scope around one ``run_loop`` (not a stop) still ends only that call by
    cancellation; the session goes on."""
    sv = _supervisor(None, {"v": tf.Variable(0)})
    reached = threading.Event()

    def step() -> None:
        reached.set()

    async with sv.managed_session() as sess:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel() -> None:
                    await anyio.to_thread.run_sync(reached.wait, 30)
                    scope.cancel()

                tg.start_soon(cancel)
                await sess.run_loop(step)
                pytest.fail("run_loop returned instead of being cancelled")
        assert scope.cancelled_caught and not sess.should_stop()
        assert await sess.run_loop(step, max_steps=sess.global_step + 2) == 2


# -- request_stop after the session ------------------------------------------------------


@pytest.mark.anyio
async def test_request_stop_after_the_session_does_nothing() -> None:
    """After the session: ``request_stop()`` from the loop and from another thread, on the
    session and on the supervisor, does nothing and never raises (TF1's Coordinator)."""
    sv = _supervisor(None, {"v": tf.Variable(0)})
    async with sv.managed_session() as sess:
        pass
    sess.request_stop()
    sess.request_stop(ValueError("late"))
    sv.request_stop()
    await anyio.to_thread.run_sync(sess.request_stop)
    await anyio.to_thread.run_sync(sv.request_stop)
    assert sess.stop_reason == "completed"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_request_stop_after_the_event_loop_finished_does_nothing(backend: str) -> None:
    """Once ``anyio.run`` has returned (its loop closed), ``request_stop()`` from any
    thread does nothing (an app's shutdown handler calling it must not fail)."""
    sv = _supervisor(None, {"v": tf.Variable(0)})
    box: list[Any] = []

    async def main() -> None:
        async with sv.managed_session() as sess:
            box.append(sess)

    anyio.run(main, backend=backend)
    sess = box[0]
    errors: list[BaseException] = []

    def late() -> None:
        try:
            sess.request_stop()
            sv.request_stop()
        except BaseException as exc:  # the test reports it
            errors.append(exc)

    thread = threading.Thread(target=late)
    thread.start()
    thread.join()
    late()
    assert errors == []


# -- bad inputs -------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("data", [5, 2.5, object()])
async def test_data_that_is_not_iterable_is_a_type_error_naming_data(data: object) -> None:
    """``data=5``: a TypeError naming ``data`` and the value's type, before any step."""
    sv = _supervisor(None, {"v": tf.Variable(0)})
    with pytest.raises(TypeError, match=rf"data must be an iterable.*got {type(data).__name__}"):
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda b: None, data=data)  # type: ignore[arg-type]
    assert sess.global_step == 0


@pytest.mark.anyio
async def test_a_step_that_is_not_callable_is_refused_and_nothing_is_lost(tmp_path: Path) -> None:
    """``sess.run(5)``, ``sess.run_loop(5)`` and ``sess.run_step_fn(5)``: a TypeError naming
    the value before anything runs; the session goes on, and its final checkpoint is written
    (a bad argument is not a failed step whose state would be suspect)."""
    v = tf.Variable(0)
    sv = _supervisor(tmp_path, {"v": v})
    async with sv.managed_session() as sess:
        await sess.run(lambda: v.assign_add(1))
        for call in (sess.run, sess.run_loop, sess.run_step_fn):
            with pytest.raises(TypeError, match="must be callable, got 5"):
                await call(5)  # type: ignore[operator]
        assert not sess.should_stop()
        await sess.run(lambda: v.assign_add(1))
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("-2")


@pytest.mark.parametrize(
    ("state", "named"),
    [
        ({"model": tf.Variable(1.0), "ids": [1, 2, 3]}, r"state\['ids'\]\[0\]"),
        ({"hparams": {"lr": 0.1}}, r"state\['hparams'\]\['lr'\]"),
        ({"pair": (tf.Variable(1), "x")}, r"state\['pair'\]\[1\]"),
        ({"lr": 0.1}, r"state\['lr'\]"),
        ({"data": tf.data.Dataset.range(3)}, r"state\['data'\] is a tf.data.Dataset"),
    ],
)
def test_state_values_a_checkpoint_would_not_save_are_refused(state: dict[str, Any], named: str) -> None:
    """A state dict holding a plain Python value (TF drops it from lists and dicts without
    a word) or a Dataset is a TypeError naming the key, in Supervisor and SessionManager."""
    with pytest.raises(TypeError, match=named):
        asv.Supervisor(None, state=state)
    with pytest.raises(TypeError, match=named):
        asv.SessionManager(state=state)


def test_a_checkpoint_state_holding_a_list_of_ints_is_refused() -> None:
    """A ``tf.train.Checkpoint`` given as state is checked the same way."""
    with pytest.raises(TypeError, match=r"state\['ids'\]"):
        asv.Supervisor(None, state=tf.train.Checkpoint(v=tf.Variable(1), ids=[1, 2]))


def test_state_of_trackables_is_accepted() -> None:
    """Variables, Keras models, optimizers and variables, generators, lists and dicts of
    variables and empty containers stay accepted."""
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    state = {
        "model": model,
        "optimizer": keras.optimizers.Adam(),
        "kvar": keras.Variable(1.0),
        "v": tf.Variable(1),
        "vs": [tf.Variable(2), {"w": tf.Variable(3)}],
        "gen": tf.random.Generator.from_seed(1),
        "module": tf.Module(),
        "empty": [],
    }
    asv.Supervisor(None, state=state)
    asv.SessionManager(state=state)
    asv.Supervisor(None, state=tf.train.Checkpoint(model=model, vs=[tf.Variable(1)]))
