"""Retention as policy objects: each stock policy's decisions, composition, the
Supervisor keywords that build them, a policy of one's own, and bad input."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor._checkpoint.policy._policies import keep_policy_for

HOUR = 3600.0
K, F, D = asv.Keep.KEEP, asv.Keep.FOREVER, asv.Keep.DROP


def records(*hours: float) -> list[asv.CheckpointRecord]:
    return [asv.CheckpointRecord(f"model.ckpt-{i}", h * HOUR) for i, h in enumerate(hours)]


def test_latest_n_keeps_the_newest() -> None:
    """LatestN(n) keeps the newest n - 1 offered (the latest, not offered, makes n)."""
    assert asv.LatestN(3).decide(records(1, 2, 3, 4), last_forever=0) == [D, D, K, K]
    assert asv.LatestN(1).decide(records(1, 2), last_forever=0) == [D, D]
    assert asv.LatestN(9).decide(records(1, 2), last_forever=0) == [K, K]


def test_every_n_hours_keeps_one_per_period_forever() -> None:
    """EveryNHours keeps, oldest first, one checkpoint at least the period after the last."""
    assert asv.EveryNHours(1).decide(records(0.5, 1.2, 1.5, 2.4), last_forever=0) == [D, F, D, F]
    assert asv.EveryNHours(1).decide(records(0.5, 1.2), last_forever=1.0 * HOUR) == [D, D]


def test_any_keep_policy_composes_keep_before_forever() -> None:
    """AnyKeepPolicy keeps what any policy keeps; only the rest is offered for keeping
    forever — TF's max_to_keep with keep_checkpoint_every_n_hours, exactly."""
    policy = asv.AnyKeepPolicy(asv.LatestN(2), asv.EveryNHours(1))
    assert policy.decide(records(0.5, 1.2, 1.5, 2.4), last_forever=0) == [D, F, D, K]
    assert keep_policy_for(2, 1.0) == policy
    assert isinstance(keep_policy_for(None, None), asv.KeepAll)
    assert keep_policy_for(5, None) == asv.LatestN(5)


