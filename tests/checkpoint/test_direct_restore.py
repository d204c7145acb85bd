"""Restoring a checkpoint of plain variables by reading its files straight into them
(``_checkpoint/_direct_restore.py``): the same values as TF's restore, every dtype and
shape class, files written by our writer and by TF's ``SaveV2``; TF's restore whenever
anything would be deferred or is not a plain variable; damage found before any variable
changes; no thread left behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from checkpoint.test_bundle import flat, varied_state, zeros_like

from asupervisor._checkpoint import store
from asupervisor._checkpoint._manager import Checkpointer
from asupervisor._checkpoint.snapshot._graph import SavedGraphMatch
from asupervisor._checkpoint.store import FastPath
from asupervisor._checkpoint.store.fast import _bundle, _direct_restore
from asupervisor._checkpoint.store.plain import _restore
from asupervisor._exceptions import CheckpointError
from asupervisor.testing import capture_logs

pytestmark = [
    pytest.mark.usefixtures("no_new_threads"),
    pytest.mark.skipif(not _bundle.available(), reason="google-crc32c's C library is not installed"),
]


def plain_state() -> dict[str, Any]:
    """:func:`varied_state` without its string variable (TF's restore reads strings)."""
    state = varied_state()
    del state["strings"]
    state["matrix"] = tf.Variable(tf.random.uniform([3, 4, 5], seed=3))
    state["big"] = tf.Variable(tf.random.uniform([3 << 20], seed=4))  # 12 MiB: six reads of PIECE_BYTES
    return state


def reads(events: list[dict[str, Any]]) -> list[str]:
    return [e["how"] for e in events if e["event"] == "checkpoint.read"]


def write(state: dict[str, Any], directory: Path, writer: str) -> str:
    """The checkpoint of ``state`` written by asupervisor (our bundle writer) or by TF."""
    checkpoint = tf.train.Checkpoint(**state)
    if writer == "tensorflow":
        return str(checkpoint.write(str(directory / "tf")))
    saver = Checkpointer(checkpoint, directory, max_to_keep=2)
    saver.prepare()
    return saver.write(saver.snapshot(1)).path


def restored(state: dict[str, Any], path: str, direct: bool) -> tuple[list[np.ndarray], list[str]]:
    fresh = zeros_like(state)
    fast = FastPath() if direct else FastPath(own_restore=False)
    with capture_logs() as events:
        store.restore_path(tf.train.Checkpoint(**fresh), path, setting=fast)
    return [v.numpy() for v in flat(fresh)], reads(events)


@pytest.mark.parametrize("writer", ["asupervisor", "tensorflow"])
def test_every_dtype_and_shape_reads_back_as_tensorflow_restores_it(tmp_path: Path, writer: str) -> None:
    """Scalars, an empty tensor, bfloat16, bool, complex, 3-D, one value over two reads,
    300 small ones: the direct read gives the values TF's restore gives, bit for bit,
    with the dtype and shape of the variable; both writers' files."""
    state = plain_state()
    path = write(state, tmp_path, writer)
    ours, how = restored(state, path, direct=True)
    theirs, how_tf = restored(state, path, direct=False)
    assert how == ["direct"] and how_tf == ["tensorflow"]
    for want, mine, tfs in zip(flat(state), ours, theirs):
        assert mine.dtype == tfs.dtype == want.dtype.as_numpy_dtype and mine.shape == tfs.shape == tuple(want.shape)
        assert mine.tobytes() == tfs.tobytes() == want.numpy().tobytes()


def test_restored_variables_train_on_and_save_again(tmp_path: Path) -> None:
    """The variables own their restored values: an in-place update after the restore
    changes the variable only, and the next checkpoint holds the updated values."""
    state = {"w": tf.Variable(tf.range(8.0)), "m": tf.Variable(tf.ones([2, 3]))}
    path = write(state, tmp_path / "a", "asupervisor")
    fresh = {k: tf.Variable(tf.zeros_like(v)) for k, v in state.items()}
    store.restore_path(tf.train.Checkpoint(**fresh), path)
    before = fresh["w"].read_value()
    fresh["w"].assign_add(tf.ones([8]))
    fresh["m"].assign(fresh["m"] * 3)
    assert before.numpy().tolist() == list(range(8))
    again = write(fresh, tmp_path / "b", "asupervisor")
    reader = tf.train.load_checkpoint(again)
    assert reader.get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE").tolist() == [float(i + 1) for i in range(8)]
    assert reader.get_tensor("m/.ATTRIBUTES/VARIABLE_VALUE").tolist() == [[3.0] * 3] * 2


def keras_state(build: bool, inputs: int = 4, units: int = 8) -> dict[str, Any]:
    """A two-layer MLP (``inputs`` -> ``units`` -> 2) and its Adam, built or not."""
    model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(units), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam(0.01)
    if build:
        optimizer.build(model.trainable_variables)
    return {"model": model, "optimizer": optimizer}


def train_once(state: dict[str, Any]) -> None:
    model, optimizer = state["model"], state["optimizer"]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.ones([2, model.input_shape[-1]])) ** 2)
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


