"""``Supervisor(progress=True)``: the live progress display, as a user sees it."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _timing import scaled

SCRIPT = """
import sys, time, anyio, tensorflow as tf, asupervisor as asv

async def main():
    w = tf.Variable(0.0)
    sv = asv.Supervisor(sys.argv[1], state={"w": w}, save_model_secs=0, save_model_steps=200, progress=True)
    def step():
        w.assign_add(1.0)
        if sv.global_step == 1200:
            print("ready", flush=True)
        time.sleep(0.002)
        return {"loss": 1.0 / (1.0 + w)}
    async with sv.managed_session() as sess:
        await sess.run_loop(step, max_steps=int(sys.argv[2]))
    sys.exit(asv.exit_code(sv.status()))

anyio.run(main)
"""


def run(tmp_path: Path, max_steps: int) -> subprocess.Popen[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "run"), str(max_steps)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.timeout(120)
def test_plain_lines_when_piped_and_the_first_ctrl_c_says_what_happens(tmp_path: Path) -> None:
    """Piped (not a terminal), the display writes plain lines on stderr (the progress
    line every 10 s), one for the newest checkpoint at each refresh and a last one with the loss and the stop reason; the
    first Ctrl-C tells the user a final checkpoint is being saved; stdout stays the
    program's. Run again, it says once where it resumed."""
    with run(tmp_path, 100_000) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=scaled(90))
    assert proc.returncode == 130, err
    assert out.strip() == ""  # nothing of the display on stdout
    lines = err.splitlines()
    saved = [int(line.split()[3].rstrip(":")) for line in lines if line.startswith("checkpoint at step ")]
    assert saved and saved[-1] >= 200 and all(step % 200 == 0 for step in saved), err
    assert any("stopping gracefully — final checkpoint at step" in line and "Ctrl-C again" in line for line in lines)
    last = [line for line in lines if "stopped (" in line][-1]
    assert "loss " in last and last.endswith("stopped (signal:SIGINT)"), last

    # run again, to a step it has passed: it says once where it resumed, never lists the
    # checkpoint it restored as a save, and ends at once
    with run(tmp_path, 100) as proc:
        _, err = proc.communicate(timeout=scaled(90))
    assert proc.returncode == 0, err
    lines = err.splitlines()
    resumed = [line for line in lines if line.startswith("resumed at step ")]
    assert len(resumed) == 1, err
    at = int(resumed[0].split()[3])  # the final checkpoint of the Ctrl-C
    assert at > saved[-1] and resumed[0].endswith(f" from {tmp_path / 'run' / f'model.ckpt-{at}'}"), err
    assert not [line for line in lines if line.startswith("checkpoint at step ")], err
    last = [line for line in lines if "stopped (" in line][-1]
    assert "saved @" not in last and last.endswith("stopped (max_steps)"), last


def test_the_line_fits_80_columns_in_place() -> None:
    """On a terminal the line is rewritten in place (carriage return, no newline), cut to
    the terminal's width less room for the terminal's ``^C`` echo, and the rest of a
    longer previous line erased (``ESC [ K``)."""
    from asupervisor._core._status import CheckpointInfo, Status
    from asupervisor._progress._part import _Output, render

    status = Status(
        running=True,
        global_step=1234,
        max_steps=100000,
        steps_per_sec=412.5,
        eta_secs=239.4,
        metrics={"loss": 0.0123456, "accuracy": 0.875, "lr": 0.001},
        last_checkpoint=CheckpointInfo(path="runs/x/model.ckpt-1200", step=1200, time=0.0),
    )
    line = render(status)
    assert line.startswith("step 1234/100000  412.5 steps/s") and "ETA 3:59" in line and "saved @1200" in line
    stream = io.StringIO()
    out = _Output(stream, in_place=True)
    os.environ["COLUMNS"] = "80"
    try:
        out.write(line + " " + "x" * 100, False)
        out.write("short", False)
    finally:
        del os.environ["COLUMNS"]
    first, second = stream.getvalue().split("\r")[1:]
    assert first.endswith("\x1b[K") and len(first) == 77 + 3 and "\n" not in first
    assert second == "short\x1b[K"


def test_lines_go_above_the_live_line_and_a_stuck_display_never_blocks_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line of its own (a checkpoint) or a log line handed to the console clears the
    live line, is written, and the live line is redrawn below it; the final line leaves
    no live line. A logging thread waits for a stuck display's writer at most
    ``_LOCK_WAIT_SECS``, then the caller writes the line itself."""
    import time

    from asupervisor._progress import _part

    stream = io.StringIO()
    out = _part._Output(stream, in_place=True)
    out.write("step 1", False)
    out.write("checkpoint at step 1: x", True)
    assert out.write_above("2026-01-01T00:00:00Z [info] app.note")
    out.write("step 2  stopped (completed)", True, True)
    assert out.write_above("after")
    assert stream.getvalue() == (
        "\rstep 1\x1b[K"
        "\rcheckpoint at step 1: x\x1b[K\nstep 1\x1b[K"
        "\r\x1b[K2026-01-01T00:00:00Z [info] app.note\nstep 1\x1b[K"
        "\rstep 2  stopped (completed)\x1b[K\n"
        "\r\x1b[Kafter\n"
    )
    monkeypatch.setattr(_part, "_LOCK_WAIT_SECS", 0.05)
    with out._lock:  # the display's writer stuck in a write to a stalled terminal
        t0 = time.monotonic()
        assert not out.write_above("a save's log line")
        assert time.monotonic() - t0 < 2
    piped = _part._Output(io.StringIO(), in_place=False)
    assert piped.write_above("plain") and piped.stream is not None and piped.stream.getvalue() == "plain\n"


LATE_SECOND_SIGNAL = """
import os, signal, sys, time, anyio, tensorflow as tf, asupervisor as asv
from asupervisor._progress._part import ProgressPart

inherited = ProgressPart.release

def release(self):
    # the session's release phase is under way: the second Ctrl-C lands now, and the
    # release waits until the display has said it (the session logs it in the same call)
    inherited(self)
    os.kill(os.getpid(), signal.SIGINT)
    t0 = time.monotonic()
    while not self._told_again and time.monotonic() - t0 < 30:
        time.sleep(0.01)
    print("second signal handled" if self._told_again else "second signal lost", flush=True)

ProgressPart.release = release

async def main():
    w = tf.Variable(0.0)
    sv = asv.Supervisor(sys.argv[1], state={"w": w}, save_model_secs=0, save_model_steps=None, progress=True)
    def step():
        w.assign_add(1.0)
        if sv.global_step == 5:
            os.kill(os.getpid(), signal.SIGINT)
        return {"loss": 1.0}
    async with sv.managed_session() as sess:
        await sess.run_loop(step, max_steps=100_000)
    sys.exit(asv.exit_code(sv.status()))

anyio.run(main, backend=sys.argv[2])
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_second_ctrl_c_as_the_session_lets_go_is_said_once(tmp_path: Path, backend: str) -> None:
    """A second Ctrl-C that lands while the session releases what it held (its last
    phase, the display's thread still there) is said by the display's line alone: the
    session's ``session.signal`` log line is not printed below it (a full run saw it when
    the display let go of the console before the session gave its signal handlers back)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-c", LATE_SECOND_SIGNAL, str(tmp_path / "run"), backend],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(90),
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stdout.strip() == "second signal handled", proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len([line for line in lines if line.startswith("second Ctrl-C: ")]) == 1, proc.stderr
    assert "session.signal" not in proc.stderr, proc.stderr
