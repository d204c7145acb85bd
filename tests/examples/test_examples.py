"""The small examples in ``examples/``, each run as a user runs it: a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf
from _timing import scaled
from eventfiles import read_events

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(name: str, *args: str, backend: str = "asyncio") -> str:
    """Run ``examples/<name>.py`` with ``args``; its stdout (it must exit 0)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--backend", backend, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(120),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_minimal_trains_and_resumes(tmp_path: Path) -> None:
    """``minimal.py`` trains to ``--steps`` with a checkpoint there; run again with more
    steps on trio, it resumes from that checkpoint."""
    out = run("minimal", "--logdir", str(tmp_path), "--steps", "40")
    assert "start: step 0" in out and "done: step 40" in out
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-40")
    out = run("minimal", "--logdir", str(tmp_path), "--steps", "90", backend="trio")
    assert "start: step 40" in out and "done: step 90, w 2.99" in out  # w -> 3


def test_keras_custom_step_lowers_the_loss(tmp_path: Path) -> None:
    """``keras_custom_step.py``: a Keras model trained by a custom step over a dataset;
    the loss on the whole data falls, and the checkpoint holds the data iterator."""
    out = run("keras_custom_step", "--logdir", str(tmp_path), "--steps", "200")
    line = next(line for line in out.splitlines() if line.startswith("done: step 200"))
    before, after = float(line.split("before ")[1].split(",")[0]), float(line.split("after ")[1])
    assert after < before / 5, line
    keys = [name for name, _ in tf.train.list_variables(str(tmp_path / "model.ckpt-200"))]
    assert any("iterator" in key.lower() or "_iterator" in key for key in keys), keys


def test_service_reads_the_loss_and_stops_early(tmp_path: Path) -> None:
    """``service_reading_loss.py``: the looped service sees the loss fall through
    ``status().metrics`` and stops the training below the target, well before
    ``--steps``; the stop is a clean one (exit 0, reason ``requested``)."""
    out = run("service_reading_loss", "--logdir", str(tmp_path), "--target", "0.01")
    losses = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if line.startswith("loss at step")]
    assert len(losses) >= 2 and losses[0] > losses[-1], out
    assert "early stop" in out and out.strip().splitlines()[-1].endswith("stop reason requested")


def test_custom_hook_sees_every_step_and_writes_at_the_end(tmp_path: Path) -> None:
    """``custom_hook.py``: ``after_run`` sees the steps (the 50th, 100th, ...) with what
    they returned, and ``end`` writes the record at the stop."""
    out = run("custom_hook", "--logdir", str(tmp_path), "--steps", "200")
    assert "done: step 200, 4 losses recorded" in out
    record = (tmp_path / "loss_every_50.txt").read_text().split("\n")
    assert [line.split()[0] for line in record if line] == ["50", "100", "150", "200"]


def test_pretrained_init_fn_only_before_the_first_checkpoint(tmp_path: Path) -> None:
    """``pretrained_init_fn.py``: the first run initialises from the pretrained backbone;
    the second resumes from its own checkpoint without reading the pretrained one."""
    pretrained, logdir = tmp_path / "pretrained", tmp_path / "run"
    run("pretrained_init_fn", "--pretrained", str(pretrained), "--make-pretrained", "--logdir", str(logdir))
    out = run("pretrained_init_fn", "--pretrained", str(pretrained), "--logdir", str(logdir), "--steps", "30")
    assert "initialised from" in out and "start: step 0" in out and "backbone kernel[0, 0] 0.50" in out
    out = run("pretrained_init_fn", "--pretrained", str(pretrained), "--logdir", str(logdir), "--steps", "60")
    assert "initialised from" not in out and "start: step 30, restored True" in out


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_tf1_port_runs_the_monitored_session_loop(tmp_path: Path, backend: str) -> None:
    """``tf1_port.py``: the ported ``should_stop()`` loop runs to ``StopAtStepHook``'s last
    step with TF1's hooks, saving every 50 steps and at the end."""
    out = run("tf1_port", "--logdir", str(tmp_path), "--steps", "120", backend=backend)
    assert f"latest checkpoint {tmp_path / 'model.ckpt-120'}" in out and "w 3.0000" in out
    assert (tmp_path / "model.ckpt-100.index").exists()


def test_keras_fit_trains_validates_and_writes_keras_runs(tmp_path: Path) -> None:
    """``keras_fit.py``: two epochs exit 0 and print the validation accuracy (better than
    chance on ten classes); the logdir holds the TensorBoard runs ``train/`` and
    ``validation/`` with an ``epoch_<metric>`` point per epoch, and a checkpoint at the
    last step."""
    out = run("keras_fit", "--logdir", str(tmp_path), "--epochs", "2")
    found = re.search(r"^done: epoch 2/2, val accuracy (\d\.\d+), stop reason epochs$", out, re.M)
    assert found, out
    assert float(found[1]) > 0.3, out
    for name in ("train", "validation"):
        assert list((tmp_path / name).glob("events.out.tfevents.*")), f"no event file in {name}/"
        events = read_events(tmp_path / name)
        for tag in ("epoch_loss", "epoch_accuracy"):
            assert [step for step, _ in events.get(tag, [])] == [0, 1], (name, tag, sorted(events))
    assert (tmp_path / "model.ckpt-48.index").exists()  # 1500 examples / 64 = 24 steps an epoch
