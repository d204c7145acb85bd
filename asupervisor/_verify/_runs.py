"""One run of a user's script for ``verify-resume``: a child process, its events, and the
SIGKILL a plan times by them.

A run is ``python -m asupervisor._verify._child SCRIPT ARGS`` (:mod:`._child`) in its own
process group, its output in files under the work directory, the library's events read
from a pipe. A :class:`KillPlan` names an event to wait for (``session.started``,
``checkpoint.saved``, ``fit.epoch``) and, given it, the seconds to wait before the
SIGKILL of the whole group. Blocking calls only: the command runs no event loop.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._child import EVENTS_FD_ENV

__all__ = ["KillPlan", "Run", "run_script"]


@dataclass(frozen=True)
class KillPlan:
    """When to kill a run: ``delay(event)`` seconds after the first event named ``anchor``
    for which it returns a number; ``phase`` says what the kill is meant to hit."""

    phase: str
    anchor: str
    delay: Callable[[dict[str, Any]], float | None]


@dataclass
class Run:
    """What a run did: its exit status (``None``: killed), its seconds, its events (each
    with ``t``, seconds since the run started), and the kill, if one came."""

    label: str
    code: int | None = None
    secs: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    killed_at: float | None = None
    phase: str | None = None
    timed_out: bool = False
    stderr: Path | None = None

    def first(self, name: str) -> dict[str, Any] | None:
        """The first event called ``name``, or ``None``."""
        return next((e for e in self.events if e["event"] == name), None)

    def all(self, name: str) -> list[dict[str, Any]]:
        """The events called ``name``, in order."""
        return [e for e in self.events if e["event"] == name]

    def stderr_tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines the run wrote on standard error."""
        if self.stderr is None or not self.stderr.exists():
            return ""
        return "\n".join(self.stderr.read_text(errors="replace").splitlines()[-lines:])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the run's process group (the script and whatever it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_script(
    label: str,
    command: Sequence[str],
    env: Mapping[str, str],
    outdir: Path,
    *,
    timeout: float,
    plan: KillPlan | None = None,
) -> Run:
    """Run ``command`` (the script and its arguments) to its end, or until ``plan`` kills
    it, or until ``timeout`` seconds (then it is killed and ``timed_out`` set)."""
    stderr = outdir / f"{label}.err"
    run = Run(label, stderr=stderr)
    read_fd, write_fd = os.pipe()
    try:
        with open(outdir / f"{label}.out", "wb") as out, open(stderr, "wb") as err:
            start = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "asupervisor._verify._child", *command],
                env={**env, EVENTS_FD_ENV: str(write_fd)},
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                pass_fds=(write_fd,),
                start_new_session=True,
            )
    finally:
        os.close(write_fd)
    try:
        kill_at = _follow(run, proc, read_fd, start, start + timeout, plan)
        if kill_at is not None:
            _kill_group(proc)
            run.killed_at = kill_at - start
            run.phase = plan.phase if plan is not None and not run.timed_out else None
        run.code = proc.wait()
        if kill_at is not None:
            run.code = None
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    finally:
        os.close(read_fd)
    run.secs = time.monotonic() - start
    return run


def _follow(
    run: Run, proc: subprocess.Popen[bytes], fd: int, start: float, deadline: float, plan: KillPlan | None
) -> float | None:
    """Read the run's events until its pipe closes (it ended) or a kill is due; the
    monotonic time of the kill, or ``None`` when the run ended by itself."""
    pending = b""
    kill_at: float | None = None
    while True:
        now = time.monotonic()
        due = min(deadline, kill_at if kill_at is not None else deadline)
        if now >= due:
            run.timed_out = now >= deadline and (kill_at is None or kill_at > deadline)
            return now
        ready, _, _ = select.select([fd], [], [], due - now)
        if not ready:
            continue
        data = os.read(fd, 65536)
        if not data:  # every holder of the pipe closed it: the script's process ended
            return None
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            event["t"] = float(event.get("t", now)) - start
            run.events.append(event)
            if plan is not None and kill_at is None and event["event"] == plan.anchor:
                delay = plan.delay(event)
                if delay is not None:
                    kill_at = start + event["t"] + max(0.0, delay)
