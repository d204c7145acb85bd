"""Staged snapshots: variables copied into reused buffers at the step boundary.

The copy must hold exactly the values at the boundary (later in-place updates do not
reach it), TF's own reader must read the checkpoint written from it, the buffers must be
reused (no allocation per save) and never be shared by two live snapshots.
"""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from asupervisor._checkpoint._manager import Checkpointer
from asupervisor._checkpoint.snapshot import _snapshot
from asupervisor._checkpoint.store.fast import _bundle
from asupervisor.testing import capture_logs

pytestmark = [
    pytest.mark.usefixtures("no_new_threads"),
    pytest.mark.skipif(not _bundle.available(), reason="google-crc32c's C library is not installed"),
]


def mixed_state() -> dict[str, Any]:
    """Staged kinds (numbers of rank >= 1, bfloat16, bool) and unstaged ones (scalars, strings)."""
    return {
        "f32": tf.Variable(tf.random.uniform([37, 5], seed=1)),
        "bf16": tf.Variable(tf.constant([0.5, 3.0, -1.0], tf.bfloat16)),
        "i64": tf.Variable(tf.constant([-(2**40), 7], tf.int64)),
        "u8": tf.Variable(tf.constant([[1, 255]], tf.uint8)),
        "flag": tf.Variable([True, False]),
        "empty": tf.Variable(tf.zeros([0, 4])),
        "scalar": tf.Variable(2.5),
        "strings": tf.Variable(tf.constant([b"", b"a\x00b"])),
    }


def values(state: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: np.array(v.numpy()) for k, v in state.items()}


def bump(state: dict[str, Any]) -> None:
    """An in-place update of every variable, as a training step does."""
    for v in state.values():
        if v.dtype == tf.bool:
            v.assign(tf.logical_not(v))
        elif v.dtype == tf.string:
            v.assign(tf.strings.join([v, b"!"]))
        else:
            v.assign_add(tf.ones_like(v))


def staged_count(snap: _snapshot.Snapshot) -> int:
    return sum(isinstance(t, _snapshot.Staged) for t in snap.tensors)


def prepared(ckpt: Any) -> _snapshot.Staging:
    """Staging buffers made ready from a first (copy-on-write) snapshot, as the writer does."""
    staging = _snapshot.Staging()
    first = _snapshot.take_snapshot(ckpt, 1, staging=staging)
    assert staged_count(first) == 0  # not prepared yet: never allocate on the step thread
    assert staging.prepare(first.tensors)
    return staging


def test_a_staged_snapshot_holds_the_boundary_values_and_tf_reads_them(tmp_path: Path) -> None:
    """Staged values are the values at the boundary, whatever the next steps do, and a
    checkpoint written from them reads back in plain TF, value for value."""
    state = mixed_state()
    ckpt = tf.train.Checkpoint(**state)
    staging = prepared(ckpt)
    at_boundary = values(state)
    snap = _snapshot.take_snapshot(ckpt, 2, staging=staging)
    assert staged_count(snap) == 6  # f32, bf16, i64, u8, flag, empty; not the scalars nor strings
    bump(state)
    bump(state)
    keys = list(range(len(snap.keys)))
    _bundle.write_bundle(str(tmp_path / "ckpt"), snap.keys, snap.tensors, [keys])
    reader = tf.train.load_checkpoint(str(tmp_path / "ckpt"))
    for name, want in at_boundary.items():
        got = reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")
        assert np.asarray(got).dtype == want.dtype and np.asarray(got).tolist() == want.tolist(), name


