"""Checkpoints: files on disk, commit protocol, retention, restore-or-init, fallback, recovery."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from _timing import scaled
from eventfiles import tick

import asupervisor as asv
from asupervisor._checkpoint.policy._policies import keep_policy_for
from asupervisor._checkpoint.snapshot import _graph
from asupervisor._checkpoint.store import _commit, _names, _retention, _state_file, _writeback
from asupervisor._checkpoint.store.fast import _bundle
from asupervisor._checkpoint.store.plain import _write
from asupervisor._core._abc import SessionAttribute
from asupervisor.testing import ManualClock, capture_logs

pytestmark = pytest.mark.usefixtures("no_new_threads", "checkpoint_store")  # a promise test: both stores

#: early writeback uses Linux's sync_file_range; elsewhere it is a documented no-op
LINUX_WRITEBACK = pytest.mark.skipif(_writeback._sync_file_range is None, reason="sync_file_range is Linux only")


def make_state() -> dict[str, Any]:
    return {"w": tf.Variable(tf.zeros([4, 3]), name="w"), "b": tf.Variable(tf.zeros([3]), name="b")}


def supervisor(logdir: Path, state: dict[str, Any], **kwargs: Any) -> asv.Supervisor:
    kwargs.setdefault("save_model_secs", 600)
    kwargs.setdefault("clock", ManualClock())
    return asv.Supervisor(logdir, state=state, save_summaries_secs=0, handle_signals=False, **kwargs)


def bump(state: dict[str, Any]) -> Any:
    def step() -> None:
        state["w"].assign_add(tf.ones([4, 3]))
        state["b"].assign_add(tf.ones([3]))

    return step


def plain_restore(logdir: Path) -> tuple[float, int]:
    """What plain TensorFlow reads from tf.train.latest_checkpoint(logdir)."""
    w = tf.Variable(tf.zeros([4, 3]))
    gs = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(w=w, global_step=gs).restore(tf.train.latest_checkpoint(str(logdir))).expect_partial()
    return float(w[0, 0]), int(gs)


def listing(logdir: Path) -> list[str]:
    return sorted(os.listdir(logdir))


def write_big_state(logdir: Path, count: int, floats: int) -> list[Any]:
    """``count`` random float32 variables of ``floats`` each, saved as step 1 directly
    through a Checkpointer (snapshot, write, commit); returns the variables."""
    from asupervisor._checkpoint._manager import Checkpointer

    big = [tf.Variable(tf.random.uniform([floats], seed=i), name=f"big{i}") for i in range(count)]
    checkpointer = Checkpointer(tf.train.Checkpoint(big=big), logdir)
    checkpointer.prepare()
    snap = checkpointer.snapshot(1)
    assert snap is not None
    checkpointer.write(snap)
    return big


def assert_plain_tf_restores(logdir: Path, big: list[Any]) -> None:
    """Plain TensorFlow restores ``tf.train.latest_checkpoint(logdir)`` to exactly ``big``."""
    fresh = [tf.Variable(tf.zeros(v.shape)) for v in big]
    tf.train.Checkpoint(big=fresh).restore(tf.train.latest_checkpoint(str(logdir))).assert_existing_objects_matched()
    assert all((a.numpy() == b.numpy()).all() for a, b in zip(big, fresh))


@pytest.mark.anyio
async def test_final_checkpoint_is_plain_tf_with_relative_state_file(tmp_path: Path) -> None:
    """A clean stop saves a final checkpoint that plain TF restores; the state file is relative."""
    state = make_state()
    sv = supervisor(tmp_path / "run", state)
    async with sv.managed_session() as sess:
        await sess.run_loop(bump(state), max_steps=7)
    assert plain_restore(tmp_path / "run") == (7.0, 7)
    text = (tmp_path / "run" / "checkpoint").read_text()
    assert 'model_checkpoint_path: "model.ckpt-7"' in text
    assert str(tmp_path) not in text
    assert sv.status().last_checkpoint is not None and sv.status().last_checkpoint.step == 7
    # a moved logdir still restores
    os.rename(tmp_path / "run", tmp_path / "moved")
    assert plain_restore(tmp_path / "moved") == (7.0, 7)


@pytest.mark.anyio
async def test_startup_checkpoint_only_after_init_and_resume_restores(tmp_path: Path) -> None:
    """An initialised state is saved at start-up; a restored one is not, and resumes its step."""
    state = make_state()
    inits: list[int] = []
    sv = supervisor(tmp_path, state, init_fn=lambda: inits.append(1))
    async with sv.managed_session() as sess:
        await sv.save_now()  # queued behind the start-up save: both are committed now
        assert (tmp_path / "model.ckpt-0.index").exists()
        await sess.run_loop(bump(state), max_steps=3)
    assert inits == [1]
    state2 = make_state()
    sv2 = supervisor(tmp_path, state2, init_fn=lambda: inits.append(2))
    with capture_logs() as logs:
        async with sv2.managed_session() as sess:
            assert sess.global_step == 3
            assert float(state2["w"][0, 0]) == 3.0
            await sess.run_loop(bump(state2), max_steps=5)
    assert inits == [1]
    saved = [e["step"] for e in logs if e["event"] == "checkpoint.saved"]
    assert saved == [5]  # no start-up save of the restored step 3


@pytest.mark.anyio
async def test_timer_saves_at_step_boundary_and_never_twice_the_same_step(tmp_path: Path) -> None:
    """Each save_model_secs tick saves at a step boundary; a tick with no new step saves nothing."""
    state = make_state()
    clock = ManualClock()
    sv = supervisor(tmp_path, state, clock=clock, save_model_secs=60)
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            await sv.save_now()
            await sess.run(bump(state))
            await sess.run(bump(state))
            await clock.wait_for_sleepers(1)
            clock.advance(60)
            await sv.save_now()  # queued behind the timer's save
            await clock.wait_for_sleepers(1)
            clock.advance(60)  # same step: nothing new to save
            await clock.wait_for_sleepers(1)
            await sess.run(bump(state))
            sess.request_stop()
    saved = [e["step"] for e in logs if e["event"] == "checkpoint.saved"]
    assert saved == [0, 2, 3]
    assert plain_restore(tmp_path) == (3.0, 3)


@pytest.mark.anyio
async def test_save_model_steps_saves_at_multiples(tmp_path: Path) -> None:
    """save_model_steps=N snapshots exactly when the global step reaches a multiple of N."""
    state = make_state()
    sv = supervisor(tmp_path, state, save_model_steps=4, max_to_keep=10)
    async with sv.managed_session() as sess:
        for _ in range(9):
            await sess.run(bump(state))
            if sess.global_step in (3, 7):
                await sv.save_now()  # also: nothing is in flight when the trigger fires
    seen = [_names.step_of(p) for p in _state_file.read_state(tmp_path).paths]  # type: ignore[union-attr]
    assert seen == [0, 3, 4, 7, 8, 9]
    assert plain_restore(tmp_path) == (9.0, 9)  # the final save


@pytest.mark.anyio
async def test_no_final_checkpoint_after_a_step_error(tmp_path: Path) -> None:
    """A step that raises stops the session without saving its possibly half-updated state."""
    state = make_state()
    sv = supervisor(tmp_path, state)

    def bad() -> None:
        state["w"].assign_add(tf.ones([4, 3]))
        raise ZeroDivisionError("boom")

    with pytest.raises(ZeroDivisionError):
        async with sv.managed_session() as sess:
            await sess.run(bump(state))
            await sess.run(bad)
    assert _state_file.read_state(tmp_path).latest == "model.ckpt-0"  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_retention_leftovers_and_foreign_files(tmp_path: Path) -> None:
    """max_to_keep applies after commit; leftovers go at start-up; others' files stay."""
    (tmp_path / "model.ckpt-3.asv-tmp-dead.index").write_bytes(b"half")
    (tmp_path / "model.ckpt-3.asv-tmp-dead.data-00000-of-00001").write_bytes(b"half")
    for name in ("other.ckpt-1.index", "model.ckpt-999.index", "notes.txt"):
        (tmp_path / name).write_text("not ours")
    state = make_state()
    sv = supervisor(tmp_path, state, max_to_keep=2)
    async with sv.managed_session() as sess:
        for _ in range(3):
            await sess.run(bump(state))
            await sv.save_now()
    names = listing(tmp_path)
    assert not [n for n in names if ".asv-tmp-" in n]
    assert {"other.ckpt-1.index", "model.ckpt-999.index", "notes.txt"} <= set(names)
    assert _state_file.read_state(tmp_path).paths == ["model.ckpt-2", "model.ckpt-3"]  # type: ignore[union-attr]
    assert "model.ckpt-0.index" not in names and "model.ckpt-1.index" not in names


