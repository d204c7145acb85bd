"""Field test: a ``from_generator`` pipeline through periodic checkpoints, in a child process.

Before ``checkpoint_iterator``, such a run died at its first periodic checkpoint with
``FailedPreconditionError: PyFunc is stateful``. The child is ``scripts/generator_train.py``
run with ``sys.executable`` as a user runs it; everything checked is its exit status, its
output and the files it left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf
from _timing import scaled

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "scripts" / "generator_train.py"
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(HERE.parent.parent), os.environ.get("PYTHONPATH", "")]),
    "TF_CPP_MIN_LOG_LEVEL": "3",
}
ITERATOR_KEY = "asv_data_iterator/.ATTRIBUTES/ITERATOR_STATE"


def _train(logdir: Path, backend: str, max_steps: int, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(logdir), backend, str(max_steps), mode],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=scaled(240),
    )


def _result(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("result ")]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0][len("result ") :])  # type: ignore[no-any-return]


def _checkpoint_steps(logdir: Path) -> list[int]:
    state = tf.train.get_checkpoint_state(str(logdir))
    assert state is not None
    return sorted(int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths)


@pytest.mark.parametrize(("backend", "resume_backend"), [("asyncio", "trio")])
def test_from_generator_trains_through_periodic_checkpoints_and_resumes(
    tmp_path: Path, backend: str, resume_backend: str
) -> None:
    """The child trains 50 steps saving every 10, completes, logs the skip reason once;
    rerun (on the other backend), it resumes from step 50 with the data from its start,
    and stops at 70."""
    first = _train(tmp_path, backend, 50, "auto")
    result = _result(first)
    assert result == {"start": 0, "first_batch": 0.0, "ran": 50, "global_step": 50}
    assert first.stderr.count("checkpoint.iterator_skipped") == 1, first.stderr[-3000:]
    assert "PyFunc is stateful" in first.stderr
    steps = _checkpoint_steps(tmp_path)
    assert steps[-1] == 50
    assert len([s for s in steps if 0 < s < 50]) >= 2, steps  # several periodic checkpoints
    assert all(ITERATOR_KEY not in dict(tf.train.list_variables(str(tmp_path / f"model.ckpt-{s}"))) for s in steps)

    second = _train(tmp_path, resume_backend, 70, "auto")
    assert _result(second) == {"start": 50, "first_batch": 0.0, "ran": 20, "global_step": 70}
    assert second.stderr.count("checkpoint.iterator_skipped") == 1
    assert _checkpoint_steps(tmp_path)[-1] == 70


def test_checkpoint_iterator_true_fails_before_the_first_step(tmp_path: Path) -> None:
    """With ``checkpoint_iterator=True`` the child fails before its first step with a
    CheckpointError naming TF's reason; nothing past step 0 is saved."""
    proc = _train(tmp_path, "trio", 50, "true")
    assert proc.returncode != 0
    assert "first_step" not in proc.stdout
    assert "CheckpointError" in proc.stderr and "checkpoint_iterator=True" in proc.stderr
    assert "PyFunc is stateful" in proc.stderr
    assert _checkpoint_steps(tmp_path) == [0]