def test_staging_buffers_are_reused_and_never_shared_by_two_live_snapshots() -> None:
    """The buffers serve one snapshot at a time: a snapshot taken while another holds them
    is copy-on-write (and still right); once the holder is gone the next one reuses the
    very same memory."""
    state = mixed_state()
    ckpt = tf.train.Checkpoint(**state)
    staging = prepared(ckpt)
    size = staging.nbytes
    a = _snapshot.take_snapshot(ckpt, 2, staging=staging)
    a_values = {k: np.array(t) for k, t in zip(a.keys, a.tensors) if isinstance(t, _snapshot.Staged)}
    buffers = [t.array for t in a.tensors if isinstance(t, _snapshot.Staged)]
    bump(state)
    b = _snapshot.take_snapshot(ckpt, 3, staging=staging)
    assert staged_count(b) == 0
    b_f32 = dict(zip(b.keys, b.tensors))["f32/.ATTRIBUTES/VARIABLE_VALUE"]
    np.testing.assert_array_equal(np.asarray(b_f32), state["f32"].numpy())
    for key, value in zip(a.keys, a.tensors):  # b did not write into a's buffers
        if key in a_values:
            assert np.array(value).tobytes() == a_values[key].tobytes(), key
    del a
    gc.collect()
    bump(state)
    c = _snapshot.take_snapshot(ckpt, 4, staging=staging)
    again = [t.array for t in c.tensors if isinstance(t, _snapshot.Staged)]
    assert len(again) == len(buffers) and all(x is y for x, y in zip(again, buffers))
    assert staging.nbytes == size
    c_f32 = dict(zip(c.keys, c.tensors))["f32/.ATTRIBUTES/VARIABLE_VALUE"]
    np.testing.assert_array_equal(np.asarray(c_f32), state["f32"].numpy())


def test_a_stop_ends_the_preparation_of_the_staging_buffers_between_buffers() -> None:
    """Touching the buffers of a large state takes the writer a second per 512 MB here,
    and the final save waits for the writer: ``stopping()`` is asked before each buffer;
    once it says yes nothing more is allocated and snapshots stay copy-on-write."""
    state = mixed_state()
    ckpt = tf.train.Checkpoint(**state)
    snap = _snapshot.take_snapshot(ckpt, 1)
    stageable = [t for t in snap.tensors if _snapshot._stageable(t)]
    assert len(stageable) >= 3
    asked: list[int] = []
    staging = _snapshot.Staging()

    def stopping() -> bool:
        asked.append(staging.nbytes)
        return len(asked) == 2  # the stop comes while the first buffer is made

    assert not staging.prepare(snap.tensors, stopping)
    assert len(asked) == 2 and staging.nbytes == stageable[0]._numpy().nbytes
    assert not staging.prepared
    bump(state)
    after = _snapshot.take_snapshot(ckpt, 2, staging=staging)
    assert staged_count(after) == 0
    f32 = dict(zip(after.keys, after.tensors))["f32/.ATTRIBUTES/VARIABLE_VALUE"]
    np.testing.assert_array_equal(np.asarray(f32), state["f32"].numpy())
    assert staging.prepare(snap.tensors) and staging.prepared  # no stop: every buffer


def test_a_large_state_is_copied_in_parallel_pieces_exactly() -> None:
    """Above the parallel threshold the copy is split in pieces over threads (joined before
    the snapshot returns): every byte lands, odd sizes and piece boundaries included."""
    rng = np.random.default_rng(0)
    big = tf.Variable(rng.standard_normal(5_000_003).astype(np.float32))  # ~20 MB, not a piece multiple
    odd = tf.Variable(rng.integers(0, 255, (3 << 20) + 1, dtype=np.uint8))
    ckpt = tf.train.Checkpoint(big=big, odd=odd)
    staging = prepared(ckpt)
    want = {"big": big.numpy().copy(), "odd": odd.numpy().copy()}
    assert sum(v.nbytes for v in want.values()) > _snapshot._COPY_PARALLEL_MIN
    snap = _snapshot.take_snapshot(ckpt, 2, staging=staging)
    big.assign_add(tf.ones_like(big))
    got = dict(zip(snap.keys, snap.tensors))
    for name, value in want.items():
        staged = got[f"{name}/.ATTRIBUTES/VARIABLE_VALUE"]
        assert isinstance(staged, _snapshot.Staged)
        assert np.asarray(staged).tobytes() == value.tobytes(), name