def test_retention_policy_keeps_one_per_n_hours() -> None:
    """keep_checkpoint_every_n_hours keeps old checkpoints spaced by the period for good."""
    hour = 3600.0
    state = _state_file.CheckpointState(
        "c5", ["c1", "c2", "c3", "c4", "c5"], [0.5 * hour, 1.2 * hour, 1.5 * hour, 2.4 * hour, 3.0 * hour], 0.0
    )
    kept, delete = _retention.select_retention(state, policy=keep_policy_for(2, 1.0))
    assert kept.paths == ["c4", "c5"]
    assert delete == ["c1", "c3"]  # c2 (1.2 h after the last preserved, 0) is kept for good
    assert kept.last_preserved == 1.2 * hour
    kept, delete = _retention.select_retention(state, policy=keep_policy_for(1, None))
    assert kept.paths == ["c5"] and delete == ["c1", "c2", "c3", "c4"]


async def _two_checkpoints(logdir: Path) -> None:
    state = make_state()
    sv = supervisor(logdir, state)
    async with sv.managed_session() as sess:
        await sess.run_loop(bump(state), max_steps=2)
    state = make_state()
    sv = supervisor(logdir, state)
    async with sv.managed_session() as sess:
        await sess.run_loop(bump(state), max_steps=4)


@pytest.mark.anyio
async def test_commits_and_deletions_cut_short_are_finished_at_start(tmp_path: Path) -> None:
    """What a kill leaves of a commit (files renamed into place, the state file not yet
    naming them) or of a retention deletion (the state file no longer naming them, files
    half deleted) is removed at the next start; a named checkpoint with a stale marker stays."""
    import shutil

    await _two_checkpoints(tmp_path)  # model.ckpt-0, -2, -4 named
    state = _state_file.read_state(tmp_path)
    assert state is not None and state.paths == ["model.ckpt-0", "model.ckpt-2", "model.ckpt-4"]
    _state_file.write_state(
        tmp_path, _state_file.CheckpointState("model.ckpt-4", state.paths[1:], state.timestamps[1:])
    )
    (tmp_path / "model.ckpt-0.index").unlink()  # retention of step 0, cut short
    (tmp_path / f"model.ckpt-0{_names.PENDING}").touch()
    for f in _names.checkpoint_files(tmp_path / "model.ckpt-4"):  # a commit of step 6, cut short
        shutil.copy(f, tmp_path / f.name.replace("model.ckpt-4", "model.ckpt-6"))
    (tmp_path / f"model.ckpt-6{_names.PENDING}").touch()
    (tmp_path / f"model.ckpt-4{_names.PENDING}").touch()  # committed; the marker outlived it
    state_ = make_state()
    async with supervisor(tmp_path, state_).managed_session() as sess:
        assert sess.global_step == 4
    names = listing(tmp_path)
    assert not [n for n in names if n.startswith(("model.ckpt-0.", "model.ckpt-6.")) or ".asv-tmp-" in n]
    assert (
        _names.missing_files(tmp_path / "model.ckpt-4") is None
        and _names.missing_files(tmp_path / "model.ckpt-2") is None
    )


