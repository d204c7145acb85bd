"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Both anyio backends, for every ``@pytest.mark.anyio`` test."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def no_new_threads() -> Iterator[None]:
    """Fails the test if it leaves a thread running that was not there before.

    The trio test runner of anyio's pytest plugin hosts trio in guest mode, whose I/O
    thread ("Trio thread N") belongs to the runner, not to the code under test; tests use
    ``anyio.to_thread`` to wait on thread events, whose pooled workers idle on for a
    while. asupervisor itself never uses either pool (``test_api`` checks that), and
    names every thread it starts ``asv-*``.
    """
    before = set(threading.enumerate())
    yield
    left = [
        t
        for t in threading.enumerate()
        if t not in before
        and t.is_alive()
        and not t.name.startswith(("Trio thread", "AnyIO worker thread"))
    ]
    assert not left, f"threads outlived the test: {[t.name for t in left]}"
