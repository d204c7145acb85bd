"""SIGTERM and SIGINT (and the other ``stop_signals``) are graceful stops, checked on a
real training process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import slowdisk
from _timing import ExitTimer, scaled, stretch

import asupervisor as asv

SCRIPT = Path(__file__).parent / "scripts" / "train_until_signal.py"


@pytest.mark.parametrize(
    ("backend", "signum"),
    [("asyncio", signal.SIGTERM), ("trio", signal.SIGINT)],  # each backend, each signal
)
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
            out, _ = proc.communicate(timeout=scaled(60))
        finally:
            proc.kill()
    assert proc.returncode == 128 + signum, out
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"stop_reason=signal:{signum.name} ")
    fields = dict(part.split("=") for part in last.split())
    assert fields["v"] == fields["step"]  # the step in flight finished; none was cut


SIGNAL_TRAIN = Path(__file__).parent / "scripts" / "signal_train.py"


def _start(backend: str, logdir: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(
        [sys.executable, str(SIGNAL_TRAIN), backend, str(logdir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
    """Wait for the child; if it hangs, kill it and fail with what it printed."""
    try:
        return proc.communicate(timeout=scaled(timeout))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the child did not exit within {timeout} s\nstdout:\n{out}\nstderr:\n{err}") from None


def _leftovers(logdir: Path) -> list[str]:
    return sorted(n for n in os.listdir(logdir) if ".asv-tmp-" in n)


def _wait_for_a_save_in_flight(logdir: Path, timeout: float = 60) -> None:
    """Until a save's temporary files are in ``logdir`` (checked every 10 ms)."""
    import time

    end = time.monotonic() + scaled(timeout)
    while not _leftovers(logdir):
        assert time.monotonic() < end, f"no save started in {logdir} within {timeout} s"
        time.sleep(0.01)


