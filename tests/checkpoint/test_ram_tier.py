"""The RAM tier (``CheckpointOptions(ram_tier=...)``): checkpoints in memory that outlives
the process, below the disk. A SIGKILLed training resumes from the tier's newest intact
checkpoint when it is newer than the disk's (checked as every restore is), copies it to
the disk, and otherwise the disk serves: a newer disk, a damaged or emptied tier (a
reboot), a logdir made again under the same name. The tier holds two checkpoints at most,
and ``status().tiers`` and ``asupervisor inspect`` show each tier's newest step. The promise tests (the
checkpointer's and the SIGKILL's) run on both stores; the session's, on the default one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import tensorflow as tf
from _timing import scaled
from tmpfs import mounted, needs_mount

import asupervisor as asv
from asupervisor._checkpoint._manager import Checkpointer
from asupervisor._checkpoint.snapshot import _snapshot
from asupervisor._checkpoint.store import FastPath, names, open_memory_tier, open_store, state_file
from asupervisor.testing import capture_logs

pytestmark = pytest.mark.usefixtures("no_new_threads")
both_stores = pytest.mark.usefixtures("checkpoint_store")

SCRIPT = Path(__file__).parent / "scripts" / "ram_tier_train.py"


def _run(logdir: Path, ram: Path, max_steps: int, *kill_at: int) -> list[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(logdir), str(ram), str(max_steps), *map(str, kill_at)],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(240),
    )
    if kill_at:
        assert out.returncode == -9, (out.returncode, out.stderr[-3000:])
    else:
        assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


@both_stores
@pytest.mark.timeout(300)
def test_a_sigkilled_training_resumes_from_the_ram_tier_and_the_disk_gets_it(tmp_path: Path) -> None:
    """The first process saves to disk only at its start (step 0) and to RAM every 0.05 s;
    it is SIGKILLed once the tier holds step >= 30. The second resumes at the tier's step,
    bitwise (``w`` is the step it was saved at), copies that checkpoint to the disk, and
    trains on to 60 (or 10 past it, when the kill came late); the tier then holds two checkpoints and no leftover."""
    logdir, ram = tmp_path / "run", tmp_path / "ram"
    killed = _run(logdir, ram, 1000, 30)
    assert killed[0] == "started 0 0.0 disk", killed
    saved, at = map(int, killed[1].split()[1:])
    assert 30 <= saved <= at, killed
    assert state_file.read_state(logdir).latest == "model.ckpt-0"  # the disk has the start only

    end = max(60, saved + 10)  # (a busy parent's kill can come late: the child ran on)
    resumed = _run(logdir, ram, end)
    assert resumed[0] == f"started {saved} {float(saved)} ram", resumed
    assert resumed[1].startswith(f"done {end} "), resumed
    state = state_file.read_state(logdir)
    assert state.latest == f"model.ckpt-{end}" and f"model.ckpt-{saved}" in state.paths, state
    (tier,) = (ram / f"asupervisor-{os.getuid()}").iterdir()
    held = names.scan_checkpoints(tier, "model.ckpt")
    assert 1 <= len(held) <= 2, held
    assert sorted(p.name for p in tier.iterdir() if names.TMP_MARKER in p.name) == []


def _state() -> tuple[tf.train.Checkpoint, tf.Variable]:
    w = tf.Variable(tf.zeros([64, 32]))
    return tf.train.Checkpoint(w=w), w


def _checkpointer(logdir: Path, ram: Path) -> tuple[Checkpointer, tf.Variable]:
    ckpt, w = _state()
    metrics = lambda: {"loss": float(w[0, 0])}  # noqa: E731 - each checkpoint records its step as its loss
    checkpointer = Checkpointer(ckpt, logdir, memory=open_memory_tier(logdir, ram), metrics=metrics)
    checkpointer.prepare()
    return checkpointer, w


def _save(checkpointer: Checkpointer, w: tf.Variable, step: int, tier: str) -> None:
    w.assign(tf.fill(w.shape, float(step)))
    snap = checkpointer.snapshot(step, tier)
    assert snap is not None
    checkpointer.write(snap)


def _restored(logdir: Path, ram: Path) -> tuple[Checkpointer, tf.Variable, list[dict[str, Any]]]:
    checkpointer, w = _checkpointer(logdir, ram)
    with capture_logs() as logs:
        checkpointer.restore()
    return checkpointer, w, logs


@both_stores
def test_the_newest_of_either_tier_is_restored(tmp_path: Path) -> None:
    """RAM at 30 over disk at 20: the RAM checkpoint is restored and then promoted (the
    disk commits it, named in the state file, with the metrics it recorded); disk at 40
    over RAM at 30: the disk's."""
    logdir, ram = tmp_path / "run", tmp_path / "ram"
    first, w = _checkpointer(logdir, ram)
    _save(first, w, 20, "disk")
    _save(first, w, 30, "ram")
    assert first.tiers == {"disk": 20, "ram": 30}

    second, w, logs = _restored(logdir, ram)
    assert float(w[0, 0]) == 30.0 and second.promotion is not None and second.tiers == {"disk": 20, "ram": 30}
    assert [e["tier"] for e in logs if e["event"] == "checkpoint.restored_from_tier"] == ["ram"]
    info = second.promote()
    assert info is not None and info.path == str(logdir / "model.ckpt-30")
    assert state_file.read_state(logdir).latest == "model.ckpt-30" and second.tiers["disk"] == 30
    assert second.last is not None and second.last.path == str(logdir / "model.ckpt-30")
    assert dict(second._metrics_of("model.ckpt-30")) == {"loss": 30.0}  # what KeepBest ranks it by

    _save(second, w, 40, "disk")
    third, w, logs = _restored(logdir, ram)
    assert float(w[0, 0]) == 40.0 and third.promotion is None
    assert not [e for e in logs if e["event"] == "checkpoint.restored_from_tier"]