@pytest.mark.parametrize("build", [True, False])
def test_keras_model_and_optimizer(tmp_path: Path, build: bool) -> None:
    """A Keras model and Adam: read directly when the optimizer's variables exist;
    before they do (TF defers its slots until the first apply) TF's restore does it.
    Either way, every value after the first step matches a run that never stopped."""
    keras.utils.set_random_seed(1)
    original = keras_state(build=True)
    train_once(original)
    path = write(original, tmp_path, "asupervisor")
    keras.utils.set_random_seed(2)
    resumed = keras_state(build=build)
    with capture_logs() as events:
        store.restore_path(tf.train.Checkpoint(**resumed), path)
    assert reads(events) == (["direct"] if build else ["tensorflow"])
    if not build:  # the slots TF defers were read and checked ahead of it, not read again
        values = len(tf.train.load_checkpoint(path).get_variable_to_shape_map()) - 1  # all but the object graph
        read = next(e for e in events if e["event"] == "checkpoint.read")
        assert (read["checked_ahead"], read["checked_after"]) == (values, 0)
    train_once(original)
    train_once(resumed)
    for a, b in zip(
        original["model"].weights + original["optimizer"].variables,
        resumed["model"].weights + resumed["optimizer"].variables,
    ):
        assert a.numpy().tobytes() == b.numpy().tobytes()


def test_what_tensorflow_must_restore_goes_to_tensorflow(tmp_path: Path) -> None:
    """Strings, a TF1 optimizer's slot variables, a ``tf.data`` iterator, a value of
    another shape (``strict=False``): TF's restore, with its results."""
    text = {"s": tf.Variable(tf.constant([b"ab", b""])), "x": tf.Variable(1.0)}
    fresh = zeros_like(text)
    with capture_logs() as events:
        store.restore_path(tf.train.Checkpoint(**fresh), write(text, tmp_path / "s", "asupervisor"))
    read = next(e for e in events if e["event"] == "checkpoint.read")
    # nothing deferred: TF's restore read and checked every value; the readers were stopped
    assert (read["how"], read["checked_ahead"], read["checked_after"]) == ("tensorflow", 0, 0)
    assert fresh["s"].numpy().tolist() == [b"ab", b""] and float(fresh["x"]) == 1.0

    var = tf.Variable([1.0, 2.0])
    opt = tf.compat.v1.train.AdamOptimizer(0.1)
    opt.minimize(lambda: tf.reduce_sum(var**2), var_list=[var])
    path = str(tf.train.Checkpoint(v=var, opt=opt).write(str(tmp_path / "v1" / "ck")))
    var2 = tf.Variable([0.0, 0.0])
    opt2 = tf.compat.v1.train.AdamOptimizer(0.1)
    opt2.minimize(lambda: tf.reduce_sum(var2**2), var_list=[var2])
    with capture_logs() as events:
        store.restore_path(tf.train.Checkpoint(v=var2, opt=opt2), path)
    assert reads(events) == ["tensorflow"]
    assert var2.numpy().tolist() == var.numpy().tolist()
    assert opt2.get_slot(var2, "m").numpy().tolist() == opt.get_slot(var, "m").numpy().tolist()

    iterator = iter(tf.data.Dataset.range(10))
    next(iterator)
    path = str(tf.train.Checkpoint(it=iterator, x=tf.Variable(3.0)).write(str(tmp_path / "it" / "ck")))
    iterator2 = iter(tf.data.Dataset.range(10))
    with capture_logs() as events:
        store.restore_path(tf.train.Checkpoint(it=iterator2, x=tf.Variable(0.0)), path, strict=False)
    assert reads(events) == ["tensorflow"] and int(next(iterator2)) == 1

    path = write({"x": tf.Variable([1.0, 2.0])}, tmp_path / "shape", "asupervisor")
    other = tf.Variable([5.0, 6.0, 7.0])
    with capture_logs() as events, pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        store.restore_path(tf.train.Checkpoint(x=other), path, strict=False)
    assert reads(events) == [] and other.numpy().tolist() == [5.0, 6.0, 7.0]  # TF's restore failed


