"""Restore in the field: damaged state files, corruption found at start-up, transient errors.

DESIGN "Promises in the field": a damaged ``checkpoint`` state file never restarts
training; every saved value is checked before the first step; transient errors are
retried, only data errors mark a checkpoint corrupt.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor._checkpoint.store import _names, _state_file
from asupervisor._checkpoint.store._owner import OWNER_FILE
from asupervisor.testing import ManualClock, capture_logs

pytestmark = pytest.mark.usefixtures("no_new_threads", "checkpoint_store")  # a promise test: both stores


def make_state() -> dict[str, Any]:
    return {"w": tf.Variable(tf.zeros([4, 3]), name="w"), "b": tf.Variable(tf.zeros([3]), name="b")}


def supervisor(logdir: Path, state: Any, **kwargs: Any) -> asv.Supervisor:
    kwargs.setdefault("save_model_secs", 600)  # never due on the manual clock: saves are explicit
    kwargs.setdefault("clock", ManualClock())
    kwargs.setdefault("recovery_wait_secs", 0)
    return asv.Supervisor(logdir, state=state, save_summaries_secs=0, handle_signals=False, **kwargs)


def bump(state: dict[str, Any]) -> Any:
    def step() -> None:
        state["w"].assign_add(tf.ones([4, 3]))
        state["b"].assign_add(tf.ones([3]))

    return step


async def three_checkpoints(logdir: Path) -> None:
    """Checkpoints of steps 2, 4 and 6 (and 0), each w == its step."""
    state = make_state()
    sv = supervisor(logdir, state)
    async with sv.managed_session() as sess:
        for _ in range(2):
            for _ in range(2):
                await sess.run(bump(state))
            await sv.save_now()
        await sess.run_loop(bump(state), max_steps=6)  # and the final save
    assert all(_names.missing_files(logdir / f"model.ckpt-{s}") is None for s in (0, 2, 4, 6))


def flip_byte(prefix: Path, key: str | None = None) -> None:
    """Flip one byte of the data file of the checkpoint ``prefix``: inside the value of
    ``key`` (found by its bytes, which are stored as they are), else near the end."""
    data = prefix.parent / f"{prefix.name}.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    if key is None:
        at = len(raw) - 20
    else:
        value = tf.train.load_checkpoint(str(prefix)).get_tensor(key).tobytes()
        at = raw.find(value)
        assert at >= 0 and raw.find(value, at + 1) < 0, "the value's bytes must be unique in the file"
        at += len(value) // 2
    raw[at] ^= 0xFF
    data.write_bytes(bytes(raw))


def listing(logdir: Path) -> dict[str, bytes]:
    """Every file's bytes; the owner lock's only by name (each start writes its owner in it)."""
    return {
        n: b"" if n == OWNER_FILE else (logdir / n).read_bytes()
        for n in sorted(os.listdir(logdir))
        if (logdir / n).is_file()
    }


DAMAGE = {
    "empty": b"",
    "garbled_text": b'model_checkpoint_path: "model.ckpt-6\nall_model_checkpoint_paths {{{ oops\n',
    "binary": bytes(range(256)) * 4,
    "dangling": b'model_checkpoint_path: "model.ckpt-90"\nall_model_checkpoint_paths: "model.ckpt-80"\n'
    b'all_model_checkpoint_paths: "model.ckpt-90"\n',
    "truncated": b'model_checkpoint_path: "model.ck',
}


@pytest.mark.anyio
@pytest.mark.parametrize("damage", sorted(DAMAGE))
async def test_damaged_state_file_restores_newest_on_disk_and_repairs(tmp_path: Path, damage: str) -> None:
    """An empty, garbled, binary, truncated or dangling state file: the newest complete
    checkpoint on disk is restored (never init_fn, never step 0), the state file is
    rewritten with relative paths naming it and the older ones, and
    ``checkpoint.state_repaired`` says what was wrong."""
    await three_checkpoints(tmp_path)
    (tmp_path / "checkpoint").write_bytes(DAMAGE[damage])
    inits: list[int] = []
    state = make_state()
    with capture_logs() as logs:
        sv = supervisor(tmp_path, state, init_fn=lambda: inits.append(1))
        async with sv.managed_session() as sess:
            assert sess.global_step == 6
            assert float(state["w"][0, 0]) == 6.0
            assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-6")
    assert inits == []
    repaired = [e for e in logs if e["event"] == "checkpoint.state_repaired"]
    assert len(repaired) == 1 and repaired[0]["problem"] and repaired[0]["latest"] == "model.ckpt-6"
    state_file = _state_file.read_state(tmp_path)
    assert state_file is not None and state_file.latest == "model.ckpt-6"
    assert state_file.paths[:4] == ["model.ckpt-0", "model.ckpt-2", "model.ckpt-4", "model.ckpt-6"]
    assert str(tmp_path) not in (tmp_path / "checkpoint").read_text()
    # nothing was set aside or lost; a restart is quiet
    assert not [n for n in os.listdir(tmp_path) if ".corrupt-" in n]
    with capture_logs() as logs:
        async with supervisor(tmp_path, make_state()).managed_session() as sess:
            assert sess.global_step == 6
    assert not [e for e in logs if e["event"] in ("checkpoint.state_repaired", "checkpoint.state_damaged")]


@pytest.mark.anyio
async def test_missing_state_file_restores_checkpoints_on_disk(tmp_path: Path) -> None:
    """A deleted state file with the checkpoints still there: the newest is restored and
    the state file written again (they are not overwritten by a run from step 0)."""
    await three_checkpoints(tmp_path)
    (tmp_path / "checkpoint").unlink()
    async with supervisor(tmp_path, make_state()).managed_session() as sess:
        assert sess.global_step == 6
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-6")


@pytest.mark.anyio
async def test_state_naming_only_a_corrupt_checkpoint_falls_back_to_unnamed_ones(tmp_path: Path) -> None:
    """The state file names only model.ckpt-6, which is corrupt: model.ckpt-4 (on disk,
    not named) is restored, 6 is set aside and the state file names 4."""
    await three_checkpoints(tmp_path)
    _state_file.write_state(tmp_path, _state_file.CheckpointState("model.ckpt-6", ["model.ckpt-6"], [1.0], 0.0))
    flip_byte(tmp_path / "model.ckpt-6")
    state = make_state()
    async with supervisor(tmp_path, state).managed_session() as sess:
        assert sess.global_step == 4
        assert float(state["w"][0, 0]) == 4.0
        assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-4")
    assert not _names.checkpoint_files(tmp_path / "model.ckpt-6")
    assert [n for n in os.listdir(tmp_path) if n.startswith("model.ckpt-6.corrupt-")]


@pytest.mark.anyio
async def test_dangling_state_file_with_nothing_on_disk_starts_fresh_and_keeps_it_aside(tmp_path: Path) -> None:
    """A state file naming checkpoints that are all gone, with none on disk: init_fn
    runs (nothing can be lost), the state file is kept aside as ``checkpoint.corrupt-*``
    and the first save writes a state file naming only what exists."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "checkpoint").write_bytes(DAMAGE["dangling"])
    inits: list[int] = []
    state = make_state()
    async with supervisor(tmp_path, state, init_fn=lambda: inits.append(1)).managed_session() as sess:
        await sess.run_loop(bump(state), max_steps=2)
    assert inits == [1]
    assert [n for n in os.listdir(tmp_path) if n.startswith("checkpoint.corrupt-")]
    state_file = _state_file.read_state(tmp_path)
    assert state_file is not None and state_file.latest == "model.ckpt-2"
    assert all(_names.missing_files(tmp_path / p) is None for p in state_file.paths)


