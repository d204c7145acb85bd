"""Events the engine emits, their route through stdlib ``logging``, and configure_logging().

The promise under test (DESIGN.md, "Logging never costs training"): events go to the
stdlib logger ``asupervisor`` whatever the application's structlog configuration; the
application filters and routes them; unconfigured, only warnings and errors reach
standard error; a closed or broken stream drops lines and never fails a save or a stop;
errors are logged with their message.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
import tensorflow as tf
from _timing import scaled

import asupervisor as asv
from asupervisor._logging import describe, get_logger
from asupervisor.testing import ManualClock, capture_logs


@pytest.fixture
def asv_logger() -> Iterator[logging.Logger]:
    """The ``asupervisor`` logger, its handlers, level and propagation restored afterwards
    (configure_logging changes them), and structlog's defaults put back."""
    logger = logging.getLogger("asupervisor")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    for handler in saved[0]:
        logger.addHandler(handler)
    logger.setLevel(saved[1])
    logger.propagate = saved[2]
    structlog.reset_defaults()


def make_state() -> dict[str, Any]:
    return {"w": tf.Variable([[1.0, 2.0]]), "b": tf.Variable([0.5])}


async def save_then_stop(logdir: Path) -> asv.Supervisor:
    """A session that saves at start (step 0), on request (step 1), then runs to step 2 and
    stops cleanly (the final checkpoint, step 2, is taken on the way out)."""
    state = make_state()
    sv = asv.Supervisor(logdir, state=state, save_model_secs=3600, save_summaries_secs=0, handle_signals=False)
    async with sv.managed_session() as sess:
        await sess.run(lambda: state["b"].assign_add([1.0]))
        await sv.save_now()
        await sess.run_loop(lambda: state["b"].assign_add([1.0]), max_steps=2)
    return sv


# --- the events -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_session_events_carry_context() -> None:
    """session.started and session.stopped are logged with step and reason."""
    sv = asv.Supervisor(None, handle_signals=False)
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda: None, max_steps=3)
    events = {e["event"]: e for e in logs}
    assert events["session.started"]["global_step"] == 0
    assert events["session.stopped"]["reason"] == "max_steps"
    assert events["session.stopped"]["global_step"] == 3


@pytest.mark.anyio
async def test_service_failure_is_logged_by_name_with_the_message() -> None:
    """A failing service logs service.failed with its name and the error's type and message."""

    async def broken() -> None:
        raise ArithmeticError("bad sum")

    sv = asv.Supervisor(None, handle_signals=False)
    sv.loop(5, broken, name="adder")
    with capture_logs() as logs, pytest.raises(ArithmeticError):
        async with sv.managed_session():
            await anyio.sleep_forever()
    failed = [e for e in logs if e["event"] == "service.failed"]
    assert failed and failed[0]["service"] == "adder"
    assert failed[0]["error"] == "ArithmeticError: bad sum"
    assert failed[0]["log_level"] == "error"


@pytest.mark.anyio
async def test_tensorflow_errors_are_logged_with_their_message() -> None:
    """A TF error (whose repr is an empty ``FailedPreconditionError()``) is logged with its message."""

    def broken() -> None:
        raise tf.errors.FailedPreconditionError(None, None, "PyFunc is stateful")

    sv = asv.Supervisor(None, handle_signals=False)
    sv.loop(5, broken, name="exporter")
    with capture_logs() as logs, pytest.raises(tf.errors.FailedPreconditionError):
        async with sv.managed_session():
            await anyio.sleep_forever()
    errors = [e["error"] for e in logs if e["event"] == "service.failed"]
    assert errors == ["FailedPreconditionError: PyFunc is stateful"]


