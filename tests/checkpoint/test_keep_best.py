"""KeepBest: retention keeps the best checkpoints by a metric each checkpoint records.

Decisions on records (ranking, ties, missing metrics, validation), and real trainings
into a real logdir: each checkpoint records the step function's ``loss`` in its own
files (fast and plain store), retention keeps the best, and a restarted supervisor ranks
the checkpoints of the earlier run by what they recorded.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor._checkpoint.snapshot._metrics import METRICS_KEY, decode

K, D = asv.Keep.KEEP, asv.Keep.DROP


def records(*losses: float | None, name: str = "val_loss") -> list[asv.CheckpointRecord]:
    return [
        asv.CheckpointRecord(f"model.ckpt-{i}", float(i), {} if loss is None else {name: loss})
        for i, loss in enumerate(losses)
    ]


def test_keep_best_keeps_the_best_n_by_its_metric() -> None:
    """min keeps the lowest, max the highest; n of them; the rest are dropped."""
    assert asv.KeepBest("val_loss").decide(records(3.0, 1.0, 2.0), last_forever=0) == [D, K, D]
    assert asv.KeepBest("val_loss", n=2).decide(records(3.0, 1.0, 2.0), last_forever=0) == [D, K, K]
    assert asv.KeepBest("val_loss", mode="max").decide(records(3.0, 1.0, 2.0), last_forever=0) == [K, D, D]
    assert asv.KeepBest("val_loss", n=5).decide(records(3.0, 1.0), last_forever=0) == [K, K]
    assert asv.KeepBest("val_loss").decide([], last_forever=0) == []


def test_ties_go_to_the_newer_and_missing_or_nan_is_never_best() -> None:
    """Of equal values the newer is kept; a record without the metric, or with NaN, is
    dropped even when nothing else has it."""
    assert asv.KeepBest("val_loss").decide(records(1.0, 2.0, 1.0), last_forever=0) == [D, D, K]
    assert asv.KeepBest("val_loss", n=2).decide(records(None, math.nan, 5.0), last_forever=0) == [D, D, K]
    assert asv.KeepBest("val_loss").decide(records(None, math.nan), last_forever=0) == [D, D]
    assert asv.KeepBest("accuracy").decide(records(1.0, 2.0), last_forever=0) == [D, D]


def test_combined_with_latest_n_it_keeps_recent_and_best() -> None:
    """AnyKeepPolicy(LatestN(2), KeepBest(...)): the newest one offered (with the latest,
    two) and the best."""
    policy = asv.AnyKeepPolicy(asv.LatestN(2), asv.KeepBest("val_loss"))
    assert policy.decide(records(0.5, 3.0, 2.0, 4.0), last_forever=0) == [K, D, D, K]


def test_records_made_the_old_way_have_no_metrics() -> None:
    """CheckpointRecord(path, time) still works, with empty metrics, and stays hashable."""
    record = asv.CheckpointRecord("model.ckpt-1", 1.0)
    assert dict(record.metrics) == {} and hash(record) == hash(asv.CheckpointRecord("model.ckpt-1", 1.0, {"a": 1.0}))


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"metric": ""}, "''"),
        ({"metric": 3}, "3"),
        ({"metric": "loss", "mode": "lowest"}, "'lowest'"),
        ({"metric": "loss", "n": 0}, "0"),
        ({"metric": "loss", "n": 1.5}, "1.5"),
        ({"metric": "loss", "n": True}, "True"),
    ],
)
def test_bad_arguments_name_the_value(kwargs: dict[str, object], named: str) -> None:
    """A bad metric, mode or n is a ValueError naming the value."""
    with pytest.raises(ValueError, match=f"KeepBest.*{named}"):
        asv.KeepBest(**kwargs)  # type: ignore[arg-type]


def steps_on_disk(logdir: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1].split(".")[0]) for p in logdir.glob("model.ckpt-*.index"))


async def train(logdir: Path, losses: list[float], store: str, **kwargs: object) -> asv.Supervisor:
    """One step per loss (the step returns it), each followed by a checkpoint."""
    sv = asv.Supervisor(
        logdir,
        state={"w": tf.Variable(1.0)},
        save_model_secs=0,
        checkpoint_store=store,
        handle_signals=False,
        save_summaries_secs=0,
        **kwargs,  # type: ignore[arg-type]
    )
    async with sv.managed_session() as sess:
        for loss in losses:
            await sess.run(lambda loss=loss: {"loss": tf.constant(loss), "label": tf.constant("not a metric")})
            await sv.save_now()
    return sv


@pytest.mark.anyio
@pytest.mark.parametrize("store", ["fast", "plain"])
async def test_retention_keeps_the_best_on_disk_and_after_a_restart(tmp_path: Path, store: str) -> None:
    """Each checkpoint records the step's loss in its own files; KeepBest keeps the
    lowest besides the latest. A restarted supervisor ranks the earlier run's
    checkpoints by what they recorded (read back from their files)."""
    await train(tmp_path, [5.0, 1.0, 3.0, 2.0, 4.0], store, keep_policy=asv.KeepBest("loss"))
    assert steps_on_disk(tmp_path) == [2, 5]  # the best (loss 1) and the latest
    recorded = tf.train.load_checkpoint(str(tmp_path / "model.ckpt-2")).get_tensor(METRICS_KEY)
    assert decode(recorded) == {"loss": 1.0}

    await train(tmp_path, [1.5, 0.5], store, keep_policy=asv.KeepBest("loss"))
    assert steps_on_disk(tmp_path) == [2, 7]  # 2 (loss 1, read back from the first run) beat 6 (1.5)
    await train(tmp_path, [9.0], store, keep_policy=asv.KeepBest("loss"))
    assert steps_on_disk(tmp_path) == [7, 8]


@pytest.mark.anyio
async def test_a_restart_reads_the_metrics_of_earlier_checkpoints(tmp_path: Path) -> None:
    """A checkpoint of an earlier run kept by LatestN is ranked by KeepBest in the next
    run: its metric was read back from its files, not lost with the process."""
    await train(tmp_path, [2.0, 1.0, 3.0], "auto", max_to_keep=3)
    assert steps_on_disk(tmp_path) == [1, 2, 3]
    await train(tmp_path, [4.0], "auto", keep_policy=asv.KeepBest("loss", n=2))
    assert steps_on_disk(tmp_path) == [1, 2, 4]  # 2 (1.0) and 1 (2.0) are the best of 1..3


@pytest.mark.anyio
async def test_checkpoints_without_the_metric_are_dropped_and_still_restore(tmp_path: Path) -> None:
    """A step without scalar outputs records nothing; such checkpoints are never best,
    and a checkpoint with metrics restores in plain TensorFlow."""
    w = tf.Variable(1.0)

    def no_outputs() -> None:
        w.assign_add(1.0)

    sv = asv.Supervisor(
        tmp_path, state={"w": w}, save_model_secs=0, keep_policy=asv.KeepBest("loss"), handle_signals=False
    )
    async with sv.managed_session() as sess:
        for _ in range(3):
            await sess.run(no_outputs)
            await sv.save_now()
        assert steps_on_disk(tmp_path) == [3]  # 1 and 2 had no loss: dropped
        assert not tf.train.load_checkpoint(str(tmp_path / "model.ckpt-3")).has_tensor(METRICS_KEY)
        await sess.run(lambda: {"loss": w.assign_add(1.0)})
        await sv.save_now()
    assert steps_on_disk(tmp_path) == [4]
    restored = tf.Variable(0.0)
    tf.train.Checkpoint(w=restored).restore(str(tmp_path / "model.ckpt-4")).assert_existing_objects_matched()
    assert restored.numpy() == 5.0
