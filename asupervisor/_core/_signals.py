"""SIGINT/SIGTERM as graceful stop requests (``handle_signals=True``).

The handlers are installed when the session starts (before start-up, so a SIGTERM
during a long restore is already a graceful stop) and put back when it has ended. The
first signal requests a stop (reason ``signal:SIGTERM``): the step in flight finishes and
the final checkpoint is saved. A second one, while the session is still stopping,
abandons the stop's remaining work: the final checkpoint being written is abandoned (its
files removed, the previous checkpoint stays the latest) and the session ends at once;
the same on both backends.

Cooperation with the application. A handler the application installed before (uvicorn's,
for one) is called too, at every signal, so the application shuts down as it would
have; at the end the handler that was there before is put back (unless the application
replaced ours meanwhile). The event loop's own Ctrl-C machinery (asyncio's runner
cancelling the main task, trio's ``KeyboardInterrupt``) and Python's default handlers are
not called: the session's graceful stop replaces them while it runs.

Handlers can only be installed from the main thread. A session whose event loop runs in
another thread (an application running training in a worker thread) installs none,
logs ``signals.not_installed``, and leaves signals to the application: stop it with
``sv.request_stop()`` from the application's own handler.

A handler runs on the main thread between two bytecodes, possibly in the middle of the
event loop's own code: it only schedules its work on the loop (``call_soon``, which both
backends allow from a signal handler), never touches a cancel scope itself.

The kernel may deliver a process's signal to any of its threads (the step thread, a
TensorFlow thread). Python then runs the handler only when the main thread next runs
Python code, so the main thread must wake: trio sets a wakeup file descriptor for that,
asyncio does not (unless ``loop.add_signal_handler`` was used). On asyncio the session
sets one of its own (:class:`_AsyncioWakeup`) for as long as its handlers are installed;
without it a SIGTERM could wait, unseen, until something else woke the loop.
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from .._logging import get_logger

if TYPE_CHECKING:
    from ._handoff import LoopHandle

__all__ = [
    "SIGNALS",
    "SignalHandlers",
    "catch_stop_signals",
    "pending_stop_signal",
    "stop_signals_from",
    "wait_stop_signal",
]

log = get_logger(__name__)

#: the signals that request a graceful stop unless ``stop_signals`` says otherwise
SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: signals no process can catch
_UNCATCHABLE = {"SIGKILL", "SIGSTOP"}


def stop_signals_from(value: object) -> tuple[signal.Signals, ...]:
    """``Supervisor(stop_signals=...)`` as signals: names (``"SIGUSR1"``, ``"USR1"``),
    numbers or ``signal.Signals``, in order, without repeats.

    Raises:
        TypeError: not a sequence of names or numbers.
        ValueError: naming a signal this platform does not have, or one no process can
            catch (SIGKILL, SIGSTOP).
    """
    if isinstance(value, (str, bytes, int)) or not hasattr(value, "__iter__"):
        raise TypeError(f"stop_signals must be a sequence of signal names or numbers, got {value!r}")
    out: list[signal.Signals] = []
    for item in value:
        try:
            if isinstance(item, str):
                name = item.upper() if item.upper().startswith("SIG") else "SIG" + item.upper()
                sig = signal.Signals[name]
            elif isinstance(item, int) and not isinstance(item, bool):
                sig = signal.Signals(item)
            else:
                raise TypeError(f"stop_signals must hold signal names or numbers, got {item!r}")
        except (KeyError, ValueError):
            raise ValueError(f"stop_signals: no signal {item!r} on this platform") from None
        if sig.name in _UNCATCHABLE:
            raise ValueError(f"stop_signals: {sig.name} cannot be caught by any process, so it cannot stop gracefully")
        if sig not in out:
            out.append(sig)
    return tuple(out)


#: modules whose handlers are the event loop's own Ctrl-C machinery (not chained)
_LOOP_MACHINERY = ("asyncio", "trio", "anyio")


def _chainable(handler: Any) -> bool:
    """Whether ``handler`` is an application's handler to call too (not a default, not
    ignored, not the event loop's own Ctrl-C machinery)."""
    if not callable(handler) or handler is signal.default_int_handler:
        return False
    while isinstance(handler, functools.partial):  # asyncio's runner installs a partial
        handler = handler.func
    module = getattr(getattr(handler, "__func__", handler), "__module__", None) or ""
    return module.split(".")[0] not in _LOOP_MACHINERY


