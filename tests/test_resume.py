"""Exact resume and crash consistency with real processes killed by SIGKILL.

``resume_train.py`` (next to this file) trains a small seeded model with a tf.data
iterator, momentum slots and a ``tf.random.Generator``, saving every few steps.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "resume_train.py"
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    "TF_CPP_MIN_LOG_LEVEL": "3",
}


def _start(logdir: Path, steps: int, save_steps: int, out: Path | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, str(SCRIPT), str(logdir), str(steps), str(save_steps), "64"]
    if out is not None:
        args.append(str(out))
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)


def _run_to_step_then_kill(logdir: Path, steps: int, save_steps: int, kill_at: int, rng: random.Random) -> int:
    """Start training, SIGKILL it a random moment after it reports step ``kill_at``."""
    proc = _start(logdir, steps, save_steps)
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        match = re.fullmatch(r"STEP (\d+)", line.strip())
        if match:  # other lines are logs
            seen = int(match.group(1))
            if seen >= kill_at:
                time.sleep(rng.uniform(0, 0.02))
                break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    return seen


def test_killed_and_resumed_training_is_bitwise_equal(tmp_path: Path) -> None:
    """A training SIGKILLed at random moments and restarted ends bitwise equal to an uninterrupted one."""
    steps, save_steps = 240, 7
    straight = _start(tmp_path / "straight", steps, save_steps, tmp_path / "straight.npy")
    rng = random.Random(1234)
    logdir = tmp_path / "killed"
    kill_at = 0
    for _ in range(3):
        kill_at = rng.randint(kill_at + 10, kill_at + 70)
        _run_to_step_then_kill(logdir, steps, save_steps, kill_at, rng)
        assert tf.train.latest_checkpoint(str(logdir)) is not None
    last = _start(logdir, steps, save_steps, tmp_path / "killed.npy")
    out, _ = last.communicate(timeout=120)
    assert last.returncode == 0 and f"DONE {steps}" in out
    out, _ = straight.communicate(timeout=120)
    assert straight.returncode == 0 and f"DONE {steps}" in out
    a = np.load(tmp_path / "straight.npy")
    b = np.load(tmp_path / "killed.npy")
    assert a.tobytes() == b.tobytes()


def _plain_tf_restores(logdir: Path, width: int) -> int:
    """Plain TensorFlow: restore the latest checkpoint and read (CRC-check) every tensor."""
    sys.path.insert(0, str(HERE))
    try:
        import resume_train
    finally:
        sys.path.remove(str(HERE))
    latest = tf.train.latest_checkpoint(str(logdir))
    assert latest is not None
    state, _, _ = resume_train.build(width)
    tf.train.Checkpoint(**state).restore(latest).assert_existing_objects_matched().expect_partial()
    reader = tf.train.load_checkpoint(latest)
    for key, dtype in reader.get_variable_to_dtype_map().items():
        if dtype != tf.variant:  # the iterator state (restored with its dataset, not read here)
            reader.get_tensor(key)
    return int(reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE"))


def _child(logdir: str, width: int, progress: object, tracked_data: bool) -> None:
    import resume_train

    resume_train.train(logdir, 10**9, 1, width, progress=progress, tracked_data=tracked_data)


@pytest.mark.parametrize(
    "tracked_data",
    [
        pytest.param(True, id="with-iterator"),  # a variant tensor: our bundle + SaveV2's, merged
        pytest.param(False, id="plain-tensors"),  # all written by asupervisor's bundle writer
    ],
)
def test_crash_consistency_under_repeated_sigkill(tmp_path: Path, tracked_data: bool) -> None:
    """Dozens of SIGKILLs while saving ~20 MB every step never leave an unrestorable latest checkpoint."""
    width = 80_000  # 16 x 80k floats: 5 MB per variable, 20 MB of state with the slots
    kills = 20
    ctx = multiprocessing.get_context("forkserver")
    # Children are forked from a server that has imported TensorFlow already (no TF op
    # has run there), so each restart costs milliseconds instead of an import.
    sys.path.insert(0, str(HERE))
    ctx.set_forkserver_preload(["tensorflow", "asupervisor", "resume_train"])
    rng = random.Random(99)
    logdir = tmp_path / "run"
    steps: list[int] = []
    mid_write = 0  # kills that left a save in flight (its temporary files)
    try:
        for _ in range(kills):
            progress = ctx.Value("q", 0, lock=False)
            proc = ctx.Process(target=_child, args=(str(logdir), width, progress, tracked_data))
            proc.start()
            deadline = time.monotonic() + 60
            while progress.value == 0 and proc.is_alive() and time.monotonic() < deadline:  # type: ignore[attr-defined]
                time.sleep(0.005)
            assert proc.is_alive(), f"the training process died on its own (exit code {proc.exitcode})"
            time.sleep(rng.uniform(0.0, 0.4))
            assert proc.pid is not None
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
            mid_write += any(".asv-tmp-" in name for name in os.listdir(logdir))
            steps.append(_plain_tf_restores(logdir, width))
            state_text = (logdir / "checkpoint").read_text()
            assert ".asv-tmp-" not in state_text and str(tmp_path) not in state_text
    finally:
        sys.path.remove(str(HERE))
        multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]
    assert steps == sorted(steps) and steps[-1] > steps[0]  # training went on across kills
    assert mid_write >= kills // 4, f"only {mid_write} of {kills} kills hit a save in flight"
