"""Ending the process at once after a session: :func:`exit_now`.

After ``managed_session()`` exits, everything a session owns is finished: the final
checkpoint committed and on disk, event files flushed and closed, its threads joined.
What is left is the interpreter's and TensorFlow's teardown, which took 2.7 to 7.4 s after
``session.stopped`` on a 2-core machine: time a spot VM's 30 s notice does not have.
:func:`exit_now` skips it (``os._exit``), after flushing the standard streams and the
logging handlers. ``atexit`` handlers do not run: a program that registered its own
calls ``sys.exit`` instead.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

from ._status import Status, exit_code

__all__ = ["exit_now"]


def exit_now(status: Status | int) -> NoReturn:
    """End the process now with ``asv.exit_code(status)`` (or the status ``status``),
    skipping the interpreter's and TensorFlow's teardown (see the module docstring).

    Call it after ``managed_session()`` exited, in place of
    ``sys.exit(asv.exit_code(sv.status()))``, where the time from the stop to the end of
    the process counts (a preemption notice): the stop's bound ``stop_grace_secs`` + 1 s
    is then the whole stop-to-exit time, plus the flushes.

    Raises:
        TypeError: ``status`` is neither a :class:`Status` nor an ``int``.
        ValueError: the session is still running (as :func:`asv.exit_code`).
    """
    if isinstance(status, Status):
        code = exit_code(status)
    elif isinstance(status, int) and not isinstance(status, bool):
        code = status
    else:
        raise TypeError(f"exit_now() takes a Status (sv.status()) or an exit status, got {status!r}")
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # a closed pipe: the status still says how it ended
            pass
    try:
        logging.shutdown()  # flushes and closes every handler, as the interpreter's exit does
    except Exception:
        pass
    os._exit(code)
