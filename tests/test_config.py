"""Bad configuration is refused with a clear error naming the bad value."""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf

import asupervisor as asv


def test_logdir_that_is_a_file(tmp_path: Path) -> None:
    """A logdir that is a file is a ValueError naming the path; the file is untouched."""
    target = tmp_path / "notes.txt"
    target.write_text("precious")
    with pytest.raises(ValueError, match=r"notes\.txt"):
        asv.Supervisor(target)
    assert target.read_text() == "precious"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("save_model_secs", -1),
        ("save_summaries_secs", -1),
        ("recovery_wait_secs", -0.5),
        ("stop_grace_secs", float("nan")),
        ("save_model_steps", 0),
        ("max_to_keep", 0),
        ("keep_checkpoint_every_n_hours", -2),
    ],
)
def test_out_of_range_values_name_the_field(field: str, value: object) -> None:
    """Each numeric setting names itself and the bad value in the error."""
    with pytest.raises(ValueError, match=field):
        asv.Supervisor(None, **{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("save_model_secs", "600"),
        ("init_fn", 3),
        ("is_chief", "yes"),
        ("hooks", [object()]),
        ("state", 42),
        ("state", tf.Variable(1.0)),
    ],
)
def test_wrong_types_name_the_field(field: str, value: object) -> None:
    """A wrong type is a TypeError naming the field."""
    with pytest.raises(TypeError, match=field):
        asv.Supervisor(None, **{field: value})  # type: ignore[arg-type]


def test_checkpoint_basename_must_be_a_file_name() -> None:
    """A basename with a path separator is refused."""
    with pytest.raises(ValueError, match="checkpoint_basename"):
        asv.Supervisor(None, checkpoint_basename="a/b")


def test_defaults_follow_tf_supervisor(tmp_path: Path) -> None:
    """Defaults match tf.train.Supervisor's where the concept survives."""
    config = asv.Supervisor(tmp_path).config
    assert config.save_model_secs == 600
    assert config.save_summaries_secs == 120
    assert config.recovery_wait_secs == 30
    assert config.stop_grace_secs == 120
    assert config.checkpoint_basename == "model.ckpt"
    assert config.max_to_keep == 5
    assert config.logdir == tmp_path


@pytest.mark.anyio
async def test_bad_max_steps() -> None:
    """run_loop(max_steps=-1) is a ValueError naming the value."""
    sv = asv.Supervisor(None, handle_signals=False)
    async with sv.managed_session() as sess:
        with pytest.raises(ValueError, match="-1"):
            await sess.run_loop(print, max_steps=-1)


def test_cluster_info_reads_tf_config() -> None:
    """TF_CONFIG decides the chief: the chief task, else worker 0."""
    single = asv.cluster_info({})
    assert single.is_chief and single.num_workers == 1
    cfg = '{"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "task": {"type": "worker", "index": 0}}'
    worker = asv.cluster_info({"TF_CONFIG": cfg})
    assert not worker.is_chief and worker.num_workers == 3 and worker.task_type == "worker"
    cfg2 = '{"cluster": {"worker": ["b:1", "c:1"]}, "task": {"type": "worker", "index": 0}}'
    assert asv.cluster_info({"TF_CONFIG": cfg2}).is_chief
    with pytest.raises(ValueError, match="TF_CONFIG"):
        asv.cluster_info({"TF_CONFIG": "{not json"})