class _AsyncioWakeup:
    """A socket pair that wakes the running asyncio loop at every signal: its write end is
    the process's wakeup file descriptor, its read end is drained by the loop. Nothing is
    done where a wakeup descriptor is set already (the application's, or asyncio's own
    after ``add_signal_handler``) or the loop cannot watch a socket."""

    def __init__(self) -> None:
        import asyncio
        import socket

        self._loop: Any = None
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        loop = asyncio.get_running_loop()
        previous = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        if previous != -1:  # someone else's: theirs wakes the loop already, or was meant to
            signal.set_wakeup_fd(previous)
            self._close_sockets()
            return
        try:
            loop.add_reader(self._read.fileno(), self._drain)
        except NotImplementedError:  # a loop that cannot watch sockets (Windows' proactor)
            signal.set_wakeup_fd(-1)
            self._close_sockets()
            return
        self._loop = loop

    def _drain(self) -> None:
        try:
            while self._read.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _close_sockets(self) -> None:
        self._read.close()
        self._write.close()

    def close(self) -> None:
        """Stop watching; put the wakeup descriptor back as it was (unless replaced since)."""
        if self._loop is None:
            return
        loop, self._loop = self._loop, None
        current = signal.set_wakeup_fd(-1)
        if current != self._write.fileno():
            signal.set_wakeup_fd(current)  # set by someone after us: theirs stays
        if not loop.is_closed():
            loop.remove_reader(self._read.fileno())
        self._close_sockets()


