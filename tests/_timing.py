"""How long a test may wait for something that should happen, on this machine now.

A wait that guards against a hang (a child process that should exit, an event that
should be set, a ``fail_after`` around work that should finish) is written for the quiet
2-core machine the suite was sized on, and stretched by :func:`slowness` with
:func:`scaled`: on a slower or busier machine (a second ``make test`` beside this one)
everything takes longer, and a hang guard is there to catch hangs, not slowness. The
per-test timeouts stretch by the same figure (``conftest.py``). A wait whose length is
what a test checks (a deadline under test, "not finished within 0.05 s") is not scaled.

Child processes get the figure through ``ASUPERVISOR_TEST_SLOWNESS`` (``conftest.py``
exports it); a script under ``tests/**/scripts`` scales its own waits by it.
"""

from __future__ import annotations

import functools
import os
import time

__all__ = ["ENV_VAR", "scaled", "slowness"]

#: the environment variable that sets the figure (and carries it to child processes)
ENV_VAR = "ASUPERVISOR_TEST_SLOWNESS"
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
def slowness() -> float:
    """How much slower this machine runs the suite now than the reference machine: the
    larger of a measured spin (a slower CPU, or cores shared with other work right now)
    and the load average per core (other work over the last minute: a second ``make
    test``, a build); 1 at least, :data:`_MAX_SLOWNESS` at most.
    ``ASUPERVISOR_TEST_SLOWNESS`` sets it."""
    given = os.environ.get(ENV_VAR)
    if given:
        return min(_MAX_SLOWNESS, max(1.0, float(given)))
    cpu = min(_spin() for _ in range(3)) / _REFERENCE_SPIN_SECS
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):  # no load average on this platform
        load = 0.0
    return min(_MAX_SLOWNESS, max(1.0, cpu, load))


def scaled(secs: float) -> float:
    """``secs``, a hang guard sized on the reference machine, for this machine now."""
    return secs * slowness()
