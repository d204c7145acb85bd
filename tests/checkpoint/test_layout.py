"""Where the values lie in a checkpoint's data files: the small ones (the object-graph
proto, scalars) first, so that a cold restore, which reads the proto before any variable
to match the model, finds it in the file's first pages and then reads on sequentially
(the kernel's own read-ahead streams the rest)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from asupervisor._checkpoint._manager import Checkpointer
from asupervisor._checkpoint.snapshot._iterator_state import index_entries
from asupervisor._checkpoint.store.plain import _write

pytestmark = pytest.mark.usefixtures("no_new_threads")

_PROTO = "_CHECKPOINTABLE_OBJECT_GRAPH"


def _state(big_elements: int, bigs: int) -> dict[str, tf.Variable]:
    """Large float tensors made before the small values, as a model's weights usually are."""
    state = {f"w{i}": tf.Variable(tf.random.uniform([big_elements], seed=i)) for i in range(bigs)}
    state.update(
        bias=tf.Variable(tf.range(100, dtype=tf.float32)),
        step=tf.Variable(12, dtype=tf.int64),
        name=tf.Variable(b"run-7"),  # a string: written by the native writer too
        empty=tf.Variable(tf.zeros([0, 4])),
    )
    return state


@pytest.mark.parametrize(
    ("big_elements", "bigs"),
    [
        pytest.param(3 << 20, 2, id="one-file-buffered"),  # 24 MB: written buffered
        pytest.param(9 << 20, 4, id="sharded-direct"),  # 144 MB: shards of 36 MB or more, direct where taken
    ],
)
def test_small_values_lie_before_the_large_ones_in_every_data_file(
    tmp_path: Path, big_elements: int, bigs: int
) -> None:
    state = _state(big_elements, bigs)
    checkpointer = Checkpointer(tf.train.Checkpoint(**state), tmp_path, staging=True)
    checkpointer.prepare()
    for step in (1, 2):  # the copy-on-write first save and a staged one
        snap = checkpointer.snapshot(step)
        assert snap is not None
        path = checkpointer.write(snap).path
        checkpointer.prepare_next(snap)
        del snap
        entries = index_entries(path)
        by_file: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
        for key, entry in entries.items():
            by_file[entry.shard_id].append((entry.offset, entry.size, key))
        for shard, placed in by_file.items():
            sizes = [size for _, size, _ in sorted(placed)]
            first_large = next((i for i, size in enumerate(sizes) if size >= _write._SMALL_FIRST), len(sizes))
            assert all(size < _write._SMALL_FIRST for size in sizes[:first_large]), (step, shard, sorted(placed))
            assert all(size >= _write._SMALL_FIRST for size in sizes[first_large:]), (step, shard, sorted(placed))
        assert entries[_PROTO].offset < 4096, entries[_PROTO]
    fresh = {k: tf.Variable(tf.zeros_like(v)) for k, v in state.items()}
    tf.train.Checkpoint(**fresh).restore(path).assert_consumed()
    for key, variable in state.items():
        assert np.array_equal(fresh[key].numpy(), variable.numpy()), key