@pytest.mark.parametrize("staging", [True, False])
def test_the_checkpointer_stages_from_its_second_save(tmp_path: Path, staging: bool) -> None:
    """The first save is copy-on-write and readies the buffers on the writer thread (logged
    with their size); from the second on saves are staged; each restores the values of its
    step. ``staging=False`` never stages."""
    state = mixed_state()
    ckpt = tf.train.Checkpoint(**state)
    checkpointer = Checkpointer(ckpt, tmp_path, staging=staging)
    checkpointer.prepare()
    saved = {}
    counts = []
    with capture_logs() as logs:
        for step in (1, 2, 3):
            bump(state)
            snap = checkpointer.snapshot(step)
            assert snap is not None
            counts.append(staged_count(snap))
            saved[step] = values(state)
            bump(state)  # training goes on while the writer writes
            checkpointer.write(snap)
            checkpointer.prepare_next(snap)  # as the writer thread does after a save
            del snap
    staged_bytes = [e["bytes"] for e in logs if e["event"] == "checkpoint.staging"]
    if staging:
        assert counts == [0, 6, 6]
        assert staged_bytes == [sum(v.nbytes for k, v in saved[1].items() if k not in ("scalar", "strings"))]
    else:
        assert counts == [0, 0, 0] and staged_bytes == []
    for step in (2, 3):
        reader = tf.train.load_checkpoint(str(tmp_path / f"model.ckpt-{step}"))
        for name, want in saved[step].items():
            assert np.asarray(reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")).tolist() == want.tolist()


@pytest.mark.anyio
@pytest.mark.parametrize("staging", [True, False])
async def test_supervisor_checkpoint_staging_reaches_the_saves(tmp_path: Path, staging: bool) -> None:
    """Supervisor(checkpoint_staging=...) decides whether a session's saves stage (logged
    checkpoint.staging with the buffers' size after the first save) or not; both resume
    the last step's values."""
    import asupervisor as asv

    state = {"w": tf.Variable(tf.zeros([1000]))}

    def step() -> None:
        state["w"].assign_add(tf.ones([1000]))

    sv = asv.Supervisor(
        tmp_path,
        state=state,
        save_model_secs=0,
        save_model_steps=5,
        save_summaries_secs=0,
        handle_signals=False,
        checkpoint_staging=staging,
    )
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            await sess.run_loop(step, max_steps=20)
    sizes = [e["bytes"] for e in logs if e["event"] == "checkpoint.staging"]
    assert sizes == ([4000] if staging else [])
    reader = tf.train.load_checkpoint(str(tmp_path / "model.ckpt-20"))
    assert reader.get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE").tolist() == [20.0] * 1000


def test_checkpoint_staging_must_be_a_bool() -> None:
    import asupervisor as asv

    with pytest.raises(TypeError, match=r"checkpoint_staging.*'no'"):
        asv.Supervisor(None, checkpoint_staging="no", handle_signals=False)  # type: ignore[arg-type]


def many_variables(copies: int = 3) -> dict[str, Any]:
    """``mixed_state`` ``copies`` times over: enough variables for a batched read."""
    return {f"{name}{i}": v for i in range(copies) for name, v in mixed_state().items()}


@pytest.mark.parametrize("chunk", [256, 8], ids=["one-function", "three-functions"])
@pytest.mark.parametrize("staging", [True, False])
def test_a_walk_of_many_variables_is_read_in_one_batched_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, staging: bool, chunk: int
) -> None:
    """From the second save on, a remembered walk of many variables (every dtype kind) is
    read by traced functions (one per BATCH_CHUNK variables, called in turn), made on the
    writer thread after the first save: the snapshot holds exactly the values at the
    boundary (staged, or shared copy-on-write with the variables), later updates do not
    reach it, and plain TF restores each step."""
    from asupervisor._checkpoint.snapshot import _walk_cache
    from asupervisor._checkpoint.snapshot._walk_cache import BATCH_MIN_VARIABLES

    monkeypatch.setattr(_walk_cache, "BATCH_CHUNK", chunk)
    state = many_variables()
    assert len(state) >= BATCH_MIN_VARIABLES
    ckpt = tf.train.Checkpoint(**state)
    checkpointer = Checkpointer(ckpt, tmp_path, staging=staging)
    checkpointer.prepare()
    walks = checkpointer._walks
    saved = {}
    for step in (1, 2, 3):
        bump(state)
        snap = checkpointer.snapshot(step)
        assert snap is not None
        saved[step] = values(state)
        bump(state)  # training goes on while the writer writes
        held = {
            k.split("/")[0]: np.asarray(t.numpy()) for k, t in zip(snap.keys, snap.tensors) if "VARIABLE_VALUE" in k
        }
        for name, want in saved[step].items():
            assert held[name].tolist() == want.tolist(), (step, name)
        assert staged_count(snap) == (18 if staging and step > 1 else 0)
        checkpointer.write(snap)
        checkpointer.prepare_next(snap)
        del snap
    assert walks.hits == 2 and walks.batched == 2
    for step in (1, 2, 3):
        reader = tf.train.load_checkpoint(str(tmp_path / f"model.ckpt-{step}"))
        for name, want in saved[step].items():
            assert np.asarray(reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")).tolist() == want.tolist()


def saved_once(ckpt: Any, logdir: Path) -> Checkpointer:
    """A copy-on-write Checkpointer of ``ckpt`` after its first save, as the writer leaves it."""
    checkpointer = Checkpointer(ckpt, logdir, staging=False)
    checkpointer.prepare()
    snap = checkpointer.snapshot(1)
    assert snap is not None
    checkpointer.write(snap)
    checkpointer.prepare_next(snap)
    return checkpointer


def test_a_walk_of_few_variables_reads_them_one_by_one(tmp_path: Path) -> None:
    """Below BATCH_MIN_VARIABLES a function call costs more than it saves: nothing is traced."""
    ckpt = tf.train.Checkpoint(**mixed_state())
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    for step in (1, 2, 3):
        snap = checkpointer.snapshot(step)
        assert snap is not None
        checkpointer.write(snap)
        checkpointer.prepare_next(snap)
    assert checkpointer._walks.hits == 2 and checkpointer._walks.batched == 0


def test_a_batched_read_that_fails_falls_back_to_reading_one_by_one(tmp_path: Path) -> None:
    """A batched read raising (injected here) is logged once and dropped; the snapshot, and
    the ones after it, read the variables one by one and hold the right values."""
    state = many_variables()
    ckpt = tf.train.Checkpoint(**state)
    checkpointer = saved_once(ckpt, tmp_path)
    walk = checkpointer._walks._walk
    assert walk is not None and walk.batch is not None

    def broken() -> list[Any]:
        raise tf.errors.InternalError(None, None, "injected")

    walk.batch = broken
    with capture_logs() as logs:
        for step in (2, 3):
            bump(state)
            snap = checkpointer.snapshot(step)
            assert snap is not None
            held = {
                k.split("/")[0]: np.asarray(t.numpy()) for k, t in zip(snap.keys, snap.tensors) if "VARIABLE_VALUE" in k
            }
            assert all(held[n].tolist() == v.tolist() for n, v in values(state).items())
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["checkpoint.batched_read_failed"]
    assert checkpointer._walks.hits == 2 and checkpointer._walks.batched == 0


def test_a_keras_variable_given_a_new_inner_variable_is_walked_again(tmp_path: Path) -> None:
    """The batched read captured the ResourceVariable inside each Keras variable; if one is
    replaced, the snapshot takes the full walk and reads the new one."""
    import keras

    state = many_variables()
    wrapped = keras.Variable(np.array([1.0, 2.0], np.float32))
    ckpt = tf.train.Checkpoint(wrapped=wrapped, **state)
    checkpointer = saved_once(ckpt, tmp_path)
    wrapped._value = tf.Variable(np.array([5.0, 6.0], np.float32))
    snap = checkpointer.snapshot(2)
    assert snap is not None
    assert dict(zip(snap.keys, snap.tensors))["wrapped/.ATTRIBUTES/VARIABLE_VALUE"].numpy().tolist() == [5.0, 6.0]
    assert checkpointer._walks.hits == 0 and checkpointer._walks.batched == 0


@pytest.mark.anyio
async def test_a_session_traces_the_batched_read_off_the_step_thread(tmp_path: Path) -> None:
    """In a session the batched read is traced by the checkpoint writer after the first
    save (the one at the start, step 0; logged ``checkpoint.batched_read``), once, and run
    there first (its first call costs as much as the trace: 1 s on the step thread at a
    thousand variables otherwise), and the checkpoints it reads resume every value."""
    import asupervisor as asv

    state = many_variables()
    traced_on: list[str] = []
    from asupervisor._checkpoint.snapshot import _walk_cache

    first_run_on: list[str] = []
    real = _walk_cache._batch_reader

    def spy(variables: list[Any]) -> Any:
        traced_on.append(threading.current_thread().name)
        reader = real(variables)

        def read() -> Any:
            if not first_run_on:  # the first call instantiates the function: as long as the trace
                first_run_on.append(threading.current_thread().name)
            return reader()

        return read

    sv = asv.Supervisor(
        tmp_path, state=state, save_model_secs=0, save_model_steps=5, save_summaries_secs=0, handle_signals=False
    )
    with capture_logs() as logs, pytest.MonkeyPatch.context() as patch:
        patch.setattr("asupervisor._checkpoint.snapshot._walk_cache._batch_reader", spy)
        async with sv.managed_session() as sess:
            await sess.run_loop(lambda: bump(state), max_steps=20)
    assert [e["step"] for e in logs if e["event"] == "checkpoint.batched_read"] == [0]
    assert traced_on == ["asv-checkpoint"] and first_run_on == ["asv-checkpoint"]
    reader = tf.train.load_checkpoint(str(tmp_path / "model.ckpt-20"))
    for name, want in values(state).items():
        assert np.asarray(reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")).tolist() == want.tolist()


def test_a_stop_ends_the_making_of_the_batched_read_between_its_functions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Making the batched read of thousands of variables takes seconds on the writer
    thread, which the final save waits for: ``stopping()`` is asked before each function
    of BATCH_CHUNK variables, and once it says yes nothing more is traced and the
    snapshots read one by one."""
    from asupervisor._checkpoint.snapshot import _walk_cache

    monkeypatch.setattr(_walk_cache, "BATCH_CHUNK", 8)
    traced: list[int] = []
    real = _walk_cache._batch_reader

    def spy(variables: list[Any]) -> Any:
        traced.append(len(variables))
        return real(variables)

    monkeypatch.setattr(_walk_cache, "_batch_reader", spy)
    state = many_variables()
    ckpt = tf.train.Checkpoint(**state)
    checkpointer = Checkpointer(ckpt, tmp_path, staging=False)
    checkpointer.prepare()
    snap = checkpointer.snapshot(1)
    assert snap is not None
    checkpointer.write(snap)
    checkpointer.prepare_next(snap, stopping=lambda: len(traced) == 1)  # the stop comes during the first
    assert traced == [8]
    walk = checkpointer._walks._walk
    assert walk is not None and walk.batch is None
    snap = checkpointer.snapshot(2)
    assert snap is not None and checkpointer._walks.batched == 0
    held = {k.split("/")[0]: np.asarray(t.numpy()) for k, t in zip(snap.keys, snap.tensors) if "VARIABLE_VALUE" in k}
    assert all(held[n].tolist() == v.tolist() for n, v in values(state).items())


def test_preparing_the_next_save_never_fails_the_committed_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Staging buffers that cannot be allocated (a MemoryError, injected) and a batched read
    that cannot be traced (injected) are logged once; the save is committed, and the next
    ones are copy-on-write, read one by one, and restore."""
    from asupervisor._checkpoint.snapshot import _walk_cache

    def no_memory(*args: Any) -> Any:
        raise MemoryError("injected")

    def no_trace(variables: list[Any]) -> Any:
        raise RuntimeError("injected")

    monkeypatch.setattr(_snapshot, "aligned_empty", no_memory)
    monkeypatch.setattr(_walk_cache, "_batch_reader", no_trace)
    state = many_variables()
    ckpt = tf.train.Checkpoint(**state)
    checkpointer = Checkpointer(ckpt, tmp_path)
    checkpointer.prepare()
    with capture_logs() as logs:
        for step in (1, 2):
            bump(state)
            snap = checkpointer.snapshot(step)
            assert snap is not None and staged_count(snap) == 0
            checkpointer.write(snap)
            checkpointer.prepare_next(snap)
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert warnings == ["checkpoint.staging_failed", "checkpoint.batched_read_failed"]  # each once: given up
    assert checkpointer._walks.batched == 0
    reader = tf.train.load_checkpoint(str(tmp_path / "model.ckpt-2"))
    for name, want in values(state).items():
        assert np.asarray(reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")).tolist() == want.tolist()
