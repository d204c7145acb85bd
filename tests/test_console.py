"""The console as a user sees it: a real pseudo-terminal, rendered by a terminal emulator.

Each test runs a child process attached to a pty (``os.openpty``, the window size set
with ``TIOCSWINSZ``, the pty its controlling terminal so that ``\\x03`` is a Ctrl-C),
feeds what it writes into ``pyte`` and asserts on the rendered screen: log lines above
the live progress line, never glued to it; one line per event; what two Ctrl-C say.
No sleeping: every wait polls the pty until the screen shows a pattern, with a deadline.
A tmux-based check of the demo's double Ctrl-C runs too, where tmux is installed.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import shlex
import shutil
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyte  # the dev extra: renders the real pseudo-terminal
import pytest
from _timing import scaled

COLS, ROWS = 160, 200  # wide enough for a log line, tall enough that nothing scrolls away

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")  # configure_logging's console lines
LIVE = re.compile(r"^step \d+/\d+  ")  # the live progress line (a max_steps run)


class Terminal:
    """A child process on a pty, its output rendered by a pyte screen."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        env.update(TF_CPP_MIN_LOG_LEVEL="3", TERM="xterm", PYTHONUNBUFFERED="1")

        def controlling_terminal() -> None:  # in the child: the pty is its terminal (Ctrl-C → SIGINT)
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=controlling_terminal,
        )
        os.close(slave)
        self.master = master
        self.screen = pyte.Screen(COLS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.eof = False

    def _pump(self, timeout: float) -> None:
        if self.eof:
            time.sleep(min(timeout, 0.05)) if self.proc.poll() is None else None
            return
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every slave end closed (the child exited)
            data = b""
        if not data:
            self.eof = True
            return
        self.raw.extend(data)
        self.stream.feed(data)

    def rows(self) -> list[str]:
        """The screen's rows, trailing blanks cut, trailing empty rows dropped."""
        rows = [row.rstrip() for row in self.screen.display]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    def text(self) -> str:
        return "\n".join(self.rows())

    def wait_for(self, what: str | Callable[[], bool], timeout: float = 120.0) -> None:
        """Read the pty until the screen shows ``what`` (a regular expression, or a
        predicate); fails with the screen at the deadline."""
        done = (lambda: re.search(what, self.text(), re.M) is not None) if isinstance(what, str) else what
        deadline = time.monotonic() + scaled(timeout)
        while not done():
            if time.monotonic() > deadline:
                pytest.fail(f"the screen never showed {what!r}:\n{self.text()}")
            if self.eof and self.proc.poll() is not None:
                pytest.fail(f"the process exited ({self.proc.returncode}) before showing {what!r}:\n{self.text()}")
            self._pump(0.2)

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")  # the terminal turns it into SIGINT for the foreground group

    def wait_exit(self, timeout: float = 90.0) -> int:
        deadline = time.monotonic() + scaled(timeout)
        while not self.eof or self.proc.poll() is None:
            if time.monotonic() > deadline:
                pytest.fail(f"the process did not exit:\n{self.text()}")
            self._pump(0.2)
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(scaled(10))
        os.close(self.master)


@contextmanager
def terminal(argv: list[str], cwd: Path) -> Iterator[Terminal]:
    term = Terminal(argv, cwd)
    try:
        yield term
    finally:
        term.close()


def assert_not_glued(rows: list[str]) -> None:
    """Each row is one thing: a log line, a display line, the live line — never two."""
    for row in rows:
        stamps = len(TIMESTAMP.findall(row))
        assert stamps <= 1 and (stamps == 0 or TIMESTAMP.match(row)), f"a log line glued to other text: {row!r}"
        if "steps/s" in row or LIVE.match(row):
            assert not stamps and "checkpoint" not in row and "Ctrl-C" not in row, f"glued to the live line: {row!r}"
        assert row == "^C" or "^C" not in row, f"the terminal's echo of Ctrl-C glued to a line: {row!r}"


SCRIPT = """
import sys, time, anyio, structlog, tensorflow as tf, asupervisor as asv

slow = sys.argv[3] == "slow-stop"  # else: "logs", the application logging at info
asv.configure_logging(level="warning" if slow else "info")  # warning: as the demo on a terminal

async def main():
    w = tf.Variable(0.0)
    sv = asv.Supervisor(sys.argv[1], state={"w": w}, save_model_secs=0, save_model_steps=100, progress=True)
    def step():
        w.assign_add(1.0)
        if not slow and sv.global_step % 150 == 0:
            structlog.get_logger().info("app.note", step=sv.global_step)  # the application's own events
        # slow-stop: from step 210 the step in flight at a Ctrl-C takes 2 s
        time.sleep(2.0 if slow and sv.global_step >= 210 else 0.004)
        return {"loss": 1.0 / (1.0 + w)}
    async with sv.managed_session() as sess:
        await sess.run_loop(step, max_steps=100_000)
    sys.exit(asv.exit_code(sv.status()))

anyio.run(main, backend=sys.argv[2])
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_log_lines_go_above_the_live_line(tmp_path: Path, backend: str) -> None:
    """With ``configure_logging()`` and ``progress=True`` on one terminal, every log line
    (asupervisor's and the application's structlog events) is a row of its own above the
    live line, which stays intact on the last row; each checkpoint is reported once (the
    log's ``checkpoint.saved``: the display leaves it to the log), and a Ctrl-C once (the
    display's line: ``session.signal`` is not printed there)."""
    with terminal([sys.executable, "-c", SCRIPT, "run", backend, "logs"], tmp_path) as term:
        term.wait_for(lambda: len(re.findall(r"checkpoint\.saved", term.text())) >= 4 and "app.note" in term.text())
        term.wait_for(lambda: bool(LIVE.match(term.rows()[-1])))  # the live line, drawn below them
        rows = term.rows()
        assert term.screen.cursor.y == len(rows) - 1
        ours = rows[next(i for i, row in enumerate(rows) if "session.started" in row) :]  # not TensorFlow's
        assert_not_glued(ours)
        assert all(TIMESTAMP.match(row) for row in ours[:-1]), "\n".join(ours)  # every row above it a log line
        term.ctrl_c()
        status = term.wait_exit()
        rows = term.rows()
    rows = rows[next(i for i, row in enumerate(rows) if "session.started" in row) :]
    text = "\n".join(rows)
    assert status == 130, text
    assert_not_glued(rows)
    saved = [int(m) for m in re.findall(r"checkpoint\.saved .*step=(\d+)", text)]
    assert saved and len(saved) == len(set(saved)), text  # one line per checkpoint
    assert not re.search(r"^checkpoint at step", text, re.M), text  # ... the log's, not also the display's
    assert len(re.findall(r"stopping gracefully — final checkpoint at step \d+; Ctrl-C again to abandon it", text)) == 1
    assert "session.signal" not in text and "session.stop_requested" not in text, text
    assert len(re.findall(r"session\.stopped .*reason=signal:SIGINT", text)) == 1, text
    last_display = [row for row in rows if row.startswith("step ")][-1]
    assert "stopped (" not in last_display, text  # the stop is the log's line
    assert "[error" not in text and "Traceback" not in text, text


def demo(logdir: Path, backend: str) -> list[str]:
    # big batches: the step in flight at the first Ctrl-C takes a while, time for the second
    return [
        sys.executable,
        "-m",
        "asupervisor",
        "demo",
        "--logdir",
        str(logdir),
        "--save-secs",
        "1",
        "--batch-size",
        "16384",
        "--backend",
        backend,
    ]


SECOND = (  # what the second Ctrl-C says: the stop's state when it came
    r"second Ctrl-C: (abandoning the final checkpoint; the latest committed checkpoint is step \d+"  # during the stop
    r"|stopping now; the final checkpoint \(step \d+\) is committed"  # after the final checkpoint
    r"|the stop had already finished; the latest checkpoint is step \d+)$"  # after the session
)


def check_double_ctrl_c(rows: list[str], status: int) -> None:
    text = "\n".join(rows)
    assert status == 130, text
    assert_not_glued(rows)
    assert (
        len(
            [
                r
                for r in rows
                if re.fullmatch(r"stopping gracefully — final checkpoint at step \d+; Ctrl-C again to abandon it", r)
            ]
        )
        == 1
    ), text
    seconds = [r for r in rows if re.search(SECOND, r)]
    # On a loaded machine the demo's quick stop can finish, and the process exit, before
    # the second Ctrl-C reaches it: then the terminal echoes the ^C below the demo's last
    # report line and nothing more is said (nothing was left to stop). A Ctrl-C that
    # reached the exiting demo without its handler would show in the status (-2) or as
    # "interrupted", both checked.
    last = max((i for i, r in enumerate(rows) if r.startswith("curves: ")), default=None)
    late = last is not None and all(r.startswith("^C") or not r.strip() for r in rows[last + 1 :])
    assert len(seconds) == 1 or (not seconds and late), text
    for wrong in ("grace period", "Traceback", "[error", "shutdown.overrun", "session.signal", "interrupted"):
        assert wrong not in text, f"{wrong!r} on the screen:\n{text}"
    steps = re.findall(r"^checkpoint at step (\d+):", text, re.M)
    assert steps and len(steps) == len(set(steps)), text  # one line per checkpoint
    assert re.search(r"stopped \(signal:SIGINT\)$", text, re.M), text


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["trio"])  # asyncio: the demo's double Ctrl-C below
def test_a_second_ctrl_c_during_the_stop_abandons_the_final_checkpoint(tmp_path: Path, backend: str) -> None:
    """A second Ctrl-C while the stop is still running (here: the step in flight takes
    2 s) says, in one line, that the final checkpoint is abandoned and which checkpoint
    is the latest — the one on disk; no error lines, no "grace period"; status 130."""
    import tensorflow as tf

    with terminal([sys.executable, "-c", SCRIPT, "run", backend, "slow-stop"], tmp_path) as term:
        term.wait_for(r"^step 21[1-9]/100000 .*saved @200")  # in the slow steps
        term.ctrl_c()
        term.wait_for(r"stopping gracefully")
        term.ctrl_c()
        status = term.wait_exit()
        rows = term.rows()
    text = "\n".join(rows)
    assert status == 130, text
    assert_not_glued(rows)
    latest = tf.train.latest_checkpoint(str(tmp_path / "run"))
    step = int(latest.rsplit("-", 1)[1])
    lines = [row for row in rows if row.startswith("second Ctrl-C")]
    assert lines == [
        f"second Ctrl-C: abandoning the final checkpoint; the latest committed checkpoint is step {step}"
    ], text
    for wrong in ("grace period", "Traceback", "[error", "shutdown.overrun", "session.signal", "checkpoint.abandoned"):
        assert wrong not in text, f"{wrong!r} on the screen:\n{text}"
    assert re.search(rf"saved @{step}  stopped \(signal:SIGINT\)$", text, re.M), text


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["asyncio"])  # trio: the slow-stop test above
def test_demo_double_ctrl_c_says_what_happens(tmp_path: Path, backend: str) -> None:
    """``asupervisor demo`` on a terminal, two Ctrl-C: the first says the stop goes on
    with a final checkpoint, the second what it found (the stop abandoned, or already
    done: the demo's stop is quick) and which checkpoint is the latest — one line each,
    no error lines, no traceback, no "grace period"; the checkpoints were each reported
    once; exit status 130."""
    with terminal(demo(tmp_path / "run", backend), tmp_path) as term:
        term.wait_for(lambda: len(re.findall(r"^checkpoint at step \d+", term.text(), re.M)) >= 2)
        term.wait_for(lambda: bool(LIVE.match(term.rows()[-1])))
        assert_not_glued(term.rows())
        term.ctrl_c()
        term.wait_for(r"stopping gracefully")
        term.ctrl_c()
        status = term.wait_exit()
        check_double_ctrl_c(term.rows(), status)


