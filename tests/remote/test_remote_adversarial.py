"""The remote tier against a hostile network and hostile timing, with a real S3 server
(moto's), real child processes and a real TCP proxy between them: a partitioned owner
whose lease another training took over (fenced: it writes nothing more and exits 77), uploads
slower than local saves, SIGKILL in the middle of a multipart upload, a store that drops
every packet (at the start: exit 69 within its deadline; during training: reported
stalled, training goes on), and a lease that knows its own owner (a create whose answer
was lost, a container restarted as pid 1 of a new pid namespace)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from _timing import scaled, stretch
from servers import (
    TRAIN_SCRIPT,
    Child,
    FaultProxy,
    Server,
    markers,
    orphans,
    s3_keys,
    s3_multipart_uploads,
    s3_objects,
    s3_read,
    s3_write,
    step_of,
    until,
)

import asupervisor as asv

sys.path.insert(0, str(TRAIN_SCRIPT.parent))
import remote_train

sys.path.remove(str(TRAIN_SCRIPT.parent))

#: a training in a new pid namespace, as pid 1 (a container); it dies with unshare
NEW_PID_NAMESPACE = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]


def _reference(mb: float, steps: int) -> str:
    """The digest of an uninterrupted run of ``steps`` steps."""
    state = remote_train.state_of(mb)
    for _ in range(steps):
        remote_train.step(state)
    return str(remote_train.digest(state))


async def _train(url: str, local: Path, mb: float, more: int, *, retry_refused: float = 0) -> tuple[int, int, str, int]:
    """``remote_train``'s training in this process, into ``url`` from ``local``: ``more``
    steps past where it resumes, saving every 20. ``retry_refused``: for this many seconds
    a start refused because another training holds the logdir is tried again. Returns the
    step it started at, the step it ended at, the state's digest, and how often it was
    refused."""
    refusals = 0
    deadline = time.monotonic() + scaled(retry_refused)
    while True:
        state = remote_train.state_of(mb)
        sv = asv.Supervisor(
            url,
            local_dir=local,
            state=state,
            save_model_steps=20,
            save_model_secs=0,
            save_summaries_secs=0,
            handle_signals=False,
        )
        try:
            async with sv.managed_session() as sess:
                started = sv.global_step
                await sess.run_loop(lambda: remote_train.step(state), max_steps=started + more)
        except asv.CheckpointError as exc:
            if "in use by another training" not in str(exc) or time.monotonic() > deadline:
                raise
            refusals += 1
            await anyio.sleep(0.25)  # the next try, until the deadline
            continue
        return started, sv.global_step, remote_train.digest(state), refusals


async def _steps(sess: asv.Session, state: dict[str, Any], n: int) -> None:
    """``n`` steps of ``remote_train`` in a session that goes on after them (``run_loop``'s
    ``max_steps`` would stop it)."""
    for _ in range(n):
        await sess.run(remote_train.step, state)


async def _poll(what: str, cond: Callable[[], bool], secs: float) -> None:
    """Poll ``cond`` on the event loop (the session's tasks run meanwhile) until it holds."""
    deadline = time.monotonic() + scaled(secs)
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {secs} s"
        await anyio.sleep(0.02)  # polling a condition, with a deadline


async def _remote_until(
    sv: asv.Supervisor, what: str, cond: Callable[[asv.RemoteStatus], bool], secs: float
) -> asv.RemoteStatus:
    """``sv.status().remote`` once ``cond`` holds for it."""
    found: list[asv.RemoteStatus] = []

    def check() -> bool:
        remote = sv.status().remote
        if remote is not None and cond(remote):
            found.append(remote)
            return True
        return False

    await _poll(what, check, secs)
    return found[0]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _logged() -> Iterator[list[logging.LogRecord]]:
    """asupervisor's log records (info and above) while the block runs, whatever handlers
    and propagation another test configured."""
    logger = logging.getLogger("asupervisor")
    handler = _Records()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _local_steps(local: Path) -> list[int]:
    """The steps of the checkpoints in a local working directory."""
    return sorted(step_of(p.name) for p in local.glob("model.ckpt-*.index"))


# -- fencing: a partition longer than the lease -------------------------------------------


@pytest.mark.timeout(240)
def test_a_partitioned_owner_taken_over_writes_nothing_more_and_exits_77(
    s3_url: str, s3_env: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, children: list[Child]
) -> None:
    """Training A is cut off from the store, in the middle of an upload, for longer than
    its lease (8 s); training B on another machine is refused while A's lease lives,
    then takes the logdir over, trains on from A's newest upload and stops. When A's
    network comes back, A finds itself fenced: it writes nothing more (not even the
    write the cut interrupted: not one object of the logdir is added, rewritten or
    deleted, so B's checkpoints, markers and state object stay exactly as B left them),
    logs ``remote.fenced`` once, at error level, keeps its local checkpoints and exits
    77. A third machine resumes from B's newest checkpoint and ends bitwise where an
    uninterrupted run does."""
    monkeypatch.setenv("ASUPERVISOR_LEASE_SECS", "8")  # renewed every 2 s
    mb = 0.5
    endpoint = s3_env.endpoint
    link = FaultProxy(s3_env.port)  # A's network; B and C reach the store directly
    try:
        a = Child(s3_url, tmp_path / "a", 10**9, 20, mb, env={"AWS_ENDPOINT_URL": link.endpoint})
        children.append(a)
        until("an upload of a trained step by A", lambda: any(s > 0 for s in markers(endpoint, s3_url)), a, secs=90)
        link.throttle(256 << 10)  # an upload takes 2 s: the cut comes in the middle of one (of a write)
        sent = link.sent
        until("an upload in flight", lambda: link.sent - sent > (64 << 10), a)
        link.cut()
        link.throttle(None)
        a_uploaded = markers(endpoint, s3_url)[-1]

        b_started, b_final, _, refusals = anyio.run(lambda: _train(s3_url, tmp_path / "b", mb, 40, retry_refused=60))
        assert refusals >= 1  # refused while A's lease lived
        assert b_started >= a_uploaded and b_started % 20 == 0, (a_uploaded, b_started)  # A's newest upload
        left_by_b = s3_objects(endpoint, s3_url)
        b_markers = markers(endpoint, s3_url)
        b_state = s3_read(endpoint, s3_url, "checkpoint")
        assert b_markers[-1] == b_final and f'model_checkpoint_path: "model.ckpt-{b_final}"' in b_state.decode()
        assert orphans(endpoint, s3_url) == []  # what A's cut upload left, B removed

        link.heal()
        try:
            until("A's exit after the network came back", lambda: a.proc.poll() is not None, secs=90)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {a.err()[-6000:]}") from None
    finally:
        link.close()

    err = a.err()
    assert a.proc.returncode == 77, f"{a.proc.returncode}: {err[-3000:]}"
    assert "done" not in a.out(), a.out()  # it stopped on the error, not at its end
    now = s3_objects(endpoint, s3_url)
    changed = sorted(k for k in set(now) | set(left_by_b) if now.get(k) != left_by_b.get(k))
    assert not changed, f"objects A added, rewrote or deleted after it was taken over: {changed}"
    assert markers(endpoint, s3_url) == b_markers
    assert s3_read(endpoint, s3_url, "checkpoint") == b_state
    fenced = re.findall(r"^.*\[(\w+)\s*\] remote\.fenced\b", err, re.MULTILINE)
    assert fenced == ["error"], f"remote.fenced logged at {fenced}: {err[-3000:]}"
    kept = _local_steps(tmp_path / "a")
    assert kept and kept[-1] > a_uploaded, kept  # A's local checkpoints, newer than its last upload, stay

    c_started, c_final, digest, refusals = anyio.run(lambda: _train(s3_url, tmp_path / "c", mb, 5))
    assert (c_started, c_final, refusals) == (b_final, b_final + 5, 0)
    assert digest == _reference(mb, c_final)


# -- uploads slower than local saves -------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_uploads_slower_than_local_saves_commit_and_leave_no_orphans(
    s3_url: str, s3_env: Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    """A slow uplink (1 MB/s: a 4 MB checkpoint takes 4 s to upload) while local saves
    come many times faster: seven local saves while the first upload is in flight, so
    local retention (max_to_keep=5) would retire its checkpoint under it. Uploads still
    commit (two within 45 s), ``status().remote`` says how far behind the remote is
    (``lag_steps``; ``last_commit_age_secs``, ``None`` before the first commit), the
    metrics expose the commit's age; the stop, with an upload in flight, logs no error
    (no ``thread.overrun``), uploads the final checkpoint, and leaves every checkpoint
    object on the bucket with its commit marker and no multipart upload in progress."""
    mb = 4.0
    proxy.throttle(1 << 20)
    state = remote_train.state_of(mb)
    sv = asv.Supervisor(
        s3_url,
        local_dir=tmp_path / "a",
        state=state,
        save_model_steps=10,
        save_model_secs=0,
        save_summaries_secs=0,
        handle_signals=False,
    )
    ended = False
    with _logged() as records:
        async with sv.managed_session() as sess:
            first = await _remote_until(sv, "first upload in flight", lambda r: r.uploading, 30)
            assert first.uploaded_step is None and first.last_commit_age_secs is None, first
            for _ in range(7):
                await _steps(sess, state, 1)
                await sv.save_now()
            during = sv.status().remote
            assert during is not None and during.uploading and during.uploaded_step is None, during  # still going
            deadline = time.monotonic() + scaled(45)
            while len(committed := markers(s3_env.endpoint, s3_url)) < 2:
                assert time.monotonic() < deadline, f"{committed} committed within 45 s"
                await _steps(sess, state, 10)
            remote = await _remote_until(sv, "second commit seen", lambda r: r.uploaded_step == committed[-1], 10)
            assert remote.lag_steps > 0 and remote.last_commit_age_secs is not None, remote
            assert remote.last_commit_age_secs >= 0, remote
            assert "asupervisor_remote_last_commit_age_seconds{" in sv.metrics_text()
            await _steps(sess, state, 10)
            await _remote_until(sv, "an upload in flight at the stop", lambda r: r.uploading, 10)
            proxy.throttle(None)  # the stop need not wait seconds for it
            ended = True  # the body ran to its end (a stop would have cancelled it silently)
    assert ended
    errors = [f"{r.levelname} {r.getMessage()}" for r in records if r.levelno >= logging.ERROR]
    assert not errors, errors
    assert markers(s3_env.endpoint, s3_url)[-1] == sv.global_step
    assert orphans(s3_env.endpoint, s3_url) == []
    assert s3_multipart_uploads(s3_env.endpoint, s3_url) == []


# -- SIGKILL in the middle of a multipart upload -------------------------------------------


@pytest.mark.timeout(180)
def test_a_multipart_upload_cut_by_sigkill_is_aborted_by_the_next_start(
    s3_url: str, s3_env: Server, proxy: FaultProxy, tmp_path: Path, children: list[Child]
) -> None:
    """A training SIGKILLed while it uploads a checkpoint file large enough for a
    multipart upload (110 MiB: over s3fs's single PUT, twice its 50 MiB part) leaves that
    upload in progress on the bucket (stored, and billed, without a name); the next
    training that starts in the logdir aborts it, and leaves no orphan object."""
    mb = 110.0
    proxy.throttle(16 << 20)  # the upload takes ~7 s: it is killed in its first second
    a = Child(s3_url, tmp_path / "a", 10**6, 10**6, mb)  # its start-up checkpoint alone
    children.append(a)
    sent = proxy.sent
    until(
        "a multipart upload in flight",
        lambda: proxy.sent - sent > (8 << 20) and bool(s3_multipart_uploads(s3_env.endpoint, s3_url)),
        a,
        secs=120,
    )
    a.kill()
    left = s3_multipart_uploads(s3_env.endpoint, s3_url)
    assert len(left) == 1 and left[0].startswith("model.ckpt-0."), left
    assert markers(s3_env.endpoint, s3_url) == []
    proxy.throttle(None)

    async def start_and_stop() -> None:
        state = remote_train.state_of(0.1)
        sv = asv.Supervisor(s3_url, local_dir=tmp_path / "b", state=state, save_model_secs=0, handle_signals=False)
        async with sv.managed_session():
            await _poll("abort of the multipart upload", lambda: not s3_multipart_uploads(s3_env.endpoint, s3_url), 10)
            aborted.append(True)

    aborted: list[bool] = []

    anyio.run(start_and_stop)
    assert aborted  # at the start, before the stop
    assert s3_multipart_uploads(s3_env.endpoint, s3_url) == []
    assert orphans(s3_env.endpoint, s3_url) == []


# -- a store that drops every packet -------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_a_blackholed_store_fails_the_start_within_its_deadline(
    s3_url: str, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store accepts connections and never answers (a firewall dropping packets):
    with ``ASUPERVISOR_REMOTE_TIMEOUT_SECS=6`` the start fails after about 6 s (not
    botocore's minutes of retries) with a ``StorageUnreachableError`` saying the store is
    unreachable and naming the URL; the stop reason maps to exit status 69; nothing was
    trained or saved."""
    monkeypatch.setenv("ASUPERVISOR_REMOTE_TIMEOUT_SECS", "6")
    proxy.blackhole()
    local = tmp_path / "a"
    sv = asv.Supervisor(s3_url, local_dir=local, state=remote_train.state_of(0.1), handle_signals=False)
    began = time.monotonic()
    with pytest.raises(asv.StorageUnreachableError) as raised:
        async with sv.managed_session():
            pytest.fail("the session started with its store unreachable")
    took = time.monotonic() - began
    assert took < 6 + 20, took
    message = str(raised.value)
    assert "unreachable" in message and s3_url in message, message
    assert isinstance(raised.value, asv.CheckpointError)
    assert sv.status().stop_reason == "storage_unreachable"
    assert asv.exit_code(sv.status()) == 69  # EX_UNAVAILABLE
    assert not list(local.glob("model.ckpt-*"))


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_blackhole_during_training_is_reported_stalled_and_heals(
    s3_url: str, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store stops answering mid-training (``ASUPERVISOR_REMOTE_TIMEOUT_SECS=4``):
    within three deadlines ``status().remote`` reports the remote stalled, with an error,
    and behind; steps go on meanwhile; once the network is back, a newer checkpoint is
    uploaded and the error and the stall clear."""
    monkeypatch.setenv("ASUPERVISOR_REMOTE_TIMEOUT_SECS", f"{4 * stretch():.1f}")  # a busy moto: the start's checks
    state = remote_train.state_of(0.1)
    sv = asv.Supervisor(s3_url, local_dir=tmp_path / "a", state=state, save_model_secs=0, handle_signals=False)
    ended = False
    async with sv.managed_session() as sess:
        await _steps(sess, state, 5)
        await sv.save_now()
        await _remote_until(sv, "first upload", lambda r: r.uploaded_step == 5, 30)
        proxy.blackhole()
        await _steps(sess, state, 5)
        await sv.save_now()
        down = await _remote_until(sv, "stall reported", lambda r: r.stalled and r.error is not None, 4 * 3 + 8)
        assert down.uploaded_step == 5 and down.lag_steps == 5, down
        with anyio.fail_after(scaled(20)):
            await _steps(sess, state, 5)  # training goes on
        assert sv.global_step == 15
        proxy.heal()
        await sv.save_now()
        up = await _remote_until(
            sv, "upload after the heal", lambda r: r.uploaded_step == 15 and r.error is None and not r.stalled, 60
        )
        assert up.lag_steps == 0, up
        ended = True  # the body ran to its end (a stop would have cancelled it silently)
    assert ended


# -- a lease that knows its own owner ------------------------------------------------------


def test_a_lease_whose_create_answer_was_lost_is_taken_as_ours(s3_url: str, s3_env: Server) -> None:
    """Our create-only write of lease n+1 reached the store but its answer was lost (the
    object exists, with our owner id, and a renewal as fresh as a live owner's): taking the
    lease again adopts it (number n+1), instead of refusing as "in use by another
    training", which the same object still means for any other owner."""
    from asupervisor._checkpoint.store.remote._io import RemoteFS
    from asupervisor._checkpoint.store.remote._lease import LEASE_PREFIX, RemoteLease

    io = RemoteFS(s3_url)
    try:
        ours = RemoteLease(io.fs, io.root, s3_url, time.time, owner_id=uuid.uuid4().hex)
        previous = {"owner": "someone", "host": "elsewhere", "pid": 7, "renewed": 1000.0, "ttl": 60, "released": True}
        landed = {
            "owner": ours.owner_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "renewed": time.time(),
            "ttl": ours.ttl,
            "released": False,
        }
        s3_write(s3_env.endpoint, s3_url, f"{LEASE_PREFIX}00000001", json.dumps(previous).encode())
        s3_write(s3_env.endpoint, s3_url, f"{LEASE_PREFIX}00000002", json.dumps(landed).encode())

        stranger = RemoteLease(io.fs, io.root, s3_url, time.time, owner_id=uuid.uuid4().hex)
        with pytest.raises(asv.CheckpointError, match="in use by another training"):
            stranger.acquire()
        ours.acquire()
        assert ours.number == 2
        leases = [k for k in s3_keys(s3_env.endpoint, s3_url) if k.startswith(LEASE_PREFIX)]
        assert leases[-1] == f"{LEASE_PREFIX}00000002", leases
        ours.renew()
        ours.release()
        body = json.loads(s3_read(s3_env.endpoint, s3_url, f"{LEASE_PREFIX}00000002"))
        assert body["owner"] == ours.owner_id and body["released"] is True, body
    finally:
        io.close()


def _pid_namespaces_missing() -> str | None:
    """Why a training cannot run as pid 1 of a new pid namespace here (``None``: it can)."""
    if shutil.which("unshare") is None:
        return "needs util-linux's unshare to run a training in a new pid namespace (not on PATH)"
    probe = subprocess.run([*NEW_PID_NAMESPACE, "true"], capture_output=True, text=True, timeout=scaled(30))
    if probe.returncode != 0:
        return f"needs CAP_SYS_ADMIN to create a pid namespace (unshare: {probe.stderr.strip()[:200]})"
    return None


_NO_PID_NAMESPACES = _pid_namespaces_missing()


@pytest.mark.timeout(180)
@pytest.mark.skipif(_NO_PID_NAMESPACES is not None, reason=str(_NO_PID_NAMESPACES))
def test_a_restarted_container_is_not_refused_by_its_own_dead_lease(
    s3_url: str, s3_env: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, children: list[Child]
) -> None:
    """A training running as pid 1 of its own pid namespace (a container) is SIGKILLed
    with its lease live for another hour; the container restarted on the same machine,
    pid 1 again, with the same local directory, starts at once (its own lease, not
    another training's) and resumes from at least the uploaded step. Killed in turn, it is
    followed by a training with another local directory on the same host, which also
    starts at once (the dead owner's local lock is free) and resumes from the remote's
    newest checkpoint, bitwise."""
    # every killed owner's lease outlives the test: a start it refused would fail at once
    # (a refusal does not wait), so starting at all is the proof, however loaded the machine
    monkeypatch.setenv("ASUPERVISOR_LEASE_SECS", "3600")
    mb = 0.1
    endpoint = s3_env.endpoint
    first = Child(s3_url, tmp_path / "a", 10**9, 20, mb, wrap=NEW_PID_NAMESPACE)
    children.append(first)
    until("an upload of the first container", lambda: bool(markers(endpoint, s3_url)), first, secs=90)
    first.kill()
    uploaded = markers(endpoint, s3_url)[-1]

    second = Child(s3_url, tmp_path / "a", 10**9, 20, mb, wrap=NEW_PID_NAMESPACE)
    children.append(second)
    until("the restarted container's start", lambda: second.started() is not None, second, secs=120)
    resumed = second.started()
    assert resumed is not None and resumed >= uploaded, (uploaded, resumed)
    second.kill()

    newest = markers(endpoint, s3_url)[-1]
    started, final, digest, _ = anyio.run(lambda: _train(s3_url, tmp_path / "b", mb, 5))
    assert started >= newest and started % 20 == 0 and final == started + 5, (newest, started, final)
    assert digest == _reference(mb, final)
