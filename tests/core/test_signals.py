"""SIGTERM and SIGINT are graceful stops, checked on a real training process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "train_until_signal.py"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_training_gracefully(backend: str, signum: signal.Signals) -> None:
    """The first SIGTERM/SIGINT ends the loop at a step boundary; the process exits with
    ``asv.exit_code``'s status for it: 143 preempted (SIGTERM), 130 interrupted (SIGINT)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    with subprocess.Popen(
        [sys.executable, str(SCRIPT), backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            proc.send_signal(signum)
            out, _ = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 128 + signum, out
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"stop_reason=signal:{signum.name} ")
    fields = dict(part.split("=") for part in last.split())
    assert fields["v"] == fields["step"]  # the step in flight finished; none was cut
