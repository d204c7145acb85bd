"""The start of each run of ``asupervisor verify-resume``: the user's script, run as
``python SCRIPT ARGS`` runs it, with the library's events copied to the tool.

``python -m asupervisor._verify._child SCRIPT ARGS...`` adds one handler to the logger
``asupervisor`` that writes each event (its name, the monotonic time, its step, its
``secs``) as a JSON line to the file descriptor named by ``ASUPERVISOR_VERIFY_EVENTS_FD``
(a pipe the tool reads), then runs SCRIPT as ``__main__`` with ``sys.argv`` and
``sys.path[0]`` as Python would set them. The tool times its kills by these events.

What it must never do: change what the script computes, or fail it: a write that fails
(the tool gone) turns the handler off.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import sys
import time

__all__ = ["EVENTS_FD_ENV", "EventPipe", "main"]

EVENTS_FD_ENV = "ASUPERVISOR_VERIFY_EVENTS_FD"


class EventPipe(logging.Handler):
    """Writes each ``asupervisor`` event as one JSON line to a file descriptor.

    With ``echo``, warnings and errors also go to standard error, as they would have
    without this handler (the library prints them only while no handler exists).
    """

    def __init__(self, fd: int, *, echo: bool) -> None:
        super().__init__(logging.INFO)
        self.fd: int | None = fd
        self.echo = echo

    def emit(self, record: logging.LogRecord) -> None:
        if self.echo and record.levelno >= logging.WARNING:
            try:
                sys.stderr.write(record.getMessage() + "\n")
                sys.stderr.flush()
            except Exception:  # a dead stderr never fails the training
                self.echo = False
        event = getattr(record, "event", None)
        if self.fd is None or not isinstance(event, str):
            return
        fields = getattr(record, "event_dict", None) or {}
        line = {"event": event, "t": time.monotonic()}
        for key in ("step", "global_step", "secs", "restored", "epoch"):
            value = fields.get(key)
            if isinstance(value, (bool, int, float)):
                line[key] = value
        try:
            os.write(self.fd, (json.dumps(line) + "\n").encode())
        except (OSError, ValueError):  # the tool is gone: stop telling it
            self.fd = None


def main(argv: list[str]) -> None:
    """Run ``argv[0]`` with arguments ``argv[1:]`` as ``__main__``, events piped out."""
    script = argv[0]
    logger = logging.getLogger("asupervisor")
    fd = os.environ.get(EVENTS_FD_ENV)
    if fd:
        echo = not logging.getLogger().handlers and not logger.handlers
        logger.addHandler(EventPipe(int(fd), echo=echo))
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