@pytest.mark.anyio
@pytest.mark.parametrize("damage_state", [False, True])
async def test_none_loads_is_an_error_listing_each_and_changes_nothing(tmp_path: Path, damage_state: bool) -> None:
    """Every checkpoint corrupt (state file sound or damaged): a CheckpointError names
    each checkpoint and why; init_fn never runs and no file is changed, renamed or
    overwritten."""
    await three_checkpoints(tmp_path)
    for step in (0, 2, 4, 6):
        flip_byte(tmp_path / f"model.ckpt-{step}")
    if damage_state:
        (tmp_path / "checkpoint").write_bytes(b"")
    before = listing(tmp_path)
    inits: list[int] = []
    with pytest.raises(asv.CheckpointError) as info:
        async with supervisor(tmp_path, make_state(), init_fn=lambda: inits.append(1)).managed_session():
            pytest.fail("the session must not start")
    message = str(info.value)
    for step in (0, 2, 4, 6):
        assert str(tmp_path / f"model.ckpt-{step}") in message
    assert "DataLossError" in message or "Checksum" in message
    assert inits == []
    assert listing(tmp_path) == before


# -- Keras + Adam: optimizer slots are restored lazily ------------------------------


def keras_state() -> tuple[Any, Any, Any]:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(0.01)
    x = tf.random.stateless_normal((16, 4), (1, 2))
    y = tf.reduce_sum(x, 1, keepdims=True)

    @tf.function
    def step() -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return {"loss": loss}

    return tf.train.Checkpoint(model=model, optimizer=opt), opt, step


