"""``sess.fit`` takes what ``model.fit`` takes: arrays (dicts for several inputs) with
``batch_size``, ``shuffle``, ``validation_split``, ``class_weight``, ``sample_weight`` and a
``(x_val, y_val)`` tuple, ending bitwise where ``model.fit`` ends; a ``PyDataset``; a
generator with ``steps_per_epoch``; what it cannot take refused at the call. Also: two
``fit`` calls in one session, ``learning_rate`` in the history, ``on_test_*`` callbacks,
Keras's progress output, callbacks' state saved and restored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from _timing import scaled
from fit_helpers import supervisor


def _arrays(n: int = 200) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(0)
    x = {"a": rng.normal(size=(n, 4)).astype("float32"), "b": rng.normal(size=(n, 3)).astype("float32")}
    y = ((x["a"][:, 0] + x["b"][:, 1]) > 0.3).astype("int64")
    return x, y


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    model = keras.Model({"a": a, "b": b}, keras.layers.Dense(2)(keras.layers.Dropout(0.2)(hidden)))
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _values(model: keras.Model) -> list[np.ndarray]:
    return [np.asarray(v) for v in (*model.weights, *model.optimizer.variables)]


@pytest.mark.anyio
async def test_arrays_train_bitwise_as_model_fit_does(tmp_path: Path) -> None:
    """Dict inputs, batch_size 16 (a partial last batch), shuffled, validation_split,
    class_weight: weights, optimizer state and history equal model.fit's bit for bit."""
    x, y = _arrays()
    kwargs: dict[str, Any] = {"batch_size": 16, "epochs": 3, "validation_split": 0.2, "class_weight": {0: 1.0, 1: 2.5}}
    expected = _model()
    keras_history = expected.fit(x, y, verbose=0, **kwargs).history
    model = _model()
    sv = supervisor(tmp_path, model)
    async with sv.managed_session() as sess:
        history = await sess.fit(model, x, y, verbose=0, **kwargs)
    assert history == keras_history and len(history["val_loss"]) == 3
    assert all(np.array_equal(a, b) for a, b in zip(_values(model), _values(expected), strict=True))
    assert sv.status().global_step == 3 * 10  # 160 training samples in batches of 16


@pytest.mark.anyio
async def test_validation_data_tuple_and_sample_weight_unshuffled(tmp_path: Path) -> None:
    x, y = _arrays()
    weights = np.linspace(0.5, 1.5, len(y)).astype("float32")
    val = ({"a": x["a"][:40], "b": x["b"][:40]}, y[:40])
    kwargs: dict[str, Any] = {
        "batch_size": 32,
        "epochs": 2,
        "shuffle": False,
        "validation_data": val,
        "sample_weight": weights,
    }
    expected = _model()
    keras_history = expected.fit(x, y, verbose=0, **kwargs).history
    model = _model()
    async with supervisor(tmp_path, model).managed_session() as sess:
        history = await sess.fit(model, x, y, verbose=0, **kwargs)
    assert history == keras_history
    assert all(np.array_equal(a, b) for a, b in zip(_values(model), _values(expected), strict=True))


