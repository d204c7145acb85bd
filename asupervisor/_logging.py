"""asupervisor's events, routed through the standard library's ``logging``; never a failure.

Every module logs through ``log = get_logger(__name__)``: a structlog logger with a fixed
processor chain, independent of the application's structlog configuration, that hands
each event to the stdlib logger ``asupervisor.<module>`` (children of ``asupervisor``).
The application routes and filters them like any other library's events
(``logging.getLogger("asupervisor").setLevel(...)``). Unconfigured (no handler anywhere),
warnings and errors are printed on standard error as stdlib's ``logging.lastResort``
would print them, by a handler of this module that a dead stream cannot fail; nothing
ever reaches standard output.

A record carries the event three ways: its message (``"checkpoint.saved step=1200 ..."``,
formatted only when a handler asks), ``record.event`` and one attribute per key-value
(``record.step == 1200``, when the name is free on a ``LogRecord``), and the whole event
dictionary as ``record.event_dict`` (what :func:`configure_logging`'s formatter renders).

What this module must never do: configure anything at import, or let a log call raise
into its caller. Events are logged on save and stop paths; a closed or broken stream
(``| tee`` whose reader died), a failing handler or a value whose ``repr`` raises drops
the line, never the save.

The console (:func:`add_console`): a live display on a terminal (the progress line) that
log lines must not break. While one is registered for a stream, this module's handlers
writing to the same file (:func:`configure_logging`'s, the last-resort one, the lines of
the application's structlog events) hand it each line instead of writing it: it clears
its live line, writes the line and redraws the live line below, all writes to that file
serialized. The display may claim events it reports itself (a Ctrl-C, the stop): those
are not printed on that file, so one event is one line. Only this module's handlers know
the console; an application's own handlers (``logging.basicConfig``) write as they do.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TextIO

import structlog

__all__ = [
    "Console",
    "add_console",
    "configure_logging",
    "console_write",
    "describe",
    "get_logger",
    "remove_console",
    "shown_on",
]

LOGGER_NAME = "asupervisor"

# Attributes a LogRecord already has (``extra`` may not overwrite them) and the two names
# ``Logger.makeRecord`` refuses.
_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
    "msg": logging.INFO,
}


def describe(exc: BaseException) -> str:
    """``"FailedPreconditionError: <message>"``: an error's type and message, for a log line.

    ``repr`` of a TensorFlow error is an empty ``FailedPreconditionError()``; its message is
    only in ``str``. Never raises, even for an exception whose ``__str__`` does.
    """
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception:
        return f"{name}: <unprintable message>"
    return f"{name}: {message}" if message else name


def _safe_repr(value: object) -> str:
    """``repr(value)``, or a placeholder when that raises."""
    try:
        return repr(value)
    except Exception:
        return f"<unrepresentable {type(value).__name__}>"


def _render_value(value: object) -> str:
    """A key-value's value for a text line: plain strings bare, others as ``repr``."""
    if isinstance(value, str):
        if value and not any(c.isspace() or c in "\"'=" for c in value):
            return value
        return _safe_repr(value)
    if isinstance(value, BaseException):
        return _safe_repr(describe(value))
    return _safe_repr(value)


class _KeyValues:
    """The ``key=value ...`` part of a message, rendered only when a handler formats it."""

    __slots__ = ("items",)

    def __init__(self, items: Mapping[str, Any]) -> None:
        self.items = items

    def __str__(self) -> str:
        return " ".join(f"{key}={_render_value(value)}" for key, value in self.items.items())


def _to_stdlib(_: Any, __: str, event_dict: structlog.typing.EventDict) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Last processor: the stdlib call's arguments (message, key-values as ``extra``)."""
    event = str(event_dict.get("event"))
    kwargs: dict[str, Any] = {}
    for name in ("exc_info", "stack_info"):
        if name in event_dict:
            kwargs[name] = event_dict.pop(name)
    items = {key: value for key, value in event_dict.items() if key != "event"}
    extra = {key: value for key, value in items.items() if key not in _RECORD_ATTRIBUTES}
    extra["event"] = event
    extra["event_dict"] = {"event": event, **items}
    message = event.replace("%", "%%")
    args: tuple[Any, ...] = ()
    if items:
        message += " %s"
        args = (_KeyValues(items),)
    kwargs["extra"] = extra
    return (message, *args), kwargs


