"""structlog events the engine emits, and configure_logging()."""

from __future__ import annotations

import io
import json

import anyio
import pytest
import structlog
from structlog.testing import capture_logs

import asupervisor as asv
from asupervisor.testing import ManualClock

pytestmark = pytest.mark.anyio


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


async def test_service_failure_is_logged_by_name() -> None:
    """A failing service logs service.failed with its name and the error."""

    async def broken() -> None:
        raise ArithmeticError("bad sum")

    sv = asv.Supervisor(None, handle_signals=False)
    sv.loop(5, broken, name="adder")
    with capture_logs() as logs, pytest.raises(ArithmeticError):
        async with sv.managed_session():
            await anyio.sleep_forever()
    failed = [e for e in logs if e["event"] == "service.failed"]
    assert failed and failed[0]["service"] == "adder" and "bad sum" in failed[0]["error"]


async def test_step_counter_logs_global_step_per_sec() -> None:
    """Every save_summaries_secs the step counter logs the rate over that interval."""
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
        {"event": "step_counter.rate", "log_level": "info", "global_step": 50, "steps_per_sec": 5.0}
    ]


def test_configure_logging_json() -> None:
    """configure_logging(json=True) prints one JSON object per event."""
    stream = io.StringIO()
    try:
        asv.configure_logging(json=True, stream=stream)
        structlog.get_logger("t").info("checkpoint.saved", step=1200, secs=0.41)
    finally:
        structlog.reset_defaults()
    record = json.loads(stream.getvalue().strip())
    assert record["event"] == "checkpoint.saved"
    assert record["step"] == 1200 and record["secs"] == 0.41
    assert record["level"] == "info"


def test_configure_logging_filters_levels() -> None:
    """Events below the configured level are dropped; a bad level name is refused."""
    stream = io.StringIO()
    try:
        asv.configure_logging(level="warning", stream=stream)
        log = structlog.get_logger("t")
        log.info("quiet.event")
        log.warning("loud.event", n=1)
    finally:
        structlog.reset_defaults()
    assert "quiet.event" not in stream.getvalue()
    assert "loud.event" in stream.getvalue()
    with pytest.raises(ValueError, match="loudest"):
        asv.configure_logging(level="loudest")
