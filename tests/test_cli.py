"""The ``asupervisor`` command, run as a user runs it: ``python -m asupervisor``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _timing import scaled


def cli(*args: str, tf_log_level: str | None = "3") -> subprocess.CompletedProcess[str]:
    """``python -m asupervisor ARGS``; ``tf_log_level=None``: as a user's shell runs it,
    without ``TF_CPP_MIN_LOG_LEVEL`` (the command sets it)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": tf_log_level or ""}
    if tf_log_level is None:
        del env["TF_CPP_MIN_LOG_LEVEL"]
    return subprocess.run(
        [sys.executable, "-m", "asupervisor", *args], capture_output=True, text=True, env=env, timeout=scaled(240)
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log directory from a real short run of ``asupervisor demo``."""
    logdir = tmp_path_factory.mktemp("cli") / "run"
    out = cli("demo", "--logdir", str(logdir), "--max-steps", "60", "--summary-secs", "0.2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"--logdir {logdir}" in out.stdout.splitlines()[-1]  # the TensorBoard command
    return logdir


def test_inspect_shows_checkpoints_and_scalars(trained: Path) -> None:
    """``inspect`` lists each checkpoint (step, loads, the latest), the scalars' last
    values and the iterator's share, in text and in JSON, and exits 0, printing nothing
    of TensorFlow's native start-up lines (absl's, CUDA's probing)."""
    text = cli("inspect", str(trained))
    assert text.returncode == 0, text.stdout + text.stderr
    assert text.stderr == "", text.stderr
    assert "model.ckpt-60" in text.stdout and "loads latest" in text.stdout and "loss =" in text.stdout
    report = json.loads(cli("inspect", str(trained), "--json").stdout)
    assert report["ok"] and report["state_file"] == {"latest": "model.ckpt-60", "problem": None}
    latest = [c for c in report["checkpoints"] if c["latest"]]
    assert [c["step"] for c in latest] == [60] and latest[0]["loads"] and latest[0]["bytes"] > 0
    assert "loss" in report["scalars"] and report["iterator_share"]["iterator_bytes"] > 0


def test_inspect_flags_a_truncated_checkpoint_and_leftovers(trained: Path, tmp_path: Path) -> None:
    """A checkpoint whose data file was truncated is flagged (exit 1), and the files of
    an interrupted save are listed."""
    import shutil

    logdir = tmp_path / "copy"
    shutil.copytree(trained, logdir)
    data = sorted(logdir.glob("model.ckpt-60.data-*"))
    with open(data[0], "r+b") as f:
        f.truncate(max(1, data[0].stat().st_size // 2))
    (logdir / "model.ckpt-61.asv-tmp-1a2b.index").write_bytes(b"")
    text = cli("inspect", str(logdir))
    assert text.returncode == 1
    assert "DOES NOT LOAD" in text.stdout and "PROBLEMS FOUND" in text.stdout
    report = json.loads(cli("inspect", str(logdir), "--json").stdout)
    bad = next(c for c in report["checkpoints"] if c["step"] == 60)
    assert not bad["loads"] and bad["error"] and not report["ok"]
    assert report["leftovers"] == ["model.ckpt-61.asv-tmp-1a2b.index"]


def test_inspect_of_a_missing_directory_says_so(tmp_path: Path) -> None:
    """A log directory that does not exist is a clear message naming it, exit 1."""
    out = cli("inspect", str(tmp_path / "nope"))
    assert out.returncode == 1 and str(tmp_path / "nope") in out.stderr


def test_help_does_not_need_tensorflow() -> None:
    """``asupervisor --help`` answers without importing TensorFlow (it is quick)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "asupervisor", "--help"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert out.returncode == 0 and "inspect" in out.stdout and "demo" in out.stdout
    assert "tensorflow" not in out.stderr


def test_an_error_is_one_line_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    """A logdir the demo cannot use: status 1 and one line naming the command, the error
    and the logdir, no traceback; with ``--debug`` the traceback."""
    bad = tmp_path / "file"
    bad.write_text("not a directory")
    out = cli("demo", "--logdir", str(bad / "run"), "--max-steps", "3")
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("asupervisor demo: CheckpointError: logdir ") and str(bad / "run") in last, last
    assert "Traceback" not in out.stderr
    said = [line for line in out.stderr.splitlines() if "CheckpointError: logdir" in line]
    assert len(said) == 1, out.stderr[-2000:]  # said once, not logged as well
    debug = cli("demo", "--logdir", str(bad / "run"), "--max-steps", "3", "--debug")
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr, debug.stderr[-2000:]


def _damage_a_weight(prefix: Path) -> None:
    """Flip a byte inside the largest weight of the checkpoint ``prefix`` (found by
    its bytes in the data files): its object graph and index stay good, so the damage is
    found by TensorFlow's own restore, the one that leaves warnings behind when it fails."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    shapes = reader.get_variable_to_shape_map()
    # the weights, through the model (a checkpoint before the first step) or the optimizer
    weights = [k for k in shapes if "_kernel/" in k or "_trainable_variables/" in k]
    key = max(weights, key=lambda k: int(np.prod(shapes[k])))
    value = reader.get_tensor(key).tobytes()
    for shard in prefix.parent.glob(f"{prefix.name}.data-*"):
        raw = bytearray(shard.read_bytes())
        at = raw.find(value)
        if at >= 0:
            assert raw.find(value, at + 1) < 0, "the value's bytes must be unique in the file"
            raw[at + len(value) // 2] ^= 0xFF
            shard.write_bytes(bytes(raw))
            return
    pytest.fail(f"{key}'s bytes are in no data file of {prefix}")


def test_demo_on_damaged_checkpoints_says_one_line_and_nothing_of_tensorflow(trained: Path, tmp_path: Path) -> None:
    """Every checkpoint's weights damaged, the demo started as a user's shell starts it
    (no ``TF_CPP_MIN_LOG_LEVEL``): status 1, the library's own log lines and the one
    error line, and nothing of TensorFlow's (its start-up lines, its "Value in checkpoint
    could not be found" warnings for a failed restore)."""
    import shutil

    logdir = tmp_path / "damaged"
    shutil.copytree(trained, logdir)
    prefixes = sorted(p.with_suffix("") for p in logdir.glob("model.ckpt-*.index"))
    assert prefixes
    for prefix in prefixes:
        _damage_a_weight(prefix)
    out = cli("demo", "--logdir", str(logdir), "--steps", "5", tf_log_level=None)
    assert out.returncode == 1, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith(f"asupervisor demo: CheckpointError: no checkpoint in {logdir} loads"), lines[-1]
    logged = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z \[\w+ *\] [a-z_.]+ ")  # the library's own log lines
    others = [line for line in lines[:-1] if not logged.match(line)]
    assert others == [], others


def test_inspect_of_a_directory_no_training_wrote_says_so(tmp_path: Path) -> None:
    """An empty directory, or one of other files (a mistyped path), is not reported ``ok``:
    status 1, a line saying nothing of a training is there, ``empty`` in the JSON."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a training")
    out = cli("inspect", str(tmp_path / "empty"))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "NOTHING OF A TRAINING HERE" in out.stdout and "\n  ok" not in out.stdout, out.stdout
    out = cli("inspect", str(tmp_path / "other"), "--json")  # the same report, as JSON
    assert out.returncode == 1, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["empty"] is True and report["ok"] is False


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--steps", "-5"], "argument --steps: expected a number >= 1, got '-5'"),
        (["--max-steps", "x"], "argument --max-steps: expected a whole number, got 'x'"),
        (["--summary-secs", "0"], "argument --summary-secs: expected a positive number of seconds, got '0'"),
        (["--foo"], "asupervisor demo: error: unrecognized arguments: --foo"),
    ],
)
def test_bad_demo_arguments_are_refused_before_anything_is_written(tmp_path: Path, args: list[str], said: str) -> None:
    """A bad value or an unknown option: status 2, the demo's own usage and one line naming
    it, and no log directory made (nothing trained, nothing saved)."""
    out = cli("demo", "--logdir", str(tmp_path / "run"), *args)
    assert out.returncode == 2, out.stderr
    assert said in out.stderr and "usage: asupervisor demo" in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()
