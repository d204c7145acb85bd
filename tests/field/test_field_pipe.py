"""Logging never costs training: a run piped through ``tee`` whose reader dies, then Ctrl-C.

``python train.py 2>&1 | tee log``, then ``tee`` dies (its terminal closed, killed with
the job), then Ctrl-C: every line the run writes now hits a broken pipe. The run must
still stop at a step boundary, commit its final checkpoint and exit. Real processes, a
real pipe read by a real ``tee``, a real SIGINT. The training script writes what it
reached to a side file, since its output is gone.
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
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import pytest
from _timing import scaled

SCRIPTS = Path(__file__).parent / "scripts"
DEMO = ["-m", "asupervisor", "demo"]  # the `asupervisor demo` command
DEADLINE_SECS = scaled(90.0)

pytestmark = pytest.mark.skipif(shutil.which("tee") is None, reason="no tee(1) on this machine")


def _read_until(stream: IO[bytes], pattern: str, deadline: float) -> None:
    """Read ``stream`` (a pipe) up to a line matching ``pattern``; fail at ``deadline``."""
    lines: list[str] = []
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(stream.fileno(), selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no line matching {pattern!r} in time; last lines: {lines[-20:]}")
            if not selector.select(left):
                continue
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                pytest.fail(f"output ended before a line matching {pattern!r}; last lines: {lines[-20:]}")
            *complete, buffer = (buffer + chunk).split(b"\n")
            for raw in complete:
                lines.append(raw.decode(errors="replace"))
                if re.search(pattern, lines[-1]):
                    return


def _latest_step(logdir: Path) -> int | None:
    """The step of the checkpoint ``tf.train.latest_checkpoint`` names in ``logdir``."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(logdir))
    return None if latest is None else int(latest.rsplit("-", 1)[1])


def _leftovers(logdir: Path) -> list[str]:
    """What an interrupted save would leave in ``logdir``."""
    return [p.name for p in logdir.iterdir() if "asv-tmp" in p.name or p.name.endswith("_temp")]


def _piped_then_interrupted(
    command: Sequence[str], tmp_path: Path, logdir: Path, *, wait_for_save_after_death: bool
) -> tuple[int, int | None]:
    """Run ``command 2>&1 | tee log``; once a periodic checkpoint is logged, kill tee, then
    (after one more checkpoint commits, if asked) send SIGINT. Returns the exit status and
    the latest checkpoint's step when tee died. Fails if the child does not exit in time."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("PYTHONUNBUFFERED", None)  # standard streams buffered, as a user's run has them
    deadline = time.monotonic() + DEADLINE_SECS
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        assert child.stdout is not None
        tee = subprocess.Popen(["tee", str(tmp_path / "log")], stdin=child.stdout, stdout=subprocess.PIPE)
        child.stdout.close()  # only tee reads the child's output now
        try:
            assert tee.stdout is not None
            _read_until(tee.stdout, r"checkpoint\.saved.*step=[1-9]", deadline)  # training, saving
        finally:
            tee.kill()  # the reader dies: from now on every write of the child fails (EPIPE)
            tee.wait()
            if tee.stdout is not None:
                tee.stdout.close()
        step_at_death = _latest_step(logdir)
        if wait_for_save_after_death:
            # A periodic save commits and logs its line into the dead pipe.
            while _latest_step(logdir) == step_at_death and child.poll() is None:
                assert time.monotonic() < deadline, "no checkpoint committed after the reader died"
                time.sleep(0.02)
        child.send_signal(signal.SIGINT)
        try:
            returncode = child.wait(timeout=max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            pytest.fail("the run did not exit after SIGINT with its output pipe dead")
    finally:
        child.kill()
        child.wait()
    return returncode, step_at_death


@pytest.mark.parametrize(
    ("backend", "wait_for_save_after_death"),
    [("asyncio", False), ("trio", True)],
    ids=["sigint-at-once-asyncio", "save-into-dead-pipe-then-sigint-trio"],
)
def test_dead_reader_then_sigint_commits_final_checkpoint(
    tmp_path: Path, backend: str, wait_for_save_after_death: bool
) -> None:
    """tee dies, then Ctrl-C (at once, or after a save logged into the dead pipe): the run
    ends without error, its final checkpoint at the step it reached is the latest, nothing
    of a save is left over, and the exit status is 0."""
    logdir, outcome_file = tmp_path / "run", tmp_path / "outcome.json"
    command = [sys.executable, str(SCRIPTS / "pipe_train.py"), backend, str(logdir), str(outcome_file)]
    returncode, _ = _piped_then_interrupted(
        command, tmp_path, logdir, wait_for_save_after_death=wait_for_save_after_death
    )
    assert outcome_file.exists(), f"the run died (exit {returncode}) before its session ended"
    outcome = json.loads(outcome_file.read_text())
    assert outcome["error"] is None, outcome
    assert outcome["step"] > 0
    assert _latest_step(logdir) == outcome["step"], "the final checkpoint was not committed"
    assert _leftovers(logdir) == []
    assert returncode == 0  # not 120: Python's exit-time flush of the dead stderr did not fail


def test_demo_piped_through_tee_that_dies_then_ctrl_c(tmp_path: Path) -> None:
    """``asupervisor demo 2>&1 | tee log``, tee killed, Ctrl-C: the demo (progress
    prints on stdout, events on stderr) exits without error after a final checkpoint newer
    than the last one before tee died, and leaves nothing of a save behind."""
    logdir = tmp_path / "run"
    command = [
        sys.executable, *DEMO, "--logdir", str(logdir), "--max-steps", "10000000",
        "--save-secs", "0.5", "--summary-secs", "0.5", "--progress-secs", "0.1",
    ]  # fmt: skip
    returncode, step_at_death = _piped_then_interrupted(command, tmp_path, logdir, wait_for_save_after_death=False)
    # 1 is an error (a print or a log line raising); 120 is Python failing to flush a dead
    # stream at exit; a negative status is death by a signal. The status of an
    # interrupted run is the demo's: asv.exit_code's "interrupted", 130.
    assert returncode == 130, returncode
    assert step_at_death is not None
    final = _latest_step(logdir)
    assert final is not None and final > step_at_death, "no final checkpoint after Ctrl-C"
    assert _leftovers(logdir) == []
