"""save_model_secs="auto": the interval is picked from the measured cost of each save."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
import tensorflow as tf
from eventfiles import tick

import asupervisor as asv
from asupervisor._checkpoint._policies import SaveMoment, save_policy_for
from asupervisor._checkpoint._saver import SaveCostMeter
from asupervisor._checkpoint._snapshot import Snapshot
from asupervisor._core._abc import SessionAttribute
from asupervisor.testing import ManualClock, capture_logs


def test_the_interval_is_the_median_cost_over_the_budget_within_bounds() -> None:
    """min_secs until measured; then median(last 5 costs) / (0.9 * budget), clamped; a
    move of more than 10 % is reported, a smaller one is not."""
    policy = asv.OverheadBudget(0.02, min_secs=1.0, max_secs=100.0)
    assert policy.every_secs == 1.0 and policy.save_cost_secs is None
    assert policy.should_save(SaveMoment("tick", 5)) and not policy.should_save(SaveMoment("step", 5))
    assert policy.observe_save_cost(0.18) == pytest.approx(10.0)  # 0.18 / 0.018
    assert policy.observe_save_cost(0.18) is None  # unchanged
    assert policy.observe_save_cost(0.19) is None  # median of three: still 0.18
    assert policy.observe_save_cost(0.19) is None and policy.every_secs == pytest.approx(0.185 / 0.018)
    assert policy.observe_save_cost(5.0) is None  # one outlier moves the median a little, unreported
    assert policy.every_secs == pytest.approx(0.19 / 0.018)
    for _ in range(5):
        policy.observe_save_cost(50.0)
    assert policy.every_secs == 100.0  # max_secs: how much a crash may lose at most
    for _ in range(5):
        policy.observe_save_cost(0.0)
    assert policy.every_secs == 1.0  # min_secs


def test_bad_budgets_and_save_model_secs_are_errors_naming_the_value() -> None:
    for bad in (0, 1, -0.1, 1.5, "2%", True, math.nan):
        with pytest.raises(ValueError, match="max_overhead"):
            asv.OverheadBudget(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"max_secs=1\.0"):
        asv.OverheadBudget(0.02, min_secs=5, max_secs=1.0)
    with pytest.raises((TypeError, ValueError), match="min_secs"):
        asv.OverheadBudget(0.02, min_secs=0)
    with pytest.raises(TypeError, match="'often'"):
        asv.Supervisor(None, save_model_secs="often", handle_signals=False)
    asv.Supervisor(None, save_model_secs="auto", handle_signals=False)


def test_auto_is_an_overhead_budget_beside_the_other_policies() -> None:
    """save_model_secs="auto" builds OverheadBudget(0.02) with the start-up and final
    saves; AnySavePolicy's every_secs follows the budget's interval as it moves."""
    policy = save_policy_for("auto", 100, multi_worker=False)
    assert isinstance(policy, asv.AnySavePolicy)
    budgets = [p for p in policy.policies if isinstance(p, asv.OverheadBudget)]
    assert len(budgets) == 1 and budgets[0].max_overhead == 0.02
    assert {type(p) for p in policy.policies} == {asv.EverySteps, asv.OverheadBudget, asv.OnStartup, asv.OnStop}
    assert policy.every_secs == budgets[0].min_secs
    assert policy.observe_save_cost(1.8) == pytest.approx(100.0)
    assert policy.every_secs == pytest.approx(100.0)
    multi = save_policy_for("auto", 100, multi_worker=True)  # no timer in multi-worker training
    assert isinstance(multi, asv.AnySavePolicy)
    assert not any(isinstance(p, asv.OverheadBudget) for p in multi.policies)


def _snap(step: int, taken_at: float, blocked: float) -> Snapshot:
    return Snapshot(step, [], [], [], taken_at, blocked)


def test_the_cost_of_a_save_is_the_training_time_it_took() -> None:
    """At 10 ms a step before the save, 40 steps in the 0.5 s from the snapshot's start to
    the commit mean the save cost 0.5 - 40.5 * 0.01 s; without a baseline, or with
    training not stepping, there is no measurement."""
    now = [0.0]
    steps = [0]
    meter = SaveCostMeter(lambda: steps[0], clock=lambda: now[0])
    assert meter.committed(_snap(0, 0.0, 0.0)) is None  # the first commit: no baseline yet
    steps[0], now[0] = 140, 1.5
    cost = meter.committed(_snap(100, 1.02, 0.02))  # the snapshot started at 1.0, step 100
    assert cost == pytest.approx(0.5 - 40.5 * 0.01)
    steps[0], now[0] = 141, 3.0
    assert meter.committed(_snap(141, 2.5, 0.01)) is None  # one step since the last commit: paused
    steps[0], now[0] = 400, 4.0
    assert meter.committed(_snap(200, 3.5, 0.0)) == 0.0  # faster than before: no cost, never negative


def test_the_baseline_starts_at_the_last_sample_after_the_previous_commit() -> None:
    """The timer's halfway sample starts the baseline: a slow stretch right after the
    previous commit (that save's after-effects) does not make the next save look free."""
    now = [0.0]
    steps = [0]
    meter = SaveCostMeter(lambda: steps[0], clock=lambda: now[0])
    meter.committed(_snap(0, 0.0, 0.0))  # the previous commit, at t=0
    steps[0], now[0] = 100, 5.0  # 50 ms a step while the previous save's effects lasted
    meter.sample()
    steps[0], now[0] = 240, 6.5  # 10 ms a step from the sample to the snapshot at t=6, step 200
    cost = meter.committed(_snap(200, 6.0, 0.0))
    assert cost == pytest.approx(0.5 - 40.5 * 0.01)  # from the commit's 30 ms/step it would read 0
    steps[0], now[0] = 280, 7.3  # the commit was at 6.5 (step 240)
    meter.sample()  # fewer than 3 steps before the next snapshot: not a baseline
    steps[0], now[0] = 300, 7.7
    cost = meter.committed(_snap(281, 7.3, 0.0))  # the baseline falls back to the commit
    assert cost == pytest.approx(0.4 - 19.5 * (0.8 / 41))


def big_state() -> dict[str, Any]:
    return {"big": tf.Variable(tf.zeros([8 << 20])), "w": tf.Variable(0.0)}


async def _steps_past(sess: Any, target: int) -> None:
    while sess.global_step < target:  # the step loop runs in real time beside the test
        await anyio.sleep(0.005)



@pytest.mark.anyio
async def test_the_timer_follows_the_interval_the_measured_saves_choose(tmp_path: Path) -> None:
    """A real session with a 32 MB state: the second timed save is measured, the interval
    it chose is logged (checkpoint.interval) and the next tick comes that long after the
    last one, not at min_secs (the timer waits for each timed save's commit, so that its
    cost decides the very next interval)."""
    state = big_state()
    clock = ManualClock()

    class Recording(asv.OverheadBudget):
        """Sees each measured cost; adds 0.09 s to it, so that the interval surely moves
        off min_secs (a tiny step may well lose nothing to a save)."""

        costs: ClassVar[list[float]] = []

        def observe_save_cost(self, cost_secs: float) -> float | None:
            self.costs.append(cost_secs)
            return super().observe_save_cost(cost_secs + 0.09)

    budget = Recording(0.02, min_secs=0.001, max_secs=1e6)
    sv = asv.Supervisor(
        tmp_path,
        state=state,
        save_policy=asv.AnySavePolicy(budget, asv.OnStop()),
        save_summaries_secs=0,
        handle_signals=False,
        clock=clock,
    )

    def step() -> None:
        state["w"].assign_add(1.0)

    def saved() -> list[int]:
        return [e["step"] for e in logs if e["event"] == "checkpoint.saved"]

    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            saver = sv._runtime.extra(SessionAttribute.checkpoints).saver  # type: ignore[union-attr, attr-defined]
            async with anyio.create_task_group() as tg:
                tg.start_soon(sess.run_loop, step)
                for _ in range(2):  # the first commit is the baseline, the second is measured
                    await _steps_past(sess, sess.global_step + 20)
                    await tick(clock, 0.001, 1, settle=False)
                    await saver.drain()
                moved = [e for e in logs if e["event"] == "checkpoint.interval"]
                assert len(moved) == 1 and len(saved()) == 2 and len(budget.costs) == 1
                assert moved[0]["save_cost_secs"] == pytest.approx(budget.costs[0], abs=1e-4)
                interval = budget.every_secs
                assert interval == pytest.approx((budget.costs[0] + 0.09) / 0.018)
                assert interval == pytest.approx(moved[0]["secs"], abs=0.01)
                await clock.wait_for_sleepers(1)
                clock.advance(interval * 0.5)  # not due yet
                for _ in range(20):
                    await anyio.sleep(0)
                assert clock.sleepers == 1 and len(saved()) == 2
                await _steps_past(sess, sess.global_step + 20)
                await tick(clock, interval * 0.6, 1, settle=False)  # now it is
                await saver.drain()
                assert len(saved()) == 3
                sess.request_stop()