@pytest.mark.anyio
@pytest.mark.parametrize("damage", ["flip", "truncate", "delete_data", "flip_index"])
async def test_corrupt_latest_falls_back_to_previous(tmp_path: Path, damage: str) -> None:
    """A damaged latest checkpoint is logged as checkpoint.corrupt and the previous one is used."""
    await _two_checkpoints(tmp_path)
    data = tmp_path / "model.ckpt-4.data-00000-of-00001"
    index = tmp_path / "model.ckpt-4.index"
    if damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[-20] ^= 0xFF  # inside the variable values
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        os.truncate(data, data.stat().st_size // 2)
    elif damage == "delete_data":
        data.unlink()
    else:
        raw = bytearray(index.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        index.write_bytes(bytes(raw))
    state = make_state()
    sv = supervisor(tmp_path, state, save_model_secs=0)
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            assert sess.global_step == 2
            assert float(state["w"][0, 0]) == 2.0
            assert float(state["b"][0]) == 2.0
            # the state file no longer names the damaged checkpoint; its files are kept aside
            assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-2")
    corrupt = [e for e in logs if e["event"] == "checkpoint.corrupt"]
    assert len(corrupt) == 1 and corrupt[0]["path"].endswith("model.ckpt-4") and corrupt[0]["reason"]
    assert not _names.checkpoint_files(tmp_path / "model.ckpt-4")
    aside = [n for n in listing(tmp_path) if n.startswith("model.ckpt-4.corrupt-")]
    assert aside and [e["files"] for e in logs if e["event"] == "checkpoint.set_aside"] == [aside]
    assert _state_file.read_state(tmp_path) == _state_file.CheckpointState(
        "model.ckpt-2",
        ["model.ckpt-0", "model.ckpt-2"],
        _state_file.read_state(tmp_path).timestamps,  # type: ignore[union-attr]
        _state_file.read_state(tmp_path).last_preserved,  # type: ignore[union-attr]
    )


@pytest.mark.anyio
async def test_saves_after_a_fallback_become_the_latest_and_good_ones_are_kept(tmp_path: Path) -> None:
    """After falling back past a corrupt latest, new saves are the latest (for plain TF too)
    and retention deletes neither them nor the checkpoint restored from."""
    await _two_checkpoints(tmp_path)  # steps 0, 2, 4
    os.truncate(tmp_path / "model.ckpt-4.data-00000-of-00001", 10)
    state = make_state()
    sv = supervisor(tmp_path, state, save_model_secs=0, save_model_steps=10, max_to_keep=1)
    async with sv.managed_session() as sess:
        assert sess.global_step == 2
        await sess.run_loop(bump(state), max_steps=3)
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-3")
    assert plain_restore(tmp_path) == (3.0, 3)
    state = make_state()
    async with supervisor(tmp_path, state, save_model_secs=0).managed_session() as sess:
        assert sess.global_step == 3 and float(state["w"][0, 0]) == 3.0


@pytest.mark.anyio
async def test_checkpoint_of_another_model_is_a_clear_error(tmp_path: Path) -> None:
    """Restoring another model's checkpoint names the missing and mis-shaped variables."""
    await _two_checkpoints(tmp_path)
    other = {"w": tf.Variable(tf.zeros([5, 3]), name="w"), "extra": tf.Variable(1.0, name="extra")}
    sv = supervisor(tmp_path, other, save_model_secs=0)
    with pytest.raises(asv.CheckpointError) as info:
        async with sv.managed_session():
            pass
    msg = str(info.value)
    assert "extra/.ATTRIBUTES/VARIABLE_VALUE" in msg and "w/.ATTRIBUTES/VARIABLE_VALUE" in msg
    assert "[4, 3]" in msg and "[5, 3]" in msg
    assert float(other["w"][0, 0]) == 0.0  # nothing was partially restored


@pytest.mark.anyio
async def test_a_failed_background_write_is_retried_by_the_final_save_whatever_the_timing(tmp_path: Path) -> None:
    """A background write that fails (step 2's) is retried by the final save, counted and
    logged, whether its error came before the stop or while the final save waited for
    it: the session ends without an error, the newest checkpoint is the final one."""
    state = make_state()
    sv = supervisor(tmp_path, state, save_model_steps=2)
    (tmp_path / "model.ckpt-2.index").mkdir(parents=True)  # publishing step 2 must fail
    with capture_logs() as events:
        async with sv.managed_session() as sess:
            await sv.save_now()  # the start-up save is committed: step 2's will not be skipped
            await sess.run_loop(bump(state), max_steps=3)
    retried = [e for e in events if e["event"] == "checkpoint.retrying"]
    assert [e["reason"] for e in retried] == ["final"] and "model.ckpt-2" in retried[0]["error"]
    assert sv.status().restarts["checkpoint"] == 1
    assert _state_file.read_state(tmp_path).paths[-1] == "model.ckpt-3"  # type: ignore[union-attr]
    assert not [n for n in listing(tmp_path) if ".asv-tmp-" in n]
    assert plain_restore(tmp_path)[1] == 3


@pytest.mark.anyio
async def test_background_write_error_is_raised_not_lost(tmp_path: Path) -> None:
    """A write error the final save does not mend (the final's own: its step's files
    cannot be published either) is raised at stop as a CheckpointError naming the file,
    chained to the OSError; the newest good checkpoint stays the latest."""
    state = make_state()
    sv = supervisor(tmp_path, state, save_model_steps=2)
    for step in (2, 3):
        (tmp_path / f"model.ckpt-{step}.index").mkdir(parents=True)  # publishing them must fail
    with pytest.raises(asv.CheckpointError, match=r"model\.ckpt-3") as info:
        async with sv.managed_session() as sess:
            await sv.save_now()  # the start-up save is committed: step 2's will not be skipped
            await sess.run_loop(bump(state), max_steps=3)
    assert isinstance(info.value.__cause__, OSError)
    assert _state_file.read_state(tmp_path).paths == ["model.ckpt-0"]  # type: ignore[union-attr]
    assert not [n for n in listing(tmp_path) if ".asv-tmp-" in n]
    plain_restore(tmp_path)  # whatever is latest is complete


@pytest.mark.anyio
async def test_save_now_needs_a_logdir() -> None:
    """save_now() without a logdir is a clear error."""
    sv = asv.Supervisor(None, state=make_state(), save_summaries_secs=0, handle_signals=False)
    async with sv.managed_session():
        with pytest.raises(RuntimeError, match="logdir"):
            await sv.save_now()


@pytest.mark.anyio
async def test_dataset_iterator_and_generator_resume_exactly(tmp_path: Path) -> None:
    """A tf.data iterator and a tf.random.Generator resume where the checkpoint left them."""

    def build() -> tuple[dict[str, Any], tf.data.Dataset]:
        state = {"acc": tf.Variable(0.0), "gen": tf.random.Generator.from_seed(7)}
        ds = tf.data.Dataset.range(1000).shuffle(50, seed=3, reshuffle_each_iteration=True).repeat()
        return state, ds

    def step_fn(state: dict[str, Any]) -> Any:
        def step(batch: Any) -> None:
            noise = state["gen"].uniform([])
            state["acc"].assign(state["acc"] * 0.5 + tf.cast(batch, tf.float32) + noise)

        return step

    state, ds = build()
    sv = supervisor(tmp_path / "a", state)
    async with sv.managed_session() as sess:
        await sess.run_loop(step_fn(state), ds, max_steps=40)
    straight = float(state["acc"])

    for stop in (15, 40):
        state, ds = build()
        sv = supervisor(tmp_path / "b", state)
        async with sv.managed_session() as sess:
            await sess.run_loop(step_fn(state), ds, max_steps=stop)
    assert float(state["acc"]) == straight


@pytest.mark.anyio
async def test_aborted_step_recovers_from_latest_checkpoint(tmp_path: Path) -> None:
    """AbortedError restores the latest checkpoint and training goes on from there; run_loop
    returns every step it ran, over all its legs (redone steps count again)."""
    state = make_state()
    failures = [7, 5]
    completed: list[int] = []

    def step() -> None:
        bump(state)()
        if failures and int(state["b"][0]) == failures[-1]:
            failures.pop()
            raise tf.errors.AbortedError(None, None, "worker restarted")
        completed.append(int(state["b"][0]))

    sv = supervisor(tmp_path, state, save_model_steps=2, recovery_wait_secs=0)
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            ran = await sess.run_loop(step, max_steps=8)
    # failed at b=5 (restored step 4), then at b=7 (restored the newest checkpoint), on to 8
    assert sess.global_step == 8 and float(state["b"][0]) == 8.0
    assert ran == len(completed) and completed[:4] == [1, 2, 3, 4] and completed[-1] == 8 and ran >= 8
    assert [e["event"] for e in logs if e["event"].startswith("session.recover")] == [
        "session.recovering",
        "session.recovered",
    ] * 2


@pytest.mark.anyio
async def test_unavailable_past_the_retry_bound_propagates(tmp_path: Path) -> None:
    """A step that keeps raising UnavailableError is retried a bounded number of times, then raised."""
    state = make_state()
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        raise tf.errors.UnavailableError(None, None, "ps down")

    sv = supervisor(tmp_path, state, recovery_wait_secs=0)
    with pytest.raises(tf.errors.UnavailableError):
        async with sv.managed_session() as sess:
            await sess.run(step)
    assert len(calls) == 4  # the first try and three retries
    assert _state_file.read_state(tmp_path).latest == "model.ckpt-0"  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_timed_save_while_a_write_is_in_flight_is_skipped_and_logged(tmp_path: Path) -> None:
    """With checkpoint_when_busy="skip", a timer tick that comes while the previous save
    is still being written is skipped, loudly."""
    state = make_state()
    clock = ManualClock()
    sv = supervisor(tmp_path, state, clock=clock, save_model_secs=60, checkpoint_when_busy="skip")
    gate = threading.Event()
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            try:
                await sv.save_now()
                saver = sv._runtime.extra(SessionAttribute.checkpoints).saver  # type: ignore[union-attr, attr-defined]
                saver._writer.submit(gate.wait)  # the writer is busy until the gate opens
                await sess.run(bump(state))
                await tick(clock, 60, 1)  # step 1 snapshotted, its write queued: in flight
                await sess.run(bump(state))
                await tick(clock, 60, 1)  # step 2: skipped, the step loop does not wait
                assert [e["step"] for e in logs if e["event"] == "checkpoint.skipped"] == [2]
            finally:
                gate.set()
    saved = [e["step"] for e in logs if e["event"] == "checkpoint.saved"]
    assert saved == [0, 1, 2]  # step 2 by the final save
    skipped = [e for e in logs if e["event"] == "checkpoint.skipped"]
    assert skipped[0]["reason"] == "timer" and "busy" in skipped[0]["why"]


def test_synchronous_save_shares_the_commit_protocol(tmp_path: Path) -> None:
    """write_checkpoint_now (CheckpointSaverHook's seam) commits like the service, and an
    older snapshot committed after it does not become the latest."""
    from asupervisor._checkpoint._manager import Checkpointer, write_checkpoint_now

    state = make_state()
    ckpt = tf.train.Checkpoint(**state, global_step=tf.Variable(0, dtype=tf.int64))
    background = Checkpointer(ckpt, tmp_path)
    background.prepare()
    ckpt.global_step.assign(3)
    older = background.snapshot(3)
    assert older is not None
    state["w"].assign_add(tf.ones([4, 3]))
    ckpt.global_step.assign(4)
    assert write_checkpoint_now(ckpt, tmp_path, "model.ckpt", 4, max_to_keep=5) == str(tmp_path / "model.ckpt-4")
    background.write(older)
    recorded = _state_file.read_state(tmp_path)
    assert recorded is not None
    assert recorded.latest == "model.ckpt-4" and recorded.paths == ["model.ckpt-3", "model.ckpt-4"]
    assert plain_restore(tmp_path) == (1.0, 4)


def test_large_snapshot_is_written_as_parallel_shards_plain_tf_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large state is written as several data shards in one checkpoint that plain TF restores."""

    monkeypatch.setattr(_write, "_SHARD_BYTES", 8 << 20)  # "large" at 24 MB, to stay quick

    big = write_big_state(tmp_path, 6, 1 << 20)  # 24 MB
    shards = [n for n in listing(tmp_path) if ".data-" in n]
    assert len(shards) == min(os.cpu_count() or 1, 3) and all(n.startswith("model.ckpt-1.") for n in shards)
    assert_plain_tf_restores(tmp_path, big)


def keras_state(width: int) -> tuple[Any, Any, Any]:
    """A Keras model, its optimizer and a training step (the optimizer builds lazily)."""
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(width), tf.keras.layers.Dense(1)])
    opt = tf.keras.optimizers.Adam(0.01)
    x = tf.ones((4, 2))

    @tf.function
    def step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    return model, opt, step


@pytest.mark.anyio
async def test_keras_model_with_lazily_built_optimizer_resumes(tmp_path: Path) -> None:
    """A trained Keras model restores into a fresh one whose optimizer is not built yet.

    Saved after training, the kernels are keyed under the optimizer's variable list (the
    shortest path then); the fresh model names them by layer. The match is by object
    graph, so this is the same model; a different width is still refused by name.
    """
    model, opt, step = keras_state(8)
    sv = supervisor(tmp_path, {"model": model, "optimizer": opt}, save_model_secs=1)
    async with sv.managed_session() as sess:
        await sess.run_loop(step, max_steps=3)
    trained = [v.numpy() for v in model.trainable_variables]

    fresh, fresh_opt, fresh_step = keras_state(8)
    async with supervisor(
        tmp_path, {"model": fresh, "optimizer": fresh_opt}, save_model_secs=0
    ).managed_session() as sess:
        assert sess.global_step == 3
        assert all((a == b.numpy()).all() for a, b in zip(trained, fresh.trainable_variables))
        await sess.run(fresh_step)
    assert int(fresh_opt.iterations.numpy()) == 4  # optimizer state restored once built

    wider, wider_opt, _ = keras_state(16)
    with pytest.raises(asv.CheckpointError, match=r"kernel.*\[2, 8\].*\[2, 16\]"):
        async with supervisor(tmp_path, {"model": wider, "optimizer": wider_opt}, save_model_secs=0).managed_session():
            pass


@pytest.mark.fast_store
def test_small_state_is_one_data_file_without_merge(tmp_path: Path) -> None:
    """Below the shard size one SaveV2 writes the checkpoint (no temporary directory, no
    merge): the fast store's sharding rule (the plain store writes pieces of 16 MB)."""

    big = write_big_state(tmp_path, 4, 1 << 20)  # 16 MB
    assert listing(tmp_path) == ["checkpoint", "model.ckpt-1.data-00000-of-00001", "model.ckpt-1.index"]
    assert_plain_tf_restores(tmp_path, big)


@pytest.mark.parametrize("shard_mb", [8, 32])
@LINUX_WRITEBACK
@pytest.mark.fast_store
def test_early_writeback_covers_every_data_file_and_stays_restorable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shard_mb: int
) -> None:
    """The writeback thread asks the kernel to write each data file (single and sharded)
    while SaveV2 runs; it ends with the write, and plain TF restores the result."""

    real = _writeback._sync_file_range
    assert real is not None
    flushed: set[str] = set()

    def recording(fd: int, offset: int, nbytes: int, flags: int) -> int:
        flushed.add(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        return real(fd, offset, nbytes, flags)

    monkeypatch.setattr(_writeback, "_sync_file_range", recording)
    monkeypatch.setattr(_writeback, "_WRITEBACK_POLL_SECS", 0.0005)
    monkeypatch.setattr(_write, "_SHARD_BYTES", shard_mb << 20)
    big = write_big_state(tmp_path, 6, 1 << 21)  # 48 MB
    assert not any(t.name == "asv-checkpoint-writeback" for t in threading.enumerate())
    shards = [n for n in listing(tmp_path) if ".data-" in n]
    assert flushed and all(".data-" in n for n in flushed)
    assert len(shards) == (1 if shard_mb == 32 else min(os.cpu_count() or 1, 4))
    assert_plain_tf_restores(tmp_path, big)


def test_durable_time_excludes_retention_and_old_checkpoints_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deletes after the commit: the checkpoint is named first, old files go after."""
    from asupervisor._checkpoint._manager import Checkpointer

    state = make_state()
    ckpt = tf.train.Checkpoint(**state)
    checkpointer = Checkpointer(ckpt, tmp_path, max_to_keep=1)
    checkpointer.prepare()
    order: list[str] = []
    real_commit, real_delete = _commit.commit, _commit.delete_checkpoint

    def commit(tmp: Path, final: Path, st: _state_file.CheckpointState, retiring: Any = ()) -> None:
        order.append("state")
        real_commit(tmp, final, st, retiring)

    def delete_checkpoint(prefix: Path) -> None:
        order.append(f"delete {prefix.name}")
        real_delete(prefix)

    monkeypatch.setattr(_commit, "commit", commit)
    monkeypatch.setattr(_commit, "delete_checkpoint", delete_checkpoint)
    for step in (1, 2):
        snap = checkpointer.snapshot(step)
        assert snap is not None
        checkpointer.write(snap)
    assert order == ["state", "state", "delete model.ckpt-1"]
    assert listing(tmp_path) == ["checkpoint", "model.ckpt-2.data-00000-of-00001", "model.ckpt-2.index"]
    assert checkpointer.last_commit_secs is not None and checkpointer.last_commit_secs > 0


@LINUX_WRITEBACK
@pytest.mark.fast_store
def test_writeback_failure_does_not_fail_the_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Early writeback is only a speed-up: if it fails, the save still commits, fsynced."""
    from asupervisor._checkpoint._manager import Checkpointer

    calls: list[int] = []
    handed = threading.Event()

    def failing(fd: int, offset: int, nbytes: int, flags: int) -> int:
        if flags == _writeback._SYNC_FILE_RANGE_WRITE:  # the early writeback's calls (not sync_data's)
            calls.append(fd)
            handed.set()
        raise OSError(5, "EIO")

    real_pwrite_all = _bundle.pwrite_all

    def pwrite_all(fd: int, data: Any, offset: int) -> None:
        real_pwrite_all(fd, data, offset)
        handed.wait(scaled(30))  # the first write waits for the writeback thread to see the file (not a race)

    _bundle.self_check()  # the writer's own check (its own files, no writeback) before the fault
    monkeypatch.setattr(_writeback, "_sync_file_range", failing)
    monkeypatch.setattr(_bundle, "pwrite_all", pwrite_all)
    monkeypatch.setattr(_writeback, "_WRITEBACK_MIN_BYTES", 1)
    monkeypatch.setattr(_writeback, "_WRITEBACK_POLL_SECS", 0.0002)
    big = tf.Variable(tf.random.uniform([1 << 22], seed=1), name="big")  # 16 MB
    ckpt = tf.train.Checkpoint(big=big)
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    snap = checkpointer.snapshot(1)
    assert snap is not None
    checkpointer.write(snap)
    assert len(calls) == 1  # called, failed, and the writeback thread stopped there
    fresh = tf.Variable(tf.zeros([1 << 22]))
    tf.train.Checkpoint(big=fresh).restore(tf.train.latest_checkpoint(str(tmp_path))).assert_existing_objects_matched()
    assert (fresh.numpy() == big.numpy()).all()


def test_commit_makes_files_and_renames_durable_before_naming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit protocol's order, recorded on the real calls: every checkpoint file is
    fsynced, renamed, and the directory fsynced before the state file is replaced."""
    from asupervisor._checkpoint._manager import Checkpointer

    events: list[str] = []
    lock = threading.Lock()
    real_fsync, real_replace = _writeback.fsync_path, os.replace

    def fsync_path(path: Path) -> None:
        real_fsync(path)
        with lock:
            events.append(f"fsync {'dir' if Path(path).is_dir() else Path(path).name}")

    def replace(src: Any, dst: Any) -> None:
        real_replace(src, dst)
        with lock:
            events.append(f"rename {Path(dst).name}")

    monkeypatch.setattr(_writeback, "fsync_path", fsync_path)
    monkeypatch.setattr(_commit.os, "replace", replace)
    checkpointer = Checkpointer(tf.train.Checkpoint(**make_state()), tmp_path)
    checkpointer.prepare()
    snap = checkpointer.snapshot(7)
    assert snap is not None
    checkpointer.write(snap)
    named = events.index("rename checkpoint")
    before = events[:named]
    for name in ("model.ckpt-7.index", "model.ckpt-7.data-00000-of-00001"):
        renamed = before.index(f"rename {name}")
        assert any(
            e.startswith("fsync model.ckpt-7.asv-tmp-") and e.endswith(name[len("model.ckpt-7") :])
            for e in before[:renamed]
        )
        assert "fsync dir" in before[renamed:]
    assert events[named + 1 :] == ["fsync dir"]
    assert plain_restore(tmp_path)[0] == 0.0


def test_commit_rereads_a_state_file_replaced_by_someone_else(tmp_path: Path) -> None:
    """The state file is not re-parsed when it is still this process's own write, but a
    replaced one (another tool's) is read again: its entries are kept."""
    from asupervisor._checkpoint._manager import Checkpointer

    checkpointer = Checkpointer(tf.train.Checkpoint(**make_state()), tmp_path, max_to_keep=5)
    checkpointer.prepare()
    for step in (1, 2):
        snap = checkpointer.snapshot(step)
        assert snap is not None
        checkpointer.write(snap)
    own = _state_file.read_own_state(tmp_path)
    assert own == _state_file.read_state(tmp_path) and own is not None and own.paths == ["model.ckpt-1", "model.ckpt-2"]
    from tensorflow.python.checkpoint import checkpoint_management

    checkpoint_management.update_checkpoint_state_internal(
        str(tmp_path), "model.ckpt-2", ["model.ckpt-1", "model.ckpt-2"], all_model_checkpoint_timestamps=[5.0, 6.0]
    )
    assert _state_file.read_own_state(tmp_path).timestamps == [5.0, 6.0]  # type: ignore[union-attr]
    snap = checkpointer.snapshot(3)
    assert snap is not None
    checkpointer.write(snap)
    recorded = _state_file.read_state(tmp_path)
    assert recorded is not None and recorded.paths == ["model.ckpt-1", "model.ckpt-2", "model.ckpt-3"]
    assert recorded.timestamps[:2] == [5.0, 6.0]


def test_model_check_matches_a_tf1_optimizers_slots_when_it_compares_key_by_key(tmp_path: Path) -> None:
    """A TF1 optimizer's slot variables hang off the saved graph's slot_variables, not its
    children; when the model check compares key by key (here: the live checkpoint has a
    save_counter the written one lacks), they are matched as TF's restore matches them
    (optimizer.get_slot), not reported missing from a checkpoint that holds them."""
    from asupervisor._checkpoint import store

    var = tf.Variable([1.0, 2.0])
    opt = tf.compat.v1.train.AdamOptimizer(0.1)
    opt.minimize(lambda: tf.reduce_sum(var**2), var_list=[var])
    path = str(tf.train.Checkpoint(v=var, opt=opt).write(str(tmp_path / "ck")))
    var2 = tf.Variable([0.0, 0.0])
    opt2 = tf.compat.v1.train.AdamOptimizer(0.1)
    opt2.minimize(lambda: tf.reduce_sum(var2**2), var_list=[var2])
    live = tf.train.Checkpoint(v=var2, opt=opt2)
    assert int(live.save_counter) == 0  # made now: the checkpoint has none, so the check compares by key
    store.restore_path(live, path)
    assert var2.numpy().tolist() == var.numpy().tolist()
    assert opt2.get_slot(var2, "m").numpy().tolist() == opt.get_slot(var, "m").numpy().tolist()
    extra = tf.train.Checkpoint(v=var2, opt=opt2, w=tf.Variable(1.0))
    with pytest.raises(asv.CheckpointError, match=r"missing from the checkpoint: w/\.ATTRIBUTES") as caught:
        store.restore_path(extra, path)
    assert "OPTIMIZER_SLOT" not in str(caught.value)  # only what is really missing is named


def test_model_check_reads_no_variable_unless_in_doubt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Restoring the same model's checkpoint checks it by object graph alone (TF's full
    serialising walk, which reads every variable, is not run); a nested variable the
    checkpoint lacks is still refused by name before anything is restored."""
    from asupervisor._checkpoint import _manager, store

    state = {"layers": [make_state(), make_state()]}
    bump(state["layers"][1])()
    checkpointer = _manager.Checkpointer(tf.train.Checkpoint(**state), tmp_path)
    checkpointer.prepare()
    snap = checkpointer.snapshot(1)
    assert snap is not None
    checkpointer.write(snap)
    walks: list[int] = []
    real = _graph.serialized

    def counting(checkpoint: Any) -> Any:
        walks.append(1)
        return real(checkpoint)

    monkeypatch.setattr(_graph, "serialized", counting)
    assert store.restore_latest(tf.train.Checkpoint(layers=[make_state(), make_state()]), tmp_path)
    assert walks == []
    grown = [make_state(), {**make_state(), "new": tf.Variable(tf.ones([2]), name="new")}]
    with pytest.raises(asv.CheckpointError, match=r"layers/1/new/\.ATTRIBUTES/VARIABLE_VALUE"):
        store.restore_latest(tf.train.Checkpoint(layers=grown), tmp_path)
    assert walks == [1] and float(grown[1]["w"][0, 0]) == 0.0


@pytest.mark.parametrize(
    "names",
    [
        ["model.ckpt-1", "model.ckpt-2"],
        ['we"ird\\name-3', "ünïcode ckpt-4", "/abs/elsewhere/model.ckpt-5"],
        [],
    ],
)
def test_state_file_reads_as_protobuf_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: list[str]
) -> None:
    """The state file parser gives what protobuf's text parser gives, for files written by
    this module and by TensorFlow, odd characters included; anything unusual goes to protobuf."""
    from tensorflow.python.checkpoint import checkpoint_management

    fast = _state_file._parse_state

    def via_protobuf() -> _state_file.CheckpointState:
        with monkeypatch.context() as m:
            m.setattr(_state_file, "_parse_state", lambda text: None)
            state = _state_file.read_state(tmp_path)
        assert state is not None and _state_file._parse_state is fast
        return state

    stamps = [1_763_000_000.123456 + i for i in range(len(names))]
    _state_file.write_state(tmp_path, _state_file.CheckpointState(names[-1] if names else None, names, stamps, 1234.5))
    assert _state_file.read_state(tmp_path) == via_protobuf()
    if names:
        checkpoint_management.update_checkpoint_state_internal(
            str(tmp_path), names[-1], names, all_model_checkpoint_timestamps=stamps, last_preserved_timestamp=7.0
        )
        assert _state_file.read_state(tmp_path) == via_protobuf()
    # a field this parser does not know: protobuf decides (here: a parse error, no state)
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "a"\nbogus_field: 1\n')
    with capture_logs() as logs:
        assert _state_file.read_state(tmp_path) is None
    assert [e["event"] for e in logs] == ["checkpoint.state_corrupt"]


def test_snapshot_reads_what_tfs_own_walk_reads_and_is_copy_on_write() -> None:
    """The snapshot's fast variable reads give TF's keys and values, and later updates do not change them.

    Plain ``tf.Variable``s and Keras 3 variables (which wrap one) are read with two ops
    instead of TF's five-op closure; the result must be the same checkpoint content.
    """
    from asupervisor._checkpoint.snapshot import _snapshot, _walk_cache

    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    opt = tf.keras.optimizers.Adam()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.ones((1, 3))))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    plain = tf.Variable([1.0, 2.0])
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, plain=plain)
    serialized, _ = _graph.serialized(ckpt)
    fast = [obj for obj in serialized if _walk_cache.plain_variable(obj) is not None]
    assert plain in fast and any(v is obj for v in model.variables for obj in fast)  # both kinds take the fast path

    snap = _snapshot.take_snapshot(ckpt, 1)
    expected = {}
    for tensor_dict in _graph.serialized(ckpt)[0].values():
        for key, value in tensor_dict.items():
            if key != "_CHECKPOINTABLE_OBJECT_GRAPH":
                expected[key] = getattr(value, "tensor", value).numpy()  # TF's own closure
    got = {k: t.numpy() for k, t in zip(snap.keys, snap.tensors) if k != "_CHECKPOINTABLE_OBJECT_GRAPH"}
    assert got.keys() == expected.keys()
    for key in got:
        assert got[key].tobytes() == expected[key].tobytes(), key
    before = got["plain/.ATTRIBUTES/VARIABLE_VALUE"].copy()
    plain.assign_add([10.0, 10.0])
    after = dict(zip(snap.keys, snap.tensors))["plain/.ATTRIBUTES/VARIABLE_VALUE"].numpy()
    assert after.tobytes() == before.tobytes()  # the snapshot kept the value at the boundary


@pytest.mark.parametrize("where", ["plain", "mirrored"])
def test_every_snapshot_counts_one_save_as_tfs_own_save_does(where: str) -> None:
    """``save_counter`` goes up by one per snapshot, and each snapshot holds its own count,
    as ``tf.train.Checkpoint.save`` numbers its saves (a plain counter takes one op, a
    counter made under a strategy TF's own ``assign_add``)."""
    from asupervisor._checkpoint.snapshot import _snapshot

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"]) if where == "mirrored" else tf.distribute.get_strategy()
    with strategy.scope():
        ckpt = tf.train.Checkpoint(w=tf.Variable([1.0, 2.0]))
        ckpt._maybe_create_save_counter()
    assert (type(ckpt.save_counter).__name__ == "ResourceVariable") is (where == "plain")
    counts = []
    for step in range(1, 4):
        snap = _snapshot.take_snapshot(ckpt, step)
        counts.append(int(dict(zip(snap.keys, snap.tensors))["save_counter/.ATTRIBUTES/VARIABLE_VALUE"].numpy()))
    assert counts == [1, 2, 3] and int(ckpt.save_counter.numpy()) == 3


def _assert_holds_what_tf_saves(snap: Any, ckpt: Any) -> None:
    """``snap`` holds TF's own walk's keys, and each value TF's own closure reads now."""

    expected = {}
    for tensor_dict in _graph.serialized(ckpt)[0].values():
        for key, value in tensor_dict.items():
            if key != "_CHECKPOINTABLE_OBJECT_GRAPH":
                expected[key] = np.asarray(getattr(value, "tensor", value).numpy())
    got = {k: np.asarray(t.numpy()) for k, t in zip(snap.keys, snap.tensors) if k != "_CHECKPOINTABLE_OBJECT_GRAPH"}
    assert got.keys() == expected.keys()
    for key in got:
        assert got[key].tobytes() == expected[key].tobytes(), key


def _tf_walk_keys(ckpt: Any) -> set[str]:

    return {k for d in _graph.serialized(ckpt)[0].values() for k in d}


def test_snapshots_reuse_the_walk_only_while_the_object_graph_is_unchanged(tmp_path: Path) -> None:
    """A snapshot skips TF's walk while the objects and their paths are the same; an object
    added, replaced or created by the optimizer's first step is in the very next snapshot."""
    from asupervisor._checkpoint._manager import Checkpointer

    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    opt = tf.keras.optimizers.Adam()
    plain = tf.Variable([1.0, 2.0])
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, plain=plain)
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    walks = checkpointer._walks

    def snapshot(step: int) -> dict[str, Any]:
        snap = checkpointer.snapshot(step)
        assert snap is not None
        assert set(snap.keys) == _tf_walk_keys(ckpt)  # exactly what TF's own walk would save
        return dict(zip(snap.keys, snap.tensors))

    snapshot(1)
    assert walks.hits == 0
    snapshot(2)
    assert walks.hits == 1  # same graph: no walk
    with tf.GradientTape() as tape:  # the first step creates the optimizer's variables
        loss = tf.reduce_sum(model(tf.ones((1, 3))))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    values = snapshot(3)
    assert walks.hits == 1 and any("optimizer" in k for k in values if "VARIABLE_VALUE" in k)
    ckpt.extra = tf.Variable(7.0)  # a new object
    assert float(snapshot(4)["extra/.ATTRIBUTES/VARIABLE_VALUE"]) == 7.0
    ckpt.plain = tf.Variable([5.0, 6.0])  # the same path, another object
    assert snapshot(5)["plain/.ATTRIBUTES/VARIABLE_VALUE"].numpy().tolist() == [5.0, 6.0]
    assert walks.hits == 1
    plain.assign([0.0, 0.0])  # the old object is no longer in the checkpoint
    ckpt.plain.assign([8.0, 9.0])
    values = snapshot(6)
    assert walks.hits == 2 and values["plain/.ATTRIBUTES/VARIABLE_VALUE"].numpy().tolist() == [8.0, 9.0]
    checkpointer.write(checkpointer.snapshot(7))  # a reused walk writes a checkpoint plain TF restores
    fresh = tf.train.Checkpoint(plain=tf.Variable([0.0, 0.0]), extra=tf.Variable(0.0))
    fresh.restore(tf.train.latest_checkpoint(str(tmp_path))).expect_partial().assert_existing_objects_matched()
    assert fresh.plain.numpy().tolist() == [8.0, 9.0] and float(fresh.extra) == 7.0
    assert walks.hits == 3


def test_a_walk_with_optimizer_slots_made_in_a_traced_step_is_reused(tmp_path: Path) -> None:
    """A Keras optimizer's first traced step makes its slots as variables of a subclass
    (``UnliftedInitializerVariable``): they are read like plain ones, so the walk is
    reused and the snapshot holds what TF's own walk reads; plain TF restores it."""
    from asupervisor._checkpoint._manager import Checkpointer

    def build() -> tuple[Any, Any, Any]:
        model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4), tf.keras.layers.Dense(2)])
        opt = tf.keras.optimizers.Adam()

        @tf.function
        def step() -> None:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(tf.ones((1, 3))))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

        return model, opt, step

    model, opt, step = build()
    step()
    assert "UnliftedInitializerVariable" in {type(v._value).__name__ for v in opt.variables}  # the slots
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    for n in (1, 2):
        step()
        snap = checkpointer.snapshot(n)
        assert snap is not None
        _assert_holds_what_tf_saves(snap, ckpt)
        checkpointer.write(snap)
    assert checkpointer._walks.hits == 1
    fresh_model, fresh_opt, fresh_step = build()
    fresh_step()  # creates the slots, then the restore overwrites them
    tf.train.Checkpoint(model=fresh_model, optimizer=fresh_opt).restore(
        str(tmp_path / "model.ckpt-2")
    ).assert_consumed()
    for a, b in zip(opt.variables + model.variables, fresh_opt.variables + fresh_model.variables):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), a.path


