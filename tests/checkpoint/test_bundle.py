"""Our tensor-bundle writer: plain TensorFlow reads what it writes, checksums included."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest
import tensorflow as tf

from asupervisor._checkpoint.snapshot import _snapshot
from asupervisor._checkpoint.snapshot._iterator_state import index_entries
from asupervisor._checkpoint.store.fast import _bundle
from asupervisor._checkpoint.store.plain import _write

pytestmark = [
    pytest.mark.usefixtures("no_new_threads"),
    pytest.mark.skipif(not _bundle.available(), reason="google-crc32c's C library is not installed"),
]


def varied_state() -> dict[str, Any]:
    """Every dtype the writer handles, odd shapes, and many small variables."""
    return {
        "f32": tf.Variable(tf.random.uniform([37, 5], seed=1)),
        "f64": tf.Variable(tf.random.uniform([3], dtype=tf.float64, seed=2)),
        "f16": tf.Variable(tf.constant([1.5, -2.25], tf.float16)),
        "bf16": tf.Variable(tf.constant([0.5, 3.0, -1.0], tf.bfloat16)),
        "i8": tf.Variable(tf.constant([-3, 7], tf.int8)),
        "u8": tf.Variable(tf.constant([[1, 255]], tf.uint8)),
        "i16": tf.Variable(tf.constant([-300], tf.int16)),
        "u16": tf.Variable(tf.constant([65000], tf.uint16)),
        "i32": tf.Variable(tf.constant([[1, -2], [3, 4]], tf.int32)),
        "u32": tf.Variable(tf.constant([4_000_000_000], tf.uint32)),
        "i64": tf.Variable(tf.constant(-(2**40), tf.int64)),
        "u64": tf.Variable(tf.constant([2**63], tf.uint64)),
        "c64": tf.Variable(tf.constant([1 + 2j], tf.complex64)),
        "c128": tf.Variable(tf.constant([3 - 4j], tf.complex128)),
        "flag": tf.Variable(True),
        "empty": tf.Variable(tf.zeros([0, 4])),
        "strings": tf.Variable(tf.constant([b"", b"a\x00b", "\u00e9t\u00e9".encode()])),
        "scalars": [tf.Variable(float(i), name=f"s{i}") for i in range(300)],
    }


def zeros_like(state: dict[str, Any]) -> dict[str, Any]:
    return {
        k: [tf.Variable(0.0) for _ in v] if isinstance(v, list) else tf.Variable(tf.zeros_like(v))
        for k, v in state.items()
    }


def flat(state: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for v in state.values():
        out.extend(v if isinstance(v, list) else [v])
    return out


def write(state: dict[str, Any], prefix: Path, shards: int = 1) -> _snapshot.Snapshot:
    snap = _snapshot.take_snapshot(tf.train.Checkpoint(**state), 1)
    assert all(_bundle.encodable(t, s) for t, s in zip(snap.tensors, snap.slices))
    groups = [list(range(j, len(snap.keys), shards)) for j in range(shards)]
    _bundle.write_bundle(str(prefix), snap.keys, snap.tensors, groups)
    return snap


@pytest.mark.parametrize("shards", [1, 3])
def test_plain_tf_restores_every_handled_dtype(tmp_path: Path, shards: int) -> None:
    """Checkpoint.restore of our bundle (1 or 3 data files) matches every object and value."""
    state = varied_state()
    write(state, tmp_path / "ckpt", shards)
    data = sorted(n for n in os.listdir(tmp_path) if ".data-" in n)
    assert data == [f"ckpt.data-{j:05d}-of-{shards:05d}" for j in range(shards)]
    fresh = zeros_like(state)
    tf.train.Checkpoint(**fresh).restore(str(tmp_path / "ckpt")).assert_consumed()
    for a, b in zip(flat(state), flat(fresh)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a.numpy(), b.numpy())


def test_load_checkpoint_reads_the_same_as_from_save_v2(tmp_path: Path) -> None:
    """tf.train.load_checkpoint sees the same keys, shapes, dtypes and values as in SaveV2's files."""
    state = varied_state()
    snap = write(state, tmp_path / "ours")
    _write._save_v2(snap, str(tmp_path / "tf"), [list(range(len(snap.keys)))])
    ours, theirs = tf.train.load_checkpoint(str(tmp_path / "ours")), tf.train.load_checkpoint(str(tmp_path / "tf"))
    assert ours.get_variable_to_shape_map() == theirs.get_variable_to_shape_map()
    assert ours.get_variable_to_dtype_map() == theirs.get_variable_to_dtype_map()
    for key in theirs.get_variable_to_shape_map():
        assert np.array_equal(ours.get_tensor(key), theirs.get_tensor(key)), key
    # the object graph is a string tensor in TF's encoding, read back byte for byte
    assert ours.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH") == theirs.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")


