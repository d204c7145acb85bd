"""``examples/keras_fit.py``: a compiled Keras model trained by ``sess.fit``, run as a
user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from eventfiles import read_events

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "keras_fit.py"


def run(logdir: Path, epochs: int) -> str:
    """Run the example to ``epochs``; its stdout (it must exit 0)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--logdir", str(logdir), "--epochs", str(epochs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_fit_trains_validates_and_writes_keras_runs(tmp_path: Path) -> None:
    """Two epochs exit 0 and print the validation accuracy (better than chance on ten
    classes); the logdir holds the TensorBoard runs ``train/`` and ``validation/`` with an
    ``epoch_<metric>`` point per epoch, and a checkpoint at the last step; a second run
    to the same epoch has nothing left to train."""
    out = run(tmp_path, 2)
    found = re.search(r"^done: epoch 2/2, val accuracy (\d\.\d+), stop reason epochs$", out, re.M)
    assert found, out
    assert float(found[1]) > 0.3, out
    for name in ("train", "validation"):
        assert list((tmp_path / name).glob("events.out.tfevents.*")), f"no event file in {name}/"
        events = read_events(tmp_path / name)
        for tag in ("epoch_loss", "epoch_accuracy"):
            assert [step for step, _ in events.get(tag, [])] == [0, 1], (name, tag, sorted(events))
    assert (tmp_path / "model.ckpt-48.index").exists()  # 1500 examples / 64 = 24 steps an epoch
    again = run(tmp_path, 2)
    assert "done: epoch 2/2, nothing to train, stop reason epochs" in again, again
