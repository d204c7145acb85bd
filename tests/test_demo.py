"""The demo that `make demo` runs: a real training process, run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"


def run_demo(logdir: Path, max_steps: int) -> str:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--logdir", str(logdir), "--max-steps", str(max_steps),
         "--progress-secs", "0.5"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_demo_trains_and_reports(tmp_path: Path) -> None:
    """The demo trains to max_steps, prints progress and a final line, and exits 0."""
    out = run_demo(tmp_path / "run", 300)
    assert "progress: step" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("done: step 300, stop reason max_steps")


def test_demo_resumes_where_it_stopped(tmp_path: Path) -> None:
    """Run again with a higher max_steps, the demo resumes from its checkpoint and finishes."""
    logdir = tmp_path / "run"
    run_demo(logdir, 100)
    out = run_demo(logdir, 160)
    assert "resumed at step 100" in out
    assert out.strip().splitlines()[-1].startswith("done: step 160, stop reason max_steps")
    assert any(p.name.startswith("events.out.tfevents") for p in logdir.iterdir())
    assert (logdir / "model.ckpt-160.index").exists()
