"""``run_loop(on_divergence=asv.Rollback(...))``: a planted NaN (or spike) in the data is
rolled back to the last good checkpoint, its data window skipped, and the training ends
bitwise where a run that never saw that window ends; no checkpoint ever holds a diverged
state; past ``max_retries`` the error propagates; bad settings are refused by name."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from _backends import in_turn

import asupervisor as asv
from asupervisor.testing import ManualClock, capture_logs

pytestmark = pytest.mark.anyio

N = 30  # elements of the dataset; one per step


def _dataset(planted: dict[int, float]) -> tf.data.Dataset:
    """Element ``i`` is ``(x, y)``, a function of ``i`` alone; ``x`` of element ``i`` is
    multiplied by ``planted[i]`` (NaN: a NaN loss; 1e4: a spike)."""
    keys = tf.constant(list(planted) or [-1], dtype=tf.int64)
    factors = tf.constant(list(planted.values()) or [1.0], dtype=tf.float32)

    def element(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        f = tf.cast(tf.stack([i % 7, i % 5, i % 3, 1]), tf.float32) / 7.0
        hit = tf.equal(keys, i)
        factor = tf.reduce_sum(tf.where(hit, factors, 0.0)) + tf.cast(~tf.reduce_any(hit), tf.float32)
        return f * factor, tf.cast(i % 4, tf.float32) / 4.0

    return tf.data.Dataset.range(N).map(element)


def _model() -> tuple[dict[str, tf.Variable], Any]:
    """A linear model with momentum, and its step (eager, elementwise: deterministic)."""
    state = {
        "w": tf.Variable([0.1, -0.2, 0.3, 0.0], name="w"),
        "m": tf.Variable(tf.zeros([4]), name="m"),
    }

    def step(batch: tuple[tf.Tensor, tf.Tensor]) -> dict[str, tf.Tensor]:
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.square(tf.reduce_sum(x * state["w"]) - y)
        grad = tape.gradient(loss, state["w"])
        state["m"].assign(0.9 * state["m"] + grad)
        state["w"].assign_sub(0.05 * state["m"])
        return {"loss": loss}

    return state, step


async def _train(
    logdir: Path, data: tf.data.Dataset, max_steps: int, *, by_hook: bool = False, **run: Any
) -> tuple[dict[str, np.ndarray], Any]:
    """Train to ``max_steps``, saving every 4 steps (``by_hook``: only a
    ``CheckpointSaverHook`` saves, from inside the step's ``after_run``)."""
    state, step = _model()
    saving: dict[str, Any] = {"save_model_steps": 4}
    if by_hook:
        saving = {"hooks": [asv.CheckpointSaverHook(str(logdir), save_steps=4)]}
    sv = asv.Supervisor(
        logdir,
        state=state,
        save_model_secs=0,
        save_summaries_secs=0,
        handle_signals=False,
        recovery_wait_secs=0,
        clock=ManualClock(),
        **saving,
    )
    async with sv.managed_session() as sess:
        await sess.run_loop(step, data=data, max_steps=max_steps, **run)
    return {name: v.numpy() for name, v in state.items()}, sv


def _checkpoints_are_finite(logdir: Path) -> list[int]:
    """The steps of the committed checkpoints, each checked to hold finite weights only."""
    steps = []
    for index in sorted(logdir.glob("model.ckpt-*.index")):
        prefix = str(index)[: -len(".index")]
        reader = tf.train.load_checkpoint(prefix)
        for key in ("w/.ATTRIBUTES/VARIABLE_VALUE", "m/.ATTRIBUTES/VARIABLE_VALUE"):
            assert np.all(np.isfinite(reader.get_tensor(key))), (prefix, key)
        steps.append(int(prefix.rsplit("-", 1)[1]))
    return sorted(steps)


@pytest.mark.parametrize(
    ("anyio_backend", "planted", "rollback", "restored", "kept", "resumed", "by_hook"),
    in_turn(
        [
            # NaN at step 10 (element 9), found at step 12's checkpoint: back to step 8, steps
            # 9-10's batches (elements 8, 9) dropped
            ({9: math.nan}, asv.Rollback(), 8, 8, 10, False),
            # the same when a hook's save (inside the step) finds it
            ({9: math.nan}, asv.Rollback(), 8, 8, 10, True),
            # NaN at step 2, before the first periodic checkpoint: back to the start-up one
            # (taken before the iterator began), elements 0-1 dropped
            ({1: math.nan}, asv.Rollback(), 0, 0, 2, False),
            # skip_steps=1: only the bad batch; step 9 is trained again on element 8
            ({9: math.inf}, asv.Rollback(skip_steps=1, check_every_n_steps=3), 8, 9, 10, False),
            # a spike (x 1e4) at step 14 over the median of the 5 losses before, found at step 16
            ({13: 1e4}, asv.Rollback(spike_factor=50.0, window=5, check_every_n_steps=5), 12, 12, 14, False),
        ],
        ids=["nan", "nan-hook-saves", "nan-before-first-checkpoint", "inf-skip-1", "spike"],
    ),
)
async def test_a_divergence_is_rolled_back_and_ends_bitwise_as_a_run_without_its_window(
    tmp_path: Path,
    planted: dict[int, float],
    rollback: asv.Rollback,
    restored: int,
    kept: int,
    resumed: int,
    by_hook: bool,
) -> None:
    """The rolled-back run and a run on ``ds.take(kept).concatenate(ds.skip(resumed))``
    end with the same bytes in every variable; the rollback is logged and counted, and
    every checkpoint it left holds finite weights."""
    with capture_logs() as logs:
        weights, sv = await _train(tmp_path / "rolled", _dataset(planted), 20, by_hook=by_hook, on_divergence=rollback)
    clean = _dataset({})
    expected, _ = await _train(tmp_path / "clean", clean.take(kept).concatenate(clean.skip(resumed)), 20)
    for name in expected:
        assert weights[name].tobytes() == expected[name].tobytes(), name
    (event,) = [e for e in logs if e["event"] == "divergence.rollback"]
    bad_step = next(iter(planted)) + 1
    assert (event["step"], event["restored_step"], event["skipped"], event["retry"]) == (
        bad_step,
        restored,
        resumed - kept,
        1,
    )
    assert event["kind"] == ("spike" if next(iter(planted.values())) == 1e4 else "non_finite")
    status = sv.status()
    assert (status.rollbacks, status.global_step, status.stop_reason) == (1, 20, "max_steps")
    assert sv._runtime.rollbacks.steps_undone == bad_step - restored  # type: ignore[attr-defined]
    assert _checkpoints_are_finite(tmp_path / "rolled")[-1] == 20
    ledger = status.goodput  # the rollback's time and the steps it undid are badput of their own
    assert ledger is not None and ledger.badput["divergence_rollback"] > 0, ledger


async def test_past_max_retries_the_error_propagates_and_no_diverged_state_is_saved(tmp_path: Path) -> None:
    """Two NaNs with ``max_retries=1``: the first is rolled back, the second raises
    ``NanLossDuringTrainingError`` (a ``DivergenceError``) out of ``run_loop`` and the
    session; no checkpoint, the final one included, holds the diverged state."""
    with capture_logs() as logs, pytest.raises(asv.NanLossDuringTrainingError, match="step 12") as raised:
        await _train(tmp_path, _dataset({5: math.nan, 13: math.nan}), 20, on_divergence=asv.Rollback(max_retries=1))
    assert isinstance(raised.value, asv.DivergenceError)
    assert "max_retries=1" in " ".join(getattr(raised.value, "__notes__", []))
    assert [e["step"] for e in logs if e["event"] == "divergence.rollback"] == [6]
    assert [e["step"] for e in logs if e["event"] == "divergence.gave_up"] == [12]
    # element 13 is step 12 once the first window (elements 4, 5) was dropped after step
    # 4; its state was refused at step 12's checkpoint, and the final one was not taken
    assert _checkpoints_are_finite(tmp_path)[-1] == 8


async def test_a_spike_past_max_retries_raises_divergence_error(tmp_path: Path) -> None:
    """``max_retries=0``: the first spike raises ``DivergenceError`` naming the step, the
    loss and the median (not a ``NanLossDuringTrainingError``)."""
    rollback = asv.Rollback(spike_factor=50.0, window=5, max_retries=0, check_every_n_steps=1)
    with pytest.raises(asv.DivergenceError, match=r"step 14.*moving median") as raised:
        await _train(tmp_path, _dataset({13: 1e4}), 20, on_divergence=rollback)
    assert not isinstance(raised.value, asv.NanLossDuringTrainingError)
    assert _checkpoints_are_finite(tmp_path)[-1] == 12


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("loss_key", ""),
        ("spike_factor", 1.0),
        ("spike_factor", math.nan),
        ("spike_factor", "3"),
        ("window", 0),
        ("skip_steps", 0),
        ("skip_steps", 2.5),
        ("max_retries", -1),
        ("max_retries", True),
        ("check_every_n_steps", 0),
    ],
)
def test_bad_settings_are_refused_naming_the_field_and_value(field: str, value: Any) -> None:
    """A ``ValueError`` naming the field and the value, as the dataclass is made."""
    with pytest.raises(ValueError, match=rf"Rollback\.{field} .*got {value!r}"):
        asv.Rollback(**{field: value})


