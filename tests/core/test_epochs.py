"""``run_loop(fn, data, epochs=N, on_epoch_end=cb)``: passes over the data, the epoch in
checkpoints (resume mid-epoch and at an epoch boundary), ``status()``'s epoch fields, the
progress line, and bad arguments refused before anything runs."""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

import anyio
import pytest
import tensorflow as tf
from _backends import in_turn

import asupervisor as asv
from asupervisor._progress._part import render

pytestmark = pytest.mark.anyio


def _supervisor(logdir: Path | None, state: Any, **kwargs: Any) -> asv.Supervisor:
    kwargs.setdefault("save_summaries_secs", 0)
    kwargs.setdefault("save_model_secs", 0)
    return asv.Supervisor(logdir, state=state, handle_signals=False, **kwargs)


def _dataset() -> tf.data.Dataset:
    """10 elements in batches of 3: 4 steps per epoch (the last batch short)."""
    return tf.data.Dataset.range(10).batch(3)


async def _train(
    logdir: Path | None, epochs: int, *, max_steps: int | None = None, **kwargs: Any
) -> tuple[list[list[int]], list[tuple[int, int]], asv.Supervisor]:
    """Run ``epochs`` over :func:`_dataset`; the batches seen, the ``on_epoch_end`` calls
    ``(epoch, global step)``, and the supervisor."""
    seen: list[list[int]] = []
    ends: list[tuple[int, int]] = []
    total = tf.Variable(0, dtype=tf.int64)
    sv = _supervisor(logdir, {"total": total}, save_model_steps=1, **kwargs)

    def step(batch: tf.Tensor) -> dict[str, tf.Tensor]:
        total.assign_add(tf.reduce_sum(batch))
        seen.append(batch.numpy().tolist())
        return {"total": total}

    async with sv.managed_session() as sess:
        await sess.run_loop(
            step,
            data=_dataset(),
            epochs=epochs,
            max_steps=max_steps,
            on_epoch_end=lambda e: ends.append((e, sv.global_step)),
        )
    return seen, ends, sv


async def test_epochs_are_passes_over_the_data_and_completing_them_is_a_clean_stop(tmp_path: Path) -> None:
    seen, ends, sv = await _train(tmp_path, 3)
    one_pass = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert seen == one_pass * 3
    assert ends == [(0, 4), (1, 8), (2, 12)]  # after each pass, before the next: 0-based, as Keras counts
    status = sv.status()
    assert (status.stop_reason, status.global_step) == ("epochs", 12)
    assert (status.epoch, status.epoch_step, status.steps_per_epoch) == (3, 0, 4)
    assert asv.exit_code(status) == 0


async def test_without_a_logdir_epochs_still_count(tmp_path: Path) -> None:
    seen, ends, sv = await _train(None, 2)
    assert len(seen) == 8 and [e for e, _ in ends] == [0, 1] and sv.status().epoch == 2


@pytest.mark.parametrize(("anyio_backend", "first_steps"), in_turn([2, 4, 5, 8]))
async def test_a_resumed_run_goes_on_from_the_epoch_and_the_step_it_reached(tmp_path: Path, first_steps: int) -> None:
    """Mid-epoch (2, 5), at the last batch of an epoch (4, 8): the resumed run sees exactly
    the rest of the uninterrupted run's batches and stops after the same epoch."""
    uninterrupted, ends, _ = await _train(tmp_path / "a", 3)
    first, first_ends, sv = await _train(tmp_path / "b", 3, max_steps=first_steps)
    assert sv.status().stop_reason == "max_steps"
    rest, rest_ends, sv = await _train(tmp_path / "b", 3)
    assert first + rest == uninterrupted
    assert first_ends + rest_ends == ends
    assert (sv.status().stop_reason, sv.global_step, sv.status().epoch) == ("epochs", 12, 3)


async def test_a_finished_run_given_more_epochs_trains_them_and_one_given_the_same_stops_at_once(
    tmp_path: Path,
) -> None:
    await _train(tmp_path, 2)
    again, ends, sv = await _train(tmp_path, 2)
    assert (again, ends, sv.status().stop_reason) == ([], [], "epochs")
    more, ends, sv = await _train(tmp_path, 3)
    assert more == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]] and ends == [(2, 12)]


async def test_status_and_progress_show_the_epoch_while_it_runs(tmp_path: Path) -> None:
    sv = _supervisor(tmp_path, {"v": tf.Variable(0)})
    shown: list[tuple[Any, ...]] = []

    def step(batch: tf.Tensor) -> None:
        status = sv.status()
        shown.append((status.epoch, status.epochs, status.epoch_step))
        if len(shown) == 6:
            shown.append(("line", render(status)))

    async with sv.managed_session() as sess:
        await sess.run_loop(step, data=_dataset(), epochs=2)
    assert shown[:6] == [(0, 2, 0), (0, 2, 1), (0, 2, 2), (0, 2, 3), (1, 2, 0), (1, 2, 1)]
    assert shown[6][1].startswith("epoch 2/2  step 5  (1/4)")


