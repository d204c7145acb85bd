"""``sv.export(model, "s3://...")``: a ``.keras`` object and a SavedModel's objects (its
``saved_model.pb`` last) on a real S3 server, loaded back from a download."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from servers import Server, s3_keys, s3_read

import asupervisor as asv


@pytest.mark.anyio
async def test_keras_and_saved_model_exports_to_s3_load_back(s3_url: str, s3_env: Server, tmp_path: Path) -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    sv = asv.Supervisor(None, state={"model": model}, handle_signals=False)
    x = np.ones((2, 4), "float32")
    assert await sv.export(model, s3_url + "/model.keras") == s3_url + "/model.keras"
    for _ in range(2):  # the second replaces the first's objects
        await sv.export(model, s3_url + "/serving/")
    keys = s3_keys(s3_env.endpoint, s3_url)
    assert "model.keras" in keys and "serving/saved_model.pb" in keys
    assert any(k.startswith("serving/variables/") for k in keys)
    (tmp_path / "model.keras").write_bytes(s3_read(s3_env.endpoint, s3_url, "model.keras"))
    np.testing.assert_allclose(
        keras.models.load_model(tmp_path / "model.keras")(x).numpy(), model(x).numpy(), rtol=1e-6
    )
    local = tmp_path / "serving"
    for key in keys:
        if key.startswith("serving/"):
            (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / key).write_bytes(s3_read(s3_env.endpoint, s3_url, key))
    loaded = tf.saved_model.load(str(local))
    np.testing.assert_allclose(loaded.serve(x).numpy(), model(x).numpy(), rtol=1e-6)
