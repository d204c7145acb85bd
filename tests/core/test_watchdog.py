"""The hang watchdog: deadlines learned from observed durations, a stuck phase named and
the process ended with the hang status, a slow but progressing phase left alone."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import slowdisk
import tensorflow as tf
from _timing import ExitTimer, scaled, stretch

import asupervisor as asv
from asupervisor._core._goodput import TimeAccount
from asupervisor._core._status import EXIT_HANG
from asupervisor._core._watchdog import LEARNED_FILE, Watchdog
from asupervisor.testing import capture_logs

SCRIPT = Path(__file__).parent / "scripts" / "hang_train.py"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Session:
    """What the watchdog reads and calls of a session (``Runtime`` in a real one)."""

    def __init__(self) -> None:
        self.step = 0
        self.times = TimeAccount(started_at=0.0)
        self.is_chief = True
        self.logdir: Path | None = None
        self.stops: list[str | None] = []
        self.badput: list[tuple[str, float]] = []
        self.suspect = False

    def record_badput(self, cause: str, secs: float = 0.0, *, steps: int = 0) -> None:
        self.badput.append((cause, secs))

    def mark_state_suspect(self) -> None:
        self.suspect = True

    def request_stop(self, exc: BaseException | None = None, *, reason: str | None = None) -> None:
        self.stops.append(reason)


def _steps(session: _Session, clock: _Clock, dog: Watchdog, n: int, secs: float) -> None:
    """``n`` completed steps of ``secs`` each, with a watchdog look after each."""
    for _ in range(n):
        dog.beat.at = clock.now
        clock.now += secs
        dog.beat.at = 0.0
        session.times.step_done(secs)
        session.step += 1
        assert not dog.check()


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("floor_secs", 0, ValueError),
        ("factor", -1.0, ValueError),
        ("unlearned_secs", float("inf"), ValueError),
        ("exit_after_secs", "5", TypeError),
        ("enabled", 1, TypeError),
        ("peer_secs", -2.0, ValueError),
    ],
)
def test_bad_options_are_refused_naming_the_field_and_value(field: str, value: object, error: type) -> None:
    """A bad setting is refused at once, naming the field and the value."""
    with pytest.raises(error, match=f"WatchdogOptions.{field}.*{value!r}"):
        asv.WatchdogOptions(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"StopOptions\.watchdog"):
        asv.StopOptions(watchdog=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got False \(off: asv\.WatchdogOptions\(enabled=False\)\)"):
        asv.StopOptions(watchdog=False)  # type: ignore[arg-type]


def test_the_step_deadline_is_learned_and_a_stuck_step_is_named() -> None:
    """The first step (tracing) gets ``unlearned_secs``; once steps completed, a step's
    deadline is ``max(floor, factor x p99)``; a step past it is a hang: ``hang:step``
    requested, the state marked suspect, its seconds recorded as ``hang`` badput."""
    clock, session = _Clock(), _Session()
    options = asv.WatchdogOptions(floor_secs=1.0, factor=4.0, unlearned_secs=60.0)
    dog = Watchdog(session, options, perf=clock)  # type: ignore[arg-type]
    dog.beat.at = clock.now  # the first step: 30 s of tracing is no hang
    clock.now += 30.0
    assert not dog.check()
    dog.beat.at = 0.0
    session.times.step_done(30.0)
    session.step = 1
    assert not dog.check()
    assert dog.deadline("step") == 60.0  # nothing learned yet: the first step is not learned from
    _steps(session, clock, dog, 20, 0.5)
    assert dog.deadline("step") == 2.0  # 4 x 0.5
    dog.beat.at = clock.now
    clock.now += 1.9
    assert not dog.check()
    clock.now += 0.2
    assert dog.check()
    assert session.stops == ["hang:step"] and session.suspect
    assert session.badput == [("hang", pytest.approx(2.1))]


def test_in_a_cluster_a_collective_gets_peer_secs_at_least() -> None:
    """Multi-worker: a step's and a barrier's deadline is at least ``peer_secs`` (30 s by
    default: TensorFlow's heartbeats name a dead peer first); alone, the learned one."""
    clock, session = _Clock(), _Session()
    options = asv.WatchdogOptions(floor_secs=1.0, factor=4.0)
    assert options.peer_secs == 30.0
    for peer_secs, step in ((30.0, 30.0), (3.0, 3.0), (1.5, 2.0)):
        dog = Watchdog(session, dataclasses.replace(options, peer_secs=peer_secs), perf=clock, cluster=True)  # type: ignore[arg-type]
        _steps(session, clock, dog, 3, 0.5)
        assert dog.deadline("step") == step  # 4 x 0.5 learned
    alone = Watchdog(session, options, perf=clock)  # type: ignore[arg-type]
    _steps(session, clock, alone, 3, 0.5)
    assert alone.deadline("step") == 2.0


def _retracing(turn: list[int], ack: list[int]) -> None:
    """Python code running on and on, as a retrace does: its innermost frame changes. It
    spins in one of two functions by the parity of ``turn[0]`` (no call inside: the
    innermost frame is the spinning one) and says which turn it is in through ``ack[0]``,
    so that a test sees it in the other function at each look, however busy the machine;
    ``turn[0] = -1`` ends it."""
    while turn[0] >= 0:
        t = turn[0]
        (_spin_odd if t % 2 else _spin_even)(turn, t, ack)


def _spin_odd(turn: list[int], t: int, ack: list[int]) -> None:
    while turn[0] == t:
        ack[0] = t


def _spin_even(turn: list[int], t: int, ack: list[int]) -> None:
    while turn[0] == t:
        ack[0] = t


def test_python_running_on_the_step_thread_is_a_retrace_not_a_hang() -> None:
    """A step during which Python code runs on the step thread (a retrace for a new input
    shape) gets the unlearned deadline, as a first step does; a step thread that waits in
    place (an op stuck on a peer, a ``py_function`` waiting) gets the learned one."""
    clock, session = _Clock(), _Session()
    options = asv.WatchdogOptions(floor_secs=1.0, factor=4.0, unlearned_secs=60.0)
    dog = Watchdog(session, options, perf=clock)  # type: ignore[arg-type]
    _steps(session, clock, dog, 20, 0.1)  # learned: 1 s
    stuck = threading.Event()
    turn, ack = [0], [-1]
    for target, hangs in ((_retracing, False), (stuck.wait, True)):
        thread = threading.Thread(target=target, args=(turn, ack) if target is _retracing else ())
        thread.start()
        try:
            dog.beat.ident = thread.ident
            dog.beat.at = clock.now
            breached = False
            for _ in range(40):  # 20 s of the fake clock, looking every 0.5 s
                clock.now += 0.5
                if target is _retracing:  # it ran on, into the other function, between two looks
                    turn[0] += 1
                    give_up = time.monotonic() + scaled(10)
                    while ack[0] != turn[0] and time.monotonic() < give_up:
                        time.sleep(0.001)
                else:
                    time.sleep(0.002)  # a stuck thread has nothing to show: it stays put
                if dog.check():
                    breached = True
                    break
            assert breached is hangs, target
        finally:
            turn[0] = -1
            stuck.set()
            thread.join()
    assert session.stops == ["hang:step"]


def test_a_phase_that_progresses_is_slow_not_stuck() -> None:
    """A save whose chunks keep coming is never a hang, however long it takes; one whose
    progress stops for longer than its deadline is; a wait for data has its own deadline."""
    clock, session = _Clock(), _Session()
    options = asv.WatchdogOptions(floor_secs=1.0, factor=2.0, unlearned_secs=3.0)
    dog = Watchdog(session, options, perf=clock)  # type: ignore[arg-type]
    mark = dog.begin("save")
    for _ in range(20):  # 20 s, a chunk every 0.9 s: slow
        clock.now += 0.9
        mark.advance()
        assert not dog.check()
    clock.now += 3.1  # no chunk for longer than the unlearned deadline: stuck
    assert dog.check()
    assert session.stops == ["hang:save"]
    clock2, session2 = _Clock(), _Session()
    dog2 = Watchdog(session2, options, perf=clock2)  # type: ignore[arg-type]
    with dog2.begin("restore"):
        clock2.now += 0.4
    assert dog2.deadline("restore") == 1.0  # learned: max(1, 2 x 0.4)
    _steps(session2, clock2, dog2, 3, 0.1)
    dog2.beat.at = -clock2.now  # waiting in next(iterator)
    clock2.now += 1.5
    assert dog2.check() and session2.stops == ["hang:input"]


def test_the_learned_deadlines_are_kept_for_the_next_start(tmp_path: Path) -> None:
    """The chief writes the p99s beside the checkpoints; a new watchdog there starts with
    them (a restart's deadlines are learned ones, not the unlearned allowance)."""
    clock, session = _Clock(), _Session()
    session.logdir = tmp_path
    options = asv.WatchdogOptions(floor_secs=1.0, factor=4.0)
    dog = Watchdog(session, options, perf=clock)  # type: ignore[arg-type]
    _steps(session, clock, dog, 5, 0.5)
    with dog.begin("save"):
        clock.now += 3.0
    dog.save()
    kept = json.loads((tmp_path / LEARNED_FILE).read_text())
    assert kept["p99_secs"] == {"step": 0.5, "input": 0.0, "save": 3.0}
    assert kept["deadline_secs"]["save"] == 12.0 and kept["deadline_secs"]["restore"] == options.unlearned_secs
    again = Watchdog(session, options, perf=clock)  # type: ignore[arg-type]
    again.load()
    assert again.deadline("step") == 2.0 and again.deadline("save") == 12.0
    assert again.deadline("restore") == options.unlearned_secs


def _child(backend: str, logdir: Path, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), backend, str(logdir), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _events(err: str, event: str) -> list[str]:
    return [line for line in err.splitlines() if event in line]


@pytest.mark.timeout(120)
def test_a_step_wedged_in_a_py_function_ends_the_process_with_the_hang_status(tmp_path: Path) -> None:
    """A step waiting forever inside ``tf.py_function`` (a real process): the log names
    phase ``step``, the step and the seconds, every thread's stack follows, and the
    process exits with 124 within max(10 s, 5 x p99) of the wedge; no final checkpoint."""
    with _child("asyncio", tmp_path / "run", "wedge") as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            assert proc.stdout.readline().strip() == "started"
            assert proc.stdout.readline().split() == ["wedged", "30"]
            exited = ExitTimer(proc.pid)
            out, err = proc.communicate(timeout=scaled(60))
            secs = exited.secs()
        finally:
            proc.kill()
    assert proc.returncode == EXIT_HANG, out + err
    (detected,) = _events(err, "hang.detected")
    # the deadline is 4 x the steps' p99 above its floor: on a busy machine (a second
    # suite beside this one) the steps, and so the deadline, are longer
    deadline = float(re.search(r"deadline_secs=([0-9.]+)", detected).group(1))  # type: ignore[union-attr]
    # (to its exit call: under a second suite's load the kernel took 15-55 s more to free it)
    bound = max(10.0, 1.25 * deadline + 2.0) * stretch()
    assert secs < bound, f"ended {secs:.1f} s after the wedge: {detected}"
    assert "phase=step" in detected and "step=29" in detected and "secs=" in detected, detected
    stacks = _events(err, "hang.stack")
    assert any("thread=asv-step" in line for line in stacks), stacks
    assert "maybe_wedge" in err  # the wedged Python function is in the step thread's stack
    assert _events(err, "hang.exit") and "stop_reason" not in out
    assert [n for n in os.listdir(tmp_path / "run") if n.startswith("model.ckpt-29")] == []


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pipe's size is set with Linux's F_SETPIPE_SZ")
def test_a_hang_exit_is_not_held_by_a_log_nobody_reads(tmp_path: Path) -> None:
    """The process's log goes to a pipe of one page whose reader stops reading once the
    step has wedged (a log collector that died): the hang's stack lines block in their
    write. The process still ends with the hang status, at most ``exit_after_secs`` + 5 s
    after the breach, unflushed, from a thread armed before the first log line."""
    import fcntl

    read_end, write_end = os.pipe()
    fcntl.fcntl(read_end, 1031, 4096)  # F_SETPIPE_SZ: one page
    reading = threading.Event()
    reading.set()
    late: list[bytes] = []  # what the drainer read after it was told to stop (its last read)

    def drain() -> None:  # until told; the read end stays open (closed, the write would fail, not block)
        while chunk := os.read(read_end, 512):
            if not reading.is_set():
                late.append(chunk)
                return

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    args = [sys.executable, str(SCRIPT), "asyncio", str(tmp_path / "run"), "wedge"]
    drainer = threading.Thread(target=drain, daemon=True)
    try:
        with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=write_end, text=True, env=env) as proc:
            os.close(write_end)
            drainer.start()
            try:
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == "started"
                assert proc.stdout.readline().split() == ["wedged", "30"]
                reading.clear()
                exited = ExitTimer(proc.pid)
                proc.wait(timeout=scaled(40))  # the old exit waited for the log, forever
                secs = exited.secs()
            finally:
                proc.kill()
        drainer.join(timeout=5)
        os.set_blocking(read_end, False)
        try:
            unread = os.read(read_end, 1 << 16)
        except BlockingIOError:
            unread = b""
    finally:
        os.close(read_end)
    assert proc.returncode == EXIT_HANG
    # what the pipe held at the exit: it was full (the stack lines' write blocked), and
    # it begins with the breach, whose seconds are those from the wedge to it (on a busy
    # machine a learned deadline, and the polls, are longer than the 1 s floor)
    log = (b"".join(late) + unread).decode(errors="replace")
    assert len(unread) > 2048 and "hang.exit" not in log, log
    (detected,) = _events(log, "hang.detected")
    breach = float(re.search(r" secs=([0-9.]+)", detected).group(1))  # type: ignore[union-attr]
    # then exit_after_secs (1 s) and the last resort's 5 s to the exit call (the kernel's
    # teardown after it took 4-30 s on a busy machine: CI once measured 11.4 s to the end)
    assert secs < breach + 1.0 + 5.0 + 2.0 * stretch(), (secs, detected)