def damage(path: str, how: str) -> None:
    data = Path(f"{path}.data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    if how == "flip":
        raw[-(1 << 20)] ^= 0x01  # inside the last (large) value
        data.write_bytes(bytes(raw))
    else:
        data.write_bytes(bytes(raw[: len(raw) - 4096]))


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_a_damaged_data_file_changes_no_variable(tmp_path: Path, how: str) -> None:
    """One flipped bit in the last value, or the file's last page gone: TF's
    ``DataLossError`` naming the file and the value, raised after every value was read
    and before any variable changed; no reader thread left (the fixture checks)."""
    state = {"a": tf.Variable(tf.range(1000.0)), "b": tf.Variable(tf.random.uniform([1 << 19], seed=5))}
    path = write(state, tmp_path, "asupervisor")
    damage(path, how)
    fresh = {"a": tf.Variable(tf.fill([1000], 7.0)), "b": tf.Variable(tf.fill([1 << 19], 7.0))}
    with pytest.raises(tf.errors.DataLossError) as caught:
        store.restore_path(tf.train.Checkpoint(**fresh), path)
    assert f"{path}.data-00000-of-00001" in str(caught.value)
    assert "b/.ATTRIBUTES/VARIABLE_VALUE" in str(caught.value)
    assert ("checksum" if how == "flip" else "truncated") in str(caught.value)
    assert all(bool(tf.reduce_all(v == 7.0)) for v in fresh.values())


def test_the_variables_adopt_the_arrays_read_without_a_copy(tmp_path: Path) -> None:
    """The reader reads into numpy arrays aligned as TF's tensors are, which TF turns into
    tensors without a copy and the variable adopts: a restore copies the state once (from
    the page cache). A TF that copied them instead would double that; this finds it."""
    path = write({"x": tf.Variable(tf.random.uniform([1 << 20], seed=6))}, tmp_path, "asupervisor")
    fresh = tf.Variable(tf.zeros([1 << 20]))
    checkpoint = tf.train.Checkpoint(x=fresh)
    prefetch = _direct_restore.start(path)
    assert prefetch is not None
    planned = _direct_restore.plan(checkpoint, SavedGraphMatch(checkpoint, prefetch.graph()), prefetch.entries)
    assert planned is not None
    values = prefetch.finish()
    (array,) = [values[p.key] for p in planned if p.variable is fresh]
    assert array.ctypes.data % 64 == 0
    _direct_restore.assign(planned, values)
    array[7] = 42.0  # (never done outside this test: the variable owns the memory now)
    assert fresh.numpy()[7] == 42.0


def test_a_damaged_index_is_a_data_error(tmp_path: Path) -> None:
    """A flipped byte in the index: a data error naming the index (the restore goes on
    to the previous checkpoint), before any variable changes."""
    x = tf.Variable(tf.range(64.0))
    path = write({"x": x}, tmp_path, "asupervisor")
    index = Path(f"{path}.index")
    raw = bytearray(index.read_bytes())
    raw[len(raw) // 3] ^= 0x10
    index.write_bytes(bytes(raw))
    fresh = tf.Variable(tf.zeros([64]))
    with pytest.raises(Exception) as caught:
        store.restore_path(tf.train.Checkpoint(x=fresh), path)
    assert _restore._data_error(caught.value) and str(index) in str(caught.value)
    assert fresh.numpy().tolist() == [0.0] * 64


def test_another_model_is_named_and_reading_stops(tmp_path: Path) -> None:
    """The model check runs on the index while the values are read: a checkpoint of
    another model is a CheckpointError naming the variable, the reader is stopped and
    joined (the fixture checks), nothing changes."""
    path = write({"x": tf.Variable(tf.random.uniform([1 << 20]))}, tmp_path, "asupervisor")
    y = tf.Variable(tf.zeros([3]))
    with pytest.raises(CheckpointError, match="missing from the checkpoint: y/"):
        store.restore_path(tf.train.Checkpoint(y=y, x=tf.Variable(tf.zeros([1 << 20]))), path)
    assert y.numpy().tolist() == [0.0] * 3


def test_a_checkpoint_in_two_data_files_reads_back(tmp_path: Path) -> None:
    """A 72 MB state is written as two data files (a reader thread for each): every
    value comes back, read directly."""
    state = {f"v{i}": tf.Variable(tf.random.uniform([9 << 20], seed=10 + i)) for i in range(2)}
    path = write(state, tmp_path, "asupervisor")
    assert sorted(p.name for p in tmp_path.glob(Path(path).name + ".data-*")) == [
        f"{Path(path).name}.data-00000-of-00002",
        f"{Path(path).name}.data-00001-of-00002",
    ]
    ours, how = restored(state, path, direct=True)
    assert how == ["direct"]
    for want, mine in zip(flat(state), ours):
        assert mine.tobytes() == want.numpy().tobytes()


def test_a_bad_value_tensorflow_defers_is_found_by_the_readers(tmp_path: Path) -> None:
    """A Keras optimizer not built yet (TF defers its slots): one flipped byte in a slot
    is found by the readers that check every value ahead of TF's restore, a
    ``DataLossError`` naming the file and the slot, and no reader is left (the fixture)."""
    keras.utils.set_random_seed(3)
    original = keras_state(build=True)
    train_once(original)
    path = write(original, tmp_path, "asupervisor")
    reader = tf.train.load_checkpoint(path)
    slot = next(
        k
        for k, shape in reader.get_variable_to_shape_map().items()
        if k.startswith("optimizer/_variables/") and shape == [4, 8]
    )
    data = Path(f"{path}.data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    at = raw.find(reader.get_tensor(slot).tobytes())
    assert at >= 0
    raw[at + 5] ^= 0x20
    data.write_bytes(bytes(raw))
    resumed = keras_state(build=False)
    with pytest.raises(tf.errors.DataLossError, match=f"{data}: checksum mismatch for {slot} \\(corrupt data file\\)"):
        store.restore_path(tf.train.Checkpoint(**resumed), path)


def test_a_read_error_names_the_file(tmp_path: Path) -> None:
    """An OS error while reading (here a data file replaced by a directory: ``EISDIR``)
    names the file the OS's own message leaves out, and is a data error (the previous
    checkpoint is tried); no variable changed."""
    x = tf.Variable(tf.range(64.0))
    path = write({"x": x}, tmp_path, "asupervisor")
    data = Path(f"{path}.data-00000-of-00001")
    data.unlink()
    data.mkdir()
    fresh = tf.Variable(tf.zeros([64]))
    with pytest.raises(IsADirectoryError) as caught:
        store.restore_path(tf.train.Checkpoint(x=fresh), path)
    assert caught.value.filename == str(data) and _restore._data_error(caught.value)
    assert fresh.numpy().tolist() == [0.0] * 64


def test_a_restore_matches_the_object_graph_once_for_the_check_and_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model check and the direct read's plan share one walk of the saved object graph
    with the live one (SavedGraphMatch); the save_counter TF's restore creates is added to
    it, so the values are read directly. Two live objects for one saved object: no plan."""
    from asupervisor._checkpoint.snapshot import _graph

    state = {"a": tf.Variable(tf.fill([8], 2.0)), "b": [tf.Variable(3.0)]}
    path = write(state, tmp_path, "asupervisor")
    made: list[_graph.SavedGraphMatch] = []
    real = _graph.SavedGraphMatch

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, checkpoint: Any, graph: Any) -> None:
            made.append(self)
            super().__init__(checkpoint, graph)

    monkeypatch.setattr(_graph, "SavedGraphMatch", Counting)
    fresh = tf.train.Checkpoint(a=tf.Variable(tf.zeros([8])), b=[tf.Variable(0.0)])
    with capture_logs() as events:
        store.restore_path(fresh, path)
    assert reads(events) == ["direct"] and len(made) == 1
    assert float(fresh.b[0]) == 3.0 and float(fresh.save_counter) == 1.0  # from the checkpoint
    live = made[0].live_by_node()
    assert live is not None and any(obj is fresh.save_counter for obj in live.values())

    reader = tf.train.load_checkpoint(path)
    shared = tf.train.Checkpoint(a=tf.Variable(tf.zeros([8])), b=[tf.Variable(0.0)])
    other = real(shared, _restore._object_graph(reader))
    other.pairs.append((other.pairs[1][0], tf.Variable(1.0)))  # a second live object for a node
    assert other.live_by_node() is None
    assert _direct_restore.plan(shared, other, {}) is None
