"""Durations a session observes (each checkpoint's phases), kept as histograms.

:class:`Timings` is written from any thread (the step thread's snapshot, the writer's
write and commit, the upload thread) under one lock, a few additions per save, and read
by ``status()`` as frozen :class:`~._status.Histogram` values, which the Prometheus text
exposes as ``asupervisor_checkpoint_seconds``.
"""

from __future__ import annotations

import bisect
import math
import threading
from typing import TYPE_CHECKING

from ._status import Histogram, ReadOnlyDict

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["BOUNDS", "Timings"]

#: bucket bounds in seconds: a snapshot's milliseconds to a slow upload's minutes
BOUNDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Timings:
    """Histograms of durations by name (see the module docstring); thread-safe."""

    def __init__(self, bounds: tuple[float, ...] = BOUNDS) -> None:
        self.bounds = bounds
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}

    def observe(self, name: str, secs: float) -> None:
        """Count one duration of ``name`` (a negative or non-finite one is ignored)."""
        if not math.isfinite(secs) or secs < 0:
            return
        bucket = bisect.bisect_left(self.bounds, secs)  # le semantics: secs <= bound
        with self._lock:
            counts = self._counts.get(name)
            if counts is None:
                counts = self._counts[name] = [0] * (len(self.bounds) + 1)
                self._sums[name] = 0.0
            counts[bucket] += 1
            self._sums[name] += secs

    def snapshot(self) -> Mapping[str, Histogram]:
        """Each name's histogram now."""
        with self._lock:
            return ReadOnlyDict(
                {
                    name: Histogram(bounds=self.bounds, counts=tuple(counts), count=sum(counts), sum=self._sums[name])
                    for name, counts in sorted(self._counts.items())
                }
            )