class _Early:
    """Stop signals caught before a session runs (:func:`catch_stop_signals`): the first
    is recorded for the next session, which stops as it starts; a second one gets the
    default action at once (the process ends, as it would have without asupervisor).
    Main thread only; the handler only records (no logging in a signal handler)."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}  # what was installed before ours
        self.received: list[str] = []
        #: called at each signal (:func:`wait_stop_signal`'s, which only schedule on a loop)
        self.wakers: list[Callable[[], None]] = []

    def catch(self, signals: tuple[signal.Signals, ...]) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in signals:
            if signal.getsignal(signum) != self.handle:
                self.previous[signum] = signal.signal(signum, self.handle)
        return True

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signal.Signals(signum).name)
        for wake in tuple(self.wakers):
            wake()
        if len(self.received) > 1:  # a second signal before any session: the default action
            previous = self.previous.pop(signum, signal.SIG_DFL)
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
            else:
                signal.raise_signal(signum)

    def hand_over(self, signum: int, installed_over: Any) -> Any:
        """The handler a session's replaced, past this catcher's (``installed_over``
        when it was not this catcher)."""
        if installed_over == self.handle:
            return self.previous.pop(signum, signal.SIG_DFL)
        return installed_over

    def take(self) -> str | None:
        """The signal received before the session, if any (then forgotten)."""
        received, self.received = self.received, []
        return received[0] if received else None


_EARLY = _Early()


def pending_stop_signal() -> str | None:
    """The name of a stop signal caught before any session (:func:`catch_stop_signals`),
    left for the next session to take; ``None`` if none came."""
    return _EARLY.received[0] if _EARLY.received else None


async def wait_stop_signal() -> str:
    """Wait until a stop signal caught by :func:`catch_stop_signals` (or a ``Supervisor``
    made) comes while no session runs; its name (at once if one came already). The
    signal is left for the next session, which then stops as it starts.

    For waits outside a session (``SessionManager``'s): the handler only schedules a wake
    on this loop; on asyncio a wakeup descriptor is set meanwhile, as a session does, so
    a signal the kernel gave another thread wakes the loop too. Without the handlers
    installed it waits until cancelled (a stop signal then has its default action).
    """
    import anyio

    from ._handoff import LoopHandle

    loop = LoopHandle()
    woken = anyio.Event()

    def wake() -> None:  # in the signal handler: schedule only
        try:
            loop.call_soon(woken.set)
        except RuntimeError:  # the loop has finished
            pass

    _EARLY.wakers.append(wake)
    wakeup = None
    if loop.backend == "asyncio" and threading.current_thread() is threading.main_thread():
        wakeup = _AsyncioWakeup()
    try:
        while (name := pending_stop_signal()) is None:
            await woken.wait()
            woken = anyio.Event()
        return name
    finally:
        _EARLY.wakers.remove(wake)
        if wakeup is not None:
            wakeup.close()


def catch_stop_signals(signals: object = ("SIGINT", "SIGTERM")) -> bool:
    """Catch the stop signals from now on, before any session runs (a script's first
    lines, before ``import tensorflow``; a ``Supervisor`` does it when it is made): the
    first one is kept for the next session, which then stops as it starts (a graceful
    stop: exit status 143 for SIGTERM); a second one ends the process as it would have.
    As PID 1 of a container, where an uncaught SIGTERM is ignored, this is what lets the
    scheduler's SIGTERM stop a training still importing. Returns whether the handlers
    could be installed (only from the main thread).

    Raises:
        ValueError: a signal that is not one (named).
    """
    return _EARLY.catch(stop_signals_from(signals))


class SignalHandlers:
    """The session's SIGINT/SIGTERM handlers (see the module docstring).

    Args:
        loop: the session's event loop (handlers schedule their work there).
        on_first: called on the loop with the signal's name at the first signal.
        on_again: called on the loop with the signal's name at each later signal.
        signals: the signals handled (``Supervisor(stop_signals=...)``).
    """

    def __init__(
        self,
        loop: LoopHandle,
        on_first: Callable[[str], None],
        on_again: Callable[[str], None],
        signals: tuple[signal.Signals, ...] = SIGNALS,
    ) -> None:
        self._loop = loop
        self._signals = signals
        self._on_first = on_first
        self._on_again = on_again
        self._previous: dict[int, Any] = {}
        self._received = 0
        self._retired = False
        self._wakeup: _AsyncioWakeup | None = None

    def install(self) -> bool:
        """Install the handlers; ``False`` (logged) off the main thread."""
        if threading.current_thread() is not threading.main_thread():
            log.info("signals.not_installed", why="the event loop is not on the main thread")
            return False
        for signum in self._signals:
            self._previous[signum] = _EARLY.hand_over(signum, signal.signal(signum, self._handle))
        if self._loop.backend == "asyncio":
            self._wakeup = _AsyncioWakeup()
        early = _EARLY.take()
        if early is not None:  # it came before the session: a stop as it starts
            log.warning("signals.before_start", signal=early, action="the session stops as it starts")
            self._received = 1
            self._loop.call_soon(lambda: self._on_first(early))
        return True

    def restore(self) -> None:
        """Put back the handlers that were there before.

        Where a handler installed after ours is still in place (another session's, the
        application's), ours stays in its chain but retires: it then only passes each
        signal on to the handler it replaced, as if it had never been there.
        """
        self._retired = True
        if self._wakeup is not None:
            self._wakeup.close()
            self._wakeup = None
        for signum, handler in self._previous.items():
            if signal.getsignal(signum) == self._handle:  # a bound method: compare, not `is`
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def _pass_on(self, signum: int, frame: FrameType | None) -> None:
        """A retired handler: what the replaced handler would have done."""
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous in (signal.SIG_DFL, None):
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # On the main thread, between two bytecodes: schedule, then chain.
        if self._retired:
            self._pass_on(signum, frame)
            return
        name = signal.Signals(signum).name
        self._received += 1
        react = self._on_first if self._received == 1 else self._on_again
        try:
            self._loop.call_soon(lambda: react(name))
        except RuntimeError:  # the loop has finished (asyncio: closed; trio: RunFinishedError)
            pass
        previous = self._previous.get(signum)
        if previous is not None and _chainable(previous):
            previous(signum, frame)