async def train_keras(logdir: Path, max_steps: int, **kwargs: Any) -> tuple[int, int]:
    """Train to ``max_steps``, saving 2 steps before and at the end; returns (start
    step, end step)."""
    ckpt, _, step = keras_state()
    sv = supervisor(logdir, ckpt, **kwargs)
    async with sv.managed_session() as sess:
        start = sess.global_step
        while sess.global_step < max_steps - 2:
            await sess.run(step)
        await sv.save_now()
        await sess.run_loop(step, max_steps=max_steps)
    return start, sv.global_step


def slot_key(prefix: Path) -> str:
    """The checkpoint key of one Adam slot (a variable of the optimizer's own list, not a
    model weight nor the iteration count)."""
    keys = tf.train.load_checkpoint(str(prefix)).get_variable_to_shape_map()
    slots = sorted(k for k, shape in keys.items() if k.startswith("optimizer/_variables/") and shape == [4, 8])
    assert len(slots) == 2  # Adam's m and v of the first kernel
    return slots[0]


@pytest.mark.anyio
async def test_flipped_byte_in_optimizer_slot_falls_back_at_startup(tmp_path: Path) -> None:
    """One flipped byte in an Adam slot of the newest checkpoint (restored by TF only at
    the first apply) is found at start-up: the previous checkpoint is restored, the
    first steps run, and a restart after that works too."""
    assert await train_keras(tmp_path, 4) == (0, 4)
    newest = tmp_path / "model.ckpt-4"
    flip_byte(newest, slot_key(newest))
    with capture_logs() as logs:
        assert await train_keras(tmp_path, 6) == (2, 6)
    corrupt = [e for e in logs if e["event"] == "checkpoint.corrupt"]
    assert len(corrupt) == 1 and corrupt[0]["path"] == str(newest) and "DataLoss" in corrupt[0]["reason"]
    assert [n for n in os.listdir(tmp_path) if n.startswith("model.ckpt-4.corrupt-")]
    assert await train_keras(tmp_path, 8) == (6, 8)


@pytest.mark.anyio
async def test_fallback_with_deferred_slots_never_reads_the_set_aside_files(tmp_path: Path) -> None:
    """The newest checkpoint's model weight is corrupt; its slots, which TF restores only
    at the first apply, were already queued when the restore failed. After the fallback
    the first step restores the previous checkpoint's slots: it neither reads the files
    set aside (NotFoundError) nor takes the failed checkpoint's values."""
    assert await train_keras(tmp_path, 4) == (0, 4)
    newest = tmp_path / "model.ckpt-4"
    kernel = next(
        k
        for k, shape in tf.train.load_checkpoint(str(newest)).get_variable_to_shape_map().items()
        if shape == [4, 8] and not k.startswith("optimizer/_variables/")
    )
    flip_byte(newest, kernel)
    expected = tf.train.load_checkpoint(str(tmp_path / "model.ckpt-2")).get_tensor(slot_key(tmp_path / "model.ckpt-2"))
    ckpt, opt, step = keras_state()
    async with supervisor(tmp_path, ckpt).managed_session() as sess:
        assert sess.global_step == 2
        opt.build(ckpt.model.trainable_variables)  # what the first apply does: deferred restores run
        restored = [v.numpy() for v in opt.variables if tuple(v.shape) == (4, 8)]
        assert any((r == expected).all() for r in restored)
        await sess.run_loop(step, max_steps=3)
    assert sv_step(tmp_path) >= 2


