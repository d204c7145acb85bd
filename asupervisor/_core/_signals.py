"""SIGINT/SIGTERM as graceful stop requests (``handle_signals=True``).

The first signal requests a stop (reason ``signal:SIGTERM``), after which the default
handlers are back in place, so a second Ctrl-C interrupts the process the usual way.
Signal handlers can only be installed from the main thread; elsewhere (an application
that runs the loop in another thread) this service logs that and does nothing.
"""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING

import anyio

from .._logging import get_logger
from ._services import Service

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from ._services import ServiceContext

__all__ = ["SignalService"]

log = get_logger(__name__)


class SignalService(Service):
    """Turns the first SIGINT or SIGTERM into ``request_stop(reason="signal:<NAME>")``."""

    name = "signals"

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Wait for one signal, request a stop, then restore the default handlers."""
        if threading.current_thread() is not threading.main_thread():
            log.info("signals.not_installed", why="event loop is not on the main thread")
            task_status.started()
            return
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
            ctx.set_service_state(self.name, "running")
            async for signum in signals:
                name = signal.Signals(signum).name
                log.warning("session.signal", signal=name)
                ctx.control.request_stop(reason=f"signal:{name}")
                break