async def test_a_list_is_iterated_again_each_epoch_and_empty_data_ends_without_looping(tmp_path: Path) -> None:
    sv = _supervisor(tmp_path, {"v": tf.Variable(0)})
    seen: list[int] = []
    async with sv.managed_session() as sess:
        assert await sess.run_loop(seen.append, data=[1, 2], epochs=3) == 6
    assert seen == [1, 2] * 3
    sv = _supervisor(tmp_path / "empty", {"v": tf.Variable(0)})
    async with sv.managed_session() as sess:
        assert await sess.run_loop(seen.append, data=tf.data.Dataset.range(0), epochs=5) == 0
    assert sv.status().stop_reason == "end_of_data"


async def test_an_error_in_on_epoch_end_stops_the_session_and_propagates(tmp_path: Path) -> None:
    def bad(epoch: int) -> None:
        raise RuntimeError(f"validation failed after epoch {epoch}")

    sv = _supervisor(tmp_path, {"v": tf.Variable(0)})
    with pytest.raises(RuntimeError, match="after epoch 0"):
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda batch: None, data=_dataset(), epochs=3, on_epoch_end=bad)
    assert sv.global_step == 4


async def test_a_stop_requested_in_on_epoch_end_ends_the_loop_there(tmp_path: Path) -> None:
    sv = _supervisor(tmp_path, {"v": tf.Variable(0)})
    async with sv.managed_session() as sess:
        n = await sess.run_loop(
            lambda batch: None, data=_dataset(), epochs=5, on_epoch_end=lambda e: sess.request_stop()
        )
    assert n == 4 and sv.status().epoch == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"epochs": -1}, ValueError, "epochs must be an int >= 0 or None, got -1"),
        ({"epochs": True}, ValueError, "got True"),
        ({"epochs": 2, "data": None}, ValueError, "epochs needs data"),
        ({"epochs": 2, "data": iter([1, 2])}, TypeError, "list_iterator is an iterator"),
        ({"on_epoch_end": print}, ValueError, "on_epoch_end needs epochs=N"),
        ({"epochs": 2, "on_epoch_end": 3}, TypeError, "on_epoch_end must be callable, got 3"),
    ],
)
async def test_bad_epoch_arguments_are_refused_before_anything_runs(
    kwargs: dict[str, Any], error: type, match: str
) -> None:
    sv = _supervisor(None, {"v": tf.Variable(0)})
    kwargs.setdefault("data", [1, 2])
    async with sv.managed_session() as sess:
        with pytest.raises(error, match=match):
            await sess.run_loop(lambda batch: None, **kwargs)
        assert sv.global_step == 0 and not sess.should_stop()
        await anyio.lowlevel.checkpoint()


async def test_an_aborted_step_recovers_from_a_checkpoint_older_than_the_epoch_state(tmp_path: Path) -> None:
    """The start-up checkpoint is taken before run_loop attaches the epoch position: a
    recovery restore of it (an AbortedError) is not "another model", and the epochs
    complete from the restored step."""
    failed: list[int] = []
    v = tf.Variable(0, dtype=tf.int64)
    sv = _supervisor(tmp_path, {"v": v}, save_model_steps=1000)

    def step(batch: tf.Tensor) -> None:
        if sv.global_step == 5 and not failed:
            failed.append(sv.global_step)
            raise tf.errors.AbortedError(None, None, "a peer restarted")
        v.assign_add(tf.reduce_sum(batch))

    async with sv.managed_session() as sess:
        await sess.run_loop(step, data=_dataset(), epochs=2)
    assert failed == [5]
    assert (sv.status().stop_reason, sv.global_step, sv.status().epoch) == ("epochs", 8, 2)
    assert int(v.numpy()) == 2 * 45


async def test_an_ended_pass_iterator_is_destroyed_off_the_step_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Destroying a tf.data iterator may wait for its background work (hundreds of ms on
    a loaded machine): each ended pass's iterator is let go on ``asv-release``, not on the
    step thread, once nothing else holds it; the two left at the end (the last pass's, the
    next pass's) go at the stop; ``asv-release`` is joined with the session. (The
    dataset's ``__iter__`` is wrapped only to see where each iterator it makes dies.)"""
    destroyed: list[str] = []
    data = tf.data.Dataset.range(40).shuffle(40, seed=0).batch(8)
    make = type(data).__iter__

    def watched(dataset: tf.data.Dataset) -> Any:
        iterator = make(dataset)
        weakref.finalize(iterator, lambda: destroyed.append(threading.current_thread().name))
        return iterator

    monkeypatch.setattr(type(data), "__iter__", watched)
    sv = _supervisor(None, {"v": tf.Variable(0)})
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda batch: None, data=data, epochs=4)
        during = list(destroyed)
    assert "asv-step" not in during
    # passes 0-2's off the step thread (pass 3's was still in the loop's hands at its end)
    assert sorted(destroyed) == ["asv-release"] * 3 + ["asv-step"] * 2
    assert not any(t.name == "asv-release" for t in threading.enumerate())


async def test_summaries_carry_the_epoch(tmp_path: Path) -> None:
    """The summary writer's last tick at the stop writes ``epoch`` (passes completed)."""
    from eventfiles import read_events

    sv = _supervisor(tmp_path, {"v": tf.Variable(0)}, save_summaries_secs=3600)
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda batch: {"size": tf.size(batch)}, data=_dataset(), epochs=2)
    events = read_events(tmp_path)
    assert events["epoch"] == [(8, 2.0)]
