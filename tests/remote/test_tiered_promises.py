"""The checkpoint promises on the tiered store (a URL logdir: a local working directory,
then the remote), as ``tests/checkpoint/`` checks them on the local stores. In-process on
``memory://`` (per process), the kill on the suite's S3 server; through the public API
and the on-remote layout of ``docs/storage.md`` only. Each promise, and where it is checked:

* **commit**: a checkpoint exists for readers only once its marker is written; the
  marker, not the state object, decides --
  :func:`test_commit_a_checkpoint_exists_for_readers_once_its_marker_does`; also
  ``test_remote.py::test_objects_without_a_marker_do_not_exist_and_are_removed`` (S3).
* **restore-or-init**: :func:`test_restore_or_init_on_a_url_logdir`.
* **fallback**: :func:`test_fallback_a_damaged_newest_remote_checkpoint_restores_the_previous`,
  :func:`test_fallback_a_reader_skips_a_damaged_remote_checkpoint`, and what a
  fallback must not leave: :func:`test_fallback_the_next_save_of_the_damaged_step_replaces_it_on_the_remote`,
  :func:`test_fallback_every_remote_checkpoint_damaged_is_an_error_not_an_init`.
* **repair**: :func:`test_repair_a_damaged_local_state_file_while_the_remote_is_sound`; the
  remote state object: ``test_remote.py::test_a_damaged_state_object_is_rebuilt_from_the_markers``.
* **retention**: ``test_remote.py::test_retention_applies_on_the_remote`` (``max_to_keep``),
  ``test_keep_best_remote.py::test_remote_retention_keeps_the_best_by_the_markers_metrics``
  (``KeepBest``).
* **SIGKILL**: :func:`test_sigkill_mid_save_then_a_restart_resumes_from_an_intact_checkpoint`
  (a local save, same machine); ``test_remote_field.py::``
  ``test_sigkill_during_an_upload_then_a_fresh_machine_resumes_exactly`` (an upload).
* **exact resume**: ``test_remote.py::test_a_fresh_machine_resumes_bitwise_from_s3``, and
  every test here that compares the weights with an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import tensorflow as tf
import training
from servers import TRAIN_SCRIPT, Child, Server, both_backends, markers, orphans, s3_read, until

import asupervisor as asv
from asupervisor.__main__ import main as cli
from asupervisor.testing import capture_logs

sys.path.insert(0, str(TRAIN_SCRIPT.parent))
import remote_train

sys.path.remove(str(TRAIN_SCRIPT.parent))

pytestmark = pytest.mark.usefixtures("no_new_threads")

#: in the name of every file of a local save in flight (the local tier's temporary files)
TMP_MARKER = ".asv-tmp-"


@pytest.fixture
def url() -> Iterator[str]:
    """A fresh ``memory://`` logdir, removed at the end (fsspec's memory store lives as
    long as the process)."""
    bucket = f"tiered-{uuid.uuid4().hex[:12]}"
    yield f"memory://{bucket}/run"
    fs = fsspec.filesystem("memory")
    if fs.exists(f"/{bucket}"):
        fs.rm(f"/{bucket}", recursive=True)


def _root(url: str) -> str:
    return url[len("memory:/") :]


def _objects(url: str) -> list[str]:
    """The object names of the logdir ``url``, sorted."""
    return sorted(p.rsplit("/", 1)[1] for p in fsspec.filesystem("memory").ls(_root(url), detail=False))


def _read(url: str, name: str) -> bytes:
    return bytes(fsspec.filesystem("memory").cat_file(f"{_root(url)}/{name}"))


def _write(url: str, name: str, data: bytes) -> None:
    fsspec.filesystem("memory").pipe_file(f"{_root(url)}/{name}", data)


def _flip_byte(url: str, name: str) -> None:
    """Flip one byte in the middle of the object ``name`` (its size unchanged)."""
    raw = bytearray(_read(url, name))
    raw[len(raw) // 2] ^= 0xFF
    _write(url, name, bytes(raw))


def _data(step: int) -> str:
    return f"model.ckpt-{step}.data-00000-of-00001"


def _reference(steps: int) -> np.ndarray:
    """The weights of an uninterrupted run of ``steps`` steps."""
    state = training.model()
    for _ in range(steps):
        training.step(state)
    return np.asarray(state["w"].numpy())


@dataclass
class Run:
    """What one session into a URL logdir did."""

    sv: asv.Supervisor
    state: dict[str, Any]
    started: int = -1  # the step it started at (restored or 0)
    w_at_start: np.ndarray | None = None
    inits: list[int] = field(default_factory=list)  # one entry per init_fn call
    logs: list[dict[str, Any]] = field(default_factory=list)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.logs if e["event"] == name]


async def _session(url: str, local: Path, steps: int, **kwargs: Any) -> Run:
    """A training into ``url`` (``local``: its working directory) to ``steps``, saving every
    5 steps; what it started from and logged."""
    state = training.model()
    inits: list[int] = []
    kwargs.setdefault("save_model_steps", 5)
    sv = asv.Supervisor(
        url,
        local_dir=local,
        state=state,
        save_model_secs=0,
        handle_signals=False,
        init_fn=lambda: inits.append(1),
        **kwargs,
    )
    run = Run(sv, state, inits=inits)
    with capture_logs() as run.logs:
        async with sv.managed_session() as sess:
            run.started = sess.global_step
            run.w_at_start = state["w"].numpy().copy()
            await sess.run_loop(lambda: training.step(state), max_steps=steps)
    return run


@pytest.mark.anyio
@both_backends
async def test_restore_or_init_on_a_url_logdir(url: str, tmp_path: Path) -> None:
    """A fresh URL logdir runs ``init_fn`` once and restores nothing; a second session on a
    fresh machine restores the remote's latest without ``init_fn``; a restart on the first
    machine, whose local tier is behind the remote, restores the newer remote one."""
    first = await _session(url, tmp_path / "a", 7)
    assert first.inits == [1] and first.started == 0
    assert not first.events("checkpoint.restored") and not first.events("remote.downloaded")
    assert "model.ckpt-7.asv-commit" in _objects(url)
    assert 'model_checkpoint_path: "model.ckpt-7"' in _read(url, "checkpoint").decode()

    second = await _session(url, tmp_path / "b", 9)
    assert second.inits == [] and second.started == 7
    assert [e["checkpoint"] for e in second.events("remote.downloaded")] == ["model.ckpt-7"]
    np.testing.assert_array_equal(second.w_at_start, _reference(7))
    np.testing.assert_array_equal(second.state["w"].numpy(), _reference(9))

    third = await _session(url, tmp_path / "a", 11)  # its local tier holds 7, the remote 9
    assert third.inits == [] and third.started == 9
    np.testing.assert_array_equal(third.state["w"].numpy(), _reference(11))


def _inspect(url: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``asupervisor inspect URL --json``, as the command prints it."""
    capsys.readouterr()
    assert cli(["inspect", url, "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


async def _watched(url: str, local: Path) -> list[str]:
    """The checkpoints a reader (``watch_checkpoints``) gets from ``url`` now, by name."""
    async with asv.watch_checkpoints(url, timeout=0, local_dir=local) as found:
        return [Path(p).name async for p in found]


@pytest.mark.anyio
@both_backends
async def test_commit_a_checkpoint_exists_for_readers_once_its_marker_does(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint's complete, sound objects under their final names, without its commit
    marker (an upload cut before it), exist for no reader: an evaluator's watch, plain
    TensorFlow on what it pulled, ``asupervisor inspect`` (a leftover), a fresh machine's
    training. Once the marker is there (the state object not yet naming it: a crash
    before it), every reader has it."""
    await training.train(url, tmp_path / "a", 10)
    other = url.replace("/run", "/other")
    await training.train(other, tmp_path / "o", 15, save_model_steps=100)  # the same model at step 15
    for name in (_data(15), "model.ckpt-15.index"):
        _write(url, name, _read(other, name))

    assert await _watched(url, tmp_path / "eval") == ["model.ckpt-0", "model.ckpt-5", "model.ckpt-10"]
    assert tf.train.latest_checkpoint(str(tmp_path / "eval")) == str(tmp_path / "eval" / "model.ckpt-10")
    report = _inspect(url, capsys)
    assert [c["step"] for c in report["checkpoints"]] == [0, 5, 10]
    assert report["leftovers"] == [_data(15), "model.ckpt-15.index"]

    _write(url, "model.ckpt-15.asv-commit", _read(other, "model.ckpt-15.asv-commit"))
    assert 'model_checkpoint_path: "model.ckpt-10"' in _read(url, "checkpoint").decode()
    assert await _watched(url, tmp_path / "eval2") == ["model.ckpt-0", "model.ckpt-5", "model.ckpt-10", "model.ckpt-15"]
    w = tf.Variable(tf.zeros([64, 32]))
    tf.train.Checkpoint(w=w).restore(str(tmp_path / "eval2" / "model.ckpt-15")).expect_partial()
    np.testing.assert_array_equal(w.numpy(), _reference(15))
    report = _inspect(url, capsys)
    assert [c["step"] for c in report["checkpoints"]] == [0, 5, 10, 15] and report["leftovers"] == []
    resumed = await _session(url, tmp_path / "b", 17)
    assert resumed.started == 15 and resumed.inits == []
    np.testing.assert_array_equal(resumed.state["w"].numpy(), _reference(17))


@pytest.mark.anyio
@both_backends
async def test_fallback_a_damaged_newest_remote_checkpoint_restores_the_previous(url: str, tmp_path: Path) -> None:
    """A flipped byte in the data object of the remote's newest checkpoint (its marker as
    it was), on a fresh machine: the checksum finds it, the warning names it, the previous
    remote checkpoint is restored (not ``init_fn``), and training goes on exactly."""
    await training.train(url, tmp_path / "a", 10)
    _flip_byte(url, _data(10))
    run = await _session(url, tmp_path / "b", 12)
    assert run.started == 5 and run.inits == []
    damaged = run.events("remote.checkpoint_damaged")
    assert [(e["checkpoint"], e["log_level"]) for e in damaged] == [("model.ckpt-10", "warning")]
    assert "its commit marker says" in damaged[0]["problem"]
    np.testing.assert_array_equal(run.w_at_start, _reference(5))
    np.testing.assert_array_equal(run.state["w"].numpy(), _reference(12))


@pytest.mark.anyio
async def test_fallback_the_next_save_of_the_damaged_step_replaces_it_on_the_remote(url: str, tmp_path: Path) -> None:
    """After a fallback from a damaged remote checkpoint 10 to 5, the training saves step 10
    again and stops there: that checkpoint reaches the remote, so the next fresh machine
    resumes at 10 and finds nothing damaged."""
    await training.train(url, tmp_path / "a", 10)
    _flip_byte(url, _data(10))
    fallback = await _session(url, tmp_path / "b", 10)
    assert fallback.started == 5
    again = await _session(url, tmp_path / "c", 12)
    assert not again.events("remote.checkpoint_damaged"), "the damaged checkpoint is still the remote's latest"
    assert again.started == 10


@pytest.mark.anyio
async def test_fallback_every_remote_checkpoint_damaged_is_an_error_not_an_init(url: str, tmp_path: Path) -> None:
    """Every remote checkpoint damaged, on a fresh machine: the start fails with a
    CheckpointError naming them; ``init_fn`` never runs and the remote is left as it was."""
    await training.train(url, tmp_path / "a", 10)
    for step in (0, 5, 10):
        _flip_byte(url, _data(step))
    before = {name: _read(url, name) for name in _objects(url) if name.startswith("model.ckpt-")}
    inits: list[int] = []
    error: Exception | None = None
    try:
        async with asv.Supervisor(
            url, local_dir=tmp_path / "b", state=training.model(), init_fn=lambda: inits.append(1), handle_signals=False
        ).managed_session():
            pass
    except asv.CheckpointError as exc:
        error = exc
    assert inits == [], "init_fn ran over a remote whose checkpoints are all damaged"
    assert error is not None and all(f"model.ckpt-{step}" in str(error) for step in (0, 5, 10)), error
    assert {name: _read(url, name) for name in _objects(url) if name.startswith("model.ckpt-")} == before


@pytest.mark.anyio
@both_backends
async def test_fallback_a_reader_skips_a_damaged_remote_checkpoint(url: str, tmp_path: Path) -> None:
    """An evaluator watching a URL logdir where one committed checkpoint fails its checksum:
    the watch logs it once, leaves no part of it on its disk, and gets the sound ones."""
    await training.train(url, tmp_path / "a", 15)
    for step in (5, 15):
        _flip_byte(url, _data(step))
    with capture_logs() as logs:
        async with asv.watch_checkpoints(url, timeout=0, local_dir=tmp_path / "eval") as found:
            assert [Path(p).name async for p in found] == ["model.ckpt-0", "model.ckpt-10"]
            assert [Path(p).name async for p in found] == []  # a second poll: 15 is not tried again
    damaged = [e for e in logs if e["event"] == "watch.checkpoint_damaged"]
    assert [(e["checkpoint"], e["log_level"]) for e in damaged] == [
        ("model.ckpt-5", "warning"),
        ("model.ckpt-15", "warning"),
    ]
    assert "its commit marker says" in damaged[0]["problem"]
    assert not [p.name for p in (tmp_path / "eval").iterdir() if "ckpt-5" in p.name or "ckpt-15" in p.name]


@pytest.mark.anyio
@both_backends
async def test_repair_a_damaged_local_state_file_while_the_remote_is_sound(url: str, tmp_path: Path) -> None:
    """Garbage in the local tier's ``checkpoint`` file, the remote sound: a restart on that
    machine restores the newest checkpoint (not ``init_fn``), goes on exactly, and both
    tiers' state files name the new latest."""
    local = tmp_path / "a"
    await training.train(url, local, 10)
    (local / "checkpoint").write_bytes(b"\x00\xffnot a state\x01")
    run = await _session(url, local, 12)
    assert run.started == 10 and run.inits == []
    np.testing.assert_array_equal(run.w_at_start, _reference(10))
    np.testing.assert_array_equal(run.state["w"].numpy(), _reference(12))
    assert tf.train.latest_checkpoint(str(local)) == str(local / "model.ckpt-12")
    assert 'model_checkpoint_path: "model.ckpt-12"' in _read(url, "checkpoint").decode()


def _remote_reference(mb: float, steps: int) -> str:
    state = remote_train.state_of(mb)
    for _ in range(steps):
        remote_train.step(state)
    return str(remote_train.digest(state))


def _writing(local: Path) -> bool:
    """Whether a local save is in flight (or was cut): its temporary files."""
    try:
        return any(TMP_MARKER in name for name in os.listdir(local))
    except FileNotFoundError:
        return False


@pytest.mark.timeout(180)
def test_sigkill_mid_save_then_a_restart_resumes_from_an_intact_checkpoint(
    s3_url: str, s3_env: Server, tmp_path: Path, children: list[Child]
) -> None:
    """A training into s3:// saving every step is SIGKILLed while a local save is being
    written (its temporary files are left): the local latest is a checkpoint plain
    TensorFlow reads in full; the restart on that machine resumes from it, removes what the
    kill left (locally and on the remote), and ends bitwise where an uninterrupted run does."""
    mb, local = 2.0, tmp_path / "a"
    for _attempt in range(3):  # a kill lands mid-save nearly always (saves take ~80 % of the time)
        child = Child(s3_url, local, 10**6, 1, mb)
        children.append(child)
        until("a committed upload", lambda: bool(markers(s3_env.endpoint, s3_url)), child)
        until("a local save in flight", lambda: _writing(local), child)
        child.kill()
        if _writing(local):
            break
    assert _writing(local), "no kill landed in the middle of a local save"

    latest = tf.train.latest_checkpoint(str(local))
    assert latest is not None
    reader = tf.train.load_checkpoint(latest)
    for key in reader.get_variable_to_shape_map():
        reader.get_tensor(key)  # every value reads (its checksum holds)
    step = int(latest.rsplit("-", 1)[1])
    assert step >= markers(s3_env.endpoint, s3_url)[-1]

    target = step + 5
    restart = Child(s3_url, local, target, 1000, mb)
    children.append(restart)
    code, out, err = restart.finish()
    assert code == 0, err[-3000:]
    assert restart.started() == step, out
    done = out.split("done ")[1].split()
    assert int(done[0]) == target and done[1] == _remote_reference(mb, target), out
    assert not _writing(local)
    assert orphans(s3_env.endpoint, s3_url) == []
    assert markers(s3_env.endpoint, s3_url)[-1] == target
    assert f'model_checkpoint_path: "model.ckpt-{target}"' in s3_read(s3_env.endpoint, s3_url, "checkpoint").decode()
