"""asupervisor's log events in tests, as dicts, the way ``structlog.testing.capture_logs`` gave them.

The library logs through the stdlib logger ``asupervisor`` (not through structlog's global
configuration, which ``structlog.testing.capture_logs`` replaces), so tests collect its
records here: each event is its ``event_dict`` (``event`` and key-values, numbers as
numbers) plus ``log_level``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any


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
    """Collect every event the ``asupervisor`` logger emits (all levels) while inside."""
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
