"""Multi-worker saving: distributed variables in snapshots, the non-chief's temporary saves.

The two-process tests start real ``MultiWorkerMirroredStrategy`` workers
(``scripts/mw_train.py``) on localhost ports; the others run in this process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf

from asupervisor._checkpoint import restore_path, take_snapshot, write_snapshot

pytestmark = pytest.mark.usefixtures("no_new_threads")


def test_snapshot_of_strategy_variables_is_read_at_the_boundary(tmp_path: Path) -> None:
    """Keras and tf.Variables made under a strategy are read when snapshotted, not when written.

    Keras 3 hands TF's checkpoint walk the distributed variable itself; the snapshot must
    read it there (a SyncOnRead read is a collective in multi-worker training), so updates
    after the snapshot do not leak into the checkpoint. The model check then matches
    variables TF wraps for saving, so the checkpoint restores.
    """
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        dense = tf.keras.layers.Dense(2, kernel_initializer="ones")
        dense.build((None, 3))
        mean = tf.keras.metrics.Mean()
        total = tf.Variable(
            5.0, synchronization=tf.VariableSynchronization.ON_READ, aggregation=tf.VariableAggregation.SUM
        )
    mean.update_state(4.0)
    ckpt = tf.train.Checkpoint(dense=dense, mean=list(mean.variables), total=total)
    snap = take_snapshot(ckpt, 1)
    assert all(isinstance(t, tf.Tensor) for t in snap.tensors)
    dense.kernel.assign(tf.fill([3, 2], 7.0))  # after the boundary: not in the checkpoint
    mean.update_state(10.0)
    total.assign(9.0)
    write_snapshot(snap, str(tmp_path / "ckpt-1"))
    restore_path(ckpt, str(tmp_path / "ckpt-1"))
    assert dense.kernel.numpy().tolist() == [[1.0, 1.0]] * 3
    assert float(mean.result()) == 4.0
    assert float(total.read_value()) == 5.0