class _Digits(keras.utils.PyDataset):
    """Eight batches of 25; counts its epoch ends."""

    def __init__(self) -> None:
        super().__init__()
        self.x, self.y = _arrays()
        self.ends = 0

    @property
    def num_batches(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        s = slice(25 * i, 25 * (i + 1))
        return {"a": self.x["a"][s], "b": self.x["b"][s]}, self.y[s]

    def on_epoch_end(self) -> None:
        self.ends += 1


class _Counting(keras.callbacks.Callback):
    """Counts test batches and epochs; its count takes part in checkpoints."""

    def __init__(self) -> None:
        super().__init__()
        self.test_batches = 0
        self.epochs_seen = 0

    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        self.test_batches += 1

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.epochs_seen += 1

    def get_state(self) -> dict[str, int]:
        return {"epochs_seen": self.epochs_seen}

    def set_state(self, state: dict[str, int]) -> None:
        self.epochs_seen = state["epochs_seen"]


@pytest.mark.anyio
async def test_two_fits_in_a_session_with_callbacks_and_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PyDataset (its on_epoch_end called), a second fit going on to epoch 3 with the
    code after it run, learning_rate in the history, on_test_* callbacks called during
    validation, Keras's per-epoch line with verbose=2; then a new session restores the
    callbacks' state."""
    model = _model()
    data = _Digits()
    x, y = _arrays()
    counting = _Counting()
    reduce = keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, min_delta=10.0, factor=0.5)
    sv = supervisor(tmp_path, model)
    after = []
    async with sv.managed_session() as sess:
        first = await sess.fit(model, data, epochs=1, verbose=0, callbacks=[counting, reduce])
        second = await sess.fit(
            model,
            data,
            epochs=3,
            verbose=2,
            validation_data=(x, y),
            validation_batch_size=100,
            callbacks=[counting, reduce],
        )
        after.append(sv.status().epoch)
    assert after == [3] and data.ends == 3
    assert (sv.status().stop_reason, sv.status().global_step) == ("epochs", 24)
    assert len(first["loss"]) == 1 and len(second["loss"]) == 2
    # the second fit's on_train_begin reset ReduceLROnPlateau (as model.fit's does): it
    # improves at epoch 1, then cuts the rate at the end of epoch 2 (logged before the cut)
    assert second["learning_rate"] == pytest.approx([0.01, 0.01])
    assert float(model.optimizer.learning_rate) == pytest.approx(0.005)
    assert counting.test_batches == 2 * 2  # two validations of 200 samples in batches of 100
    out = capsys.readouterr().out
    assert "Epoch 2/3" in out and "Epoch 3/3" in out and "val_loss" in out and out.count("8/8") == 2

    restored, counting2 = _model(), _Counting()
    reduce2 = keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, min_delta=10.0, factor=0.5)
    async with supervisor(tmp_path, restored).managed_session() as sess:
        history = await sess.fit(restored, _Digits(), epochs=4, verbose=0, callbacks=[counting2, reduce2])
    assert counting2.epochs_seen == 4  # 3 restored
    assert history["learning_rate"] == pytest.approx([0.005])  # restored: no improvement again, a cut
    assert float(restored.optimizer.learning_rate) == pytest.approx(0.0025)


@pytest.mark.anyio
async def test_a_generator_with_steps_per_epoch(tmp_path: Path) -> None:
    x, y = _arrays()

    def batches() -> Any:
        while True:
            for i in range(0, 200, 50):
                yield {"a": x["a"][i : i + 50], "b": x["b"][i : i + 50]}, y[i : i + 50]

    model = _model()
    sv = supervisor(tmp_path, model)
    async with sv.managed_session() as sess:
        history = await sess.fit(model, batches(), epochs=2, steps_per_epoch=3, verbose=0)
    assert len(history["loss"]) == 2
    assert (sv.status().global_step, sv.status().stop_reason, sv.status().steps_per_epoch) == (6, "epochs", 3)


