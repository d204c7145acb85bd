"""The goodput ledger against a stopwatch: a real training SIGKILLed mid-run, after a
checkpoint, and restarted to its end (``scripts/ledger_train.py``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _timing import scaled

from asupervisor._inspect import run as inspect

SCRIPT = Path(__file__).parent / "scripts" / "ledger_train.py"
LEDGER = "asupervisor-goodput.json"


def _start(logdir: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(logdir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _line(proc: subprocess.Popen[str], expected: str) -> None:
    """Wait for the child's next stdout line, which must be ``expected``."""
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != expected:
        proc.kill()
        _, err = proc.communicate(timeout=scaled(60))
        raise AssertionError(f"expected {expected!r} from the training, got {line!r}\n{err[-3000:]}")


def _latest_step(logdir: Path) -> int | None:
    try:
        text = (logdir / "checkpoint").read_text()
    except FileNotFoundError:
        return None
    match = re.search(r'^model_checkpoint_path: ".*-(\d+)"$', text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _ledger(logdir: Path) -> dict[str, object] | None:
    try:
        data: dict[str, object] = json.loads((logdir / LEDGER).read_text())
    except FileNotFoundError:
        return None
    return data


@pytest.mark.timeout(240)
def test_ledger_of_a_killed_and_restarted_training_matches_a_stopwatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A training is SIGKILLed while a step hangs, after its checkpoint of step 20 and once
    its ledger recorded step 25; restarted, it resumes from step 20, does steps 21-25 again
    and trains to step 60. The ledger's wall time equals a stopwatch around both processes
    (from the first start to the second one's end of session: the interpreter's teardown
    after it, TensorFlow's own, is no part of a training) within 5 %, productive time and
    badput by cause add up to it, the kill shows as one restart, 5 redone steps and the
    time lost between the processes, and ``asupervisor inspect`` prints it."""
    logdir = tmp_path / "run"
    started = time.monotonic()
    first = _start(logdir, "60", "25")
    try:
        _line(first, "holding")
        deadline = time.monotonic() + scaled(60)
        while True:  # the ledger's periodic rewrite records the step that hangs
            ledger = _ledger(logdir)
            if ledger is not None and ledger["step"] == 25 and _latest_step(logdir) == 20:
                break
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"no ledger of step 25 after checkpoint 20 within 60 s: {ledger}"
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=scaled(60))
        assert first.returncode == -signal.SIGKILL
        second = _start(logdir, "60")
        assert second.stdout is not None
        done = second.stdout.readline().split()
        assert done[:1] == ["done"], (done, second.communicate()[1][-3000:])
        # the child's own reading of the shared monotonic clock: the parent, on a busy
        # machine, may read the line a while after it was written
        stopwatch = float(done[1]) - started
        _, err = second.communicate(timeout=scaled(60))
        assert second.returncode == 0, err[-3000:]
    finally:
        for proc in (first, locals().get("second")):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=scaled(60))

    ledger = _ledger(logdir)
    assert ledger is not None
    wall = ledger["wall_secs"]
    assert isinstance(wall, float)
    assert abs(wall - stopwatch) <= 0.05 * stopwatch, (wall, stopwatch)
    badput = ledger["badput"]
    assert isinstance(badput, dict)
    assert ledger["productive_secs"] + sum(badput.values()) == pytest.approx(wall, rel=1e-9)
    assert ledger["step"] == 60 and ledger["ended"] == "max_steps"
    assert ledger["restarts"] == 1 and ledger["redone_steps"] == 5
    for cause in (
        "training_prep",
        "data_loading_sync",
        "unproductive_checkpoint_restore_time",
        "wasted_progress_from_disruption",
        "infrastructure_recovery_from_disruption",
    ):
        assert badput.get(cause, 0) > 0, cause
    # two start-ups (imports included): most of a run this short
    assert badput["training_prep"] > 0.3 * wall

    capsys.readouterr()
    assert inspect(str(logdir)) == 0
    text = capsys.readouterr().out
    assert "1 restarts, 5 steps redone, step 60, max_steps" in text
    assert "badput wasted_progress_from_disruption" in text
    assert inspect(str(logdir), as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["goodput"]["redone_steps"] == 5 and report["goodput"]["wall_secs"] == wall