@pytest.mark.timeout(180)
@pytest.mark.skipif(not slowdisk.available(), reason="the slow disk is a FUSE mount: it needs root and /dev/fuse")
def test_a_restore_held_by_the_disk_is_named_and_ends_the_process(tmp_path: Path) -> None:
    """A restore whose read of the checkpoint's data hangs in the file system (the slow
    disk, ``tests/slowdisk.py``, holding the read for 6 s): ``hang.detected
    phase=restore`` once the deadline (2 s here, nothing learned about restores yet) has
    passed, the process told to end (``hang.exit``) a second later, and its status the
    hang status. (A thread in a held read leaves the kernel only when the disk answers:
    the process ends then, as with any hung network file system.)"""
    backing = tmp_path / "disk"
    backing.mkdir()
    with _child("trio", backing / "run", "save") as first:
        out, err = first.communicate(timeout=scaled(120))
    assert first.returncode == 0, out + err
    with slowdisk.mounted(backing, tmp_path / "mnt", mb_per_sec=100) as mnt:
        (backing / f"{slowdisk.READ_STALL_PREFIX}6").touch()
        # to files, not pipes: the child's thread in the held read keeps its pipes open
        # after the process has ended, until the disk answers
        with open(tmp_path / "out", "w+") as out_file, open(tmp_path / "err", "w+") as err_file:
            env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
            args = [sys.executable, str(SCRIPT), "trio", str(mnt / "run"), "restore"]
            with subprocess.Popen(args, stdout=out_file, stderr=err_file, env=env) as proc:
                exited = ExitTimer(proc.pid)
                try:
                    proc.wait(timeout=scaled(60))
                finally:
                    proc.kill()
                secs = exited.secs()
        out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert proc.returncode == EXIT_HANG, out + err
    assert secs < 40, f"the held restore ended the process after {secs:.1f} s"
    (detected,) = _events(err, "hang.detected")
    assert "phase=restore" in detected and "deadline_secs=2.0" in detected, detected
    stuck = float(detected.split("secs=")[-1].split()[0])  # the last secs= field: how long it was held
    assert 2.0 < stuck < 3.0, detected
    assert _events(err, "hang.exit") and "started" not in out


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # the watchdog is a thread: one backend is enough
@pytest.mark.timeout(120)
@pytest.mark.skipif(not slowdisk.available(), reason="the slow disk is a FUSE mount: it needs root and /dev/fuse")
async def test_a_slow_save_and_a_long_first_step_are_no_hang(tmp_path: Path, no_new_threads: None) -> None:
    """A first step longer than the floor (tracing) and saves that take longer than their
    deadline but keep writing (4 MB at 2 MB/s on the slow disk) stop nothing: the training
    runs to its end, no ``hang.detected``; what was learned is kept for the next start."""
    backing = tmp_path / "disk"
    backing.mkdir()
    options = asv.WatchdogOptions(floor_secs=1.0, unlearned_secs=1.5, exit_after_secs=None)
    state = {"w": tf.Variable(0.0), "big": tf.Variable(tf.zeros([1 << 20]))}

    def step() -> None:
        if state["w"].assign_add(1.0) == 1.0:
            time.sleep(1.2)  # the first step: longer than the floor

    with slowdisk.mounted(backing, tmp_path / "mnt", mb_per_sec=2) as mnt, capture_logs() as logs:
        sv = asv.Supervisor(
            mnt / "run",
            state=state,
            save_model_secs=3600,
            save_summaries_secs=0,
            stop=asv.StopOptions(watchdog=options),
        )
        async with sv.managed_session() as sess:
            await sess.run_loop(step, max_steps=40)
    assert sv.status().stop_reason == "max_steps"
    assert [e for e in logs if e["event"].startswith("hang.")] == []
    saves = [e for e in logs if e["event"] == "checkpoint.saved"]
    assert len(saves) == 2, [e["event"] for e in logs]  # the start-up one and the final one
    kept = json.loads((backing / "run" / LEARNED_FILE).read_text())["p99_secs"]
    assert kept["save"] > options.unlearned_secs and kept["step"] < 1.0
