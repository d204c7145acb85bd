"""The small training the remote-tier tests run in-process: a seeded state (weights and a
random generator), a deterministic step, and a training into a URL logdir."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor._checkpoint.store.remote._io import RemoteFS, create_only
from asupervisor._checkpoint.store.remote._lease import LEASE_PREFIX, RemoteLease


def model() -> dict[str, Any]:
    """A fresh seeded state: 64x32 weights and a generator."""
    tf.keras.utils.set_random_seed(1)
    w = tf.Variable(tf.random.normal([64, 32]), name="w")
    gen = tf.random.Generator.from_seed(7)
    return {"w": w, "gen": gen}


def step(state: dict[str, Any]) -> None:
    """One deterministic step of ``state``."""
    state["w"].assign_add(state["gen"].normal([64, 32]))


async def train(url: str, local: Path, steps: int, **kwargs: Any) -> tuple[asv.Supervisor, dict[str, Any]]:
    """Train a fresh state into ``url`` (``local``: its working directory) to ``steps``;
    saves every 5 steps unless told otherwise."""
    state = model()
    if "save_policy" not in kwargs:
        kwargs.setdefault("save_model_steps", 5)
        kwargs.setdefault("save_model_secs", 0)
    sv = asv.Supervisor(url, local_dir=local, state=state, handle_signals=False, **kwargs)
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: step(state), max_steps=steps)
    return sv, state


async def fresh_machine_resumes_bitwise(
    url: str, tmp_path: Path, keys: Callable[[], list[str]], read: Callable[[str], bytes]
) -> None:
    """The fresh-machine scenario, on any store: train 12 steps into ``url``; its objects
    (``keys()``, ``read(name)``) hold a committed checkpoint 12 with its marker and the
    state object, and no probe; a second training with an empty local working directory
    downloads checkpoint 12 and ends at step 20 bitwise where an uninterrupted run does."""
    sv, _ = await train(url, tmp_path / "machine-a", 12)
    remote = sv.status().remote
    assert remote is not None and remote.uploaded_step == 12 and remote.lag_steps == 0 and remote.error is None
    assert sv.logdir == url
    names = keys()
    assert "model.ckpt-12.asv-commit" in names and "checkpoint" in names, names
    assert not [k for k in names if k.startswith(".asv-probe-")], names
    marker = json.loads(read("model.ckpt-12.asv-commit"))
    assert marker["step"] == 12 and "model.ckpt-12.index" in marker["files"]

    sv2, resumed = await train(url, tmp_path / "machine-b", 20)
    assert sv2.status().global_step == 20
    reference = model()
    for _ in range(20):
        step(reference)
    np.testing.assert_array_equal(resumed["w"].numpy(), reference["w"].numpy())
    assert sorted(p.name for p in (tmp_path / "machine-b").glob("model.ckpt-12.*")) == [
        "model.ckpt-12.data-00000-of-00001",
        "model.ckpt-12.index",
    ]


async def second_training_refused(url: str, tmp_path: Path, keys: Callable[[], list[str]]) -> None:
    """While a training owns ``url`` (its lease object, created create-only), a second one
    (another machine: another local directory) fails at start naming the owner; after the
    first ends, it starts."""
    state = model()
    sv = asv.Supervisor(url, local_dir=tmp_path / "a", state=state, save_model_secs=0, handle_signals=False)
    refused = False
    async with sv.managed_session() as sess:
        for _ in range(3):  # one at a time: a run_loop reaching max_steps would stop the session
            await sess.run(step, state)
        assert f"{LEASE_PREFIX}00000001" in keys()
        second = asv.Supervisor(url, local_dir=tmp_path / "b", state=model(), handle_signals=False)
        with pytest.raises(asv.CheckpointError, match=r"in use by another training \(host .* pid \d+"):
            async with second.managed_session():
                pytest.fail("two owners")
        refused = True
    assert refused  # the refusal above was reached, inside the first session
    assert not list((tmp_path / "b").glob("model.ckpt-*"))
    sv3, _ = await train(url, tmp_path / "b", 5)
    assert sv3.status().global_step == 5


class ListingOnceStale:
    """An fsspec file system whose first listing is taken just before another contender
    created its lease: it lacks the lease objects; every later call is the real one."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self._stale = True

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        names = self._fs.ls(path, detail=detail, **kwargs)
        if self._stale:
            self._stale = False
            return [n for n in names if LEASE_PREFIX not in str(n if not detail else n["name"])]
        return names

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)


def lost_race_refused(url: str, read: Callable[[str], bytes]) -> None:
    """Two trainings start at once: one creates lease 1 after the other listed none. The
    other's create-only write of lease 1 is refused, it looks again and is refused naming
    the owner; the owner's lease (``read(name)``) stays its own."""
    io = RemoteFS(url)
    try:
        first = RemoteLease(io.fs, io.root, url)
        first.acquire()
        owner_body = read(f"{LEASE_PREFIX}00000001")
        second = RemoteLease(ListingOnceStale(io.fs), io.root, url)
        with pytest.raises(asv.CheckpointError, match=r"in use by another training \(host .* pid \d+"):
            second.acquire()
        assert read(f"{LEASE_PREFIX}00000001") == owner_body
        first.release()
    finally:
        io.close()


def create_only_conforms(url: str) -> None:
    """The one conditional write (``create_only``) on this backend: a first create writes,
    a second at the same path raises ``FileExistsError`` and leaves the first's bytes; a
    create at another path writes."""
    io = RemoteFS(url)
    try:
        path = io.path(f"conformance-{uuid.uuid4().hex[:8]}")
        create_only(io, path, b"first")
        with pytest.raises(FileExistsError):
            create_only(io, path, b"second")
        assert io.cat_file(path) == b"first"
        create_only(io, path + "-other", b"other")
        assert io.cat_file(path + "-other") == b"other"
    finally:
        io.close()


async def missing_bucket_fails_the_start(url: str, tmp_path: Path) -> None:
    """``url`` names a bucket (container) that does not exist: a CheckpointError naming the
    URL before the first step, and nothing saved locally."""
    local = tmp_path / "l"
    sv = asv.Supervisor(url, local_dir=local, state=model(), handle_signals=False)
    with pytest.raises(asv.CheckpointError, match=rf"{url} cannot be written"):
        async with sv.managed_session():
            pytest.fail("the session started")
    assert not list(local.glob("model.ckpt-*"))
