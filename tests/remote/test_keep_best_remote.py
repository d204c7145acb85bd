"""KeepBest on a URL logdir: each commit marker carries the metrics its checkpoint
records, and retention on the remote ranks by them (nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tensorflow as tf
from servers import Server, s3_keys, s3_read

import asupervisor as asv

pytestmark = pytest.mark.usefixtures("no_new_threads")


@pytest.mark.anyio
async def test_remote_retention_keeps_the_best_by_the_markers_metrics(
    s3_url: str, s3_env: Server, tmp_path: Path
) -> None:
    """Three runs, each ending with a checkpoint whose loss is known: the remote keeps the
    best (from its marker) and the latest; the marker holds the loss."""
    for steps, loss in ((3, 1.0), (6, 5.0), (9, 2.0)):  # each run's final checkpoint is uploaded at its stop
        sv = asv.Supervisor(
            s3_url,
            local_dir=tmp_path / "a",
            state={"w": tf.Variable(0.0)},
            save_model_secs=0,
            save_model_steps=100,
            keep_policy=asv.KeepBest("loss"),
            handle_signals=False,
        )
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda loss=loss: {"loss": tf.constant(loss)}, max_steps=steps)
    keys = s3_keys(s3_env.endpoint, s3_url)
    steps_left = sorted({int(k.split("-")[1].split(".")[0]) for k in keys if k.startswith("model.ckpt-")})
    assert steps_left == [3, 9], keys  # 3 (loss 1) beat 6 (loss 5); 9 is the latest
    marker = json.loads(s3_read(s3_env.endpoint, s3_url, "model.ckpt-3.asv-commit"))
    assert marker["metrics"] == {"loss": 1.0}