def sv_step(logdir: Path) -> int:
    latest = tf.train.latest_checkpoint(str(logdir))
    assert latest is not None
    return _names.step_of(Path(latest).name) or 0


# -- transient is not corrupt -------------------------------------------------------


class FlakyValue(tf.Module):
    """A trackable whose restore raises the given errors first (a real failure inside
    TF's restore, as a flaky filesystem would raise it), then restores normally."""

    def __init__(self, errors: list[Exception]) -> None:
        super().__init__()
        self.value = tf.Variable(0.0)
        self.errors = errors
        self.restores = 0

    def _serialize_to_tensors(self) -> dict[str, Any]:
        return {"v": self.value.read_value()}

    def _restore_from_tensors(self, restored_tensors: dict[str, Any]) -> Any:
        self.restores += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.value.assign(restored_tensors["v"])


async def flaky_checkpoint(logdir: Path) -> None:
    flaky = FlakyValue([])
    async with supervisor(logdir, {"flaky": flaky}).managed_session() as sess:
        await sess.run_loop(lambda: flaky.value.assign_add(1.0), max_steps=4)


@pytest.mark.anyio
async def test_transient_error_in_restore_is_retried_not_set_aside(tmp_path: Path) -> None:
    """UnavailableError, then AbortedError, raised while restoring: start-up retries
    (logged ``session.start_retrying``) and restores the same checkpoint; nothing is
    marked corrupt or set aside."""
    await flaky_checkpoint(tmp_path)
    before = sorted(os.listdir(tmp_path))
    flaky = FlakyValue(
        [tf.errors.UnavailableError(None, None, "nfs gone"), tf.errors.AbortedError(None, None, "again")]
    )
    with capture_logs() as logs:
        async with supervisor(tmp_path, {"flaky": flaky}).managed_session() as sess:
            assert sess.global_step == 4 and float(flaky.value) == 4.0
    assert flaky.restores == 3
    assert [e["attempt"] for e in logs if e["event"] == "session.start_retrying"] == [1, 2]
    assert not [e for e in logs if e["event"] in ("checkpoint.corrupt", "checkpoint.set_aside")]
    assert set(before) <= set(os.listdir(tmp_path))
    assert not [n for n in os.listdir(tmp_path) if ".corrupt-" in n]


@pytest.mark.anyio
async def test_session_manager_lets_a_transient_error_of_an_explicit_path_through(tmp_path: Path) -> None:
    """``SessionManager.prepare_session(checkpoint_filename_with_path=...)`` whose restore
    raises UnavailableError (a flaky filesystem) raises that error as itself, to be retried
    by the caller; it is not reported as a damaged checkpoint and nothing is set aside. A
    data error in the same place stays a ``CheckpointError``."""
    await flaky_checkpoint(tmp_path)
    path = tf.train.latest_checkpoint(str(tmp_path))
    assert path is not None
    before = sorted(os.listdir(tmp_path))
    flaky = FlakyValue([tf.errors.UnavailableError(None, None, "nfs gone")])
    sm = asv.SessionManager(state={"flaky": flaky, "global_step": tf.Variable(0, dtype=tf.int64)})
    with pytest.raises(tf.errors.UnavailableError, match="nfs gone"):
        await sm.prepare_session(checkpoint_filename_with_path=path)
    assert sorted(os.listdir(tmp_path)) == before
    flaky.errors = [tf.errors.DataLossError(None, None, "checksum mismatch")]
    with pytest.raises(asv.CheckpointError, match="checksum mismatch"):
        await sm.prepare_session(checkpoint_filename_with_path=path)
    await sm.prepare_session(checkpoint_filename_with_path=path)
    assert float(flaky.value) == 4.0