def test_a_walk_of_variables_made_under_a_strategy_is_reused(tmp_path: Path) -> None:
    """Keras variables and tf.Variables made under a tf.distribute strategy: a
    MirroredVariable's primary copy is read directly (what TF saves: every copy holds the
    same value), a SyncOnRead one (a metric, a counter) as TF's walk reads it, at every
    snapshot, in key order. The walk is reused, each snapshot holds what TF's own walk
    reads, and the checkpoint restores."""
    from asupervisor._checkpoint._manager import Checkpointer
    from asupervisor._checkpoint.snapshot import _walk_cache
    from asupervisor._checkpoint.store import restore_path

    def build() -> tuple[dict[str, Any], Any]:
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
            opt = tf.keras.optimizers.Adam()
            mean = tf.keras.metrics.Mean()
            epoch = tf.Variable(0, dtype=tf.int64)  # tf.Variables too, as TF's MWMS tutorial has them
            total = tf.Variable(
                0.0, synchronization=tf.VariableSynchronization.ON_READ, aggregation=tf.VariableAggregation.SUM
            )

        @tf.function
        def step() -> None:
            def replica() -> None:
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(model(tf.ones((1, 3))))
                opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
                mean.update_state(loss)
                total.assign_add(1.0)

            strategy.run(replica)
            epoch.assign_add(1)

        state = {"model": model, "opt": opt, "metric": list(mean.variables), "epoch": epoch, "total": total}
        return state, step

    state, step = build()
    step()
    ckpt = tf.train.Checkpoint(**state)
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    for n in (1, 2, 3):
        step()
        snap = checkpointer.snapshot(n)
        assert snap is not None
        _assert_holds_what_tf_saves(snap, ckpt)
        checkpointer.write(snap)
    walk = checkpointer._walks._walk
    assert walk is not None and checkpointer._walks.hits == 2
    # total, and the metric's total and count where Keras makes them on-read (newer Keras;
    # earlier ones mirror them: read directly, as any other mirrored variable)
    on_read = sum(type(getattr(v, "value", v)).__name__ == "SyncOnReadVariable" for v in state["metric"])
    assert walk.kinds.count(_walk_cache._DISTRIBUTED) == 1 + on_read
    owners = {type(getattr(o, "_value", o)).__name__ for o in walk.variable_owners}
    assert "MirroredVariable" in owners and state["epoch"] in walk.variable_owners
    fresh, fresh_step = build()
    fresh_step()
    restore_path(tf.train.Checkpoint(**fresh), str(tmp_path / "model.ckpt-3"))
    for a, b in zip(
        state["opt"].variables + state["model"].variables + state["metric"],
        fresh["opt"].variables + fresh["model"].variables + fresh["metric"],
    ):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), a.path
    assert int(fresh["epoch"].read_value()) == int(state["epoch"].read_value()) == 4
    assert float(fresh["total"].read_value()) == float(state["total"].read_value()) == 4.0


