"""``asv.GcePreemptionNotice`` against a fake GCE metadata server on 127.0.0.1.

The fake (``fake_metadata.py``) holds each ``wait_for_change=true`` GET until the test
changes the key's value, and answers as the real server does.
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
import tensorflow as tf
from _timing import scaled
from fake_metadata import MAINTENANCE, PREEMPTED, FakeMetadata

import asupervisor as asv
from asupervisor.testing import capture_logs


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    fake = FakeMetadata()
    fake.thread.start()
    yield fake
    fake.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stepper(at: int, action: Callable[[], None]) -> Callable[[], None]:
    """A step function that calls ``action`` (on the step thread) at its ``at``-th step."""
    n = [0]

    def step() -> None:
        n[0] += 1
        if n[0] == at:
            action()

    return step


def make_supervisor(logdir: Path) -> asv.Supervisor:
    return asv.Supervisor(str(logdir), state={"w": tf.Variable(0.0)}, handle_signals=False)


def test_the_fake_refuses_a_request_without_the_metadata_flavor_header(metadata: FakeMetadata) -> None:
    """The fake server answers 403 without ``Metadata-Flavor: Google``, as GCE's does, so
    the tests below passing means the service sends the header."""
    url = f"http://{metadata.host}/computeMetadata/v1/{PREEMPTED}"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=scaled(5))
    assert info.value.code == 403
    info.value.close()
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=scaled(5)) as response:
        assert response.read() == b"FALSE"


@pytest.mark.anyio
async def test_a_preemption_notice_stops_the_training_with_a_final_checkpoint_and_143(
    no_new_threads: None, metadata: FakeMetadata, tmp_path: Path
) -> None:
    """``instance/preempted`` turning ``TRUE`` while the service's GET hangs: the training
    stops gracefully (``preempted:gce``, one ``preemption.notice``), its final checkpoint
    holds the last step, and ``exit_code`` is 143."""

    def preempt() -> None:
        assert metadata.hanging[PREEMPTED].wait(scaled(10)), "the service never hung a GET"
        metadata.set(PREEMPTED, "TRUE")

    sv = make_supervisor(tmp_path)
    sv.add_service(asv.GcePreemptionNotice(metadata.host))
    with capture_logs() as events, anyio.fail_after(scaled(30)):
        async with sv.managed_session() as sess:
            await sess.run_loop(stepper(3, preempt), max_steps=10**9)
    status = sv.status()
    assert status.stop_reason == "preempted:gce", status
    assert asv.exit_code(status) == 143
    assert status.last_checkpoint is not None and status.last_checkpoint.step == status.global_step >= 3
    notices = [e for e in events if e["event"] == "preemption.notice"]
    assert [(e["source"], e["notice"], e["log_level"]) for e in notices] == [("gce", "preempted", "warning")], notices
    assert metadata.refused == 0


@pytest.mark.anyio
async def test_a_maintenance_event_stops_the_training_and_the_host_comes_from_the_environment(
    no_new_threads: None, metadata: FakeMetadata, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``instance/maintenance-event`` turning ``TERMINATE_ON_HOST_MAINTENANCE`` stops the
    training as a preemption does; the host is read from ``GCE_METADATA_HOST``."""
    monkeypatch.setenv("GCE_METADATA_HOST", metadata.host)

    def maintenance() -> None:
        assert metadata.hanging[MAINTENANCE].wait(scaled(10)), "the service never hung a GET"
        metadata.set(MAINTENANCE, "TERMINATE_ON_HOST_MAINTENANCE")

    sv = make_supervisor(tmp_path)
    sv.add_service(asv.GcePreemptionNotice())
    with capture_logs() as events, anyio.fail_after(scaled(30)):
        async with sv.managed_session() as sess:
            await sess.run_loop(stepper(3, maintenance), max_steps=10**9)
    status = sv.status()
    assert (status.stop_reason, asv.exit_code(status)) == ("preempted:gce", 143), status
    assert status.last_checkpoint is not None and status.last_checkpoint.step == status.global_step
    notices = [e for e in events if e["event"] == "preemption.notice"]
    assert [(e["source"], e["notice"]) for e in notices] == [("gce", "TERMINATE_ON_HOST_MAINTENANCE")], notices