_LARGE = (1 << 31) + (3 << 20)  # a tensor over 2 GiB, not a multiple of the write piece


def _large_room(directory: Path) -> str | None:
    """Why a >2 GiB shard cannot be tested here, or ``None``."""
    free = shutil.disk_usage(directory).free
    if free < 3 * _LARGE:
        return f"{free >> 20} MiB free in {directory}: a >2 GiB shard twice needs {3 * _LARGE >> 20} MiB"
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return "no /proc/meminfo to tell whether 10 GiB of memory are free"
    if available < 5 * _LARGE:
        return f"{available >> 20} MiB of memory available: the comparison needs {5 * _LARGE >> 20} MiB"
    return None


_LARGE_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
_NO_LARGE_ROOM = _large_room(_LARGE_DIR)


@pytest.mark.timeout(240)  # 4 GiB written and 2 GiB read back: ~20 s alone, ~45 s beside another test
@pytest.mark.skipif(_NO_LARGE_ROOM is not None, reason=f"machine limit: {_NO_LARGE_ROOM}")
def test_a_shard_over_2_gib_reads_back_as_save_v2s() -> None:
    """A data file over 2 GiB (a tensor larger than 2 GiB, and tensors placed after it, at
    offsets past 2^31): TF reads back from ours what it reads from SaveV2's, value for value,
    and the index entries agree on dtype, shape, size and checksum."""
    work = Path(tempfile.mkdtemp(prefix="asv-large-", dir=_LARGE_DIR))
    try:
        big = tf.constant(np.resize(np.arange(251, dtype=np.uint8), _LARGE))  # no page equals another
        values = {"a_small": tf.constant([1.5, -2.0]), "b_big": big, "c_after": tf.range(1000, dtype=tf.int64)}
        keys = list(values)
        tensors = [values[k] for k in keys]
        _bundle.write_bundle(str(work / "ours"), keys, tensors, [[1, 2, 0]])  # the big one first: the rest past 2 GiB
        snap = _snapshot.Snapshot(1, keys, [""] * len(keys), tensors, 0.0, 0.0)
        _write._save_v2(snap, str(work / "tf"), [[0, 1, 2]])
        assert os.path.getsize(_bundle.data_path(str(work / "ours"), 0, 1)) > 1 << 31
        ours_entries, theirs_entries = index_entries(str(work / "ours")), index_entries(str(work / "tf"))
        assert ours_entries["c_after"].offset > 1 << 31
        for key in keys:
            a, b = ours_entries[key], theirs_entries[key]
            assert (a.dtype, a.shape, a.size, a.crc32c) == (b.dtype, b.shape, b.size, b.crc32c), key
        small = {k: v.numpy() for k, v in values.items() if k != "b_big"}
        del big, values, tensors, snap
        # TF's reader checks every value against its entry's checksum, equal to SaveV2's
        # above: reading ours back is reading SaveV2's bytes (a 2 GiB read spared)
        ours = tf.train.load_checkpoint(str(work / "ours"))
        for key, want in small.items():
            assert np.array_equal(ours.get_tensor(key), want), key
        got = ours.get_tensor("b_big")
        assert got.shape == (_LARGE,) and got.dtype == np.uint8
        for start in (0, (1 << 31) - 7, _LARGE - 300):  # the pattern, across the 2 GiB mark too
            assert np.array_equal(got[start : start + 300], (np.arange(start, start + 300) % 251).astype(np.uint8))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_index_over_several_table_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index larger than one table block (here 100 bytes) is read through its block index."""
    monkeypatch.setattr(_bundle, "_BLOCK_SIZE", 100)
    state = varied_state()
    write(state, tmp_path / "ckpt")
    fresh = zeros_like(state)
    tf.train.Checkpoint(**fresh).restore(str(tmp_path / "ckpt")).assert_consumed()
    assert [float(v) for v in fresh["scalars"]] == [float(i) for i in range(300)]


@pytest.mark.parametrize("where", ["data", "index"])
def test_tensorflow_detects_a_flipped_byte(tmp_path: Path, where: str) -> None:
    """TF's reader checks our checksums: one flipped byte in the data or the index is an error."""
    big = tf.Variable(tf.random.uniform([1000], seed=3))
    write({"big": big}, tmp_path / "ckpt")
    path = tmp_path / ("ckpt.data-00000-of-00001" if where == "data" else "ckpt.index")
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 if where == "index" else 100] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises((tf.errors.DataLossError, tf.errors.OpError, ValueError)):
        tf.train.Checkpoint(big=tf.Variable(tf.zeros([1000]))).restore(str(tmp_path / "ckpt")).assert_consumed()


