"""Stop signals caught before the session (``asv.catch_stop_signals()`` in a script's
first lines, or a ``Supervisor`` made): a SIGTERM while the script still imports
TensorFlow stops the session as it starts, cleanly (the checkpoint on disk is left as it
was, exit status 143), also as PID 1 of a new PID namespace, where an uncaught SIGTERM is
ignored. Real processes, real signals."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _timing import ExitTimer, scaled

from asupervisor._checkpoint.store import state_file

SCRIPT = Path(__file__).parent / "scripts" / "early_signal.py"


def _can_unshare() -> bool:
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-pf", "true"], capture_output=True, timeout=scaled(30)).returncode == 0


def _run(
    logdir: Path, max_steps: int, *, early_signal: bool, pid1: bool = False, mode: str = "catch"
) -> tuple[int, list[str]]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, str(SCRIPT), str(logdir), str(max_steps), mode]
    if pid1:
        command = ["unshare", "-pf", *command]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        if early_signal:
            target = proc.pid
            if pid1:  # the python process: unshare's child, PID 1 of the new namespace
                target = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
            os.kill(target, signal.SIGTERM)
        proc.stdin.write("go\n")
        proc.stdin.close()
        out = proc.stdout.read().splitlines()
        return proc.wait(timeout=scaled(240)), out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A logdir a first run trained to step 5 (once for the module: each test takes a copy)."""
    logdir = tmp_path_factory.mktemp("trained") / "run"
    code, out = _run(logdir, 5, early_signal=False)
    assert code == 0 and out[-1] == "done max_steps 5", (code, out)
    return logdir


def _copy_of(trained: Path, tmp_path: Path) -> Path:
    logdir = tmp_path / "run"
    shutil.copytree(trained, logdir)
    return logdir


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "pid1",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.skipif(not _can_unshare(), reason="needs unshare -pf (Linux, root or user namespaces)"),
        ),
    ],
)
def test_a_sigterm_while_importing_stops_the_session_as_it_starts(tmp_path: Path, trained: Path, pid1: bool) -> None:
    """A first run trained to step 5. The second is sent SIGTERM before it imports
    TensorFlow: its session stops as it starts (``signal:SIGTERM``, exit status 143),
    without a step, and checkpoint 5 stays the latest, its files untouched."""
    logdir = _copy_of(trained, tmp_path)
    files = {p.name: p.stat().st_mtime_ns for p in logdir.glob("model.ckpt-5.*")}
    code, out = _run(logdir, 1000, early_signal=True, pid1=pid1)
    assert (code, out[-1]) == (143, "done signal:SIGTERM 5"), (code, out)
    assert state_file.read_state(logdir).latest == "model.ckpt-5"
    assert {p.name: p.stat().st_mtime_ns for p in logdir.glob("model.ckpt-5.*")} == files


@pytest.mark.timeout(300)
def test_a_sigterm_between_the_supervisor_and_its_session_stops_it_as_it_starts(tmp_path: Path, trained: Path) -> None:
    """No early call: the ``Supervisor`` is made, then a SIGTERM comes before
    ``managed_session()`` (while the data is built): the session stops as it starts with
    status 143, and the checkpoint on disk stays the latest."""
    logdir = _copy_of(trained, tmp_path)
    code, out = _run(logdir, 1000, early_signal=True, mode="supervisor")
    assert (code, out[-1]) == (143, "done signal:SIGTERM 5"), (code, out)
    assert state_file.read_state(logdir).latest == "model.ckpt-5"


WAIT_SCRIPT = Path(__file__).parent / "scripts" / "worker_wait.py"


@pytest.mark.timeout(120)
def test_a_sigterm_ends_a_non_chief_waiting_for_the_chiefs_checkpoint(tmp_path: Path) -> None:
    """A non-chief ``MonitoredTrainingSession`` waits for the chief's first checkpoint
    (``SessionManager.wait_for_session``, checking every 30 s). A SIGTERM during the wait
    ends it at once: the session stops as it starts, without a step, and the process
    exits 143 well before the next check would have come."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, str(WAIT_SCRIPT), str(tmp_path / "run"), "asyncio"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stderr is not None
            for line in proc.stderr:  # the wait has begun when its first check found nothing
                if "session_manager.waiting_for_session" in line:
                    break
            else:
                raise AssertionError("the worker never waited")
            exited = ExitTimer(proc.pid)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
            took = exited.secs()
        finally:
            proc.kill()
    assert (proc.returncode, out.splitlines()[-1:]) == (143, ["done signal:SIGTERM 0"]), err[-3000:]
    assert "session_manager.stopped" in err and "signal=SIGTERM" in err, err[-3000:]
    assert took < 15, f"the wait ended {took:.1f} s after the signal (the next check was 30 s away)"