@pytest.mark.anyio
async def test_errors_of_the_server_are_retried(no_new_threads: None, metadata: FakeMetadata, tmp_path: Path) -> None:
    """Failed GETs (503s) once the server has answered are retried after a backoff: the
    training goes on, and a notice after them still stops it."""
    metadata.fail_waits = 3

    def preempt() -> None:
        assert metadata.hanging[PREEMPTED].wait(scaled(10)), "the service never hung a GET"
        metadata.set(PREEMPTED, "TRUE")

    sv = make_supervisor(tmp_path)
    sv.add_service(asv.GcePreemptionNotice(metadata.host, maintenance=False, backoff_secs=0.01))
    with capture_logs() as events, anyio.fail_after(scaled(30)):
        async with sv.managed_session() as sess:
            await sess.run_loop(stepper(3, preempt), max_steps=10**9)
    assert asv.exit_code(sv.status()) == 143
    failed = [e for e in events if e["event"] == "preemption.poll_failed"]
    assert len(failed) == 3 and failed[0]["log_level"] == "warning", failed


@pytest.mark.anyio
async def test_off_gce_the_training_goes_on_after_one_info_log(no_new_threads: None, tmp_path: Path) -> None:
    """Nothing listening at the metadata host: one ``preemption.no_metadata_server`` at
    info, the service finishes quietly, the training runs to ``max_steps`` (exit 0)."""
    sv = make_supervisor(tmp_path)
    sv.add_service(asv.GcePreemptionNotice(f"127.0.0.1:{closed_port()}"))
    with capture_logs() as events, anyio.fail_after(scaled(30)):
        async with sv.managed_session() as sess:
            while sv.status().services.get("gce_preemption") != "finished":
                await anyio.sleep(0.01)  # bounded by fail_after: the probe fails at once
            await sess.run_loop(lambda: None, max_steps=20)
    status = sv.status()
    assert (status.stop_reason, status.global_step, asv.exit_code(status)) == ("max_steps", 20, 0), status
    mine = [e for e in events if e["event"].startswith("preemption.")]
    assert [(e["event"], e["log_level"]) for e in mine] == [("preemption.no_metadata_server", "info")], mine


@pytest.mark.anyio
async def test_the_session_exits_promptly_while_a_get_hangs(
    no_new_threads: None, metadata: FakeMetadata, tmp_path: Path
) -> None:
    """The body ends while both GETs hang (the server would hold them 10 minutes): the
    stop interrupts them, the session ends well within its bound, no thread is left."""
    sv = make_supervisor(tmp_path)
    sv.add_service(asv.GcePreemptionNotice(metadata.host, wait_secs=600))
    with anyio.fail_after(60):  # never hangs the test run (without the interruption: 120 s)
        async with sv.managed_session() as sess:
            for key in (PREEMPTED, MAINTENANCE):
                assert await anyio.to_thread.run_sync(metadata.hanging[key].wait, scaled(10)), key
            await sess.run_loop(lambda: None, max_steps=5)
            body_ended = time.monotonic()
    assert time.monotonic() - body_ended < 10, "the stop waited for a hanging GET"
    assert (sv.status().stop_reason, asv.exit_code(sv.status())) == ("max_steps", 0)


def test_arguments_are_checked() -> None:
    """A bad host, wait or backoff is refused at construction, naming the argument."""
    with pytest.raises(ValueError, match="host"):
        asv.GcePreemptionNotice("http://metadata/")
    with pytest.raises(ValueError, match="wait_secs"):
        asv.GcePreemptionNotice(wait_secs=0)
    with pytest.raises(ValueError, match="backoff_secs"):
        asv.GcePreemptionNotice(backoff_secs=-1)
