"""The remote tier in the field, with real child processes, a real S3 server (moto's) and
a real TCP proxy between them that cuts or slows the network: SIGKILL during an upload,
SIGTERM on a slow network, an outage during training."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from _timing import ExitTimer, scaled, stretch
from servers import TRAIN_SCRIPT, Child, FaultProxy, Server, both_backends, markers, until

import asupervisor as asv

sys.path.insert(0, str(TRAIN_SCRIPT.parent))
import remote_train

sys.path.remove(str(TRAIN_SCRIPT.parent))


def _reference(mb: float, steps: int) -> str:
    state = remote_train.state_of(mb)
    for _ in range(steps):
        remote_train.step(state)
    return remote_train.digest(state)


@pytest.mark.timeout(180)
def test_a_file_system_option_comes_from_fsspec_config(
    s3_env: Server, s3_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, children: list[Child]
) -> None:
    """An option the library's own environment does not give (here the S3 endpoint, as
    for MinIO or R2) reaches every file system the training opens through fsspec's
    configuration: ``FSSPEC_S3_ENDPOINT_URL`` in the training process's environment."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", s3_env.endpoint)
    child = Child(s3_url, tmp_path / "local", 6, 3, 0.1)
    children.append(child)
    code, out, err = child.finish()
    assert code == 0, err[-3000:]
    assert out.splitlines()[-1].startswith("done 6 ")
    assert markers(s3_env.endpoint, s3_url)[-1] == 6  # uploaded: the endpoint came from the config


def test_sigkill_during_an_upload_then_a_fresh_machine_resumes_exactly(
    s3_url: str, s3_env: Server, proxy: FaultProxy, tmp_path: Path, children: list[Child]
) -> None:
    """SIGKILL while a checkpoint is being uploaded (a slow network): the remote's latest
    is the previous committed checkpoint; a fresh machine resumes from it, removes what
    the cut upload left, and ends bitwise where an uninterrupted run does."""
    mb = 4.0
    first = Child(s3_url, tmp_path / "a", 10_000, 20, mb)
    children.append(first)
    until("a first committed upload", lambda: bool(markers(s3_env.endpoint, s3_url)), first)
    committed = markers(s3_env.endpoint, s3_url)
    proxy.throttle(256 << 10)  # 4 MB at 256 KB/s: an upload now takes ~16 s
    sent = proxy.sent
    until("an upload in flight", lambda: proxy.sent - sent > (1 << 20), first)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    proxy.throttle(None)
    after = markers(s3_env.endpoint, s3_url)
    assert after[-1] >= committed[-1] and len(after) <= len(committed) + 1, (committed, after)
    resumed_from = after[-1]

    target = resumed_from + 7
    second = Child(s3_url, tmp_path / "b", target, 1000, mb)
    children.append(second)
    code, out, err = second.finish()
    assert code == 0, err[-3000:]
    started = int(out.split("started ")[1].split()[0])
    assert started == resumed_from, out
    done = out.split("done ")[1].split()
    assert int(done[0]) == target and done[1] == _reference(mb, target), out
    assert markers(s3_env.endpoint, s3_url)[-1] == target


@pytest.mark.timeout(180)
def test_sigterm_on_a_slow_network_leaves_the_previous_remote_latest(
    s3_url: str, s3_env: Server, proxy: FaultProxy, tmp_path: Path, children: list[Child]
) -> None:
    """SIGTERM while the network is too slow to upload the final checkpoint within
    stop_grace_secs: the process exits 143 in time, the final checkpoint is committed
    locally, the log says what was left where, and the remote keeps its previous latest;
    the next start on the same machine uploads it."""
    mb = 8.0
    child = Child(s3_url, tmp_path / "a", 10_000, 10_000, mb, grace=3)
    children.append(child)
    until("the start-up upload", lambda: bool(markers(s3_env.endpoint, s3_url)), child)
    until("its start", lambda: child.started() is not None, child)
    proxy.throttle(64 << 10)  # 8 MB at 64 KB/s: two minutes
    sent_before = proxy.sent
    exited = ExitTimer(child.proc.pid)
    child.proc.send_signal(signal.SIGTERM)
    code, _, err = child.finish()
    took = exited.secs()
    assert code == 143, err[-3000:]
    assert took < 3 + 20, took  # the grace, plus the wind-down and the interpreter's exit
    assert "remote.left_behind" in err, err[-3000:]
    assert proxy.sent > sent_before  # it did try
    assert markers(s3_env.endpoint, s3_url) == [0]
    local = sorted(p.name for p in (tmp_path / "a").glob("model.ckpt-*.index"))
    assert len(local) == 2, local  # the start-up checkpoint and the final one, committed locally

    proxy.throttle(None)
    again = Child(s3_url, tmp_path / "a", 0, 10_000, mb)  # max_steps reached: it only starts and stops
    children.append(again)
    code, _out, err = again.finish()
    assert code == 0, err[-3000:]
    final_step = int(local[-1].split("-")[1].split(".")[0])
    assert markers(s3_env.endpoint, s3_url)[-1] == final_step


@pytest.mark.anyio
@both_backends
@pytest.mark.timeout(120)
async def test_an_outage_during_training_is_retried_and_training_goes_on(
    s3_url: str, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The network goes down: steps go on, ``status().remote`` shows the error (the upload
    stalled: no progress within ASUPERVISOR_REMOTE_TIMEOUT_SECS, while the libraries
    still retry) and the lag; once it is back, the newest checkpoint is uploaded and the
    error clears."""
    monkeypatch.setenv("ASUPERVISOR_REMOTE_TIMEOUT_SECS", f"{3 * stretch():.1f}")  # a busy moto: the start's checks
    state = remote_train.state_of(0.1)
    sv = asv.Supervisor(s3_url, local_dir=tmp_path / "a", state=state, save_model_secs=0, handle_signals=False)

    async def status_until(what: str, cond: Callable[[asv.Status], bool]) -> asv.Status:
        with anyio.fail_after(scaled(60)):
            while not cond(status := sv.status()):
                await anyio.sleep(0.02)  # polling a condition, with a deadline
        return status

    reached = False
    async with sv.managed_session() as sess:
        # one step at a time (a run_loop reaching max_steps would stop the session)
        for _ in range(5):
            await sess.run(remote_train.step, state)
        await sv.save_now()
        await status_until("an upload", lambda s: s.remote is not None and s.remote.uploaded_step == 5)
        proxy.cut()
        for _ in range(5):
            await sess.run(remote_train.step, state)
        await sv.save_now()
        down = await status_until("the error", lambda s: s.remote is not None and s.remote.error is not None)
        assert down.remote is not None and down.remote.lag_steps == 5 and down.remote.uploaded_step == 5
        for _ in range(2):  # training goes on
            await sess.run(remote_train.step, state)
        assert sv.global_step == 12
        proxy.heal()
        up = await status_until(
            "the upload after the outage and no error",
            lambda s: s.remote is not None and s.remote.uploaded_step == 10 and s.remote.error is None,
        )
        assert up.remote is not None and up.remote.lag_steps == 0 and not up.remote.stalled
        reached = True
    assert reached  # the body ran to its end: it was not cut short by a stop