def test_variant_tensors_are_left_to_save_v2_and_merged(tmp_path: Path) -> None:
    """A tf.data iterator's state (a variant tensor) is not ours to write: SaveV2 writes it,
    our writer the rest, and one merged checkpoint restores both."""
    it = iter(tf.data.Dataset.range(10))
    next(it)
    big = tf.Variable(tf.random.uniform([1000], seed=4))
    ckpt = tf.train.Checkpoint(it=it, w=big)
    snap = _snapshot.take_snapshot(ckpt, 1)
    assert [_bundle.encodable(t, s) for t, s in zip(snap.tensors, snap.slices)].count(False) == 1
    _write.write_snapshot(snap, str(tmp_path / "ckpt"), native=_bundle)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.data-00000-of-00002", "ckpt.data-00001-of-00002", "ckpt.index"]
    it2 = iter(tf.data.Dataset.range(10))
    fresh = tf.Variable(tf.zeros([1000]))
    tf.train.Checkpoint(it=it2, w=fresh).restore(str(tmp_path / "ckpt")).assert_consumed()
    assert int(next(it2)) == 1 and np.array_equal(fresh.numpy(), big.numpy())


def _file_crc(path: Path) -> int:
    return int(google_crc32c.value(path.read_bytes()))


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
def test_the_writer_sums_each_file_from_the_bytes_it_wrote(tmp_path: Path, direct: bool) -> None:
    """Asked for checksums, the writer returns each file's size and CRC32C, computed from
    the bytes in memory, equal to the file's: strings, empty and scalar values, and the
    zeros before a large value placed at an aligned offset, in two data files."""
    state = varied_state()
    state["big"] = tf.Variable(tf.random.uniform([700_000], seed=5))  # 2.8 MB: placed at a block
    snap = _snapshot.take_snapshot(tf.train.Checkpoint(**state), 1)
    groups = [list(range(j, len(snap.keys), 2)) for j in range(2)]
    sums = _bundle.write_bundle(str(tmp_path / "ckpt"), snap.keys, snap.tensors, groups, direct=direct, checksums=True)
    files = {p.name[len("ckpt") :]: p for p in tmp_path.iterdir()}
    assert sorted(sums) == sorted(files) == [".data-00000-of-00002", ".data-00001-of-00002", ".index"]
    for suffix, (size, crc) in sums.items():
        assert (size, crc) == (files[suffix].stat().st_size, _file_crc(files[suffix])), suffix
    assert _bundle.write_bundle(str(tmp_path / "again"), snap.keys, snap.tensors, groups) == {}