def test_an_uninitialised_variable_is_left_out_until_it_holds_a_value(tmp_path: Path) -> None:
    """As TF's own save does, a variable without a value is not in the snapshot, and the
    walk is not reused while one is in the checkpoint; once assigned, it is saved."""
    from tensorflow.python.ops.resource_variable_ops import UninitializedVariable

    from asupervisor._checkpoint._manager import Checkpointer

    late = UninitializedVariable(shape=[2], dtype=tf.float32)
    ckpt = tf.train.Checkpoint(v=tf.Variable(1.0), late=late)
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    key = "late/.ATTRIBUTES/VARIABLE_VALUE"
    for n in (1, 2):
        snap = checkpointer.snapshot(n)
        assert snap is not None and key not in snap.keys
        checkpointer.write(snap)
    assert checkpointer._walks.hits == 0
    tf.train.Checkpoint(v=tf.Variable(1.0), late=late).write(str(tmp_path / "plain"))
    assert key not in tf.train.load_checkpoint(str(tmp_path / "plain")).get_variable_to_shape_map()  # TF agrees
    late.assign([3.0, 4.0])
    for n in (3, 4):
        snap = checkpointer.snapshot(n)
        assert snap is not None and dict(zip(snap.keys, snap.tensors))[key].numpy().tolist() == [3.0, 4.0]
    assert checkpointer._walks.hits == 1