def test_describe_gives_type_and_message_and_never_raises() -> None:
    """describe(): ``Type: message``, the bare type for an empty message, a placeholder
    for a message that cannot be printed."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert describe(tf.errors.NotFoundError(None, None, "x.index")) == "NotFoundError: x.index"
    assert describe(OSError(28, "No space left on device")) == "OSError: [Errno 28] No space left on device"
    assert describe(KeyError("step")) == "KeyError: 'step'"
    assert describe(StopIteration()) == "StopIteration"
    assert describe(Unprintable()) == "Unprintable: <unprintable message>"


@pytest.mark.anyio
async def test_step_counter_logs_global_step_per_sec() -> None:
    """Every save_summaries_secs the step counter logs the rate over that interval, with
    the name of the service (bound through structlog's contextvars) that logged it."""
    clock = ManualClock()
    sv = asv.Supervisor(None, handle_signals=False, save_summaries_secs=10, clock=clock)
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            await anyio.wait_all_tasks_blocked()
            for _ in range(50):
                await sess.run(lambda: None)
            clock.advance(10)
            await anyio.wait_all_tasks_blocked()
            assert sv.status().steps_per_sec == pytest.approx(5.0)
    rates = [e for e in logs if e["event"] == "step_counter.rate"]
    assert rates == [
        {
            "event": "step_counter.rate",
            "log_level": "info",
            "global_step": 50,
            "steps_per_sec": 5.0,
            "service": "step_counter",
        }
    ]


# --- the route: stdlib logging ----------------------------------------------------------


@pytest.mark.anyio
async def test_events_are_stdlib_records_of_the_asupervisor_logger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each event is a stdlib record of a child of ``asupervisor``: dotted name, key-values as
    attributes (numbers stay numbers), a readable message, the caller's file and line."""
    caplog.set_level(logging.INFO, logger="asupervisor")
    await save_then_stop(tmp_path)
    saved = [r for r in caplog.records if getattr(r, "event", None) == "checkpoint.saved"]
    assert [r.step for r in saved] == [0, 1, 2]  # type: ignore[attr-defined]
    record = saved[1]
    assert record.name.startswith("asupervisor.") and record.levelno == logging.INFO
    assert isinstance(record.secs, float)  # type: ignore[attr-defined]
    assert record.event_dict["step"] == 1  # type: ignore[attr-defined]
    assert record.getMessage().startswith("checkpoint.saved ")
    assert "step=1 " in record.getMessage() + " "
    assert f"path={tmp_path / 'model.ckpt-1'}" in record.getMessage()
    # the record points at the library code that logged it, not at structlog or logging
    assert Path(asv.__file__).parent in Path(record.pathname).parents
    assert Path(record.pathname).name != "_logging.py"


@pytest.mark.anyio
async def test_application_filters_with_stdlib_levels(caplog: pytest.LogCaptureFixture) -> None:
    """``logging.getLogger("asupervisor").setLevel(WARNING)`` (or a root level of WARNING, as
    ``basicConfig(level=WARNING)`` sets) keeps info events out and lets errors through."""

    async def broken() -> None:
        raise ArithmeticError("bad sum")

    caplog.set_level(logging.WARNING, logger="asupervisor")
    sv = asv.Supervisor(None, handle_signals=False)
    sv.loop(5, broken, name="adder")
    with pytest.raises(ArithmeticError):
        async with sv.managed_session():
            await anyio.sleep_forever()
    events = [getattr(r, "event", None) for r in caplog.records]
    assert "service.failed" in events
    assert "session.started" not in events and all(r.levelno >= logging.WARNING for r in caplog.records)


@pytest.mark.anyio
async def test_application_structlog_config_neither_reroutes_nor_breaks_events(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An application's structlog configuration (even one whose processor raises, or
    ``capture_logs()``) does not touch the library's events: they still reach stdlib."""

    def explode(_: Any, __: str, event_dict: Any) -> Any:
        raise RuntimeError("an application processor bug")

    caplog.set_level(logging.INFO, logger="asupervisor")
    structlog.configure(processors=[explode])
    try:
        with structlog.testing.capture_logs() as app_events:
            await save_then_stop(tmp_path)
    finally:
        structlog.reset_defaults()
    assert app_events == []
    saved = [getattr(r, "event_dict", {}) for r in caplog.records if getattr(r, "event", None) == "checkpoint.saved"]
    assert [event["step"] for event in saved] == [0, 1, 2]


def test_record_attributes_never_clash_and_odd_values_render() -> None:
    """Key-values named like LogRecord fields (``thread``, ``message``) stay in the event
    without breaking the record; a value whose repr raises renders as a placeholder."""

    class BadRepr:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("asupervisor.test_clash")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        get_logger("asupervisor.test_clash").info(
            "odd.values", thread="asv-step", message="m", name="n", value=BadRepr(), pct="100%"
        )
    finally:
        logger.removeHandler(handler)
    (record,) = records
    assert record.event_dict["thread"] == "asv-step"  # type: ignore[attr-defined]
    assert record.threadName != "asv-step"
    text = record.getMessage()
    assert text.startswith("odd.values thread=asv-step message=m name=n value=<unrepresentable BadRepr>")
    assert "pct=100%" in text


def _run_unconfigured(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=scaled(120))


FAILING_SERVICE = """if True:
    import anyio, asupervisor as asv

    async def broken():
        raise ArithmeticError("bad sum")

    async def main():
        sv = asv.Supervisor(None, handle_signals=False)
        sv.loop(5, broken, name="adder")
        try:
            async with sv.managed_session():
                await anyio.sleep_forever()
        except ArithmeticError:
            pass

    anyio.run(main)
"""


def test_unconfigured_only_warnings_and_errors_reach_stderr_and_nothing_stdout() -> None:
    """With no logging set up by the application, info events print nowhere, a service's
    error reaches standard error (stdlib's last resort), standard output stays empty."""
    proc = _run_unconfigured(FAILING_SERVICE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert "service.failed" in proc.stderr and "ArithmeticError: bad sum" in proc.stderr
    assert "session.started" not in proc.stderr and "session.stopped" not in proc.stderr


def test_basic_config_warning_filters_info_and_formats_errors() -> None:
    """An application's ``logging.basicConfig(level=WARNING)`` keeps info events out and
    prints errors in its own format, on standard error."""
    code = "import logging; logging.basicConfig(level=logging.WARNING)\n" + FAILING_SERVICE
    proc = _run_unconfigured(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert (
        "ERROR:asupervisor._core._services:service.failed service=adder error='ArithmeticError: bad sum'" in proc.stderr
    )
    assert "session.started" not in proc.stderr


@pytest.mark.parametrize("dead", ["broken-pipe", "closed"])
def test_unconfigured_errors_into_a_dead_stderr_cost_nothing(dead: str) -> None:
    """Unconfigured, an error event written to a standard error that is a pipe without
    reader, or closed: the process ends normally with status 0 (stdlib's own last resort
    would leave the line buffered and Python's exit would turn the status into 120)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("PYTHONUNBUFFERED", None)  # buffered standard streams, as a user's run has them
    if dead == "broken-pipe":
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            proc = subprocess.run(
                [sys.executable, "-c", FAILING_SERVICE],
                stdout=write_end,
                stderr=write_end,
                env=env,
                timeout=scaled(120),
            )
        finally:
            os.close(write_end)
    else:
        code = "import sys; sys.stderr.close()\n" + FAILING_SERVICE
        proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL, env=env, timeout=scaled(120))
    assert proc.returncode == 0


# --- configure_logging ----------------------------------------------------------------


def test_configure_logging_json(asv_logger: logging.Logger) -> None:
    """configure_logging(json=True) prints one JSON object per event, numbers as numbers,
    for the library's events and the application's own structlog events."""
    stream = io.StringIO()
    asv.configure_logging(json=True, stream=stream)
    get_logger("asupervisor._checkpoint._manager").info("checkpoint.saved", step=1200, secs=0.41)
    structlog.get_logger("app").info("app.event", n=1)
    library, app = (json.loads(line) for line in stream.getvalue().splitlines())
    assert library["event"] == "checkpoint.saved"
    assert library["step"] == 1200 and library["secs"] == 0.41
    assert library["level"] == "info" and "timestamp" in library
    assert app["event"] == "app.event" and app["n"] == 1


def test_configure_logging_filters_levels(asv_logger: logging.Logger) -> None:
    """Events below the configured level are dropped; a bad level name is refused."""
    stream = io.StringIO()
    asv.configure_logging(level="warning", stream=stream)
    log = get_logger("asupervisor.t")
    log.info("quiet.event")
    log.warning("loud.event", n=1)
    assert "quiet.event" not in stream.getvalue()
    assert "loud.event" in stream.getvalue() and "n=1" in stream.getvalue()
    with pytest.raises(ValueError, match="loudest"):
        asv.configure_logging(level="loudest")


def test_configure_logging_twice_does_not_duplicate_lines(asv_logger: logging.Logger) -> None:
    """A second configure_logging replaces the first handler: one line per event, on the
    latest stream; the root logger's handlers are not touched."""
    root_handlers = list(logging.getLogger().handlers)
    first, second = io.StringIO(), io.StringIO()
    asv.configure_logging(stream=first)
    asv.configure_logging(stream=second)
    get_logger("asupervisor.t").info("once.event")
    assert first.getvalue() == ""
    assert second.getvalue().count("once.event") == 1
    assert len(asv_logger.handlers) == 1
    assert logging.getLogger().handlers == root_handlers


# --- never a failure -------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_configured_renderer_failure_falls_back_to_a_plain_line(asv_logger: logging.Logger, as_json: bool) -> None:
    """A value the renderer cannot handle (its ``repr`` raises) gives a plain line with a
    placeholder instead of an exception, on the console and the JSON renderer alike."""

    class BadRepr:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    stream = io.StringIO()
    asv.configure_logging(json=as_json, stream=stream)
    get_logger("asupervisor.t").error("odd.value", value=BadRepr(), step=3)
    assert stream.getvalue() == "error odd.value value=<unrepresentable BadRepr> step=3\n"


@pytest.mark.anyio
async def test_closed_stream_drops_lines_and_saves_and_stops(tmp_path: Path, asv_logger: logging.Logger) -> None:
    """configure_logging's stream closed under a run: lines are dropped, the save and the
    final checkpoint still commit, the session ends cleanly."""
    stream = io.StringIO()
    asv.configure_logging(stream=stream)
    stream.close()
    sv = await save_then_stop(tmp_path)
    assert sv.status().stop_reason == "max_steps"
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-2")


@pytest.mark.anyio
async def test_broken_pipe_drops_lines_and_saves_and_stops(tmp_path: Path, asv_logger: logging.Logger) -> None:
    """configure_logging's stream is a pipe whose reader is gone (``| tee`` killed): the save
    and the stop succeed, and the stream is left so that flushing it (as Python does at
    exit) no longer fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = open(write_end, "w", buffering=1)  # closed below
    try:
        asv.configure_logging(stream=stream)
        sv = await save_then_stop(tmp_path)
        assert sv.status().stop_reason == "max_steps"
        assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-2")
        stream.write("after the reader died\n")
        stream.flush()  # no BrokenPipeError: the dead pipe was replaced by os.devnull
    finally:
        stream.close()


@pytest.mark.anyio
async def test_failing_handler_of_the_application_never_reaches_the_caller(
    tmp_path: Path, asv_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An application's own handler on a closed stream, with standard error closed too (so
    stdlib's ``handleError`` raises ``ValueError`` out of the log call), and a handler
    that raises: the save, the stop and the error path all still work."""

    class Raising(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise RuntimeError("a handler bug")

        def handleError(self, record: logging.LogRecord) -> None:
            raise  # re-raise the emit error, as a strict handler would

    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stderr", closed)
    asv_logger.addHandler(logging.StreamHandler(closed))
    asv_logger.addHandler(Raising())
    asv_logger.setLevel(logging.DEBUG)
    sv = await save_then_stop(tmp_path)
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-2")
    assert sv.status().stop_reason == "max_steps"

    async def broken() -> None:
        raise ArithmeticError("bad sum")

    sv = asv.Supervisor(None, handle_signals=False)
    sv.loop(5, broken, name="adder")
    with pytest.raises(ArithmeticError):  # the cause, not a logging error
        async with sv.managed_session():
            await anyio.sleep_forever()


class _FakeConsole:
    """A live display registered as the console of a stream: records what it is handed."""

    def __init__(self, stream: io.StringIO, claimed: set[str] = frozenset(), alive: bool = True) -> None:  # type: ignore[assignment]
        self.stream, self.claimed, self.alive = stream, claimed, alive
        self.above: list[str] = []

    def write_above(self, line: str) -> bool:
        if not self.alive:
            return False
        self.above.append(line)
        self.stream.write("[above]" + line + "\n")
        return True

    def claims(self, event: str, fields: Any) -> bool:
        return event in self.claimed


def test_lines_on_a_consoles_stream_go_through_it(asv_logger: logging.Logger) -> None:
    """While a console (the live progress line) is registered on a stream,
    configure_logging's lines for that stream — asupervisor's events and the
    application's structlog events — are handed to it (it writes them above its live
    line); events it claims are not printed there; a console that is gone lets the
    handler write itself; lines for another stream never go through it."""
    from asupervisor._logging import add_console, remove_console, shown_on

    shared, other = io.StringIO(), io.StringIO()
    console = _FakeConsole(shared, claimed={"session.signal"})
    asv.configure_logging(stream=shared)
    add_console(shared, console)
    try:
        log = get_logger("asupervisor._core._runtime")
        log.info("checkpoint.saved", step=3)
        log.warning("session.signal", signal="SIGINT")  # claimed: the display says it
        structlog.get_logger().info("app.note", n=1)
        assert [line.split()[-2:] for line in console.above] == [["checkpoint.saved", "step=3"], ["app.note", "n=1"]]
        assert "session.signal" not in shared.getvalue()
        assert shown_on(shared, "asupervisor._checkpoint._manager", logging.INFO)
        assert not shown_on(shared, "asupervisor._checkpoint._manager", logging.DEBUG)
        assert not shown_on(other, "asupervisor._checkpoint._manager", logging.INFO)
        console.alive = False  # the display's stream broke: the handler writes the line itself
        log.info("session.stopped", reason="completed")
        assert shared.getvalue().splitlines()[-1].endswith("reason=completed")
        assert not shared.getvalue().splitlines()[-1].startswith("[above]")
    finally:
        remove_console(console)
    log.warning("session.signal", signal="SIGINT")  # no console: printed as before
    assert "session.signal" in shared.getvalue()


def test_the_applications_own_handlers_do_not_know_the_console(asv_logger: logging.Logger) -> None:
    """A handler of the application's (``logging.basicConfig``'s StreamHandler) writes as
    it always did: the console only reroutes asupervisor's own handlers."""
    from asupervisor._logging import add_console, remove_console

    shared = io.StringIO()
    console = _FakeConsole(shared, claimed={"session.signal"})
    handler = logging.StreamHandler(shared)
    asv_logger.addHandler(handler)
    asv_logger.setLevel(logging.INFO)
    add_console(shared, console)
    try:
        get_logger("asupervisor._core._runtime").warning("session.signal", signal="SIGINT")
    finally:
        remove_console(console)
    assert console.above == [] and shared.getvalue() == "session.signal signal=SIGINT\n"
