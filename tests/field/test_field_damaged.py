"""Field tests of restore: a training process is killed, its ``checkpoint`` state file or
its newest checkpoint is damaged, and it is started again as a user would. It must go on
from the newest good checkpoint (never from step 0, never over the checkpoints on disk).
Each runs ``scripts/damaged_train.py`` (Keras + Adam, a checkpoint every 5 steps) in a
child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _timing import scaled
from pagecache import drop_cached

pytestmark = pytest.mark.usefixtures("checkpoint_store")  # a promise test: both stores

SCRIPT = Path(__file__).parent / "scripts" / "damaged_train.py"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def run_child(logdir: Path, max_steps: int, backend: str, timeout: float = 120, *options: str) -> list[str]:
    """Run the training to ``max_steps``; returns its stdout lines (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(logdir), str(max_steps), backend, *options],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
        env=ENV,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def train_then_kill(logdir: Path, max_steps: int, backend: str, timeout: float = 120, *options: str) -> list[str]:
    """Train to ``max_steps`` (checkpoints every 5 steps), then SIGKILL the child while
    its session is running; returns the lines it printed."""
    child = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(logdir), str(max_steps), backend, "--hold", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=ENV,
    )
    lines: list[str] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.strip())
            if line.startswith("holding"):
                break
        assert lines and lines[-1] == "holding", lines
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=scaled(timeout)) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    return lines


def start_line(lines: list[str]) -> tuple[int, str]:
    """The step the child started at and what ``tf.train.latest_checkpoint`` said then."""
    fields = next(line for line in lines if line.startswith("start ")).split()
    return int(fields[1]), fields[2]


def flip_in_slot(prefix: Path, slot: bool = True, shape: tuple[int, int] = (4, 8)) -> str:
    """Flip a byte inside an Adam slot of the checkpoint ``prefix`` (found by its bytes,
    stored as they are in the data file), or with ``slot=False`` inside the first
    layer's kernel (of ``shape``); returns the value's key."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    keys = [k for k, s in reader.get_variable_to_shape_map().items() if s == list(shape)]
    key = sorted(k for k in keys if k.startswith("optimizer/_variables/") == slot)[0]
    value = reader.get_tensor(key).tobytes()
    data = prefix.parent / f"{prefix.name}.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    at = raw.find(value)
    assert at >= 0 and raw.find(value, at + 1) < 0
    raw[at + len(value) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    return key


DAMAGE = {
    "empty": b"",
    "binary": bytes(range(256)) * 8,
    "dangling": b'model_checkpoint_path: "model.ckpt-500"\nall_model_checkpoint_paths: "model.ckpt-500"\n',
}


@pytest.mark.parametrize(("damage", "backend"), [("empty", "asyncio"), ("binary", "trio")])
def test_killed_run_with_damaged_state_file_resumes_from_newest_good_step(
    tmp_path: Path, damage: str, backend: str
) -> None:
    """Killed at step 10 (checkpoints 0, 5, 10), the state file then emptied, filled with
    binary garbage: the restarted training
    starts at step 10 (init_fn is not called), the state file names model.ckpt-10 again
    before any new save, and training goes on to the end."""
    logdir = tmp_path / "run"
    lines = train_then_kill(logdir, 10, backend)
    assert "saved 10" in lines
    (logdir / "checkpoint").write_bytes(DAMAGE[damage])
    lines = run_child(logdir, 15, backend)
    assert "init_fn" not in lines
    step, latest_at_start = start_line(lines)
    assert step == 10
    assert latest_at_start == str(logdir / "model.ckpt-10")  # repaired before the first step
    assert lines[-1] == "end 15"
    text = (logdir / "checkpoint").read_text()
    assert 'model_checkpoint_path: "model.ckpt-15"' in text and str(tmp_path) not in text
    assert not [n for n in os.listdir(logdir) if ".corrupt-" in n]


def test_flipped_byte_in_optimizer_slot_resumes_from_previous_checkpoint(tmp_path: Path) -> None:
    """Killed at step 10, one byte flipped in an Adam slot of model.ckpt-10 (which TF
    restores only at the first step): the restarted training finds it at start-up,
    starts at step 5, trains on to 15; started again, it goes on from 15."""
    logdir = tmp_path / "run"
    train_then_kill(logdir, 10, "trio")
    flip_in_slot(logdir / "model.ckpt-10")
    lines = run_child(logdir, 15, "trio")
    step, latest_at_start = start_line(lines)
    assert step == 5 and latest_at_start == str(logdir / "model.ckpt-5")
    assert lines[-1] == "end 15"
    assert [n for n in os.listdir(logdir) if n.startswith("model.ckpt-10.corrupt-")]
    lines = run_child(logdir, 20, "asyncio")
    assert start_line(lines)[0] == 15 and lines[-1] == "end 20"


@pytest.mark.fast_store  # the fast store's own reader (the plain store's is TF's: the tests above)
@pytest.mark.parametrize("wide", [False, True], ids=["small", "wide"])
def test_flipped_byte_in_a_value_read_directly_resumes_from_previous_checkpoint(tmp_path: Path, wide: bool) -> None:
    """The optimizer built before the session (``--build``): a restore reads the files
    straight into the variables. Killed at step 10, one byte flipped in a kernel of
    model.ckpt-10: the restarted training's direct read finds the bad checksum (its own
    message names the file and the kernel), model.ckpt-5 is read directly, training
    starts at step 5 and goes on to 15; model.ckpt-10 is set aside. ``wide``: a 2 MiB
    kernel, the checkpoints' files dropped from the page cache before the restart, so
    the kernel is read with direct I/O (where the filesystem's page cache drops: the
    damage is found either way)."""
    logdir = tmp_path / "run"
    options = ("--build", "--wide") if wide else ("--build",)
    train_then_kill(logdir, 10, "asyncio", 120, *options)
    key = flip_in_slot(logdir / "model.ckpt-10", slot=False, shape=(1024, 512) if wide else (4, 8))
    if wide:
        files = [str(p) for p in logdir.glob("model.ckpt-*.data-*")]
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)  # clean pages, which the kernel drops
            finally:
                os.close(fd)
        drop_cached(files)
    lines = run_child(logdir, 15, "asyncio", 120, *options)
    newest = logdir / "model.ckpt-10"
    corrupt = [line.split(maxsplit=2)[1:] for line in lines if line.startswith("corrupt ")]
    assert len(corrupt) == 1 and corrupt[0][0] == str(newest), lines
    assert f"{newest}.data-00000-of-00001: checksum mismatch for {key} (corrupt data file)" in corrupt[0][1]
    assert [line.split()[1:] for line in lines if line.startswith("read ")] == [
        ["direct", str(logdir / "model.ckpt-5")]
    ]
    step, latest_at_start = start_line(lines)
    assert step == 5 and latest_at_start == str(logdir / "model.ckpt-5")
    assert lines[-1] == "end 15"
    assert [n for n in os.listdir(logdir) if n.startswith("model.ckpt-10.corrupt-")]