@pytest.mark.timeout(240)
@pytest.mark.skipif(not slowdisk.available(), reason="the slow disk is a FUSE mount: it needs root and /dev/fuse")
@pytest.mark.parametrize("backend", ["asyncio"])  # trio: test_console's second Ctrl-C during a slow stop
def test_second_signal_abandons_the_final_checkpoint(tmp_path: Path, backend: str) -> None:
    """A second Ctrl-C while the final checkpoint of a 64 MB state is being saved — on a
    disk that writes 40 MB/s (``tests/slowdisk.py``), so that save takes 1.6 s at the
    least — abandons it the same way on both backends: nothing of it stays, the
    checkpoint taken before stays the latest, the process ends at once (not after the
    120 s grace) with the interrupted status 130."""

    backing = tmp_path / "disk"
    backing.mkdir()
    with (
        slowdisk.mounted(backing, tmp_path / "mnt", mb_per_sec=40) as mnt,
        _start(backend, mnt / "run", "--mb", "64") as proc,
    ):
        try:
            assert proc.stdout is not None and proc.stderr is not None
            ready = proc.stdout.readline().split()
            assert ready[0] == "ready", ready
            saved_step = int(ready[1])
            proc.send_signal(signal.SIGINT)
            for line in proc.stderr:  # the first signal is taken: the stop has begun
                if "session.signal" in line:
                    break
            _wait_for_a_save_in_flight(backing / "run")  # the final save's files appear
            exited = ExitTimer(proc.pid)
            proc.send_signal(signal.SIGINT)
            out, err = _finish(proc)
            secs = exited.secs()
        finally:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert secs < 30, f"the second Ctrl-C took {secs:.1f} s to end the process"
    last = out.strip().splitlines()[-1]
    assert last.startswith("stop_reason=signal:SIGINT ")
    assert last.endswith(f"latest={mnt / 'run' / f'model.ckpt-{saved_step}'}"), last
    assert "checkpoint.abandoned" in err
    assert _leftovers(backing / "run") == []


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["asyncio"])  # (the writer's thread; trio: the start-up's SIGTERM below)
def test_sigterm_while_the_writer_prepares_the_next_save_is_not_kept_waiting(tmp_path: Path, backend: str) -> None:
    """After the start-up save of a state of 3,000 variables the writer makes their batched
    read (seconds of tracing); a SIGTERM sent as soon as that save is logged ends the
    making between two of its pieces: the final checkpoint is taken and the process exits
    preempted, and the batched read is never finished (``checkpoint.batched_read`` would
    say it was: without the stop check it is, and the stop waits for it)."""
    logdir = tmp_path / "run"
    with _start(backend, logdir, "--vars", "3000", "--debug") as proc:
        try:
            assert proc.stderr is not None
            seen = []
            for line in proc.stderr:
                seen.append(line)
                if "checkpoint.saved" in line:  # the start-up save: the writer now prepares the next
                    break
            assert any("checkpoint.saved" in line for line in seen), "".join(seen)
            proc.send_signal(signal.SIGTERM)
            out, err = _finish(proc)
        finally:
            proc.kill()
    err = "".join(seen) + err
    assert proc.returncode == 143, out + err
    assert "checkpoint.batched_read " not in err and not err.rstrip().endswith("checkpoint.batched_read"), err
    last = out.strip().splitlines()[-1]
    assert last.startswith("stop_reason=signal:SIGTERM latest=")
    assert not last.endswith("latest=None"), last


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["trio"])  # asyncio: the writer's SIGTERM above
def test_sigterm_during_start_up_is_a_graceful_stop(tmp_path: Path, backend: str) -> None:
    """A SIGTERM while the state is being initialised (a slow ``init_fn``) does not kill
    the process: start-up completes, the session stops before the first step with a
    checkpoint of the initialised state, and the process exits preempted (143)."""
    logdir = tmp_path / "run"
    with _start(backend, logdir, "--slow-init") as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "init"
            proc.send_signal(signal.SIGTERM)
            out, err = _finish(proc)
        finally:
            proc.kill()
    assert proc.returncode == 143, out + err
    last = out.strip().splitlines()[-1]
    assert last == f"stop_reason=signal:SIGTERM latest={logdir / 'model.ckpt-0'}", last
    assert _leftovers(logdir) == []


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_applications_handler_is_called_too_and_put_back(tmp_path: Path, backend: str) -> None:
    """A handler the application installed before the session (a web server's) is called
    at the signal as well as the graceful stop (final checkpoint taken), and is the
    handler again once the session has ended."""
    logdir = tmp_path / "run"
    with _start(backend, logdir, "--app-handler") as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().split()[0] == "ready"
            proc.send_signal(signal.SIGTERM)
            out, err = _finish(proc)
        finally:
            proc.kill()
    assert proc.returncode == 143, out + err
    lines = out.strip().splitlines()
    assert "app-handler SIGTERM" in lines
    assert "handler-restored True" in lines
    stop = lines[-1]
    assert stop.startswith("stop_reason=signal:SIGTERM latest=")
    step = int(lines[-2].split()[1])
    assert stop.endswith(f"latest={logdir / f'model.ckpt-{step}'}")  # the final checkpoint


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_signal_delivered_to_another_thread_stops_the_session(tmp_path: Path, backend: str) -> None:
    """The kernel may hand a process's SIGTERM to any thread; the step thread sends it to
    itself here (``pthread_kill``), while the event loop on the main thread sleeps with
    nothing due for an hour. The main thread must wake and stop the session gracefully,
    final checkpoint included (on asyncio this needs the session's wakeup descriptor:
    without it the child hangs)."""
    logdir = tmp_path / "run"
    with _start(backend, logdir, "--signal-from-thread") as proc:
        try:
            out, err = _finish(proc, timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 143, out + err
    lines = out.strip().splitlines()
    assert lines[-1].startswith("stop_reason=signal:SIGTERM latest="), out
    step = int(lines[-2].split()[1])
    assert step >= 20 and lines[-1].endswith(f"latest={logdir / f'model.ckpt-{step}'}")  # the final checkpoint


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_signal_added_to_stop_signals_is_a_graceful_stop(tmp_path: Path, backend: str) -> None:
    """``stop_signals=("SIGINT", "SIGTERM", "SIGUSR1")`` (SLURM's ``--signal=USR1@90``):
    SIGUSR1 stops at a step boundary with a final checkpoint, and the process exits with
    128 + its number, as ``asv.exit_code`` says for another signal."""
    logdir = tmp_path / "run"
    with _start(backend, logdir, "--stop-signals", "SIGINT,SIGTERM,USR1") as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().split()[0] == "ready"
            proc.send_signal(signal.SIGUSR1)
            out, err = _finish(proc)
        finally:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGUSR1, out + err
    lines = out.strip().splitlines()
    step = int(lines[-2].split()[1])
    assert lines[-1] == f"stop_reason=signal:SIGUSR1 latest={logdir / f'model.ckpt-{step}'}", lines[-1]


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (("SIGINT", "SIGNOPE"), ValueError, r"no signal 'SIGNOPE'"),
        (("SIGKILL",), ValueError, r"SIGKILL cannot be caught"),
        ("SIGTERM", TypeError, r"a sequence of signal names or numbers, got 'SIGTERM'"),
        ((1.5,), TypeError, r"got 1.5"),
    ],
)
def test_bad_stop_signals_are_refused_naming_the_value(value: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        asv.Supervisor(stop_signals=value)  # type: ignore[arg-type]


def test_stop_signals_take_names_numbers_and_short_names() -> None:
    sv = asv.Supervisor(stop_signals=("SIGTERM", "usr1", int(signal.SIGUSR2), "SIGTERM"))
    assert sv.config.stop_signals == (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


STUCK_DATA = Path(__file__).parent / "scripts" / "stuck_data.py"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("backend", "exit"), [("asyncio", "now"), ("trio", "sys.exit")])
def test_sigterm_while_the_input_hangs_ends_the_process_within_its_grace(
    tmp_path: Path, backend: str, exit: str
) -> None:
    """A SIGTERM to a training whose ``tf.data`` input stopped answering (a reader on a dead
    mount: the step thread waits in the iterator's ``next()``) ends the process
    ``stop_grace_secs`` (2 s) + the 1 s wind-down after it, with the preempted status and
    the restart point named: the final checkpoint is left out (the thread that owns the
    state is stuck), the last committed one stays the latest. Through ``asv.exit_now`` (as
    the docs advise) and through a plain ``sys.exit``, whose interpreter teardown must not
    wait for the stuck reader either."""

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    logdir = tmp_path / "run"
    args = [sys.executable, str(STUCK_DATA), backend, str(logdir), exit]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().split()[0] == "stuck"
            exited = ExitTimer(proc.pid)
            proc.send_signal(signal.SIGTERM)
            out, err = _finish(proc, timeout=60)  # the old stop waited for the data, forever
            took = exited.secs()
        finally:
            proc.kill()
    assert proc.returncode == 143, out + err
    latest = logdir / "model.ckpt-0"
    assert out.strip().splitlines()[-1] == f"stop_reason=signal:SIGTERM latest={latest}", out
    overrun = [line for line in err.splitlines() if "shutdown.overrun" in line]
    assert len(overrun) == 1 and "final_checkpoint" in overrun[0] and str(latest) in overrun[0], err[-3000:]
    assert sorted(p.name for p in logdir.glob("model.ckpt-*.index")) == ["model.ckpt-0.index"]
    # the grace and the wind-down, then the interpreter's teardown (sys.exit: seconds)
    assert took < 2 + 1 + (1.0 if exit == "now" else 10.0) * stretch(), f"{took:.1f} s from SIGTERM to exit"
