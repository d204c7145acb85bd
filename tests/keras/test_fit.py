"""``sess.fit(model, data, epochs=, validation_data=, callbacks=)``: a compiled Keras model
trained with its own steps; history, TensorBoard runs, callbacks, refusals; bitwise resume
after SIGKILLs at seeded random moments; the same accuracy as Keras's ``fit`` with
``BackupAndRestore``; the best checkpoint by ``val_loss`` kept."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from _timing import scaled
from eventfiles import read_events
from fit_helpers import supervisor

import asupervisor as asv

SCRIPT = Path(__file__).parent / "scripts" / "digits_fit.py"


def _data(n: int = 256) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=0).batch(32)
    val = tf.data.Dataset.from_tensor_slices((x[:64], y[:64])).batch(64)
    return train, val


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


@pytest.mark.anyio
async def test_fit_trains_with_the_compiled_steps_and_returns_keras_history(tmp_path: Path) -> None:
    model = _model()
    train, val = _data()
    sv = supervisor(tmp_path, model)
    async with sv.managed_session() as sess:
        history = await sess.fit(model, train, epochs=3, validation_data=val)
    assert sorted(history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert all(len(values) == 3 for values in history.values())
    assert history["loss"][-1] < history["loss"][0] and history["val_accuracy"][-1] > 0.8
    status = sv.status()
    assert (status.stop_reason, status.epoch, status.global_step, asv.exit_code(status)) == ("epochs", 3, 24, 0)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-24")
    # TensorBoard: epoch_* scalars per epoch in the train/ and validation/ runs, as Keras writes them
    for run, prefix in (("train", ""), ("validation", "val_")):
        events = read_events(tmp_path / run)
        assert [step for step, _ in events["epoch_loss"]] == [0, 1, 2]
        assert [v for _, v in events["epoch_accuracy"]] == pytest.approx(history[f"{prefix}accuracy"])


@pytest.mark.anyio
async def test_early_stopping_stops_the_session_cleanly(tmp_path: Path) -> None:
    model = _model()
    train, _ = _data()
    sv = supervisor(tmp_path, model)
    stopper = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)  # never improves enough
    async with sv.managed_session() as sess:
        history = await sess.fit(model, data=train, epochs=10, callbacks=[stopper])  # DESIGN's name
    assert len(history["loss"]) == 2
    assert (sv.status().stop_reason, sv.status().epoch, asv.exit_code(sv.status())) == ("stop_training", 2, 0)


@pytest.mark.anyio
async def test_reduce_lr_on_plateau_changes_the_checkpointed_learning_rate(tmp_path: Path) -> None:
    model = _model()
    train, val = _data()
    sv = supervisor(tmp_path, model)
    reduce = keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, min_delta=10.0, factor=0.5)
    async with sv.managed_session() as sess:
        await sess.fit(model, train, epochs=3, validation_data=val, callbacks=[reduce])
    assert float(model.optimizer.learning_rate) == pytest.approx(0.05 * 0.5**2)
    restored = _model()
    sv = supervisor(tmp_path, restored)
    async with sv.managed_session() as sess:  # the finished run: nothing more to train
        await sess.fit(restored, train, epochs=3)
    assert float(restored.optimizer.learning_rate) == pytest.approx(0.05 * 0.5**2)


@pytest.mark.anyio
async def test_bad_arguments_are_refused_before_any_step(tmp_path: Path) -> None:
    model = _model()
    train, _ = _data()
    sv = supervisor(tmp_path, model)
    async with sv.managed_session() as sess:
        with pytest.raises(ValueError, match="remove BackupAndRestore"):
            await sess.fit(model, train, epochs=1, callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "b"))])
        with pytest.raises(ValueError, match="epochs must be an int >= 0, got 'two'"):
            await sess.fit(model, train, epochs="two")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="trains a Keras model"):
            await sess.fit(object(), train, epochs=1)
        uncompiled = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        with pytest.raises(ValueError, match="needs a compiled model"):
            await sess.fit(uncompiled, train, epochs=1)
        other = _model()
        with pytest.raises(ValueError, match=r"not in the supervisor's state.*state=\{'model': model\}"):
            await sess.fit(other, train, epochs=1)
        assert sv.global_step == 0


@pytest.mark.anyio
async def test_keep_best_keeps_the_epoch_end_checkpoint_with_the_best_val_loss(tmp_path: Path) -> None:
    """The checkpoints at each epoch's end carry that epoch's val_loss (the ones between
    carry none). "Best" here is the highest val_loss (mode="max"), which this training
    has after its first epoch, so that the kept one is not simply a recent one."""
    model = _model()
    train, val = _data()
    policy = asv.AnyKeepPolicy(asv.LatestN(1), asv.KeepBest("val_loss", mode="max"))
    sv = supervisor(tmp_path, model, keep_policy=policy, save_model_steps=3)
    async with sv.managed_session() as sess:
        history = await sess.fit(model, train, epochs=6, validation_data=val)
    assert int(np.argmax(history["val_loss"])) == 0  # 8 steps per epoch: the checkpoint at step 8
    kept = sorted(int(p.name.split("-")[1].split(".")[0]) for p in tmp_path.glob("model.ckpt-*.index"))
    assert kept == [8, 48]


@pytest.mark.anyio
async def test_epoch_end_checkpoints_resume_the_shuffled_data_bitwise_and_free_ended_iterators_off_the_step_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint after each validated epoch holds the next pass's iterator: one epoch
    and a resume to three end bitwise where three in one session end (the shuffle's next
    orders included; each session has its own dataset, as a restarted process has). The
    ended passes' iterators, which that checkpoint's remembered object walk holds until
    the next save, are destroyed on ``asv-release``, never on the step thread during the
    fit; none outlives its session (the checkpoint object, in reference cycles, would
    keep the last until a garbage collection, on the next session's step thread).
    (``__iter__`` is wrapped only to see where each training iterator dies.)"""
    destroyed: list[str] = []  # the threads this session's iterators died on
    made: list[weakref.ref[Any]] = []
    trains: list[tf.data.Dataset] = []
    make = type(_data()[0]).__iter__

    def watched(dataset: tf.data.Dataset) -> Any:
        iterator = make(dataset)
        if trains and dataset is trains[-1]:
            died = destroyed  # (this session's list, not the next's)
            weakref.finalize(iterator, lambda: died.append(threading.current_thread().name))
            made.append(weakref.ref(iterator))
        return iterator

    monkeypatch.setattr(type(_data()[0]), "__iter__", watched)

    async def fit(logdir: Path, epochs: int) -> list[np.ndarray]:
        nonlocal destroyed
        destroyed = []
        model = _model()
        train, val = _data()
        trains.append(train)
        sv = supervisor(logdir, model, save_model_secs=3600)
        async with sv.managed_session() as sess:
            await sess.fit(model, train, epochs=epochs, validation_data=val, verbose=0)
            assert "asv-step" not in destroyed
        assert all(ref() is None for ref in made), "an iterator outlived its session"
        return [np.asarray(w) for w in model.weights]

    uninterrupted = await fit(tmp_path / "a", 3)
    assert "asv-release" in destroyed  # (those still held by the walk at the stop go then)
    await fit(tmp_path / "b", 1)
    resumed = await fit(tmp_path / "b", 3)
    assert all(np.array_equal(a, b) for a, b in zip(uninterrupted, resumed, strict=True))


