"""How long a test may wait for something that should happen, on this machine now.

A wait that guards against a hang (a child process that should exit, an event that
should be set, a ``fail_after`` around work that should finish) is written for the quiet
2-core machine the suite was sized on, and stretched by :func:`slowness` with
:func:`scaled`: on a slower or busier machine (a second ``make test`` beside this one)
everything takes longer, and a hang guard is there to catch hangs, not slowness. The
per-test timeouts stretch by the same figure, taken as each test starts
(``conftest.py``). A wait whose length is what a test checks (a deadline under test,
"not finished within 0.05 s") is not scaled.

The figure is measured *now*, not once: a second suite started beside this one, at the
same moment, loads the machine only after both measured a quiet one. Its CPU part (a
spin) is measured once per suite and handed to pytest-xdist's workers through
``ASUPERVISOR_TEST_CPU_SLOWNESS``; the load part is the load average of the moment.
Child processes get the figure of the test that started them through
``ASUPERVISOR_TEST_SLOWNESS`` (``conftest.py`` sets it as each test starts); a script
under ``tests/**/scripts`` scales its own waits by it. Set before the suite starts,
``ASUPERVISOR_TEST_SLOWNESS`` fixes the figure.
"""

from __future__ import annotations

import functools
import os
import threading
import time

__all__ = ["CPU_ENV_VAR", "ENV_VAR", "ExitTimer", "busy", "cpu_slowness", "scaled", "slowness", "stretch"]

#: the environment variable that fixes the figure, and carries it to child processes
ENV_VAR = "ASUPERVISOR_TEST_SLOWNESS"
#: the environment variable carrying the CPU part, measured once, to pytest-xdist's workers
CPU_ENV_VAR = "ASUPERVISOR_TEST_CPU_SLOWNESS"
#: the figure the user fixed, read before the suite sets ``ENV_VAR`` for child processes
_GIVEN = os.environ.get(ENV_VAR)
#: a fixed pure-Python loop took this long (best of three) on the quiet 2-core machine the
#: suite's timeouts were set on (pyproject's 60 s, each ``@pytest.mark.timeout``, the
#: waits given to :func:`scaled`)
_REFERENCE_SPIN_SECS = 0.095
#: the most the timeouts stretch: past it a hang should still fail in reasonable time
_MAX_SLOWNESS = 5.0


def _spin() -> float:
    started = time.perf_counter()
    x = 0
    for i in range(1_000_000):
        x += i * i
    return time.perf_counter() - started


@functools.cache
def cpu_slowness() -> float:
    """How much slower a fixed spin runs here than on the reference machine (a slower
    CPU, or cores shared right now); measured once (``CPU_ENV_VAR`` gives it)."""
    given = os.environ.get(CPU_ENV_VAR)
    if given:
        return float(given)
    return min(_spin() for _ in range(3)) / _REFERENCE_SPIN_SECS


def slowness() -> float:
    """How much slower this machine runs the suite now than the reference machine: the
    larger of :func:`cpu_slowness` and the load average per core now (other work over
    the last minute: a second ``make test``, a build, this suite's own processes); 1 at
    least, :data:`_MAX_SLOWNESS` at most. ``ASUPERVISOR_TEST_SLOWNESS``, set before the
    suite starts, fixes it."""
    if _GIVEN:
        return min(_MAX_SLOWNESS, max(1.0, float(_GIVEN)))
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):  # no load average on this platform
        load = 0.0
    return min(_MAX_SLOWNESS, max(1.0, cpu_slowness(), load))


def scaled(secs: float) -> float:
    """``secs``, a hang guard sized on the reference machine, for this machine now."""
    return secs * slowness()


#: the slowness from which the machine is *busy*: more than the suite's own load (its
#: workers and their processes put 1.2-2.1 on each of 2 cores, measured), e.g. a second
#: suite beside it (2.7-5.5)
_BUSY_SLOWNESS = 2.5


def _runnable_per_core(samples: int = 20) -> float:
    """Tasks ready to run per core now (``procs_running`` of ``/proc/stat``, this one
    included), the mean of ``samples`` readings 10 ms apart; 0 where there is none."""
    seen: list[int] = []
    for _ in range(samples):
        try:
            with open("/proc/stat") as f:
                seen += [int(line.split()[1]) for line in f if line.startswith("procs_running")]
        except OSError:  # not Linux
            return 0.0
        time.sleep(0.01)
    return sum(seen) / max(1, len(seen)) / (os.cpu_count() or 1)


def _slowness_now() -> float:
    """:func:`slowness` with the tasks ready to run right now on top (0.2 s of readings):
    the load average lags a minute behind a second suite's start."""
    return min(_MAX_SLOWNESS, max(slowness(), _runnable_per_core()))


def busy() -> bool:
    """Whether the machine is busy beyond the suite's own load now: a test that checks how
    closely a deadline is used (within a step), not only that it is met, checks the
    closeness on a machine that is not (the benches hold it on a quiet one)."""
    return _slowness_now() >= _BUSY_SLOWNESS


def stretch() -> float:
    """How much a window under test (a notice's deadline, a store's time to answer)
    stretches, decided as it opens (a child process calls it before each of its windows):
    the slowness now on a busy machine, else 1 (the suite's own load is what the windows
    were sized under, and a longer window is a longer test)."""
    now = _slowness_now()
    return now if now >= _BUSY_SLOWNESS else 1.0


class ExitTimer:
    """How long after its construction a child process called exit, watched by a thread
    (Linux: a non-zero exit status appears in ``/proc/PID/stat`` the moment the process
    calls exit; the kernel frees its memory after that, which for a TensorFlow process on
    a busy machine took 30 s here, a time no program controls). Elsewhere, for status 0,
    or when the process was reaped before a look saw it, the reaping is the end."""

    def __init__(self, pid: int) -> None:
        self.started = time.monotonic()
        self._path = f"/proc/{pid}/stat"
        self._at: float | None = None
        self._thread = threading.Thread(target=self._watch, name="exit-timer", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while True:
            try:
                with open(self._path) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                return  # reaped (or no /proc)
            if len(fields) >= 50 and fields[-1] != "0":  # exit_code, the stat's last field
                self._at = time.monotonic()
                return
            time.sleep(0.01)

    def ended(self) -> float:
        """The monotonic time the process called exit (call after it was reaped; if that
        was not seen, now)."""
        self._thread.join(timeout=5)
        return time.monotonic() if self._at is None else self._at

    def secs(self) -> float:
        """Seconds from the construction to :meth:`ended`."""
        return self.ended() - self.started