def test_bad_policies_are_clear_errors() -> None:
    """Bad arguments name the value; a policy returning the wrong thing is a TypeError."""
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=repr(bad)):
            asv.LatestN(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nan"):
        asv.EveryNHours(float("nan"))
    with pytest.raises(ValueError, match="at least one"):
        asv.AnyKeepPolicy()
    with pytest.raises(TypeError, match="KeepPolicy"):
        asv.AnyKeepPolicy(5)  # type: ignore[arg-type]

    class Short:
        def decide(self, checkpoints: Sequence[asv.CheckpointRecord], *, last_forever: float) -> list[asv.Keep]:
            return []

    with pytest.raises(TypeError, match="one Keep per checkpoint"):
        asv.AnyKeepPolicy(Short()).decide(records(1, 2), last_forever=0)


def test_supervisor_keywords_and_keep_policy() -> None:
    """keep_policy= takes a KeepPolicy; anything else, or giving it with max_to_keep or
    keep_checkpoint_every_n_hours, is a clear error naming the values."""
    asv.Supervisor(None, keep_policy=asv.LatestN(3))
    with pytest.raises(TypeError, match="keep_policy must be a KeepPolicy"):
        asv.Supervisor(None, keep_policy=3)
    with pytest.raises(ValueError, match="not both"):
        asv.Supervisor(None, keep_policy=asv.LatestN(3), max_to_keep=2)
    with pytest.raises(ValueError, match="keep_checkpoint_every_n_hours=1"):
        asv.Supervisor(None, keep_policy=asv.LatestN(3), keep_checkpoint_every_n_hours=1)


@pytest.mark.anyio
async def test_a_users_policy_drives_real_retention(tmp_path: Path) -> None:
    """A policy of one's own decides what stays on disk in a real training: here only
    odd steps beyond the newest two are kept, forever; unmanaged files stay."""

    class KeepOddSteps:
        def decide(self, checkpoints: Sequence[asv.CheckpointRecord], *, last_forever: float) -> list[asv.Keep]:
            return [F if int(r.path.rsplit("-", 1)[1]) % 2 else D for r in checkpoints]

    w = tf.Variable(0.0)
    tf.train.Checkpoint(w=w).write(str(tmp_path / "other-1"))  # not the supervisor's: left alone
    sv = asv.Supervisor(
        tmp_path,
        state={"w": w},
        save_model_secs=0,
        save_model_steps=1,
        keep_policy=asv.AnyKeepPolicy(asv.LatestN(2), KeepOddSteps()),
        handle_signals=False,
        save_summaries_secs=0,
    )
    async with sv.managed_session() as sess:
        for _ in range(6):
            await sess.run(lambda: None)
            await sv.save_now()
    kept = sorted(int(p.name.split("-")[1].split(".")[0]) for p in tmp_path.glob("model.ckpt-*.index"))
    assert kept == [1, 3, 5, 6] and (tmp_path / "other-1.index").exists()


def moment(kind: str, step: int = 0, **kwargs: object) -> asv.SaveMoment:
    return asv.SaveMoment(kind=kind, step=step, **kwargs)  # type: ignore[arg-type]


def test_stock_save_policies_decide_at_their_moments() -> None:
    """EverySteps saves at its multiples, EverySeconds at ticks, OnStartup after an init
    only, OnStop at the stop (in multi-worker only for an agreed stop); AnySavePolicy
    asks at the union of their moments."""
    assert asv.EverySteps(50).should_save(moment("step", 100)) and not asv.EverySteps(50).should_save(
        moment("step", 75)
    )
    assert asv.EverySeconds(5).should_save(moment("tick")) and not asv.EverySeconds(5).should_save(moment("stop"))
    assert asv.OnStartup().should_save(moment("startup")) and not asv.OnStartup().should_save(
        moment("startup", restored=True)
    )
    assert asv.OnStop().should_save(moment("stop", stop_reason="signal:SIGTERM"))
    assert not asv.OnStop().should_save(moment("stop", stop_reason="signal:SIGTERM", multi_worker=True))
    assert asv.OnStop().should_save(moment("stop", stop_reason="max_steps", multi_worker=True))
    combined = asv.AnySavePolicy(asv.EverySteps(40), asv.EverySteps(60), asv.EverySeconds(9), asv.EverySeconds(3))
    assert combined.every_steps == 20 and combined.every_secs == 3.0
    assert combined.should_save(moment("step", 120)) and not combined.should_save(moment("step", 20))
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match=repr(bad)):
            asv.EverySteps(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="SavePolicy"):
        asv.AnySavePolicy(asv.LatestN(2))  # type: ignore[arg-type]


def test_save_policy_keyword_is_validated() -> None:
    """save_policy= takes a SavePolicy; anything else, or giving it with save_model_secs
    or save_model_steps, is a clear error naming the values."""
    asv.Supervisor(None, save_policy=asv.EverySteps(10))
    with pytest.raises(TypeError, match="save_policy must be a SavePolicy"):
        asv.Supervisor(None, save_policy="often")
    with pytest.raises(ValueError, match="save_model_steps=5"):
        asv.Supervisor(None, save_policy=asv.EverySteps(10), save_model_steps=5)


@pytest.mark.anyio
async def test_a_users_save_policy_drives_real_saves(tmp_path: Path) -> None:
    """A policy of one's own decides which checkpoints are taken in a real training: asked
    at its every_steps multiples, at start-up and at the stop, never at other steps."""
    asked: list[tuple[str, int]] = []

    class OddHundreds:
        every_steps = 100

        def should_save(self, moment: asv.SaveMoment) -> bool:
            asked.append((moment.kind, moment.step))
            return moment.kind == "step" and (moment.step // 100) % 2 == 1

    sv = asv.Supervisor(
        tmp_path, state={"w": tf.Variable(0.0)}, save_policy=OddHundreds(), handle_signals=False, save_summaries_secs=0
    )
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: None, max_steps=550)
    saved = sorted(int(p.name.split("-")[1].split(".")[0]) for p in tmp_path.glob("model.ckpt-*.index"))
    assert saved == [100, 300, 500]
    assert asked == [("startup", 0), *(("step", s) for s in (100, 200, 300, 400, 500)), ("stop", 550)]