def _command(logdir: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), str(logdir), str(out), *extra]


def _run(logdir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_command(logdir, out, *extra), capture_output=True, text=True, timeout=scaled(300))


def _load(out: Path) -> tuple[list[np.ndarray], dict[str, list[float]]]:
    with np.load(out) as data:
        history = json.loads(str(data["history"]))
        return [data[k] for k in data.files if k != "history"], history


@pytest.mark.timeout(300)  # five trainings in child processes (~10 s each on 2 busy cores)
def test_a_fit_killed_at_random_moments_resumes_bitwise_and_matches_keras(tmp_path: Path) -> None:
    """SIGKILL at 2 seeded random steps of a 3-epoch Dropout model (24 steps per epoch,
    checkpoints every 5 steps and at each validated epoch's end): the final weights equal
    an uninterrupted run's bit for bit, and so do the last epoch's metrics. The
    uninterrupted run reaches the validation accuracy of Keras's own ``fit`` with
    ``BackupAndRestore`` on the same data (within noise)."""
    # Keras's own run goes beside the uninterrupted one: it shares nothing with it.
    with subprocess.Popen(
        _command(tmp_path / "k", tmp_path / "k.npz", "--keras"), stderr=subprocess.PIPE, text=True
    ) as keras_run:
        done = _run(tmp_path / "a", tmp_path / "a.npz")
        _, keras_stderr = keras_run.communicate(timeout=scaled(300))
    assert done.returncode == 0, done.stderr[-3000:]
    assert keras_run.returncode == 0, keras_stderr[-3000:]
    kills = sorted(random.Random(1234).sample(range(2, 72), 2))
    for step in kills:
        killed = _run(tmp_path / "b", tmp_path / "b.npz", "--kill-at", str(step))
        assert killed.returncode == -9, (step, killed.stderr[-3000:])
    resumed = _run(tmp_path / "b", tmp_path / "b.npz")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (a, history_a), (b, history_b) = _load(tmp_path / "a.npz"), _load(tmp_path / "b.npz")
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)), f"kills at {kills}"
    assert {k: v[-1] for k, v in history_b.items()} == {k: v[-1] for k, v in history_a.items()}
    _, keras_history = _load(tmp_path / "k.npz")
    assert len(history_a["loss"]) == len(keras_history["loss"]) == 3
    assert abs(history_a["val_accuracy"][-1] - keras_history["val_accuracy"][-1]) < 0.05
