"""Restoring large values with direct I/O (``_checkpoint/_direct_restore.py``): our writer
places each large value at a block of its data file; a restore reads such a value that
is not in the page cache straight into its array, past the page cache; one that is
cached is read buffered; damage is found as on the buffered path; a filesystem that
refuses direct reads gets buffered ones. Every test drops the files from the page cache
first, so it needs a filesystem whose page cache drops (not tmpfs)."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from checkpoint.test_direct_io import TMP, _page_cache_drops
from checkpoint.test_direct_restore import keras_state, reads, train_once
from pagecache import drop_cached, resident_pages

from asupervisor._checkpoint import store
from asupervisor._checkpoint._manager import Checkpointer
from asupervisor._checkpoint.snapshot._iterator_state import index_entries
from asupervisor._checkpoint.store.fast import _bundle, _direct, _direct_restore
from asupervisor.testing import capture_logs

pytestmark = [
    pytest.mark.usefixtures("no_new_threads"),
    pytest.mark.skipif(not _bundle.available(), reason="google-crc32c's C library is not installed"),
    pytest.mark.skipif(
        not _direct.ENABLED or not _page_cache_drops(TMP),
        reason=f"{TMP} keeps files in memory (tmpfs) or this OS has no O_DIRECT",
    ),
]

BIG = "big/.ATTRIBUTES/VARIABLE_VALUE"
ODD = "odd/.ATTRIBUTES/VARIABLE_VALUE"


def state() -> dict[str, tf.Variable]:
    """Two large values of odd sizes (not whole blocks) and small ones packed between."""
    rng = np.random.default_rng(1)
    return {
        "small": tf.Variable(tf.range(10, dtype=tf.float32)),
        "count": tf.Variable(7, dtype=tf.int64),
        "odd": tf.Variable(rng.random((1 << 18) + 3, np.float32)),  # 1 MiB + 12 bytes
        "big": tf.Variable(tf.cast(rng.random((5 << 19) + 1, np.float32), tf.bfloat16)),  # 5 MiB + 2 bytes
    }


def fresh() -> dict[str, tf.Variable]:
    return {k: tf.Variable(tf.fill(v.shape, tf.constant(7, v.dtype))) for k, v in state().items()}


def written(directory: Path) -> tuple[str, Path]:
    """The checkpoint of :func:`state` (written buffered: a small file), its data file
    dropped from the page cache."""
    saver = Checkpointer(tf.train.Checkpoint(**state()), directory, max_to_keep=2)
    saver.prepare()
    path = saver.write(saver.snapshot(1)).path
    data = Path(f"{path}.data-00000-of-00001")
    drop_cached([str(data)])
    return path, data


def restore(path: str) -> tuple[dict[str, tf.Variable], list[str]]:
    variables = fresh()
    with capture_logs() as events:
        store.restore_path(tf.train.Checkpoint(**variables), path)
    return variables, reads(events)


def cached_pages(path: Path, offset: int, size: int) -> int:
    """How many of the pages wholly inside ``[offset, offset + size)`` of ``path`` are in
    the page cache."""
    return sum(resident_pages(str(path))[-(-offset // mmap.PAGESIZE) : (offset + size) // mmap.PAGESIZE])


def same(variables: dict[str, tf.Variable]) -> bool:
    want = state()
    return all(variables[k].numpy().tobytes() == want[k].numpy().tobytes() for k in want)


def test_large_values_go_at_a_block_and_are_read_past_the_page_cache(tmp_path: Path) -> None:
    """The large values start at a block (the small ones packed back to back); a
    restore with none of the file cached reads them directly into the variables' new
    memory: exact values, and not one of their pages in the page cache after (a buffered
    read would leave them all)."""
    path, data = written(tmp_path)
    entries = index_entries(path)
    assert entries[ODD].offset % _direct.ALIGN == 0 and entries[BIG].offset % _direct.ALIGN == 0
    assert (
        entries["small/.ATTRIBUTES/VARIABLE_VALUE"].offset % _direct.ALIGN != 0
        or entries["count/.ATTRIBUTES/VARIABLE_VALUE"].offset % _direct.ALIGN != 0
    )
    variables, how = restore(path)
    assert how == ["direct"] and same(variables)
    for key in (ODD, BIG):
        # at most the few pages the object graph's buffered read brought in ahead
        assert cached_pages(data, entries[key].offset, entries[key].size) < entries[key].size // mmap.PAGESIZE // 8, key


def test_a_cached_value_is_read_from_the_page_cache(tmp_path: Path) -> None:
    """A large value whose first page is cached is read buffered (from memory, where a
    direct read would go to the disk); the other, not cached, still directly."""
    path, data = written(tmp_path)
    entries = index_entries(path)
    assert entries[BIG].offset < entries[ODD].offset  # (the buffered one last: its read-ahead stays in it)
    fd = os.open(data, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # exactly that page, no read-ahead
        os.pread(fd, 1, entries[ODD].offset)
    finally:
        os.close(fd)
    variables, how = restore(path)
    assert how == ["direct"] and same(variables)
    pages = entries[ODD].size // mmap.PAGESIZE
    assert cached_pages(data, entries[ODD].offset, entries[ODD].size) == pages  # read through the page cache
    assert cached_pages(data, entries[BIG].offset, entries[BIG].size) < entries[BIG].size // mmap.PAGESIZE // 8


def _smaps_field(address: int, field: str) -> str:
    """The ``field`` line's value in ``/proc/self/smaps`` for the mapping holding ``address``."""
    found = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                found = lo <= address < hi
            elif found and head == field:
                return line[len(field) :].strip()
    raise AssertionError(f"no mapping holds {address:#x}")


