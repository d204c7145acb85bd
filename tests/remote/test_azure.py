"""URL logdirs against Azurite, the Azure Storage emulator (its Blob service on
127.0.0.1, which adlfs reaches through ``AZURE_STORAGE_CONNECTION_STRING``): a fresh
machine resumes bitwise from ``az://``, one owner per remote logdir (the lease's
create-only write is Azure's ``If-None-Match: *``: a contender that lost the race is
refused), a missing container fails the start, and a training process ends with the
Azure clients closed (no exit-time errors).

Azurite is an npm package: ``make venv`` installs it with the machine's npm. Without
Node.js these tests are skipped, naming that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import training
from _timing import scaled
from servers import Server, azurite, azurite_connection_string, azurite_missing, running

pytestmark = [
    pytest.mark.usefixtures("no_new_threads"),
    pytest.mark.skipif(azurite_missing() is not None, reason=str(azurite_missing())),
]


# -- the emulator --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def azure_server() -> Iterator[Server]:
    """Azurite's Blob service (in memory) on 127.0.0.1, for every test of this worker."""
    with running(azurite()) as server:
        yield server


@pytest.fixture
def azure_env(azure_server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Server:
    """The environment of a training against ``azure_server``: adlfs pointed at it, and a
    user cache (the default local working directories) under ``tmp_path``."""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string(azure_server))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return azure_server


def _container(server: Server, name: str) -> Any:
    """A container client of the emulator, behind the product's back (the Azure SDK's
    synchronous client: no adlfs, no event loop thread)."""
    from azure.storage.blob import ContainerClient

    return ContainerClient.from_connection_string(azurite_connection_string(server), name)


@pytest.fixture
def az_url(azure_env: Server) -> str:
    """``az://<a new container>/run`` on the emulator."""
    name = f"c-{uuid.uuid4().hex[:12]}"
    with _container(azure_env, name) as container:
        container.create_container()
    return f"az://{name}/run"


def _split(url: str) -> tuple[str, str]:
    container, prefix = url[len("az://") :].split("/", 1)
    return container, prefix


def _keys(server: Server, url: str) -> list[str]:
    """The blob names under ``url``, relative to it."""
    name, prefix = _split(url)
    with _container(server, name) as container:
        return sorted(b.name[len(prefix) + 1 :] for b in container.list_blobs(name_starts_with=prefix + "/"))


def _get(server: Server, url: str, name: str) -> bytes:
    container_name, prefix = _split(url)
    with _container(server, container_name) as container:
        return bytes(container.download_blob(f"{prefix}/{name}").readall())


# -- the tests -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_fresh_machine_resumes_bitwise_from_azure(az_url: str, azure_env: Server, tmp_path: Path) -> None:
    """Train 12 steps into az://; a second training with an empty local working directory
    downloads the newest checkpoint and goes on exactly as one uninterrupted run does."""
    await training.fresh_machine_resumes_bitwise(
        az_url,
        tmp_path,
        lambda: _keys(azure_env, az_url),
        lambda name: _get(azure_env, az_url, name),
    )


@pytest.mark.anyio
async def test_a_second_training_is_refused_naming_the_owner(az_url: str, azure_env: Server, tmp_path: Path) -> None:
    """While a training owns the az:// logdir (its lease blob, created create-only), a
    second one (another machine: another local directory) fails at start naming the
    owner; after the first ends, it starts."""
    await training.second_training_refused(az_url, tmp_path, lambda: _keys(azure_env, az_url))


def test_a_contender_that_lost_the_race_for_the_lease_is_refused(az_url: str, azure_env: Server) -> None:
    """Two trainings start at once: one creates lease 1 after the other listed none. The
    other's create-only write of lease 1 (adlfs: ``overwrite=False``, Azure's
    ``If-None-Match: *``) is refused, it looks again and is refused naming the owner; the
    owner's lease stays its own."""
    training.lost_race_refused(az_url, lambda name: _get(azure_env, az_url, name))


def test_the_conditional_write_refuses_a_second_create(az_url: str) -> None:
    """``create_only`` (adlfs: ``If-None-Match: *``): a second create at a path is refused
    and the first's bytes stay."""
    training.create_only_conforms(az_url)


@pytest.mark.anyio
async def test_a_missing_container_fails_the_start(azure_env: Server, tmp_path: Path) -> None:
    """A container that does not exist: a CheckpointError naming the URL before the first step."""
    url = f"az://no-such-container-{uuid.uuid4().hex[:8]}/run"
    await training.missing_bucket_fails_the_start(url, tmp_path)


def test_a_training_process_exits_with_the_azure_clients_closed(az_url: str, azure_env: Server, tmp_path: Path) -> None:
    """A training into az:// in its own process ends cleanly: adlfs closes its service
    client in finalizers that would run at interpreter exit on the session's stopped
    loop ("Loop is not running", "Unclosed client session"); the session closes them
    while its loop runs, so the process's stderr has none of that."""
    script = Path(__file__).parent / "scripts" / "remote_train.py"
    argv = [sys.executable, str(script), az_url, str(tmp_path / "local"), "6", "3", "0.1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(120), env=os.environ.copy())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].startswith("done 6 ")
    for noise in ("Loop is not running", "Unclosed client session", "Unclosed connector", "Traceback"):
        assert noise not in done.stderr, done.stderr[-3000:]
    assert "model.ckpt-6.asv-commit" in _keys(azure_env, az_url)