@both_stores
def test_a_damaged_ram_checkpoint_falls_back_to_an_older_one_then_to_the_disk(tmp_path: Path) -> None:
    """The tier's newest checkpoint fails its checksum: the one before it (still newer
    than the disk's) is restored and the damaged one set aside in the tier; with every
    RAM checkpoint damaged, the disk's is restored and the tier named as unusable."""
    logdir, ram = tmp_path / "run", tmp_path / "ram"
    first, w = _checkpointer(logdir, ram)
    _save(first, w, 10, "disk")
    _save(first, w, 20, "ram")
    _save(first, w, 25, "ram")
    tier = first.memory.dir  # type: ignore[union-attr]
    data = next(tier.glob("model.ckpt-25.data-*"))
    data.write_bytes(b"\x00" * data.stat().st_size)

    _, w, logs = _restored(logdir, ram)
    assert float(w[0, 0]) == 20.0
    assert any(e["event"] == "checkpoint.corrupt" and "model.ckpt-25" in e["path"] for e in logs), logs
    assert not (tier / "model.ckpt-25.index").exists()  # set aside, as on disk

    for data in tier.glob("model.ckpt-20.data-*"):
        data.write_bytes(b"\x01" * data.stat().st_size)
    _, w, logs = _restored(logdir, ram)
    assert float(w[0, 0]) == 10.0
    assert [e["event"] for e in logs if e["event"] == "checkpoint.ram_tier_unusable"] == [
        "checkpoint.ram_tier_unusable"
    ]


@both_stores
def test_an_emptied_tier_or_a_logdir_made_again_leaves_the_disk_to_serve(tmp_path: Path) -> None:
    """A reboot empties the tier: the disk's checkpoint is restored. A logdir removed and
    made again under the same name does not get the old tier's checkpoints: the tier is
    reset (logged) and nothing is restored."""
    logdir, ram = tmp_path / "run", tmp_path / "ram"
    first, w = _checkpointer(logdir, ram)
    _save(first, w, 10, "disk")
    _save(first, w, 20, "ram")
    first.memory.clear()  # type: ignore[union-attr]
    _, w, _ = _restored(logdir, ram)
    assert float(w[0, 0]) == 10.0

    again, w = _checkpointer(logdir, ram)
    _save(again, w, 20, "ram")
    for path in logdir.iterdir():
        path.unlink()
    logdir.rmdir()
    with capture_logs() as logs:
        fresh, w, _ = _restored(logdir, ram)
    assert [e["event"] for e in logs] == ["checkpoint.ram_tier_reset"] and float(w[0, 0]) == 0.0
    assert fresh.last is None and names.scan_checkpoints(fresh.memory.dir, None) == []  # type: ignore[union-attr]