def test_snapshots_from_a_reused_walk_read_a_data_iterator_where_it_is_now(tmp_path: Path) -> None:
    """A data iterator's position is serialised again at every snapshot, also when the walk
    is reused: restoring each checkpoint with plain TF resumes the data where it was."""
    from asupervisor._checkpoint._manager import Checkpointer

    iterator = iter(tf.data.Dataset.range(10))
    ckpt = tf.train.Checkpoint(v=tf.Variable(1.0), it=iterator)
    checkpointer = Checkpointer(ckpt, tmp_path, max_to_keep=5)
    checkpointer.prepare()
    for step in range(1, 4):
        next(iterator)  # consumed 1, 2, 3 elements
        snap = checkpointer.snapshot(step)
        assert snap is not None and set(snap.keys) == _tf_walk_keys(ckpt)
        checkpointer.write(snap)
    assert checkpointer._walks.hits == 2
    for step in range(1, 4):
        fresh = iter(tf.data.Dataset.range(10))
        tf.train.Checkpoint(it=fresh).restore(str(tmp_path / f"model.ckpt-{step}")).expect_partial()
        assert int(next(fresh)) == step


def test_snapshots_walk_every_time_when_an_object_computes_other_tensors(tmp_path: Path) -> None:
    """A checkpoint holding an object with tensors of its own making (here a legacy
    saveable: a tf.lookup table) is walked at every snapshot."""
    from asupervisor._checkpoint._manager import Checkpointer

    table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=-1)
    table.insert(tf.constant(["a"]), tf.constant([1], tf.int64))
    ckpt = tf.train.Checkpoint(v=tf.Variable(1.0), table=table)
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    first = checkpointer.snapshot(1)
    table.insert(tf.constant(["b"]), tf.constant([2], tf.int64))
    second = checkpointer.snapshot(2)
    assert first is not None and second is not None and checkpointer._walks.hits == 0
    keys = [k for k in second.keys if "table" in k]
    assert keys and any(dict(zip(second.keys, second.tensors))[k].shape[0] == 2 for k in keys)
