"""structlog set-up for applications that want it; asupervisor never configures logging itself.

Library modules only call ``structlog.get_logger(__name__)``. Whether events are printed,
as JSON or for a console, is the application's choice, made by calling
:func:`configure_logging` (or configuring structlog itself). Importing this module must
not configure anything.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

__all__ = ["configure_logging"]


def configure_logging(
    *, json: bool = False, level: str | int = "info", stream: TextIO | None = None
) -> None:
    """Configure structlog to print asupervisor's (and the application's) events.

    Args:
        json: ``True`` renders one JSON object per line (for log collectors), ``False``
            a human-readable console line.
        level: the lowest level printed, a name (``"debug"``, ``"info"``, ...) or a
            ``logging`` number.
        stream: where lines go; standard error by default.

    Raises:
        ValueError: ``level`` is not a known level name.
    """
    if isinstance(level, str):
        number = logging.getLevelName(level.upper())
        if not isinstance(number, int):
            raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
        level = number
    renderer: structlog.typing.Processor
    if json:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
