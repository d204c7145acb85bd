"""Fixtures of the remote-tier tests: a real S3 server (moto's, in a child process) per
test worker, a fresh bucket per test, the environment that points s3fs at them, a fault
proxy in front of it, and the child trainings a test started (killed at its end)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import S3_ENV, Child, FaultProxy, Server, make_bucket, moto_server, running


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Server]:
    """moto's S3 API server on 127.0.0.1, for every test of this worker."""
    with running(moto_server()) as server:
        yield server


@pytest.fixture
def s3_env(s3_server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Server:
    """The environment of a training against ``s3_server``: credentials, the endpoint,
    and a user cache (the default local working directories) under ``tmp_path``."""
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return s3_server


@pytest.fixture
def s3_url(s3_env: Server) -> str:
    """``s3://<a new bucket>/run`` on the test's S3 server."""
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    make_bucket(s3_env.endpoint, bucket)
    return f"s3://{bucket}/run"


@pytest.fixture
def anyio_backend() -> str:
    """The remote tier's tests run on asyncio; those marked ``servers.both_backends``
    (its start-up, uploads, outage and stop: the parts that touch the event loop) on
    trio too."""
    return "asyncio"


@pytest.fixture
def proxy(s3_env: Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A proxy in front of the S3 server; the environment's endpoint is the proxy."""
    p = FaultProxy(s3_env.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """The child trainings of a test: each is killed, if it still runs, at its end."""
    made: list[Child] = []
    yield made
    for child in made:
        child.close()
