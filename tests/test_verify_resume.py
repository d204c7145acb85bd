"""``asupervisor verify-resume``, run as users run it: a command whose runs are real
processes, SIGKILLed and restarted, their final checkpoints compared bitwise.

The script (``tests/verify_scripts/regression.py``) is deterministic with its data,
optimizer and RNG in the state; with ``--untracked`` its batches come from a Python
iterator outside the state, which a resumed run starts again: the command must catch it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _timing import scaled

from asupervisor import _overrides
from asupervisor._verify import _tool

SCRIPT = Path(__file__).resolve().parent / "verify_scripts" / "regression.py"


def verify(*args: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """``python -m asupervisor verify-resume --workdir WORKDIR ARGS``, finished."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASUPERVISOR_")}
    return subprocess.run(
        [sys.executable, "-m", "asupervisor", "verify-resume", "--workdir", str(workdir), "--timeout", "120", *args],
        capture_output=True,
        text=True,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout=scaled(400),
    )


def test_a_deterministic_script_resumes_exactly_through_two_kills(tmp_path: Path) -> None:
    """Two SIGKILLs, at least one after a checkpoint past the start: the resumed runs
    end in the reference's state, bitwise (exit 0); the script runs on trio."""
    proc = verify(
        "--kills", "2", "--steps", "40", str(SCRIPT), "--logdir", "{logdir}", "--backend", "trio", workdir=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    # (and, when tf.data's injected prefetch buffer was saved filled differently, a note why
    # the iterator's bytes were not compared)
    assert lines[-1].startswith("verify-resume: exact (2 kills): the final state at step 40 is bitwise the reference's")
    assert sum("killed after" in line for line in lines) == 2, proc.stdout
    resumed_from = [int(n) for n in re.findall(r"^run \d+: from step (\d+)", proc.stdout, re.M)]
    assert any(0 < n < 40 for n in resumed_from), proc.stdout
    assert (tmp_path / "resumed" / "model.ckpt-40.index").exists()


def test_an_untracked_iterator_is_caught(tmp_path: Path) -> None:
    """Batches from a Python iterator outside the state: after a kill past a checkpoint
    the resumed run reads other batches; the command names the first differing value
    and the cause, exit 1."""
    proc = verify("--kills", "1", "--no-control", str(SCRIPT), "--logdir", "{logdir}", "--untracked", workdir=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("verify-resume: differs at bias/.ATTRIBUTES/VARIABLE_VALUE (weights"), proc.stdout
    assert "the data iterator is not checkpointed (an untracked iterator" in last, last


def test_a_missing_script_is_one_line_and_status_2(tmp_path: Path) -> None:
    """No such script: one line naming it, exit 2, nothing run."""
    proc = verify(str(tmp_path / "nope.py"), workdir=tmp_path / "work")
    assert proc.returncode == 2
    assert proc.stdout == f"verify-resume: no such script: {str(tmp_path / 'nope.py')!r}\n"
    assert not (tmp_path / "work").exists()


def test_the_overrides_read_the_environment() -> None:
    """``ASUPERVISOR_LOGDIR`` replaces the logdir, ``ASUPERVISOR_MAX_STEPS`` adds a stop at
    that step, ``ASUPERVISOR_SAVE_STEPS`` a cadence; a bad number names the variable."""
    env = {"ASUPERVISOR_LOGDIR": "/x", "ASUPERVISOR_MAX_STEPS": "7", "ASUPERVISOR_SAVE_STEPS": "3"}
    assert _overrides.logdir("runs/a", env) == "/x" and _overrides.logdir("runs/a", {}) == "runs/a"
    (hook,) = _overrides.stop_hooks(env)
    assert hook.last_step == 7 and _overrides.stop_hooks({}) == []
    assert _overrides.save_settings({"save_policy": None}, env)["save_model_steps"] == 3
    with pytest.raises(ValueError, match="ASUPERVISOR_MAX_STEPS must be a whole number >= 1, got '0'"):
        _overrides.stop_hooks({"ASUPERVISOR_MAX_STEPS": "0"})
    names = (_overrides.LOGDIR_ENV, _overrides.MAX_STEPS_ENV, _overrides.SAVE_STEPS_ENV)
    assert names == (_tool.LOGDIR_ENV, _tool.MAX_STEPS_ENV, _tool.SAVE_STEPS_ENV)  # the tool sets what is read


def test_a_prefetch_buffer_saved_filled_differently_is_the_same_position(tmp_path: Path) -> None:
    """Two saves of one pipeline's iterator at the same position, one right after a batch,
    one after its prefetch buffer filled: their bytes differ, the batches they resume to do
    not. The comparison sees only the iterator's serialized state differ, which the tool
    does not count against an exact resume when two uninterrupted runs differ so too."""
    import time

    import tensorflow as tf
    from tensorflow.python.data.experimental.ops.testing import sleep  # tf.data's own test op

    from asupervisor._verify import _compare

    # each element takes 0.1 s to come (a sleep inside tf.data: the iterator stays serializable)
    ds = tf.data.Dataset.range(100).apply(sleep(100_000)).prefetch(8)

    def save(name: str, wait: float) -> str:
        iterator = iter(ds)
        next(iterator)
        time.sleep(wait)
        return str(tf.train.Checkpoint(it=iterator).write(str(tmp_path / name)))

    filled = save("filled", scaled(1.5))
    # (a save waits for the element the prefetch thread is making; on a busy machine the
    # buffer can fill meanwhile: a fresh iterator again, a few times at most)
    for attempt in range(5):
        fresh = save(f"fresh{attempt}", 0.0)
        differences = _compare.compare(fresh, filled)
        if differences:
            break
    assert differences and _compare.only_iterator_bytes(differences), differences
    prefixes = [fresh, filled]
    resumed = []
    for prefix in prefixes:
        iterator = iter(ds)
        tf.train.Checkpoint(it=iterator).read(prefix).assert_consumed()
        resumed.append([int(next(iterator)) for _ in range(3)])
    assert resumed[0] == resumed[1] == [1, 2, 3]
    assert not _compare.only_iterator_bytes([_compare.Difference("asv_epoch/.ATTRIBUTES/VARIABLE_VALUE", "iterator")])