@pytest.mark.anyio
async def test_transient_error_in_init_fn_is_retried_with_backoff(tmp_path: Path) -> None:
    """init_fn raising UnavailableError is retried after the recovery backoff (on the
    session's clock); the session starts once it succeeds, and hooks see one start-up."""
    calls: list[int] = []

    def init_fn() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise tf.errors.UnavailableError(None, None, "parameter server restarting")

    class Counter(asv.SessionRunHook):
        def __init__(self) -> None:
            self.calls: list[str] = []

        def begin(self) -> None:
            self.calls.append("begin")

        def after_create_session(self, session: Any) -> None:
            self.calls.append("after_create_session")

    hook = Counter()
    clock = ManualClock()
    sv = supervisor(tmp_path, make_state(), init_fn=init_fn, clock=clock, recovery_wait_secs=8, hooks=[hook])

    async def drive() -> None:  # half a second at a time, whenever someone sleeps on it
        while True:
            await clock.wait_for_sleepers(1)
            clock.advance(0.5)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(drive)
        with capture_logs() as logs:
            async with sv.managed_session() as sess:
                assert sess.global_step == 0
        tg.cancel_scope.cancel()
    assert len(calls) == 3
    assert [e["backoff_secs"] for e in logs if e["event"] == "session.start_retrying"] == [1.0, 2.0]
    assert hook.calls == ["begin", "after_create_session"]  # hooks see one start-up


@pytest.mark.anyio
async def test_transient_errors_past_the_policy_propagate_as_themselves(tmp_path: Path) -> None:
    """A transient error that keeps coming is retried a bounded number of times, then
    comes out as itself."""
    calls: list[int] = []

    def init_fn() -> None:
        calls.append(1)
        raise tf.errors.AbortedError(None, None, "always")

    with pytest.raises(tf.errors.AbortedError):
        async with supervisor(tmp_path, make_state(), init_fn=init_fn).managed_session():
            pytest.fail("the session must not start")
    assert len(calls) == 4  # the first try and three retries (the recovery policy)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "error",
    [
        tf.errors.PermissionDeniedError(None, None, "no read permission"),
        tf.errors.ResourceExhaustedError(None, None, "out of memory"),
        KeyError("a bug in user code"),
    ],
    ids=["permission", "resources", "user"],
)
async def test_other_restore_errors_propagate_and_set_nothing_aside(tmp_path: Path, error: Exception) -> None:
    """An error that is neither transient nor about the checkpoint's data propagates as
    itself, at once, and no checkpoint is marked corrupt, renamed or dropped."""
    await flaky_checkpoint(tmp_path)
    before = listing(tmp_path)
    flaky = FlakyValue([error])
    with pytest.raises(type(error)):
        async with supervisor(tmp_path, {"flaky": flaky}).managed_session():
            pytest.fail("the session must not start")
    assert flaky.restores == 1
    assert listing(tmp_path) == before


@pytest.mark.anyio
async def test_user_error_in_init_fn_is_not_retried(tmp_path: Path) -> None:
    """A user error in init_fn propagates as itself after one call."""
    calls: list[int] = []

    def init_fn() -> None:
        calls.append(1)
        raise ValueError("bad init")

    with pytest.raises(ValueError, match="bad init"):
        async with supervisor(tmp_path, make_state(), init_fn=init_fn).managed_session():
            pytest.fail("the session must not start")
    assert calls == [1]


# -- the other front doors ----------------------------------------------------------


@pytest.mark.anyio
async def test_session_manager_and_monitored_session_restore_past_a_damaged_state_file(tmp_path: Path) -> None:
    """SessionManager and MonitoredTrainingSession restore through the same code: a
    binary state file does not make either start from scratch."""
    await three_checkpoints(tmp_path)
    (tmp_path / "checkpoint").write_bytes(DAMAGE["binary"])
    state = make_state()
    await asv.SessionManager(state=state).prepare_session(str(tmp_path), init_fn=lambda: pytest.fail("init_fn"))
    assert float(state["w"][0, 0]) == 6.0
    state = make_state()
    async with asv.MonitoredTrainingSession(
        str(tmp_path), state=state, save_checkpoint_secs=None, save_summaries_steps=None, log_step_count_steps=None
    ) as sess:
        assert float(state["w"][0, 0]) == 6.0
        assert not sess.should_stop()
    assert _state_file.read_state(tmp_path) is not None