class _SafeBoundLogger(structlog.stdlib.BoundLogger):
    """structlog's stdlib bound logger whose calls never raise into the caller."""

    def _proxy_to_logger(self, method_name: str, event: str | None = None, *event_args: str, **event_kw: Any) -> Any:
        if event_args:
            event_kw["positional_args"] = event_args
        try:
            logger: logging.Logger = self._logger
            level = _LEVELS.get(method_name, logging.INFO)
            if not logger.isEnabledFor(level):
                return None
            args, kwargs = self._process_event(method_name, event, event_kw)
            if _stdlib_last_resort_would_print(logger):
                _last_resort(logger, level, args, kwargs)
            else:
                # 3 = this frame, the BoundLogger method (``info``...), then the caller.
                logger.log(level, *args, stacklevel=3, **kwargs)
        except structlog.DropEvent:
            pass
        except Exception:
            # A broken stream (the lastResort handler lets ``ValueError: I/O operation on
            # closed file`` out of ``handleError``), a handler's error, a re-entrant write
            # from a signal handler: drop the line, never fail the save or stop logging it.
            pass
        return None


def _stdlib_last_resort_would_print(logger: logging.Logger) -> bool:
    """Whether stdlib would hand a record of ``logger`` to its own ``logging.lastResort``:
    no handler anywhere up the hierarchy, and the application left lastResort alone."""
    return type(logging.lastResort) is _STDLIB_LAST_RESORT_TYPE and not logger.hasHandlers()


