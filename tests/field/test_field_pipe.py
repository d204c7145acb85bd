"""Logging never costs training: a run piped through ``tee`` whose reader dies, then Ctrl-C.

``python train.py 2>&1 | tee log``, then ``tee`` dies (its terminal closed, killed with the
job), then Ctrl-C: every log line now hits a broken pipe. The run must still stop at a
step boundary, commit its final checkpoint and exit. Real processes, a real pipe, a real
SIGINT; the child writes what it reached to a side file, since its output is gone.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
DEADLINE_SECS = 60.0

pytestmark = pytest.mark.skipif(shutil.which("tee") is None, reason="no tee(1) on this machine")


def _read_until(stream: object, pattern: str, deadline: float) -> list[str]:
    """Lines read from ``stream`` (a pipe) up to one matching ``pattern``; fails at ``deadline``."""
    assert hasattr(stream, "fileno")
    lines: list[str] = []
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(stream.fileno(), selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no line matching {pattern!r} in time; got {lines[-20:]}")
            if not selector.select(left):
                continue
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                pytest.fail(f"output ended before a line matching {pattern!r}; got {lines[-20:]}")
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace")
                lines.append(line)
                if re.search(pattern, line):
                    return lines


def _latest_step(logdir: Path) -> int | None:
    """The step of the checkpoint named latest in ``logdir``'s state file, read as TF does."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(logdir))
    return None if latest is None else int(latest.rsplit("-", 1)[1])


def _run_piped_then_interrupt(tmp_path: Path, backend: str, *, wait_for_save_after_death: bool) -> None:
    """Start the child piped into tee, kill tee, SIGINT the child; check what is on disk."""
    logdir = tmp_path / "run"
    outcome_file = tmp_path / "outcome.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": ""}
    deadline = time.monotonic() + DEADLINE_SECS
    child = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "pipe_train.py"), backend, str(logdir), str(outcome_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        assert child.stdout is not None
        tee = subprocess.Popen(["tee", str(tmp_path / "log")], stdin=child.stdout, stdout=subprocess.PIPE)
        child.stdout.close()  # only tee reads the child's output now
        try:
            # Training is under way and periodic checkpoints are being logged.
            _read_until(tee.stdout, r"checkpoint\.saved.*step=[1-9]", deadline)
        finally:
            tee.kill()  # the reader dies: from now on every write of the child fails (EPIPE)
            tee.wait()
            assert tee.stdout is not None
            tee.stdout.close()
        if wait_for_save_after_death:
            # A periodic save commits while its log line hits the dead pipe.
            seen = _latest_step(logdir)
            while _latest_step(logdir) == seen and child.poll() is None:
                assert time.monotonic() < deadline, "no checkpoint committed after the reader died"
                time.sleep(0.02)
        child.send_signal(signal.SIGINT)
        try:
            returncode = child.wait(timeout=max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            pytest.fail("the child did not exit after SIGINT with its output pipe dead")
    finally:
        child.kill()
        child.wait()

    assert outcome_file.exists(), f"the child died (exit {returncode}) before its session ended"
    outcome = json.loads(outcome_file.read_text())
    assert outcome["error"] is None, outcome
    assert outcome["step"] > 0
    assert _latest_step(logdir) == outcome["step"], "the final checkpoint was not committed"
    leftovers = [p.name for p in logdir.iterdir() if "asv-tmp" in p.name or p.name.endswith("_temp")]
    assert leftovers == []
    assert returncode == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_dead_reader_then_sigint_commits_final_checkpoint(tmp_path: Path, backend: str) -> None:
    """tee dies, Ctrl-C right after: the run exits 0 with its final checkpoint committed."""
    _run_piped_then_interrupt(tmp_path, backend, wait_for_save_after_death=False)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_saves_logged_to_dead_reader_still_count(tmp_path: Path, backend: str) -> None:
    """A periodic save logged to a dead pipe still counts; the later Ctrl-C saves and exits 0."""
    _run_piped_then_interrupt(tmp_path, backend, wait_for_save_after_death=True)
