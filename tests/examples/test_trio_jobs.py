"""``examples/trio_jobs.py``: training jobs in a trio nursery, run as a user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from _timing import scaled

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trio_jobs.py"


def run(logdir: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--logdir", str(logdir), "--report-secs", "0.2", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_jobs_train_side_by_side_and_resume(tmp_path: Path) -> None:
    """Two jobs train to their ``max_steps`` in one nursery and exit 0; a second run
    resumes each at its last step (nothing to do) and checkpoints stay per job."""
    with run(tmp_path, "--steps", "50") as proc:
        out, err = proc.communicate(timeout=scaled(120))
    assert proc.returncode == 0, err
    assert "job0: stopped at step 50 (max_steps)" in out and "job1: stopped at step 50 (max_steps)" in out
    for job in ("job0", "job1"):
        assert (tmp_path / job / "model.ckpt-50.index").exists()
    with run(tmp_path, "--steps", "60") as proc:
        out, err = proc.communicate(timeout=scaled(120))
    assert proc.returncode == 0, err
    assert "job0: resumed at step 50" in out and "job1: stopped at step 60 (max_steps)" in out


def test_one_ctrl_c_stops_every_job_with_a_final_checkpoint(tmp_path: Path) -> None:
    """One SIGINT stops both jobs gracefully (each saves its last step; the sessions'
    handlers chain) and the runner exits with the interrupted status 130."""
    with run(tmp_path, "--steps", "100000000") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("progress:") and all(int(n) > 0 for n in line.split()[2::2]):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=scaled(120))
    assert proc.returncode == 130, err
    for job in ("job0", "job1"):
        stopped = next(line for line in out.splitlines() if line.startswith(f"{job}: stopped at step"))
        assert stopped.endswith("(signal:SIGINT)"), stopped
        step = int(stopped.split("step ")[1].split()[0])
        assert f'model_checkpoint_path: "model.ckpt-{step}"' in (tmp_path / job / "checkpoint").read_text()
