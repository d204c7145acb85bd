"""The remote tier when the network or another owner gets in the way, in-process against
moto's S3 server on 127.0.0.1: a lost lease fences every write, a silent endpoint fails
the start within its bound, the lease recognises itself and a holder that is gone, the
checkpoint being uploaded is kept from local retention."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import training
from _timing import scaled
from servers import Server, both_backends, s3_keys, s3_read, s3_write

import asupervisor as asv
from asupervisor._checkpoint.policy._policies import LatestN
from asupervisor._checkpoint.store.remote._lease import LEASE_PREFIX, RemoteLease
from asupervisor._checkpoint.store.remote._tier import OWNER_ID_FILE, RemoteTier

pytestmark = pytest.mark.usefixtures("no_new_threads")


@pytest.mark.anyio
@both_backends
async def test_a_lost_lease_fences_every_write_and_exits_77(
    s3_url: str, s3_env: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another training took the logdir over while this one trained (and before its next
    renewal): from its next write on this one writes nothing to the remote (no checkpoint objects, marker, state object, deletion,
    summaries, final upload), stops with LeaseLostError (stop reason ``lease_lost``,
    exit status 77), and keeps its checkpoints locally."""
    monkeypatch.setenv("ASUPERVISOR_LEASE_SECS", "600")  # no renewal in the test: the writes' fence finds it
    state = training.model()
    sv = asv.Supervisor(
        s3_url, local_dir=tmp_path / "a", state=state, save_model_steps=4, save_model_secs=0, handle_signals=False
    )
    other = {"owner": "y", "host": "elsewhere", "pid": 1, "renewed": 4e9, "ttl": 60, "released": False}
    before: dict[str, bytes] = {}
    gate = threading.Event()

    def step() -> None:
        if sv.global_step == 6:
            gate.wait(scaled(60))  # no new checkpoint until the takeover is in place
        training.step(state)

    async def take_over() -> None:
        with anyio.fail_after(scaled(30)):
            while not ((r := sv.status().remote) is not None and r.uploaded_step == 4 and not r.uploading):
                await anyio.sleep(0.02)  # polling a condition, with a deadline
        s3_write(s3_env.endpoint, s3_url, f"{LEASE_PREFIX}00000002", json.dumps(other).encode())
        before.update({k: s3_read(s3_env.endpoint, s3_url, k) for k in s3_keys(s3_env.endpoint, s3_url)})
        gate.set()

    with pytest.raises(asv.LeaseLostError, match="was taken over by another training"):
        async with sv.managed_session() as sess, anyio.create_task_group() as tg:
            tg.start_soon(take_over)
            await sess.run_loop(step, max_steps=10**9)  # saves on, until stopped
    status = sv.status()
    assert status.stop_reason == "lease_lost" and asv.exit_code(status) == 77
    assert status.remote is not None and status.remote.fenced and status.remote.error is not None
    after = {k: s3_read(s3_env.endpoint, s3_url, k) for k in s3_keys(s3_env.endpoint, s3_url)}
    assert after == before  # not one object written, rewritten or deleted after the takeover
    local = sorted(int(p.name.split("-")[1].split(".")[0]) for p in (tmp_path / "a").glob("model.ckpt-*.index"))
    assert local[-1] == status.global_step > 4  # its own work is kept locally, final checkpoint included