@pytest.mark.anyio
async def test_session_manager_none_loads_is_an_error(tmp_path: Path) -> None:
    """SessionManager with every checkpoint corrupt raises CheckpointError instead of
    calling init_fn over them."""
    await three_checkpoints(tmp_path)
    for step in (0, 2, 4, 6):
        flip_byte(tmp_path / f"model.ckpt-{step}")
    with pytest.raises(asv.CheckpointError, match=r"model\.ckpt-6"):
        await asv.SessionManager(state=make_state()).prepare_session(str(tmp_path), init_fn=lambda: None)


@pytest.mark.anyio
@pytest.mark.parametrize("damage", sorted(DAMAGE))
async def test_watch_checkpoints_survives_a_damaged_state_file(tmp_path: Path, damage: str) -> None:
    """watch_checkpoints over a damaged state file sees no checkpoint (and does not crash)."""
    (tmp_path / "checkpoint").write_bytes(DAMAGE[damage])
    async with asv.watch_checkpoints(tmp_path, timeout=0, clock=ManualClock()) as checkpoints:
        assert [p async for p in checkpoints] == []


@pytest.mark.anyio
async def test_transient_error_in_a_recovery_restore_is_retried(tmp_path: Path) -> None:
    """A step raises UnavailableError; the restore that recovers from it meets an
    UnavailableError too: that is one more attempt of the recovery policy, not a corrupt
    checkpoint, and training goes on to max_steps."""
    flaky = FlakyValue([])
    raised: list[int] = []

    def step() -> None:
        flaky.value.assign_add(1.0)
        if float(flaky.value) == 3.0 and not raised:
            raised.append(1)
            flaky.errors.append(tf.errors.UnavailableError(None, None, "nfs gone during recovery"))
            raise tf.errors.UnavailableError(None, None, "step lost its peer")

    sv = supervisor(tmp_path, {"flaky": flaky})
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            await sess.run_loop(step, max_steps=5)
    assert sv.global_step == 5
    assert flaky.restores == 2  # the failed one and the one that worked
    assert [e["attempt"] for e in logs if e["event"] == "session.recovering"] == [1, 2]
    assert not [e for e in logs if e["event"] in ("checkpoint.corrupt", "checkpoint.set_aside")]


def test_the_repaired_state_drops_the_bad_and_names_the_restored_latest() -> None:
    """A sound state file keeps its checkpoints but the bad ones, the restored one added in
    step order; a damaged one is rebuilt from the complete checkpoints on disk up to the
    restored step, oldest first, each stamped with its commit time."""
    from asupervisor._checkpoint.store._candidates import repaired_state
    from asupervisor._checkpoint.store._state_file import CheckpointState

    def stamp(name: str) -> float:
        return float(name.rsplit("-", 1)[1])

    sound = CheckpointState("model.ckpt-30", ["model.ckpt-10", "model.ckpt-30"], [10.0, 30.0], 5.0)
    kept = repaired_state(
        sound, "model.ckpt-20", bad={"model.ckpt-30"}, on_disk=[], committed_at=stamp, last_preserved=5.0
    )
    assert (kept.latest, kept.paths, kept.timestamps) == (
        "model.ckpt-20",
        ["model.ckpt-10", "model.ckpt-20"],
        [10.0, 20.0],
    )
    assert kept.last_preserved == 5.0
    on_disk = ["model.ckpt-40", "model.ckpt-30", "model.ckpt-20", "model.ckpt-10"]  # newest first
    rebuilt = repaired_state(
        None, "model.ckpt-30", bad={"model.ckpt-20"}, on_disk=on_disk, committed_at=stamp, last_preserved=0.0
    )
    assert (rebuilt.latest, rebuilt.paths) == ("model.ckpt-30", ["model.ckpt-10", "model.ckpt-30"])
    assert rebuilt.timestamps == [10.0, 30.0]
