"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# on a GPU, every TensorFlow process of the suite (this one, pytest-xdist's workers and the
# processes tests start, which inherit it) takes memory as it needs it, not all of it at
# its start: several share the GPU (set before TensorFlow is imported; a value the shell
# gave stays)
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")

import pytest
from _timing import CPU_ENV_VAR, ENV_VAR, cpu_slowness, slowness

#: the environment variable choosing the checkpoint store (asupervisor._checkpoint.store.ENV_VAR)
STORE_ENV = "ASUPERVISOR_CHECKPOINT_STORE"
#: the fast store runs on Linux only (asupervisor._checkpoint.store.fast_store_available)
LINUX = sys.platform.startswith("linux")


def pytest_configure(config: pytest.Config) -> None:
    """The CPU part of the slowness figure, measured once, goes to pytest-xdist's workers
    (the load part is taken as each test starts)."""
    os.environ[CPU_ENV_VAR] = f"{cpu_slowness():.2f}"


#: each test's own timeout (its marker's, or pyproject's), before stretching
_BASE_TIMEOUT = pytest.StashKey[float]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's timeout as written, stretched as the test starts (below)."""
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        item.stash[_BASE_TIMEOUT] = float(marker.args[0]) if marker is not None and marker.args else default


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """On a slow or busy machine the test's timeout stretches by :func:`slowness` as it
    starts (before pytest-timeout reads it): a test that waits on a real process or a real
    TensorFlow import takes longer there, and the timeout is there to catch hangs, not
    slowness. The processes the test starts get the same figure (``ENV_VAR``)."""
    factor = slowness()
    os.environ[ENV_VAR] = f"{factor:.2f}"
    base = item.stash.get(_BASE_TIMEOUT, 0.0)
    if base > 0 and factor > 1.0:
        item.add_marker(pytest.mark.timeout(base * factor), append=False)
    yield


def pytest_report_header(config: pytest.Config) -> str:
    """The header says how much the timeouts stretch."""
    return (
        f"per-test timeouts x{slowness():.2f} now, taken again as each test starts (ASUPERVISOR_TEST_SLOWNESS fixes it)"
    )


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
        if t not in before and t.is_alive() and not t.name.startswith(("Trio thread", "AnyIO worker thread"))
    ]
    assert not left, f"threads outlived the test: {[t.name for t in left]}"


@pytest.fixture(autouse=True)
def _default_checkpoint_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with the store the platform picks ("auto"), whatever the shell set."""
    monkeypatch.delenv(STORE_ENV, raising=False)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The promise tests (modules using the ``checkpoint_store`` fixture) run against both
    stores; one marked ``fast_store`` tests a mechanism of the fast store, on it alone."""
    if "checkpoint_store" in metafunc.fixturenames:
        fast = pytest.param(
            "fast", marks=pytest.mark.skipif(not LINUX, reason="the fast checkpoint store is Linux only")
        )
        fast_only = metafunc.definition.get_closest_marker("fast_store") is not None
        metafunc.parametrize("checkpoint_store", [fast] if fast_only else [fast, "plain"], indirect=True)


@pytest.fixture
def checkpoint_store(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, _default_checkpoint_store: None
) -> str:
    """The checkpoint store of this run of a promise test: chosen through the environment
    variable, so that supervisors made in the test and child processes it starts use it."""
    kind: str = request.param
    monkeypatch.setenv(STORE_ENV, kind)
    return kind