@pytest.mark.anyio
async def test_a_silent_endpoint_fails_the_start_within_its_bound(
    s3_env: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endpoint that takes connections and never answers (a wedged proxy, a blackhole
    behind a load balancer): the start fails within ASUPERVISOR_REMOTE_TIMEOUT_SECS with
    StorageUnreachableError naming the URL (stop reason ``storage_unreachable``, exit
    status 69), not after the libraries' minutes of retries."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # connections complete in the kernel's backlog; nothing ever answers
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setenv("ASUPERVISOR_REMOTE_TIMEOUT_SECS", "2")
        sv = asv.Supervisor("s3://bucket/run", local_dir=tmp_path / "l", state=training.model(), handle_signals=False)
        started = time.monotonic()
        with pytest.raises(asv.StorageUnreachableError, match=r"s3://bucket/run is unreachable.*within 2 s"):
            async with sv.managed_session():
                pytest.fail("the session started")
        took = time.monotonic() - started
    assert took < 2 + 30, took  # not the libraries' minutes of retries (150 s and more before)
    status = sv.status()
    assert status.stop_reason == "storage_unreachable" and asv.exit_code(status) == 69


def test_a_bad_timeout_setting_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ASUPERVISOR_REMOTE_TIMEOUT_SECS that is not a positive number: a ValueError naming it."""
    monkeypatch.setenv("ASUPERVISOR_REMOTE_TIMEOUT_SECS", "soon")
    with pytest.raises(ValueError, match="ASUPERVISOR_REMOTE_TIMEOUT_SECS must be a number of seconds, got 'soon'"):
        RemoteTier("memory://b/run", tmp_path, basename="model.ckpt", keep_policy=LatestN(2), owner=True)


@contextlib.contextmanager
def _tier(url: str, local: Path) -> Iterator[RemoteTier]:
    tier = RemoteTier(url, local, basename="model.ckpt", keep_policy=LatestN(2), owner=True)
    try:
        yield tier
    finally:
        tier.close()


def _lease_body(**fields: object) -> bytes:
    body = {"owner": "z" * 32, "host": socket.gethostname(), "pid": os.getpid(), "renewed": time.time(), "ttl": 60}
    return json.dumps({**body, "released": False, **fields}).encode()


def test_a_lease_whose_create_answer_was_lost_is_recognised(s3_url: str, s3_env: Server, tmp_path: Path) -> None:
    """The create-only write of lease 1 landed but its answer was lost (the object exists,
    with this owner's id): taking the lease again finds its own id and keeps lease 1,
    instead of refusing itself as "another training"."""
    with _tier(s3_url, tmp_path / "a") as tier:
        owner_id = tier._owner_id()
        s3_write(s3_env.endpoint, s3_url, f"{LEASE_PREFIX}00000001", _lease_body(owner=owner_id))
        tier.open()
        assert tier.lease is not None and tier.lease.number == 1 and tier.lease.owner_id == owner_id
    assert (tmp_path / "a" / OWNER_ID_FILE).read_text().strip() == owner_id


def test_a_restart_with_the_same_local_dir_takes_its_live_lease_at_once(
    s3_url: str, s3_env: Server, tmp_path: Path
) -> None:
    """A container restarted with its local directory (pid 1 again, in a new pid namespace:
    no pid probe can tell): the lease it left, live for another minute, carries the owner
    id kept in that directory, so the restart takes it at once; a training with another
    local directory is still refused."""
    with _tier(s3_url, tmp_path / "a") as first:
        first.open()
        assert first.lease is not None
        first.lease.number = None  # the process "dies": no release, the lease stays live
    with _tier(s3_url, tmp_path / "other") as stranger, pytest.raises(asv.CheckpointError, match="in use by another"):
        stranger.open()
    with _tier(s3_url, tmp_path / "a") as again:
        again.open()
        assert again.lease is not None and again.lease.number == 1


def _holder(lock: Path) -> subprocess.Popen[str]:
    """A process holding ``lock``'s flock until its stdin closes (a live holder elsewhere)."""
    code = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_holder_on_this_host_is_taken_over_once_its_lock_is_free(s3_url: str, s3_env: Server, tmp_path: Path) -> None:
    """A live lease of this host, from another pid namespace (its pid means nothing here),
    records the local owner lock its holder held: while a process holds that lock the
    lease is refused; once the lock is free (its holder gone, whatever its namespace) it
    is taken over at once."""
    lock = tmp_path / "elsewhere" / "asupervisor.lock"
    lock.parent.mkdir()
    body = _lease_body(pidns="4026531836-not-ours", lock=str(lock))
    s3_write(s3_env.endpoint, s3_url, f"{LEASE_PREFIX}00000001", body)
    holder = _holder(lock)
    try:
        with _tier(s3_url, tmp_path / "b") as tier, pytest.raises(asv.CheckpointError, match="in use by another"):
            tier.open()
    finally:
        holder.communicate("")
    with _tier(s3_url, tmp_path / "b") as tier:
        tier.open()
        assert tier.lease is not None and tier.lease.number == 2


def test_the_fence_renews_an_expired_lease_before_writing(s3_url: str, s3_env: Server, tmp_path: Path) -> None:
    """An owner whose renewals failed for longer than the ttl, while nobody took the lease:
    its next write renews the lease first (the fence), then goes ahead."""
    now = [1000.0]
    with _tier(s3_url, tmp_path / "a") as tier:
        tier.wall_clock = lambda: now[0]
        tier.open()
        lease = tier.lease
        assert isinstance(lease, RemoteLease)
        lease.wall_clock = tier.wall_clock
        lease._renewed_at = now[0]
        now[0] += lease.ttl + 1
        lease.check()  # renews first
        assert json.loads(s3_read(s3_env.endpoint, s3_url, f"{LEASE_PREFIX}00000001"))["renewed"] == now[0]


def test_a_pinned_checkpoint_outlives_retention_until_unpinned(tmp_path: Path) -> None:
    """max_to_keep=1: a checkpoint pinned (an upload reads it) stays on disk and named while
    newer ones are saved; the first save after it is unpinned retires it."""
    import tensorflow as tf

    from asupervisor._checkpoint._manager import Checkpointer

    w = tf.Variable(1.0)
    ckpt = Checkpointer({"w": w}, tmp_path, basename="model.ckpt", keep_policy=LatestN(1))

    def save(step: int) -> str:
        snap = ckpt.snapshot(step)
        assert snap is not None
        return ckpt.write(snap).path

    first = save(1)
    with ckpt.pinned(first) as there:
        assert there
        save(2)
        save(3)
        assert Path(first + ".index").exists()
        assert [p.name for p in sorted(tmp_path.glob("*.index"))] == ["model.ckpt-1.index", "model.ckpt-3.index"]
    save(4)
    assert [p.name for p in sorted(tmp_path.glob("*.index"))] == ["model.ckpt-4.index"]


def test_the_flock_probe_tells_a_free_lock_from_a_held_one(tmp_path: Path) -> None:
    """The probe behind the takeover: a lock file nobody holds is free; one a live process
    holds is not; a missing file is not (nothing can be told)."""
    from asupervisor._checkpoint.store.remote._lease import _lock_free

    lock = tmp_path / "asupervisor.lock"
    assert not _lock_free(str(lock))
    lock.write_text("{}")
    assert _lock_free(str(lock))
    holder = _holder(lock)
    try:
        assert not _lock_free(str(lock))
    finally:
        holder.communicate("")
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again once its holder ended
    finally:
        os.close(fd)


class _AnswerLost:
    """A file system whose first create-only write lands on the server and then loses its
    answer (the connection drops after the request went through): the caller sees an error."""

    def __init__(self, fs: object) -> None:
        self._fs = fs
        self.lost = 0

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite") -> None:
        self._fs.pipe_file(path, value, mode=mode)  # type: ignore[attr-defined]
        if mode == "create" and not self.lost:
            self.lost += 1
            raise ConnectionResetError("the connection dropped before the answer came")

    def __getattr__(self, name: str) -> object:
        return getattr(self._fs, name)


def test_a_create_whose_answer_never_came_is_taken_as_ours(s3_url: str, s3_env: Server, tmp_path: Path) -> None:
    """The create-only write of the lease reached the store, but its answer was lost (an
    error, not "exists"): the lease is read back and, being ours, kept; not reported as a
    failure to write the logdir, and no second lease is made."""
    from asupervisor._checkpoint.store.remote._io import RemoteFS

    io = RemoteFS(s3_url)
    try:
        flaky = _AnswerLost(io.fs)
        lease = RemoteLease(flaky, io.root, s3_url)
        lease.acquire()
        assert flaky.lost == 1 and lease.number == 1
        names = [k for k in s3_keys(s3_env.endpoint, s3_url) if k.startswith(LEASE_PREFIX)]
        assert names == [f"{LEASE_PREFIX}00000001"], names
        assert json.loads(s3_read(s3_env.endpoint, s3_url, names[0]))["owner"] == lease.owner_id
    finally:
        io.close()