TMUX = shutil.which("tmux")


@pytest.mark.timeout(240)
@pytest.mark.skipif(TMUX is None, reason="this machine has no tmux binary (the pyte-based tests above cover the same)")
def test_demo_double_ctrl_c_in_tmux(tmp_path: Path) -> None:
    """The same as a user's terminal multiplexer renders it (tmux, 80 columns)."""
    tmux = TMUX
    assert tmux is not None
    sock = str(tmp_path / "tmux.sock")
    done = tmp_path / "status"

    def t(*args: str) -> str:
        return subprocess.run(
            [tmux, "-S", sock, *args], capture_output=True, text=True, check=True, timeout=scaled(30)
        ).stdout

    def pane() -> list[str]:
        rows = [row.rstrip() for row in t("capture-pane", "-p", "-J", "-S", "-", "-t", "demo").splitlines()]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    def wait(pred: Callable[[list[str]], bool], what: str, timeout: float = 120) -> list[str]:
        deadline = time.monotonic() + scaled(timeout)
        while True:
            rows = pane()
            if pred(rows):
                return rows
            if time.monotonic() > deadline:
                pytest.fail(f"tmux never showed {what}:\n" + "\n".join(rows))
            time.sleep(0.1)  # polling the pane, with a deadline

    command = shlex.join(demo(tmp_path / "run", "asyncio")) + f"; echo $? > {shlex.quote(str(done))}"  # any clone path
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    subprocess.run(
        [tmux, "-S", sock, "-f", "/dev/null", "new-session", "-d", "-s", "demo", "-x", "80", "-y", "50", command],
        check=True,
        env=env,
        timeout=scaled(30),
    )
    try:
        t("set-option", "-t", "demo", "remain-on-exit", "on")
        t("set-option", "-t", "demo", "history-limit", "5000")
        wait(lambda rows: len([r for r in rows if r.startswith("checkpoint at step")]) >= 2, "two checkpoints")
        t("send-keys", "-t", "demo", "C-c")
        wait(lambda rows: any("stopping gracefully" in r for r in rows), "the first Ctrl-C's line")
        t("send-keys", "-t", "demo", "C-c")
        deadline = time.monotonic() + scaled(90)
        while not done.exists() or not done.read_text().strip():
            if time.monotonic() > deadline:
                pytest.fail("the demo did not exit:\n" + "\n".join(pane()))
            time.sleep(0.1)
        check_double_ctrl_c([r for r in pane() if not r.startswith("Pane is dead")], int(done.read_text()))
    finally:
        subprocess.run([tmux, "-S", sock, "kill-server"], capture_output=True, timeout=scaled(30))
