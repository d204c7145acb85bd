"""URL logdirs against a real GCS emulator (``gcp-storage-emulator``, on 127.0.0.1, which
gcsfs reaches through ``STORAGE_EMULATOR_HOST``): a fresh machine resumes bitwise from
``gs://``, one owner per remote logdir, a missing bucket fails the start."""

from __future__ import annotations

import json
import logging
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import training
from _timing import scaled
from servers import Server, gcs_emulator, running

pytestmark = pytest.mark.usefixtures("no_new_threads")


# -- the emulator --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[Server]:
    """``gcp-storage-emulator`` (in memory) on 127.0.0.1, for every test of this worker."""
    with running(gcs_emulator()) as server:
        yield server


@pytest.fixture
def gcs_env(
    gcs_server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> Server:
    """The environment of a training against ``gcs_server``: gcsfs pointed at the
    emulator (anonymous: no credentials of the machine's), and a user cache (the default
    local working directories) under ``tmp_path``."""
    # gcsfs asks Google's gRPC control API for the bucket's type on every call and warns
    # each time it cannot (no credentials, an emulator): hundreds of lines, all the same
    caplog.set_level(logging.ERROR, logger="gcsfs")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.endpoint)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return gcs_server


def _api(endpoint: str, path: str, body: dict[str, Any] | None = None) -> bytes:
    """A request to the emulator's JSON API, behind the product's back (plain HTTP: no
    gcsfs, whose event loop thread would outlive the test)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(endpoint + path, data=data, method="GET" if body is None else "POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=scaled(30)) as response:
        return bytes(response.read())


@pytest.fixture
def gcs_url(gcs_env: Server) -> str:
    """``gs://<a new bucket>/run`` on the emulator."""
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    _api(gcs_env.endpoint, "/storage/v1/b?project=test", {"name": bucket})
    return f"gs://{bucket}/run"


def _split(url: str) -> tuple[str, str]:
    bucket, prefix = url[len("gs://") :].split("/", 1)
    return bucket, prefix


def _keys(endpoint: str, url: str) -> list[str]:
    """The object names under ``url``, relative to it."""
    bucket, prefix = _split(url)
    query = urllib.parse.urlencode({"prefix": prefix + "/"})
    listing = json.loads(_api(endpoint, f"/storage/v1/b/{bucket}/o?{query}"))
    assert "nextPageToken" not in listing, "paged listing: ask for the next page"
    return sorted(o["name"][len(prefix) + 1 :] for o in listing.get("items", []))


def _get(endpoint: str, url: str, name: str) -> bytes:
    bucket, prefix = _split(url)
    return _api(endpoint, f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(f'{prefix}/{name}', safe='')}?alt=media")


# -- the tests -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_fresh_machine_resumes_bitwise_from_gcs(gcs_url: str, gcs_env: Server, tmp_path: Path) -> None:
    """Train 12 steps into gs://; a second training with an empty local working directory
    downloads the newest checkpoint and goes on exactly as one uninterrupted run does."""
    await training.fresh_machine_resumes_bitwise(
        gcs_url,
        tmp_path,
        lambda: _keys(gcs_env.endpoint, gcs_url),
        lambda name: _get(gcs_env.endpoint, gcs_url, name),
    )


@pytest.mark.anyio
async def test_a_second_training_is_refused_naming_the_owner(gcs_url: str, gcs_env: Server, tmp_path: Path) -> None:
    """While a training owns the gs:// logdir (its lease object, created create-only), a
    second one (another machine: another local directory) fails at start naming the
    owner; after the first ends, it starts."""
    await training.second_training_refused(gcs_url, tmp_path, lambda: _keys(gcs_env.endpoint, gcs_url))


@pytest.mark.xfail(
    strict=True,
    raises=pytest.fail.Exception,
    reason=(
        "gcp-storage-emulator 2026.7.19: uploads ignore the ifGenerationMatch=0 "
        "precondition (gcsfs pipe_file(mode='create') overwrites an existing object "
        "instead of answering 412), so the lease's create-only write cannot lose a race"
    ),
)
def test_a_contender_that_lost_the_race_for_the_lease_is_refused(gcs_url: str, gcs_env: Server) -> None:
    """Two trainings start at once: one creates lease 1 after the other listed none. The
    other's create-only write of lease 1 (gcsfs: ``ifGenerationMatch=0``) is refused, it
    looks again and is refused naming the owner; the owner's lease stays its own."""
    training.lost_race_refused(gcs_url, lambda name: _get(gcs_env.endpoint, gcs_url, name))


@pytest.mark.xfail(
    strict=True,
    raises=pytest.fail.Exception,
    reason=(
        "gcp-storage-emulator 2026.7.19: uploads ignore the ifGenerationMatch=0 "
        "precondition (gcsfs pipe_file(mode='create') overwrites an existing object "
        "instead of answering 412), so the lease's create-only write cannot lose a race"
    ),
)
def test_the_conditional_write_refuses_a_second_create(gcs_url: str, gcs_env: Server) -> None:
    """``create_only`` (gcsfs: ``ifGenerationMatch=0``): a second create at a path is
    refused and the first's bytes stay (the emulator does not honour it: strict xfail)."""
    training.create_only_conforms(gcs_url)


@pytest.mark.anyio
async def test_a_missing_bucket_fails_the_start(gcs_env: Server, tmp_path: Path) -> None:
    """A bucket that does not exist: a CheckpointError naming the URL before the first step."""
    url = f"gs://no-such-bucket-{uuid.uuid4().hex[:8]}/run"
    await training.missing_bucket_fails_the_start(url, tmp_path)