async def test_run_loop_refuses_a_rollback_it_cannot_do(tmp_path: Path) -> None:
    """Before any step: no ``Rollback`` (``TypeError``), no data, ``epochs``,
    ``checkpoint_iterator=False``, or no logdir (``ValueError``)."""
    state, step = _model()
    data = _dataset({})
    sv = asv.Supervisor(tmp_path, state=state, save_summaries_secs=0, handle_signals=False)
    async with sv.managed_session() as sess:
        with pytest.raises(TypeError, match="got 'yes'"):
            await sess.run_loop(step, data=data, on_divergence="yes")  # type: ignore[arg-type]
        for kwargs, match in [
            ({"data": None}, "needs data"),
            ({"data": data, "epochs": 2}, "epochs=2"),
            ({"data": data, "checkpoint_iterator": False}, "checkpoint_iterator=False"),
        ]:
            with pytest.raises(ValueError, match=match):
                await sess.run_loop(step, on_divergence=asv.Rollback(), **kwargs)
        assert sess.global_step == 0
    sv = asv.Supervisor(None, state=_model()[0], handle_signals=False)
    async with sv.managed_session() as sess:
        with pytest.raises(ValueError, match="logdir"):
            await sess.run_loop(step, data=data, on_divergence=asv.Rollback())
