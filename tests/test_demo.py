"""The demo that `make demo` runs: a real training process, run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _timing import scaled

DEMO = ["-m", "asupervisor", "demo"]  # the command `asupervisor demo`, as `make demo` runs it


def run_demo(logdir: Path, max_steps: int, *, stderr: list[str] | None = None, extra: tuple[str, ...] = ()) -> str:
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the demo silences TensorFlow by itself
    proc = subprocess.run(
        [
            sys.executable,
            *DEMO,
            "--logdir",
            str(logdir),
            "--max-steps",
            str(max_steps),
            "--progress-secs",
            "0.5",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(300),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    if stderr is not None:
        stderr.append(proc.stderr)
    return proc.stdout


def test_demo_trains_and_reports(tmp_path: Path) -> None:
    """The demo trains to max_steps, prints progress and a final line, and exits 0; none
    of TensorFlow's start-up lines (absl's notice, the CUDA probe) reach its stderr."""
    err: list[str] = []
    out = run_demo(tmp_path / "run", 300, stderr=err)
    noise = [
        line for line in err[0].splitlines() if "absl::InitializeLog" in line or line[:5] in ("I0000", "W0000", "E0000")
    ]
    assert noise == [], noise
    assert "progress: step" in out
    last = out.strip().splitlines()[-2]
    assert last.startswith("done: step 300, stop reason max_steps")


def test_demo_with_an_overhead_budget_cadence(tmp_path: Path) -> None:
    """`asupervisor demo --save-secs auto` trains with save_model_secs="auto" and leaves
    the final checkpoint; a bad value is a usage error naming it."""
    logdir = tmp_path / "run"
    out = run_demo(logdir, 200, extra=("--save-secs", "auto"))
    assert out.strip().splitlines()[-2].startswith("done: step 200, stop reason max_steps")
    assert (logdir / "model.ckpt-200.index").exists()
    bad = subprocess.run(
        [sys.executable, *DEMO, "--logdir", str(logdir), "--save-secs", "often"],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert bad.returncode == 2 and "'often'" in bad.stderr, bad.stderr


def test_demo_resumes_where_it_stopped(tmp_path: Path) -> None:
    """Run again with a higher max_steps, the demo resumes from its checkpoint and finishes."""
    logdir = tmp_path / "run"
    run_demo(logdir, 100)
    out = run_demo(logdir, 160)
    assert "resumed at step 100" in out
    assert out.strip().splitlines()[-2].startswith("done: step 160, stop reason max_steps")
    assert any(p.name.startswith("events.out.tfevents") for p in logdir.iterdir())
    assert (logdir / "model.ckpt-160.index").exists()


def test_ctrl_c_stops_the_demo_gracefully_and_it_resumes(tmp_path: Path) -> None:
    """SIGINT mid-training: a clean exit with a final checkpoint; the next run resumes there."""
    import signal

    logdir = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    with subprocess.Popen(
        [sys.executable, *DEMO, "--logdir", str(logdir), "--max-steps", "1000000", "--progress-secs", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until it is really training
            if line.startswith("progress: step ") and not line.startswith("progress: step 0/"):
                break
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=scaled(120))
    assert proc.returncode == 130, out  # interrupted (asv.exit_code)
    last = [line for line in out.strip().splitlines() if line.startswith("done:")][-1]
    assert "stop reason signal:SIGINT" in last
    stopped_at = int(last.split()[2].rstrip(","))
    assert stopped_at > 0
    assert (logdir / f"model.ckpt-{stopped_at}.index").exists()  # the final checkpoint
    resumed = run_demo(logdir, stopped_at + 50)
    assert f"resumed at step {stopped_at}" in resumed
    assert resumed.strip().splitlines()[-2].startswith(f"done: step {stopped_at + 50}, stop reason max_steps")
