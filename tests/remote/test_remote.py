"""URL logdirs against a real S3 server (moto's, on 127.0.0.1): train to ``s3://``, a fresh
machine (an empty local working directory) resumes bitwise, only committed checkpoints
exist for readers, retention applies on the remote, bad buckets and credentials fail the
start, one owner per remote logdir, unknown schemes are refused at construction."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import numpy as np
import pytest
import tensorflow as tf
import training
from _timing import scaled
from servers import FaultProxy, Server, both_backends, moto_server, running, s3_call, s3_keys, s3_read, s3_write

import asupervisor as asv
from asupervisor._checkpoint.store.remote._lease import LEASE_PREFIX

pytestmark = pytest.mark.usefixtures("no_new_threads")


_model, _step, _train = training.model, training.step, training.train


_keys, _put = s3_keys, s3_write


@pytest.mark.anyio
@both_backends
async def test_a_fresh_machine_resumes_bitwise_from_s3(s3_url: str, s3_env: Server, tmp_path: Path) -> None:
    """Train 12 steps into s3://; a second training with an empty local working directory
    downloads the newest checkpoint and goes on exactly as one uninterrupted run does."""
    await training.fresh_machine_resumes_bitwise(
        s3_url, tmp_path, lambda: s3_keys(s3_env.endpoint, s3_url), lambda name: s3_read(s3_env.endpoint, s3_url, name)
    )


@pytest.mark.anyio
async def test_objects_without_a_marker_do_not_exist_and_are_removed(
    s3_url: str, s3_env: Server, tmp_path: Path
) -> None:
    """A checkpoint's objects without its commit marker (an upload cut short) are not
    restored by anyone, and the next owner removes them at start."""
    await _train(s3_url, tmp_path / "a", 10)
    _put(s3_env.endpoint, s3_url, "model.ckpt-99.index", b"half an upload")
    _put(s3_env.endpoint, s3_url, "model.ckpt-99.data-00000-of-00001", b"x" * 100)
    sv, _ = await _train(s3_url, tmp_path / "b", 12)
    assert sv.status().global_step == 12  # resumed at 10, not 99
    keys = _keys(s3_env.endpoint, s3_url)
    assert not [k for k in keys if k.startswith("model.ckpt-99")], keys


@pytest.mark.anyio
async def test_a_damaged_state_object_is_rebuilt_from_the_markers(s3_url: str, s3_env: Server, tmp_path: Path) -> None:
    """Garbage in the remote ``checkpoint`` object: the start restores the newest committed
    checkpoint from the markers, and the next upload writes a good state object."""
    await _train(s3_url, tmp_path / "a", 10)
    _put(s3_env.endpoint, s3_url, "checkpoint", b"\x00\xffnot a state\x01")
    sv, _ = await _train(s3_url, tmp_path / "b", 15)
    assert sv.status().global_step == 15
    text = s3_read(s3_env.endpoint, s3_url, "checkpoint").decode()
    assert 'model_checkpoint_path: "model.ckpt-15"' in text


@pytest.mark.anyio
async def test_retention_applies_on_the_remote(s3_url: str, s3_env: Server, tmp_path: Path) -> None:
    """max_to_keep=2: the remote keeps the newest two committed checkpoints, markers and
    files, and the state object names just them."""
    for steps in (3, 6, 9):  # each run's final checkpoint is uploaded at its stop
        await _train(s3_url, tmp_path / "a", steps, max_to_keep=2, save_model_steps=100)
    keys = _keys(s3_env.endpoint, s3_url)
    steps_left = sorted({int(k.split("-")[1].split(".")[0]) for k in keys if k.startswith("model.ckpt-")})
    assert steps_left == [6, 9], keys
    for step in steps_left:
        assert f"model.ckpt-{step}.asv-commit" in keys


@pytest.mark.anyio
async def test_a_local_checkpoint_newer_than_the_remote_is_used_and_uploaded(
    s3_url: str, s3_env: Server, tmp_path: Path
) -> None:
    """A restart on the same machine whose newest local checkpoint never reached the
    remote (upload_every=1000 and no final upload: a kill) resumes from it and uploads it."""
    local = tmp_path / "a"
    await _train(s3_url, local, 10)
    remote_before = _keys(s3_env.endpoint, s3_url)
    # a newer local checkpoint the remote never got: a plain local training into the same directory
    state = _model()
    sv = asv.Supervisor(local, state=state, save_model_secs=0, save_model_steps=5, handle_signals=False)
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: _step(state), max_steps=15)
    assert "model.ckpt-15.asv-commit" not in remote_before
    sv2, _ = await _train(s3_url, local, 16)
    assert sv2.status().global_step == 16
    assert "model.ckpt-16.asv-commit" in _keys(s3_env.endpoint, s3_url)


async def _start_fails(url: str, local: Path, match: str) -> None:
    """A training into ``url`` fails its start with a CheckpointError matching ``match``,
    before its first step."""
    sv = asv.Supervisor(url, local_dir=local, state=_model(), handle_signals=False)
    with pytest.raises(asv.CheckpointError, match=match):
        async with sv.managed_session():
            pytest.fail("the session started")
    assert not list(local.glob("model.ckpt-*"))


@pytest.mark.anyio
async def test_a_missing_bucket_fails_the_start(s3_env: Server, tmp_path: Path) -> None:
    """A bucket that does not exist: a CheckpointError naming the URL before the first step."""
    await _start_fails(
        "s3://no-such-bucket-here/run", tmp_path / "l", r"s3://no-such-bucket-here/run cannot be written"
    )


@pytest.mark.anyio
async def test_refused_credentials_fail_the_start(
    s3_env: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys the server does not know (moto checking credentials, as S3 does): a
    CheckpointError naming the URL and the refusal, before the first step."""
    with running(moto_server(check_credentials=True)) as strict:
        monkeypatch.setenv("AWS_ENDPOINT_URL", strict.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOTAKEY")
        await _start_fails("s3://bucket/run", tmp_path / "l", r"s3://bucket/run cannot be written .*PermissionError")


@pytest.mark.anyio
async def test_an_unreachable_endpoint_fails_the_start(
    s3_env: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listening at the endpoint: a CheckpointError before the first step."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    await _start_fails("s3://bucket/run", tmp_path / "l", "Could not connect")


@pytest.mark.anyio
async def test_a_second_training_is_refused_naming_the_owner(s3_url: str, s3_env: Server, tmp_path: Path) -> None:
    """While a training owns the remote logdir, a second one (another machine: another
    local directory) fails at start naming the owner; after the first ends, it starts."""
    state = _model()
    sv = asv.Supervisor(s3_url, local_dir=tmp_path / "a", state=state, save_model_secs=0, handle_signals=False)
    refused = False
    async with sv.managed_session() as sess:
        for _ in range(3):  # one at a time: a run_loop reaching max_steps would stop the session
            await sess.run(_step, state)
        second = asv.Supervisor(s3_url, local_dir=tmp_path / "b", state=_model(), handle_signals=False)
        with pytest.raises(asv.CheckpointError, match=r"in use by another training \(host .* pid \d+"):
            async with second.managed_session():
                pytest.fail("two owners")
        refused = True
    assert refused  # the refusal above was reached, inside the first session
    sv3, _ = await _train(s3_url, tmp_path / "b", 5)
    assert sv3.status().global_step == 5


def test_the_conditional_write_refuses_a_second_create(s3_url: str) -> None:
    """``create_only`` (s3fs: ``If-None-Match: *``) on moto: a second create at a path is
    refused and the first's bytes stay; memory:// (fsspec's exclusive create) too."""
    training.create_only_conforms(s3_url)
    training.create_only_conforms(f"memory://conformance-{uuid.uuid4().hex[:8]}")


@pytest.mark.anyio
async def test_an_expired_lease_is_taken_over(
    s3_url: str, s3_env: Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease not renewed for its time to live (its owner died on another machine) is
    taken over, and the log says whose it was."""
    dead = {"owner": "x", "host": "gone-host", "pid": 4242, "renewed": 1000.0, "ttl": 60, "released": False}
    _put(s3_env.endpoint, s3_url, f"{LEASE_PREFIX}00000003", json.dumps(dead).encode())
    with caplog.at_level("WARNING", logger="asupervisor"):
        sv, _ = await _train(s3_url, tmp_path / "a", 3)
    assert sv.status().global_step == 3
    assert "remote.lease_taken_over" in caplog.text and "gone-host" in caplog.text
    assert f"{LEASE_PREFIX}00000004" in _keys(s3_env.endpoint, s3_url)


@pytest.mark.parametrize(
    ("logdir", "match"),
    [
        ("nosuch://bucket/run", r"no storage implementation handles nosuch://"),
        ("s3://", r"names no bucket or path"),
        ("s3:/bucket/run", r"looks like a URL with one slash after 's3:': write 's3://bucket/run'"),
        ("gs:/b/x", r"write 'gs://b/x' \(or './gs:/b/x' for a local directory"),
    ],
)
def test_unknown_schemes_are_refused_at_construction(logdir: str, match: str, tmp_path: Path) -> None:
    """A URL nothing serves is a ValueError naming it, never a local folder."""
    with pytest.raises(ValueError, match=match):
        asv.Supervisor(logdir)
    assert not Path("nosuch:").exists()


def test_local_dir_is_for_url_logdirs_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="local_dir="):
        asv.Supervisor(tmp_path / "run", local_dir=tmp_path / "l")


def test_the_default_local_dir_is_under_the_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    sv = asv.Supervisor("memory://bucket/run")
    assert Path(sv.config.logdir).parent == tmp_path / "asupervisor"  # type: ignore[arg-type]
    assert sv.logdir == "memory://bucket/run"


@pytest.mark.anyio
async def test_watch_checkpoints_follows_a_url_logdir(s3_url: str, tmp_path: Path) -> None:
    """An evaluator watching a URL logdir gets each committed checkpoint once, downloaded
    and verified into its own directory, restorable by plain TensorFlow; a checkpoint it
    moved on from is deleted there, the last one it got stays."""
    # two runs saving only at their stop: two final uploads (5, 10)
    await _train(s3_url, tmp_path / "train", 5, save_policy=asv.OnStop())
    await _train(s3_url, tmp_path / "train", 10, save_policy=asv.OnStop())
    seen = []
    async with asv.watch_checkpoints(s3_url, timeout=0, local_dir=tmp_path / "eval") as checkpoints:
        async for path in checkpoints:
            seen.append(path)
    assert [Path(p).name for p in seen] == ["model.ckpt-5", "model.ckpt-10"]
    assert all(Path(p).parent == tmp_path / "eval" for p in seen)
    assert sorted(p.name.split(".data")[0] for p in (tmp_path / "eval").glob("model.ckpt-*")) == [
        "model.ckpt-10",
        "model.ckpt-10.index",
    ]
    w = tf.Variable(tf.zeros([64, 32]))
    tf.train.Checkpoint(w=w).restore(seen[-1]).expect_partial()
    reference = _model()
    for _ in range(10):
        _step(reference)
    np.testing.assert_array_equal(w.numpy(), reference["w"].numpy())


def test_inspect_reads_a_url_logdir(s3_url: str, s3_env: Server, tmp_path: Path) -> None:
    """``asupervisor inspect s3://...`` lists the committed checkpoints from their markers
    and the objects of an upload that never committed, as a user runs it."""
    anyio.run(_train, s3_url, tmp_path / "a", 5)
    _put(s3_env.endpoint, s3_url, "model.ckpt-7.index", b"cut short")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, "-m", "asupervisor", "inspect", s3_url, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(120),
    )
    report = json.loads(out.stdout)
    assert out.returncode == 0, out.stderr[-2000:]
    assert report["state_file"] == {"latest": "model.ckpt-5", "problem": None}
    assert [c["step"] for c in report["checkpoints"] if c["latest"]] == [5]
    assert report["leftovers"] == ["model.ckpt-7.index"] and report["owner"] is None


@pytest.mark.anyio
async def test_monitored_training_session_takes_a_url(
    s3_url: str, s3_env: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TF1's front door with ``checkpoint_dir="s3://..."``: its CheckpointSaverHook saves
    into the URL logdir's local tier, and the checkpoints reach the remote."""
    state = _model()
    async with asv.MonitoredTrainingSession(
        s3_url, state=state, save_checkpoint_steps=4, save_checkpoint_secs=None, handle_signals=False
    ) as sess:
        while not sess.should_stop() and sess.global_step < 8:
            await sess.run(lambda: _step(state))
    assert "model.ckpt-8.asv-commit" in _keys(s3_env.endpoint, s3_url)
    assert not Path("s3:").exists()


@pytest.mark.anyio
async def test_summaries_reach_the_remote(s3_url: str, s3_env: Server, tmp_path: Path) -> None:
    """The event files of the local tier are uploaded with the checkpoints."""
    state = _model()
    sv = asv.Supervisor(
        s3_url, local_dir=tmp_path / "a", state=state, save_model_secs=0, save_model_steps=100, handle_signals=False
    )
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: _step(state), max_steps=2)
        sv.summary_computed({"loss": 1.5}, global_step=2)
    events = [k for k in _keys(s3_env.endpoint, s3_url) if k.startswith("events.out.tfevents.")]
    assert len(events) == 1, events


@pytest.mark.anyio
@both_backends
async def test_an_owner_whose_lease_was_taken_over_stops(
    s3_url: str, s3_env: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another training took the logdir over (this one was presumed dead): at its next
    renewal this one stops with a CheckpointError instead of writing on."""
    monkeypatch.setenv("ASUPERVISOR_LEASE_SECS", "0.4")  # renewed every 0.1 s
    state = _model()
    sv = asv.Supervisor(s3_url, local_dir=tmp_path / "a", state=state, save_model_secs=0, handle_signals=False)
    other = {"owner": "y", "host": "elsewhere", "pid": 1, "renewed": 4e9, "ttl": 60, "released": False}
    with pytest.raises(asv.CheckpointError, match="was taken over by another training"):
        async with sv.managed_session():
            _put(s3_env.endpoint, s3_url, f"{LEASE_PREFIX}00000002", json.dumps(other).encode())
            await anyio.sleep_forever()


@pytest.mark.anyio
async def test_upload_every_uploads_every_nth_local_checkpoint_and_the_final_one(tmp_path: Path) -> None:
    """upload_every=2: the local tier commits checkpoints 1, 2, 3, 4 and the final one, 5;
    the remote gets the first, the third (the second commit since the last upload) and
    the final one."""
    import fsspec

    url = f"memory://cadence-{tmp_path.name}/run"
    state = _model()
    policy = asv.AnySavePolicy(asv.EverySteps(1000), asv.OnStop())  # no start-up checkpoint
    sv = asv.Supervisor(
        url,
        local_dir=tmp_path / "a",
        state=state,
        save_policy=policy,
        upload_every=2,
        handle_signals=False,
        max_to_keep=None,
    )

    async def uploaded(step: int) -> None:
        with anyio.fail_after(scaled(30)):
            while (remote := sv.status().remote) is None or remote.uploaded_step != step:
                await anyio.sleep(0.01)  # polling a condition, with a deadline

    async with sv.managed_session() as sess:
        for step in (1, 2, 3, 4):
            await sess.run(lambda: _step(state))
            await sv.save_now()
            if step in (1, 3):
                await uploaded(step)
        await sess.run(lambda: _step(state))
    fs = fsspec.filesystem("memory")
    markers = sorted(
        p.rsplit("/", 1)[1] for p in fs.ls(url[len("memory://") :], detail=False) if p.endswith(".asv-commit")
    )
    assert markers == ["model.ckpt-1.asv-commit", "model.ckpt-3.asv-commit", "model.ckpt-5.asv-commit"]
    assert sv.status().save_seconds["upload"].count == 3  # what metrics_text exposes per upload
    assert sv.status().save_seconds["commit"].count == 5


@pytest.mark.anyio
async def test_in_a_cluster_local_checkpoints_the_remote_never_got_are_set_aside(tmp_path: Path) -> None:
    """Multi-worker training: the other workers restore the remote's newest checkpoint, so a
    chief whose local tier holds a newer one (never uploaded) sets it aside (kept, renamed)
    and restores the remote's newest too."""
    from asupervisor._checkpoint.policy._policies import LatestN
    from asupervisor._checkpoint.store.plain._store import PlainStore
    from asupervisor._checkpoint.store.remote._tier import RemoteTier

    url = f"memory://agree-{tmp_path.name}/run"
    local = tmp_path / "chief"
    await _train(url, local, 5)
    state = _model()
    sv = asv.Supervisor(local, state=state, save_model_secs=0, save_model_steps=100, handle_signals=False)
    async with sv.managed_session() as sess:  # on the local tier alone: never uploaded
        await sess.run_loop(lambda: _step(state), max_steps=9)
    assert tf.train.latest_checkpoint(str(local)) == str(local / "model.ckpt-9")

    tier = RemoteTier(url, local, basename="model.ckpt", keep_policy=LatestN(5), owner=False)
    try:
        tier.open()
        assert tier.pull(PlainStore(local), agree=True) is None  # the remote's newest is here already
    finally:
        tier.close()
    assert tf.train.latest_checkpoint(str(local)) == str(local / "model.ckpt-5")
    kept = sorted(p.name for p in local.glob("model.ckpt-9.not-uploaded-*"))
    assert len(kept) == 2 and kept[0].endswith(".data-00000-of-00001") and kept[1].endswith(".index"), kept


def test_an_abandoned_upload_leaves_no_multipart_upload_behind(
    s3_url: str, s3_env: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large file (a multipart upload) abandoned mid-way at the stop's deadline: its
    multipart upload is aborted, not left stored (and billed) without a name."""
    from asupervisor._checkpoint.store.remote._io import RemoteFS

    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(120 << 20))  # over s3fs's single-PUT size: parts
    proxy = FaultProxy(s3_env.port)
    proxy.throttle(20 << 20)  # 120 MB at 20 MB/s: six seconds
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    io = RemoteFS(s3_url)

    def check() -> None:
        if proxy.sent > (8 << 20):  # a part or more on its way
            raise TimeoutError("abandoned")

    try:
        with pytest.raises(TimeoutError):
            io.put_file(str(big), io.path("big.bin"), check)
    finally:
        io.close()
        proxy.close()
    gc.collect()  # a connection left open would be collected here, failing this test (ResourceWarning)
    bucket = s3_url[len("s3://") :].split("/")[0]
    assert s3_call(s3_env.endpoint, "list_multipart_uploads", Bucket=bucket).get("Uploads", []) == []
    assert "big.bin" not in _keys(s3_env.endpoint, s3_url)


def test_opening_the_tier_again_keeps_its_own_lease(s3_url: str, tmp_path: Path) -> None:
    """A start-up retry (a transient error in the restore) opens the tier again: it keeps
    the lease it holds instead of finding itself "in use by another training"."""
    from asupervisor._checkpoint.policy._policies import LatestN
    from asupervisor._checkpoint.store.remote._tier import RemoteTier

    tier = RemoteTier(s3_url, tmp_path / "a", basename="model.ckpt", keep_policy=LatestN(2), owner=True)
    try:
        tier.open()
        held = tier.lease.number if tier.lease is not None else None
        tier.open()
        assert tier.lease is not None and tier.lease.number == held == 1
    finally:
        tier.close()


def test_a_local_path_with_a_colon_is_not_taken_for_a_url(tmp_path: Path) -> None:
    """Only a known storage scheme with one slash is refused: a local directory whose name
    has a colon (``run:/x`` under a relative path, ``./s3:/x``) is a local logdir."""
    for logdir in ("run:/x", "./s3:/bucket/run"):
        sv = asv.Supervisor(logdir, state=_model(), handle_signals=False)
        assert Path(str(sv.logdir)) == Path(logdir)  # a local logdir, as given


@pytest.mark.anyio
async def test_an_upload_carries_the_checksums_its_write_computed(
    s3_url: str, s3_env: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the fast store, the commit marker's size and CRC32C of each file come from the
    write (the native writer summed the bytes it wrote): the upload reads no file for a
    checksum, only to send it; each carried sum equals the file's."""
    from asupervisor._checkpoint.store.remote import _tier

    summed: list[str] = []
    read_for_sum = _tier.crc32c_of
    monkeypatch.setattr(_tier, "crc32c_of", lambda path: summed.append(Path(path).name) or read_for_sum(path))
    await _train(s3_url, tmp_path / "a", 10, checkpoint_store="fast", save_model_steps=100)
    assert summed == []
    marker = json.loads(s3_read(s3_env.endpoint, s3_url, "model.ckpt-10.asv-commit"))
    assert len(marker["files"]) == 2
    for name, entry in marker["files"].items():
        local = tmp_path / "a" / name
        assert (entry["size"], entry["crc32c"]) == (local.stat().st_size, read_for_sum(local)), name