def huge_kib(address: int) -> int:
    """``AnonHugePages`` (KiB) of the mapping of this process holding ``address``."""
    return int(_smaps_field(address, "AnonHugePages:").split()[0])


def advised_huge(address: int) -> bool:
    """Whether the memory at ``address`` was advised into huge pages (``MADV_HUGEPAGE``:
    the ``hg`` flag of its mapping; ``madvise`` splits a mapping at the range it advises)."""
    return "hg" in _smaps_field(address, "VmFlags:").split()


def memory(variable: tf.Variable) -> int:
    """The address of ``variable``'s memory (a read shares it; ``numpy()`` would copy)."""
    return int(variable.value()._numpy().ctypes.data)


def thp_fallbacks() -> int:
    """How many times this machine's kernel fell back to small pages for a huge page."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == "thp_fault_fallback":
            return int(value)
    return 0


def huge_pages_on() -> bool:
    """Whether the kernel gives transparent huge pages to memory that asks for them."""
    try:
        return "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not huge_pages_on(), reason="this kernel has transparent huge pages off (or none)")
def test_a_value_read_directly_is_in_the_huge_pages_it_fills(tmp_path: Path) -> None:
    """The 5 MiB value read with direct I/O lands in two huge pages (the disk's requests
    then as large as 4 MiB, against ~1 MiB into small pages), and its last, partial 2 MiB
    in small ones (no huge page holds memory the value does not use); the variable holds
    that memory (no copy). Only the whole huge pages the value fills are advised huge."""
    path, _ = written(tmp_path)
    fallbacks = thp_fallbacks()
    variables, how = restore(path)
    assert how == ["direct"] and same(variables)
    address = memory(variables["big"])
    assert address % _direct_restore.HUGE_PAGE == 0
    assert advised_huge(address) and not advised_huge(address + (4 << 20))
    if thp_fallbacks() == fallbacks:  # (else the kernel had no free huge page: small pages, as designed)
        assert huge_kib(address) == 4096
    assert huge_kib(address + (4 << 20)) == 0
    # (the 1 MiB value gets no memory of its own: it lives in malloc's memory, which may
    # be memory numpy advised huge for an earlier large array, so nothing is asserted of it)


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_damage_in_a_value_read_directly_changes_no_variable(tmp_path: Path, how: str) -> None:
    """One flipped bit in the middle of the large value, or the file cut inside it: TF's
    ``DataLossError`` naming the file and the value, and no variable changed."""
    path, data = written(tmp_path)
    big = index_entries(path)[BIG]
    with open(data, "r+b") as f:
        if how == "flip":
            f.seek(big.offset + big.size // 2)
            byte = f.read(1)[0]
            f.seek(big.offset + big.size // 2)
            f.write(bytes([byte ^ 0x04]))
        else:
            f.truncate(big.offset + big.size - 3000)
        os.fsync(f.fileno())
    drop_cached([str(data)])
    variables = fresh()
    with pytest.raises(tf.errors.DataLossError) as caught:
        store.restore_path(tf.train.Checkpoint(**variables), path)
    assert str(data) in str(caught.value) and BIG in str(caught.value)
    assert ("checksum" if how == "flip" else "truncated") in str(caught.value)
    assert all(bool(tf.reduce_all(v == tf.constant(7, v.dtype))) for v in variables.values())


@pytest.mark.parametrize("refused_at", ["open", "read"])
def test_a_filesystem_refusing_direct_reads_gets_buffered_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused_at: str
) -> None:
    """``EINVAL`` for ``O_DIRECT`` (at the open, or at the first read as some FUSE
    filesystems do): the values are read buffered, exactly, with no error; after a refusal
    no other direct read is tried in that restore."""
    path, data = written(tmp_path)
    real_open, real_preadv = os.open, os.preadv
    tries: list[str] = []

    def open_(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_DIRECT and str(file) == str(data):
            tries.append("open")
            if refused_at == "open":
                raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(file, flags, *args, **kwargs)

    def preadv(fd: int, buffers: Any, offset: int, *flags: int) -> int:
        if refused_at == "read" and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            tries.append("read")
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, buffers, offset, *flags)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "preadv", preadv)
    variables, how = restore(path)
    assert how == ["direct"] and same(variables)
    assert tries == (["open"] if refused_at == "open" else ["open", "read"])


def test_the_page_cache_probe_sees_a_page_come_and_go(tmp_path: Path) -> None:
    """:func:`_direct_restore._in_page_cache` tells a cached page from a dropped one
    without reading it (the probe itself leaves the page out)."""
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.write(os.urandom(3 * mmap.PAGESIZE))
        os.fsync(f.fileno())  # clean pages: the kernel drops them
    drop_cached([str(path)])
    fd = os.open(path, os.O_RDONLY)
    try:
        assert not _direct_restore._in_page_cache(fd, mmap.PAGESIZE + 5)
        assert not _direct_restore._in_page_cache(fd, mmap.PAGESIZE + 5)  # still not: the probe reads nothing
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        os.pread(fd, 1, mmap.PAGESIZE + 7)
        assert _direct_restore._in_page_cache(fd, mmap.PAGESIZE + 5)
        assert not _direct_restore._in_page_cache(fd, 2 * mmap.PAGESIZE)
    finally:
        os.close(fd)


def test_values_tensorflow_must_restore_are_checked_and_restored(tmp_path: Path) -> None:
    """A Keras model whose Adam is not built yet (TF defers its slots): TF's restore does
    it, while the readers, which had begun reading the large kernel directly, check every
    value ahead of it through the page cache; after the first step every value matches a
    run that never stopped."""
    import keras

    keras.utils.set_random_seed(1)
    original = keras_state(build=True, inputs=1024, units=512)  # a 2 MiB kernel
    train_once(original)
    saver = Checkpointer(tf.train.Checkpoint(**original), tmp_path, max_to_keep=2)
    saver.prepare()
    path = saver.write(saver.snapshot(1)).path
    drop_cached([str(p) for p in tmp_path.glob("model.ckpt-1.data-*")])
    keras.utils.set_random_seed(2)
    resumed = keras_state(build=False, inputs=1024, units=512)
    with capture_logs() as events:
        store.restore_path(tf.train.Checkpoint(**resumed), path)
    (read,) = [e for e in events if e["event"] == "checkpoint.read"]
    assert read["how"] == "tensorflow" and read["checked_after"] == 0
    assert read["checked_ahead"] == sum(
        1 for e in index_entries(path).values() if e.dtype != tf.string.as_datatype_enum
    )
    train_once(original)
    train_once(resumed)
    for want, got in zip(original["model"].weights, resumed["model"].weights):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