def test_the_tier_of_a_deleted_logdir_is_swept_at_the_next_start(tmp_path: Path) -> None:
    """A logdir deleted leaves its RAM tier behind (memory until a reboot); the next
    training with a RAM tier under the same root removes it, and leaves the tier of a
    logdir that still exists alone."""
    ram = tmp_path / "ram"
    gone, kept = tmp_path / "gone", tmp_path / "kept"
    for logdir in (gone, kept):
        checkpointer, w = _checkpointer(logdir, ram)
        _save(checkpointer, w, 3, "ram")
    gone_tier, kept_tier = open_memory_tier(gone, ram).dir, open_memory_tier(kept, ram).dir
    for path in gone.iterdir():
        path.unlink()
    gone.rmdir()
    with capture_logs() as logs:
        _checkpointer(tmp_path / "third", ram)
    assert [(e["event"], e["dir"]) for e in logs if "swept" in e["event"]] == [
        ("checkpoint.ram_tier_swept", str(gone_tier))
    ]
    assert not gone_tier.exists() and names.scan_checkpoints(kept_tier, None) == ["model.ckpt-3"]


@both_stores
def test_the_ram_tier_holds_two_checkpoints_and_never_repeats_the_disk(tmp_path: Path) -> None:
    """Five RAM saves leave the newest two in the tier; a RAM snapshot of a step the disk
    has already is not taken (it would be no newer)."""
    logdir, ram = tmp_path / "run", tmp_path / "ram"
    checkpointer, w = _checkpointer(logdir, ram)
    for step in range(1, 6):
        _save(checkpointer, w, step, "ram")
    assert names.scan_checkpoints(checkpointer.memory.dir, "model.ckpt") == ["model.ckpt-5", "model.ckpt-4"]  # type: ignore[union-attr]
    _save(checkpointer, w, 6, "disk")
    assert checkpointer.snapshot(6, "ram") is None


def test_the_ram_tier_is_an_option_with_clear_errors(tmp_path: Path) -> None:
    """``ram_tier`` and ``ram_save_secs`` live in ``CheckpointOptions`` alone: a wrong type
    or value names it, and the flat keyword is refused, pointing at the option."""
    with pytest.raises(TypeError, match=r"CheckpointOptions.ram_tier must be True, False or a directory, got 3"):
        asv.CheckpointOptions(ram_tier=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"ram_save_secs must be a number of seconds or 'auto', got 'often'"):
        asv.CheckpointOptions(ram_tier=True, ram_save_secs="often")
    with pytest.raises(ValueError, match=r"ram_save_secs must be > 0 .*got 0"):
        asv.CheckpointOptions(ram_tier=True, ram_save_secs=0)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'ram_tier'; did you mean checkpoint=asv\."):
        asv.Supervisor(tmp_path, state={"v": tf.Variable(1.0)}, ram_tier=True)  # type: ignore[call-arg]


