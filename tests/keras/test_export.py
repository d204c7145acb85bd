"""``sv.export(model, path, best=, mode=)``: ``.keras`` and SavedModel exports that load
back, the best checkpoint by a recorded metric, refusals, and no torn export after a
SIGKILL at random moments of one."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from _timing import scaled
from fit_helpers import supervisor
from test_fit import _data, _model

import asupervisor as asv

SCRIPT = Path(__file__).parent / "scripts" / "export_loop.py"
X = np.random.default_rng(1).normal(size=(4, 8)).astype("float32")


async def _trained(logdir: Path, epochs: int = 2) -> tuple[keras.Model, asv.Supervisor]:
    model = _model()
    train, val = _data()
    policy = asv.AnyKeepPolicy(asv.LatestN(1), asv.KeepBest("val_loss", mode="max"))
    sv = supervisor(logdir, model, keep_policy=policy)
    async with sv.managed_session() as sess:
        await sess.fit(model, train, epochs=epochs, validation_data=val)
    return model, sv


@pytest.mark.anyio
async def test_keras_and_saved_model_exports_load_back_with_the_same_predictions(tmp_path: Path) -> None:
    model, sv = await _trained(tmp_path)
    expected = model(X).numpy()
    assert await sv.export(model, tmp_path / "out" / "model.keras") == str(tmp_path / "out" / "model.keras")
    np.testing.assert_allclose(
        keras.models.load_model(tmp_path / "out" / "model.keras")(X).numpy(), expected, rtol=1e-6
    )
    for _ in range(2):  # the second replaces the first
        await sv.export(model, tmp_path / "out" / "saved")
    loaded = tf.saved_model.load(str(tmp_path / "out" / "saved"))
    np.testing.assert_allclose(loaded.serve(X).numpy(), expected, rtol=1e-6)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.keras", "saved"]  # nothing left beside


@pytest.mark.anyio
async def test_best_exports_the_checkpoint_with_the_best_recorded_metric_and_puts_the_weights_back(
    tmp_path: Path,
) -> None:
    model, sv = await _trained(tmp_path)
    expected = model(X).numpy()
    await sv.export(model, tmp_path / "best.keras", best="val_loss", mode="max")
    np.testing.assert_array_equal(model(X).numpy(), expected)  # the model in memory is untouched
    first_epoch = _model()  # the highest val_loss: after the first epoch (8 steps)
    tf.train.Checkpoint(model=first_epoch).read(str(tmp_path / "model.ckpt-8")).expect_partial()
    np.testing.assert_allclose(
        keras.models.load_model(tmp_path / "best.keras")(X).numpy(), first_epoch(X).numpy(), rtol=1e-6
    )


@pytest.mark.anyio
async def test_bad_exports_are_refused_naming_the_value(tmp_path: Path) -> None:
    model, sv = await _trained(tmp_path, epochs=1)
    with pytest.raises(ValueError, match=r"not HDF5: '.*model\.h5'"):
        await sv.export(model, str(tmp_path / "model.h5"))
    with pytest.raises(ValueError, match="mode must be 'min' or 'max', got 'lowest'"):
        await sv.export(model, tmp_path / "m.keras", best="val_loss", mode="lowest")
    with pytest.raises(ValueError, match=r"no checkpoint in .* recorded 'val_auc'"):
        await sv.export(model, tmp_path / "m.keras", best="val_auc")
    with pytest.raises(TypeError, match="exports a Keras model"):
        await sv.export(object(), tmp_path / "m.keras")
    async with sv.managed_session():
        with pytest.raises(RuntimeError, match="after managed_session"):
            await sv.export(model, tmp_path / "m.keras")
    assert not (tmp_path / "m.keras").exists()
    other = asv.Supervisor(tmp_path / "w", state={"model": model}, is_chief=False, handle_signals=False)
    assert await other.export(model, tmp_path / "w.keras") is None and not (tmp_path / "w.keras").exists()


@pytest.mark.parametrize("name", ["model.keras", "saved"])
def test_a_sigkill_during_an_export_leaves_the_previous_or_the_new_one(tmp_path: Path, name: str) -> None:
    """An exporter SIGKILLed at seeded random moments (twice for a SavedModel, once for a
    ``.keras`` file): the target always loads, with one of the two sets of weights it
    alternates."""
    target = tmp_path / name
    rng = random.Random(7)
    for _ in range(2 if name == "saved" else 1):  # the directory's swap is the harder case
        wanted = rng.randrange(1, 4)
        with subprocess.Popen([sys.executable, str(SCRIPT), str(target)], stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:  # wait for the wanted export to begin, then kill within it
                if line.strip() == f"begin {wanted}":
                    time.sleep(rng.uniform(0, 0.4))  # a random moment, not a wait for a condition
                    proc.kill()
                    break
            assert proc.wait(timeout=scaled(60)) == -9
        if name.endswith(".keras"):
            loaded = keras.models.load_model(target)
            weights = loaded.get_weights()
        else:
            weights = [v.numpy() for v in tf.saved_model.load(str(target)).variables]
        assert all(np.all(w == 0.5) for w in weights) or not any(np.all(w == 0.5) for w in weights)
