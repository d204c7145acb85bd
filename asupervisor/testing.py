"""Helpers for testing code that uses asupervisor: a clock you move by hand, captured events.

Use :class:`ManualClock` as ``Supervisor(..., clock=ManualClock())`` (or for any service
that takes a clock) so that "every 600 s" runs the moment the test calls ``advance(600)``.
Use :func:`capture_logs` to assert on the events asupervisor logs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel

__all__ = ["ManualClock", "capture_logs"]


class _Collector(logging.Handler):
    """Appends each record's event (with its level) to a list."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__(logging.DEBUG)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        event = dict(getattr(record, "event_dict", None) or {"event": record.getMessage()})
        event["log_level"] = record.levelname.lower()
        self.events.append(event)


@contextlib.contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """Collect every event the ``asupervisor`` logger emits, at every level, while inside.

    Each event is a dict as ``structlog.testing.capture_logs`` gives: ``event`` (the
    dotted name), its key-values (numbers as numbers) and ``log_level``. asupervisor logs
    through the standard library logger ``asupervisor``, not through structlog's global
    configuration, so structlog's own ``capture_logs`` does not see its events.

    Example::

        with capture_logs() as events:
            ...
        assert any(e["event"] == "checkpoint.saved" for e in events)
    """
    events: list[dict[str, Any]] = []
    logger = logging.getLogger("asupervisor")
    handler = _Collector(events)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield events
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class ManualClock:
    """A :class:`asupervisor.Clock` whose time moves only when :meth:`advance` is called.

    Sleepers wake, in deadline order, when the time passes their deadline. Methods must be
    called on the event loop thread.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._changed = anyio.Event()
        self._sleepers = 0
        self._sleepers_changed = anyio.Event()

    def now(self) -> float:
        """The current manual time."""
        return self._now

    @property
    def sleepers(self) -> int:
        """How many tasks are waiting in :meth:`sleep_until` right now."""
        return self._sleepers

    async def sleep_until(self, deadline: float) -> None:
        """Wait until :meth:`advance` moved the time to ``deadline`` or beyond."""
        self._sleepers += 1
        self._sleepers_changed.set()
        try:
            while self._now < deadline:
                await self._changed.wait()
        finally:
            self._sleepers -= 1

    async def wait_for_sleepers(self, count: int = 1) -> None:
        """Return once at least ``count`` tasks are sleeping on this clock."""
        while self._sleepers < count:
            self._sleepers_changed = anyio.Event()
            await self._sleepers_changed.wait()

    def advance(self, secs: float) -> None:
        """Move time forward by ``secs`` and wake every sleeper whose deadline passed."""
        if secs < 0:
            raise ValueError(f"cannot move a clock backwards (secs={secs!r})")
        self._now += secs
        event, self._changed = self._changed, anyio.Event()
        event.set()

    async def advance_on_sleep(self, secs: float, *, times: int | None = None) -> None:
        """Each time a task sleeps on this clock, move time ``secs`` on (``times`` times,
        or until cancelled): run it in a task beside code that waits on timers.

        After each move it lets the woken sleepers run before it waits again.
        """
        done = 0
        while times is None or done < times:
            await self.wait_for_sleepers(1)
            self.advance(secs)
            while self._sleepers:
                await anyio.lowlevel.checkpoint()
            done += 1