@pytest.mark.anyio
async def test_what_fit_cannot_take_is_refused_naming_it(tmp_path: Path) -> None:
    x, y = _arrays()
    model = _model()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(10)
    sv = supervisor(tmp_path, model)
    async with sv.managed_session() as sess:
        with pytest.raises(ValueError, match="initial_epoch"):
            await sess.fit(model, x, y, epochs=2, initial_epoch=1)
        with pytest.raises(ValueError, match="y is given with x of type"):
            await sess.fit(model, ds, y, epochs=1)
        with pytest.raises(ValueError, match=r"validation_split.*pass validation_data"):
            await sess.fit(model, ds, epochs=1, validation_split=0.2)
        with pytest.raises(ValueError, match="steps_per_epoch=3 is taken with a generator only"):
            await sess.fit(model, x, y, epochs=1, steps_per_epoch=3)
        with pytest.raises(ValueError, match=r"generator.*pass steps_per_epoch"):
            await sess.fit(model, iter(ds), epochs=1)
        with pytest.raises(ValueError, match="verbose must be"):
            await sess.fit(model, x, y, epochs=1, verbose=3)
        with pytest.raises(ValueError, match=r"validation_data must be \(x_val, y_val\)"):
            await sess.fit(model, x, y, epochs=1, validation_data=(x,))
        with pytest.raises(ValueError, match="class_weight is taken with arrays"):
            await sess.fit(model, _Digits(), epochs=1, class_weight={0: 1.0})
        with pytest.raises(TypeError, match="as x or as data, not both"):
            await sess.fit(model, ds, data=ds, epochs=1)
    assert sv.status().global_step == 0


def test_the_data_position_hints_name_fit_too() -> None:
    """The advice to leave the data's position out names fit's argument, not run_loop's only."""
    from asupervisor._checkpoint.snapshot._iterator_state import pipeline_changed_error, restore_mismatch_error

    for error in (pipeline_changed_error("a", "b", None), restore_mismatch_error(ValueError("x"), None)):
        assert "checkpoint_iterator=False (to run_loop or fit)" in str(error)


CALLBACKS_SCRIPT = Path(__file__).parent / "scripts" / "callbacks_fit.py"


def _script(logdir: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(CALLBACKS_SCRIPT), str(logdir), str(out), *extra]


@pytest.mark.timeout(300)  # four trainings in child processes (~6 s each)
def test_arrays_then_a_pydataset_with_stock_callbacks_resume_bitwise_after_sigkills(tmp_path: Path) -> None:
    """A fit on shuffled arrays, then one on a shuffled PyDataset, EarlyStopping (which
    stops the second), ReduceLROnPlateau and LearningRateScheduler changing the rate each
    epoch, ModelCheckpoint, TerminateOnNaN, a callback of its own: SIGKILLed once mid-epoch
    in each fit, the resumed run ends at the same step, stopped by EarlyStopping at the
    same epoch, with the same weights, optimizer state and learning rate, bit for bit."""
    # fit 1: epochs of 19 steps (0-38); fit 2: of 15 (38-53-68-83). Checkpoints every 5
    # steps: each kill resumes from a checkpoint inside an epoch (arrays, then the PyDataset)
    kills = [16, 61]
    with subprocess.Popen(_script(tmp_path / "a", tmp_path / "a.npz"), stderr=subprocess.PIPE, text=True) as whole:
        for step in kills:
            killed = subprocess.run(
                _script(tmp_path / "b", tmp_path / "b.npz", "--kill-at", str(step)),
                capture_output=True,
                text=True,
                timeout=scaled(300),
            )
            assert killed.returncode == -9, (step, killed.stderr[-3000:])
        resumed = subprocess.run(
            _script(tmp_path / "b", tmp_path / "b.npz"), capture_output=True, text=True, timeout=scaled(300)
        )
        _, whole_stderr = whole.communicate(timeout=scaled(300))
    assert whole.returncode == 0, whole_stderr[-3000:]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with np.load(tmp_path / "a.npz") as a, np.load(tmp_path / "b.npz") as b:
        record_a, record_b = json.loads(str(a["record"])), json.loads(str(b["record"]))
        assert all(np.array_equal(a[k], b[k]) for k in a.files if k != "record"), f"kills at {kills}"
    assert (record_a["stop_reason"], record_a["stopped_epoch"], record_a["step"]) == ("stop_training", 4, 83)
    assert {k: record_b[k] for k in ("stop_reason", "stopped_epoch", "step", "batches")} == {
        k: record_a[k] for k in ("stop_reason", "stopped_epoch", "step", "batches")
    }
    assert {k: v[-1] for k, v in record_b["history"].items()} == {k: v[-1] for k, v in record_a["history"].items()}