def _last_resort(logger: logging.Logger, level: int, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """What stdlib's last resort does (warnings and errors, the bare message, on the
    current standard error), through a handler that a dead stderr cannot fail: stdlib's
    lets ``ValueError`` out of a closed stderr, and leaves the line of a broken pipe in
    stderr's buffer, to fail again at exit and turn the exit status into 120."""
    if level < _LAST_RESORT.level:
        return
    exc_info = kwargs.get("exc_info")
    if isinstance(exc_info, BaseException):
        exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
    elif exc_info and not isinstance(exc_info, tuple):
        exc_info = sys.exc_info()
    msg, *rest = args
    record = logger.makeRecord(
        logger.name, level, "(unknown file)", 0, msg, tuple(rest), exc_info or None, extra=kwargs.get("extra")
    )
    if logger.filter(record):
        _LAST_RESORT.handle(record)


_PROCESSORS: list[structlog.typing.Processor] = [
    structlog.contextvars.merge_contextvars,
    _to_stdlib,
]


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """The logger for module ``name`` (``asupervisor._x``), routed to stdlib ``logging``.

    Built here, not through ``structlog.get_logger`` or ``wrap_logger``: its processors,
    wrapper and context class are fixed, so an application's ``structlog.configure``
    neither reroutes nor breaks the library's events.
    """
    return _SafeBoundLogger(logging.getLogger(name), _PROCESSORS, {})


# --- the console: log lines above a live display ------------------------------------------


class Console(Protocol):
    """A live display sharing a file with log lines (see the module docstring)."""

    def write_above(self, line: str) -> bool:
        """Any thread: write ``line`` (no newline) above the live line; ``False`` when the
        display is gone (the caller then writes the line itself). Must not block for long
        on the display's own writer."""
        ...

    def claims(self, event: str, fields: Mapping[str, Any]) -> bool:
        """Whether the display reports this event itself (its log line is then not printed
        on the display's file)."""
        ...


_consoles: list[tuple[object, Console]] = []  # (stream, console), newest last
_consoles_lock = threading.Lock()


def add_console(stream: Any, console: Console) -> None:
    """Register ``console`` as the live display on ``stream`` (until :func:`remove_console`)."""
    with _consoles_lock:
        _consoles.append((stream, console))


def remove_console(console: Console) -> None:
    """Unregister ``console`` (no error when it is not registered)."""
    with _consoles_lock:
        _consoles[:] = [(s, c) for s, c in _consoles if c is not console]


def _file_id(stream: Any) -> tuple[int, int] | None:
    try:
        st = os.fstat(stream.fileno())
    except Exception:  # no file descriptor (a StringIO), a closed stream
        return None
    return (st.st_dev, st.st_ino) if st.st_ino else (st.st_dev, st.st_rdev)


def _same_file(a: Any, b: Any) -> bool:
    """Whether two streams write to the same file (object, or device and inode)."""
    if a is b:
        return True
    ida = _file_id(a)
    return ida is not None and ida == _file_id(b)


def _console_for(stream: Any) -> Console | None:
    """The console registered on ``stream``'s file, if any (cheap when there is none)."""
    if not _consoles:
        return None
    with _consoles_lock:
        registered = list(_consoles)
    for other, console in reversed(registered):
        if _same_file(stream, other):
            return console
    return None


def console_write(stream: Any, line: str) -> bool:
    """Write ``line`` above the live display on ``stream``'s file, when there is one;
    ``False``: none (write it yourself). For a front door's own lines (the demo's)."""
    console = _console_for(stream)
    return console is not None and console.write_above(line)


def shown_on(stream: Any, logger_name: str, level: int) -> bool:
    """Whether a record of ``logger_name`` at ``level`` would be printed on ``stream``'s
    file by one of this module's handlers (:func:`configure_logging`'s): a display leaves
    such an event to the log line."""
    try:
        logger: logging.Logger | None = logging.getLogger(logger_name)
        if logger is None or not logger.isEnabledFor(level):
            return False
        while logger is not None:
            for handler in logger.handlers:
                if isinstance(handler, _Handler) and level >= handler.level and _same_file(handler.stream, stream):
                    return True
            if not logger.propagate:
                break
            logger = logger.parent
    except Exception:
        return False
    return False


# --- configure_logging: printing for applications that want it -------------------------


def _event_from_record(_: Any, __: str, event_dict: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """ProcessorFormatter pre-chain: asupervisor's records carry their event dictionary."""
    record = event_dict.get("_record")
    carried = getattr(record, "event_dict", None)
    if not isinstance(carried, dict):
        return event_dict
    rebuilt = dict(carried)
    for key in ("_record", "_from_structlog", "exc_info", "stack_info"):
        if key in event_dict:
            rebuilt[key] = event_dict[key]
    return rebuilt


def _discard_dead_pipe(stream: TextIO) -> None:
    """Point a stream whose pipe broke at ``os.devnull``, as Python's documentation
    recommends after a ``BrokenPipeError``: a pipe whose readers are gone never gets one
    back, and what stays in the stream's buffer would otherwise fail again at every write
    and at interpreter exit (which turns the process's exit status into 120)."""
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
    except Exception:
        pass  # not backed by a file descriptor: nothing is buffered below Python


class _SafeFormatter(structlog.stdlib.ProcessorFormatter):
    """A ProcessorFormatter whose failures (a renderer, a value) fall back to a plain line."""

    def format(self, record: logging.LogRecord) -> str:
        try:
            return super().format(record)
        except Exception:
            try:
                return f"{record.levelname.lower()} {record.getMessage()}"
            except Exception:
                return f"{record.levelname.lower()} {_safe_repr(getattr(record, 'event', record.msg))}"


if TYPE_CHECKING:
    _StreamHandler = logging.StreamHandler[TextIO]
else:  # not subscriptable at run time before Python 3.11
    _StreamHandler = logging.StreamHandler


#: events a command line reports itself, in its own one line (not printed a second time)
_REPORTED_BY_CALLER: set[str] = set()


def reported_by_caller(*events: str) -> None:
    """The command line reports these events itself (the start's error, in one line):
    ``configure_logging``'s handler does not print them."""
    _REPORTED_BY_CALLER.update(events)


class _Handler(_StreamHandler):
    """configure_logging's handler: writes to ``stream`` (standard error, looked up at each
    line, when none was given); a dead stream drops the line quietly."""

    def __init__(self, stream: TextIO | None) -> None:
        super().__init__()
        self._fixed = stream

    @property
    def stream(self) -> TextIO:
        return self._fixed if self._fixed is not None else sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        # StreamHandler.__init__ assigns the stream; ours is chosen by the property.
        pass

    def emit(self, record: logging.LogRecord) -> None:
        carried = getattr(record, "event_dict", None)
        if _REPORTED_BY_CALLER and isinstance(carried, dict) and carried.get("event") in _REPORTED_BY_CALLER:
            return
        console = _console_for(self.stream)
        if console is None:
            super().emit(record)
            return
        try:
            carried = getattr(record, "event_dict", None)
            if isinstance(carried, dict) and console.claims(str(carried.get("event")), carried):
                return  # the display reports this event itself
            if not console.write_above(self.format(record)):
                super().emit(record)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, BrokenPipeError):
            _discard_dead_pipe(self.stream)
        if isinstance(error, (OSError, ValueError)):
            return  # closed or broken stream (a reader that died): the line is dropped
        try:
            super().handleError(record)
        except Exception:
            pass


_STDLIB_LAST_RESORT_TYPE = getattr(logging, "_StderrHandler", type(logging.lastResort))
_LAST_RESORT = _Handler(None)
_LAST_RESORT.setLevel(logging.WARNING)


class _LineLogger:
    """structlog's final logger for the application's own events: one line per event,
    write errors dropped (the same stream as asupervisor's lines, the same promise)."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def msg(self, message: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            if console_write(stream, message):
                return
            with self._lock:
                stream.write(message + "\n")
                stream.flush()
        except BrokenPipeError:
            _discard_dead_pipe(stream)
        except Exception:
            pass

    log = debug = info = warn = warning = error = critical = exception = fatal = failure = msg


def _level_number(level: str | int) -> int:
    if isinstance(level, bool) or not isinstance(level, (str, int)):
        raise ValueError(f"level must be a level name or number, not {level!r}")  # noqa: TRY004 - documented
    if isinstance(level, int):
        return level
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")  # noqa: TRY004
    return number


def configure_logging(*, json: bool = False, level: str | int = "info", stream: TextIO | None = None) -> None:
    """Print asupervisor's (and the application's structlog) events on ``stream``.

    Installs one handler on the ``asupervisor`` logger (not the root logger), replacing the
    one an earlier call installed, and sets that logger's level. asupervisor's events then
    stop propagating to the root logger, so an application that also configured root
    logging does not see them twice. Also configures structlog (``structlog.configure``)
    so the application's own structlog events print the same way. Lines that cannot be
    written (a closed stream, a pipe whose reader died) are dropped.

    Args:
        json: ``True`` renders one JSON object per line (for log collectors), ``False``
            a human-readable console line.
        level: the lowest level printed, a name (``"debug"``, ``"info"``, ...) or a
            ``logging`` number.
        stream: where lines go; standard error (as it is when each line is written) by
            default.

    Raises:
        ValueError: ``level`` is not a known level name.
    """
    number = _level_number(level)
    renderer: structlog.typing.Processor
    if json:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)

    handler = _Handler(stream)
    handler.setFormatter(
        _SafeFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
            foreign_pre_chain=[
                _event_from_record,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
        )
    )
    logger = logging.getLogger(LOGGER_NAME)
    for old in [h for h in logger.handlers if isinstance(h, _Handler)]:
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(number)
    logger.propagate = False

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=lambda *_: _LineLogger(stream),
        cache_logger_on_first_use=False,
    )