@pytest.mark.timeout(240)
def test_status_and_inspect_show_each_tier(tmp_path: Path, anyio_backend: str) -> None:
    """While a session with the RAM tier trains, ``status().tiers`` shows the disk's start
    checkpoint and, once one is saved, the tier's newest step; ``asupervisor inspect``
    names the tier and its newest step."""
    logdir, ram = tmp_path / "run", tmp_path / "ram"
    w = tf.Variable(0.0)
    sv = asv.Supervisor(
        logdir,
        state={"w": w},
        checkpoint=asv.CheckpointOptions(save_secs=3600, ram_tier=ram, ram_save_secs=0.05),
        save_summaries_secs=0,
        handle_signals=False,
    )

    async def main() -> None:
        with anyio.fail_after(scaled(120)):
            async with sv.managed_session() as sess:
                while "ram" not in sv.status().tiers:
                    await sess.run(lambda: w.assign_add(1.0))
                    await anyio.sleep(0.01)  # the step's work, as a training's
                sess.request_stop()

    anyio.run(main, backend=anyio_backend)
    tiers = sv.status().tiers
    assert tiers["disk"] == sv.global_step and 1 <= tiers["ram"] <= sv.global_step, tiers
    if anyio_backend == "trio":
        return  # inspect reads the files: the same whatever the backend that wrote them
    out = subprocess.run(
        [sys.executable, "-m", "asupervisor", "inspect", str(logdir)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert out.returncode == 0, out.stderr
    assert f"ram tier: {open_memory_tier(logdir, ram).dir}  newest step" in out.stdout, out.stdout


def test_a_store_object_given_to_the_supervisor_takes_every_byte(tmp_path: Path, anyio_backend: str) -> None:
    """``Supervisor(store=...)`` takes a store object, as httpx's ``Client(transport=)``:
    here the chosen store of the logdir wrapped to count its writes and commits; a
    second training restores what it committed."""
    logdir = tmp_path / "run"

    class Counting:
        def __init__(self) -> None:
            self.inner = open_store(logdir)
            self.calls: list[str] = []

        def __getattr__(self, name: str) -> Any:
            attr = getattr(self.inner, name)
            if name not in ("write", "commit", "restore_newest"):
                return attr

            def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls.append(name)
                return attr(*args, **kwargs)

            return counted

    store = Counting()
    w = tf.Variable(0.0)
    sv = asv.Supervisor(logdir, state={"w": w}, store=store, save_summaries_secs=0, handle_signals=False)

    async def main(supervisor: asv.Supervisor) -> None:
        async with supervisor.managed_session() as sess:
            await sess.run_loop(lambda: w.assign_add(1.0), max_steps=3)

    anyio.run(main, sv, backend=anyio_backend)
    assert store.calls.count("write") == store.calls.count("commit") == 2 and "restore_newest" in store.calls
    with pytest.raises(TypeError, match=r"store must be a store name or a checkpoint store object.*lacks prepare"):
        asv.Supervisor(logdir, state={"w": w}, store=object())
    w.assign(0.0)
    again = asv.Supervisor(logdir, state={"w": w}, save_summaries_secs=0, handle_signals=False)
    anyio.run(main, again, backend=anyio_backend)
    assert again.status().last_checkpoint is not None and float(w) == 3.0


def _ram_save(checkpointer: Checkpointer, w: tf.Variable, step: int) -> int:
    """A RAM save as the saver makes it (snapshot, write, the next one prepared); the
    inode of the data file it committed."""
    w.assign(tf.fill(w.shape, float(step)))
    snap = checkpointer.snapshot(step, "ram")
    assert snap is not None
    checkpointer.write(snap)
    checkpointer.prepare_next(snap)
    del snap
    tier = checkpointer.memory.dir  # type: ignore[union-attr]
    (data,) = [p for p in tier.iterdir() if p.name.startswith(f"model.ckpt-{step}.data-")]
    return data.stat().st_ino


def test_ram_saves_stage_into_reused_data_files(tmp_path: Path) -> None:
    """On the fast store a RAM save's staging copy lands in a data file of the tier itself
    (a slot): from the third save on, the checkpoints' data files are the same three
    inodes (two kept, one being written), restored bitwise. A variable added to the
    checkpoint does not fit the slots' layout: that save is written whole all the same,
    and the slots are laid out again for the next. At the end the spare slot is removed."""
    logdir, ram = tmp_path / "run", tmp_path / "ram"
    checkpointer, w = _checkpointer(logdir, ram)
    _save(checkpointer, w, 0, "disk")
    inodes = [_ram_save(checkpointer, w, step) for step in range(1, 9)]
    assert len(set(inodes[2:])) == 3, inodes

    extra = tf.Variable(tf.fill([300], 7.0))
    checkpointer.checkpoint.extra = extra
    after = [_ram_save(checkpointer, w, step) for step in range(9, 15)]
    assert len(set(after[2:])) == 3, after
    checkpointer.close()
    tier = checkpointer.memory.dir  # type: ignore[union-attr]
    assert sorted(p.name for p in tier.iterdir() if names.TMP_MARKER in p.name) == []
    assert names.scan_checkpoints(tier, "model.ckpt") == ["model.ckpt-14", "model.ckpt-13"]

    ckpt, w2 = _state()
    ckpt.extra = tf.Variable(tf.zeros([300]))
    again = Checkpointer(ckpt, logdir, memory=open_memory_tier(logdir, ram))
    again.prepare()
    again.restore()
    assert float(w2[0, 0]) == 14.0 and float(ckpt.extra[299]) == 7.0


def test_with_the_staging_files_switched_off_ram_saves_are_written_the_usual_way(tmp_path: Path) -> None:
    """``FastPath(staging_files=False)``: the RAM tier's store lends no staging files, its
    saves are written the usual way (no spare file in the tier), and the newest is
    restored as with them."""
    logdir, ram = tmp_path / "run", tmp_path / "ram"
    off = FastPath(staging_files=False)
    ckpt, w = _state()
    checkpointer = Checkpointer(ckpt, logdir, fast_path=off, memory=open_memory_tier(logdir, ram, off))
    checkpointer.prepare()
    _save(checkpointer, w, 0, "disk")
    for step in range(1, 7):
        _ram_save(checkpointer, w, step)
    assert checkpointer.ram is not None and checkpointer.ram.store.staging() is None
    assert not [p for p in checkpointer.memory.dir.iterdir() if "slot" in p.name]  # type: ignore[union-attr]
    checkpointer.close()
    ckpt2, w2 = _state()
    again = Checkpointer(ckpt2, logdir, memory=open_memory_tier(logdir, ram))
    again.prepare()
    again.restore()
    assert float(w2[0, 0]) == 6.0


def test_a_ram_snapshot_holds_its_staging_buffers_until_it_is_gone(tmp_path: Path) -> None:
    """A RAM snapshot staged into the checkpointer's own buffers (the tier's slots are not
    laid out before its first save) keeps them from the next snapshot until it is gone:
    given back early, a disk save could overwrite them while the RAM write reads them."""
    logdir, ram = tmp_path / "run", tmp_path / "ram"
    checkpointer, w = _checkpointer(logdir, ram)
    _save(checkpointer, w, 0, "disk")
    snap = checkpointer.snapshot(1, "disk")
    assert snap is not None
    checkpointer.write(snap)
    checkpointer.prepare_next(snap)  # the checkpointer's staging buffers made
    del snap
    staging = checkpointer._staging
    assert staging is not None and staging.ready()
    ram_snap = checkpointer.snapshot(2, "ram")
    assert ram_snap is not None and ram_snap.tier == "ram"
    assert any(isinstance(t, _snapshot.Staged) for t in ram_snap.tensors)
    assert not staging.ready()
    checkpointer.write(ram_snap)
    del ram_snap
    assert staging.ready()


@pytest.mark.timeout(300)
def test_the_copy_of_a_restored_ram_checkpoint_to_disk_waits_for_the_first_step(
    tmp_path: Path, anyio_backend: str
) -> None:
    """A training SIGKILLed with a RAM checkpoint newer than the disk's resumes from it;
    its copy to the disk starts only once the first step is done (its CPU would delay
    that step, the trace of a model's step), and is on the disk when the session ends."""
    logdir, ram = tmp_path / "run", tmp_path / "ram"
    killed = _run(logdir, ram, 1000, 30)
    saved = int(killed[1].split()[1])
    w = tf.Variable(tf.zeros([256, 64]), name="w")
    sv = asv.Supervisor(
        logdir,
        state={"w": w},
        checkpoint=asv.CheckpointOptions(save_secs=3600, ram_tier=ram, ram_save_secs=3600),
        save_summaries_secs=0,
        handle_signals=False,
    )
    during_first_step: list[str | None] = []

    def step() -> None:
        if not during_first_step:
            during_first_step.append(state_file.read_state(logdir).latest)
        w.assign_add(tf.ones_like(w))

    async def main() -> None:
        async with sv.managed_session() as sess:
            assert sv.global_step == saved
            await sess.run_loop(step, max_steps=saved + 3)

    anyio.run(main, backend=anyio_backend)
    assert during_first_step == ["model.ckpt-0"]
    assert f"model.ckpt-{saved}" in state_file.read_state(logdir).paths


@needs_mount
def test_a_ram_file_system_without_room_for_the_slots_leaves_the_usual_writes(tmp_path: Path) -> None:
    """The slots' pages are reserved when they are made: on a 1 MiB tmpfs, three slots of
    a 300 KiB state plus the first checkpoint do not fit, which is a logged warning (a
    page touched through a mapping on a full file system would be a SIGBUS); the RAM
    saves go on the usual way, and the newest is restored."""
    logdir = tmp_path / "run"
    with mounted(tmp_path / "ram", "1m") as ram:
        ckpt, w = tf.train.Checkpoint(), tf.Variable(tf.zeros([75, 1024]))
        ckpt.w = w
        checkpointer = Checkpointer(ckpt, logdir, memory=open_memory_tier(logdir, ram))
        checkpointer.prepare()
        with capture_logs() as logs:
            for step in range(1, 7):
                _ram_save(checkpointer, w, step)
        checkpointer.close()
        assert [e["event"] for e in logs if e["event"] == "checkpoint.ram_slots_off"] == ["checkpoint.ram_slots_off"]
        assert not [e for e in logs if e["event"] == "checkpoint.ram_failed"]
        ckpt2, w2 = tf.train.Checkpoint(), tf.Variable(tf.zeros([75, 1024]))
        ckpt2.w = w2
        again = Checkpointer(ckpt2, logdir, memory=open_memory_tier(logdir, ram))
        again.prepare()
        again.restore()
        assert float(w2[0, 0]) == 6.0