def test_a_merged_checkpoint_carries_the_sums_of_the_native_writers_files(tmp_path: Path) -> None:
    """With a value SaveV2 must write (a tf.data iterator), MergeV2Checkpoints renames the
    native writer's data file: its sum is carried under the new name; the files TF wrote
    (its data file, the merged index) are not summed."""
    it = iter(tf.data.Dataset.range(10))
    next(it)
    ckpt = tf.train.Checkpoint(it=it, w=tf.Variable(tf.random.uniform([1000], seed=4)))
    snap = _snapshot.take_snapshot(ckpt, 1)
    sums = _write.write_snapshot(snap, str(tmp_path / "ckpt"), native=_bundle, checksums=True)
    assert list(sums) == [".data-00000-of-00002"]
    size, crc = sums[".data-00000-of-00002"]
    data = tmp_path / "ckpt.data-00000-of-00002"
    assert (size, crc) == (data.stat().st_size, _file_crc(data))


def test_the_self_check_passes_with_this_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the TensorFlow and google-crc32c installed here, TF's reader reads back what the
    writer writes: the first-use self-check passes, silently."""
    from asupervisor.testing import capture_logs

    monkeypatch.setattr(_bundle, "_checked", [])
    with capture_logs() as logs:
        assert _bundle.self_check()
    assert logs == []


def test_a_broken_writer_falls_back_to_save_v2_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the writer's files no longer read back (here: its checksum masking broken, as a
    google-crc32c or TensorFlow change could do), the self-check says so once and every
    save of the process goes through SaveV2: the checkpoints still restore."""
    from asupervisor.testing import capture_logs

    monkeypatch.setattr(_bundle, "_checked", [])
    monkeypatch.setattr(_bundle, "_mask", lambda crc: crc ^ 0x5A5A5A5A)
    state = {"v": tf.Variable(tf.range(10.0)), "s": tf.Variable(b"text")}
    with capture_logs() as logs:
        for step in (1, 2):
            snap = _snapshot.take_snapshot(tf.train.Checkpoint(**state), step)
            _write.write_snapshot(snap, str(tmp_path / f"ckpt-{step}"), native=_bundle)
    assert [e["event"] for e in logs] == ["checkpoint.native_writer_off"]
    assert "checksum" in logs[0]["why"].lower() or "corrupt" in logs[0]["why"].lower(), logs[0]
    fresh = {"v": tf.Variable(tf.zeros([10])), "s": tf.Variable(b"")}
    tf.train.Checkpoint(**fresh).restore(str(tmp_path / "ckpt-2")).assert_consumed()
    assert fresh["v"].numpy().tolist() == list(range(10)) and fresh["s"].numpy() == b"text"


def test_the_self_check_clears_what_a_killed_process_left(tmp_path: Path) -> None:
    """A process SIGKILLed during its self-check leaves ``asv-bundle-check-<pid>-*`` in
    the temporary directory; the next self-check removes those of processes that are
    gone, and keeps those of running ones."""
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    root = Path(tempfile.gettempdir())
    stale = root / f"asv-bundle-check-{gone.pid}-x1y2z3ab"
    running = root / f"asv-bundle-check-{os.getppid()}-x1y2z3ab"
    for directory in (stale, running):
        directory.mkdir()
        (directory / "check.index").write_bytes(b"left over")
    try:
        assert _bundle._run_self_check()
        assert not stale.exists()
        assert (running / "check.index").read_bytes() == b"left over"
    finally:
        shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(running, ignore_errors=True)
