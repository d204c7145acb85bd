"""The SLURM batch script of ``docs/operations.md``, run as SLURM would run it: by bash,
in a process group of its own, with stand-ins for ``srun`` (it runs its command) and
``scontrol`` (it records what it was asked), around a real training with
``stop_signals=("SIGINT", "SIGTERM", "SIGUSR1")``. The warning (SIGUSR1 to the batch
shell alone, ``--signal=B:USR1@N``) and the end of the job's time (SIGTERM to every
process of the job) each stop the training with its final checkpoint and requeue the job.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _timing import scaled

ROOT = Path(__file__).resolve().parents[1]
TRAIN = """
import sys

import anyio
import tensorflow as tf

import asupervisor as asv

logdir = sys.argv[sys.argv.index("--logdir") + 1]
w = tf.Variable(0.0)
sv = asv.Supervisor(
    logdir, state={"w": w}, stop_signals=("SIGINT", "SIGTERM", "SIGUSR1"), save_model_secs=3600, stop_grace_secs=60
)


async def main() -> None:
    async with sv.managed_session() as sess:
        print("started", flush=True)
        await sess.run_loop(lambda: w.assign_add(1.0))


anyio.run(main)
print(f"stopped {sv.status().stop_reason} at {sv.global_step}", flush=True)
sys.exit(asv.exit_code(sv.status()))
"""


def _script() -> str:
    """The page's batch script, as written."""
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page[page.index("## SLURM") :]
    m = re.search(r"```bash\n(.*?)```", section, re.S)
    assert m is not None, "no bash block in the SLURM section"
    return m.group(1)


def _run(tmp_path: Path, send: signal.Signals, to_group: bool) -> tuple[int, str, str, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (
        ("srun", 'exec "$@"'),
        ("scontrol", 'echo "$@" >> "$SCONTROL_LOG"'),
        ("python", f'exec {shlex.quote(sys.executable)} "$@"'),
    ):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "train.py").write_text(TRAIN)
    logdir = tmp_path / "run"
    (tmp_path / "job.sh").write_text(_script().replace("/shared/runs/exp1", str(logdir)))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SCONTROL_LOG": str(tmp_path / "scontrol.log"),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    with subprocess.Popen(
        ["bash", str(tmp_path / "job.sh")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a job's
    ) as job:  # its pipes closed whatever happens
        try:
            assert job.stdout is not None and job.stderr is not None
            line = job.stdout.readline()  # the training runs (its signal handlers are in place)
            if line.strip() != "started":
                job.wait(scaled(60))
                pytest.fail(f"the job did not start its training: {line}{job.stderr.read()[-3000:]}")
            if to_group:
                os.killpg(job.pid, send)
            else:
                os.kill(job.pid, send)
            out, err = job.communicate(timeout=scaled(180))
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.communicate()
    log = tmp_path / "scontrol.log"
    return job.returncode, out, err + (log.read_text() if log.exists() else ""), logdir


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("send", "to_group", "status", "reason"),
    [
        (signal.SIGUSR1, False, 138, "signal:SIGUSR1"),  # the warning, to the batch shell alone
        (signal.SIGTERM, True, 143, "signal:SIGTERM"),  # the end of the time, to the whole job
    ],
)
def test_the_slurm_script_stops_the_training_and_requeues(
    tmp_path: Path, send: signal.Signals, to_group: bool, status: int, reason: str
) -> None:
    """The signal reaches the training once, which stops with its final checkpoint and the
    signal's exit status; the batch shell survives to run ``scontrol requeue <job id>`` and
    exits with the training's status."""
    code, out, err, logdir = _run(tmp_path, send, to_group)
    assert code == status, err[-3000:]
    stopped = re.search(r"stopped (\S+) at (\d+)", out)
    assert stopped is not None and stopped.group(1) == reason, out + err[-3000:]
    step = int(stopped.group(2))
    assert (logdir / f"model.ckpt-{step}.index").exists(), sorted(p.name for p in logdir.iterdir())
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"], err[-3000:]
