"""save_model_secs="auto": the interval is picked from the measured cost of each save."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import anyio
import pytest
import tensorflow as tf
from eventfiles import tick

import asupervisor as asv
from asupervisor._checkpoint.policy._cadence import Cadence, SaveCostMeter
from asupervisor._checkpoint.policy._policies import SaveMoment, interval_bound, save_policy_for, takes_write_secs
from asupervisor._checkpoint.saving._saver import CheckpointSaver
from asupervisor._checkpoint.snapshot._snapshot import Snapshot
from asupervisor._core._abc import SessionAttribute
from asupervisor.testing import ManualClock, capture_logs


def test_the_interval_is_the_median_cost_over_the_budget_within_bounds() -> None:
    """start_secs until measured; then median(last 5 costs) / (0.9 * budget), clamped; a
    move of more than 10 % is reported, a smaller one is not."""
    policy = asv.OverheadBudget(0.02, min_secs=1.0, max_secs=100.0, start_secs=1.0)
    assert policy.every_secs == 1.0 and policy.save_cost_secs is None and policy.bound is None
    assert policy.should_save(SaveMoment("tick", 5)) and not policy.should_save(SaveMoment("step", 5))
    assert policy.observe_save_cost(0.18) == pytest.approx(10.0)  # 0.18 / 0.018
    assert policy.bound == "budget"
    assert policy.observe_save_cost(0.18) is None  # unchanged
    assert policy.observe_save_cost(0.19) is None  # median of three: still 0.18
    assert policy.observe_save_cost(0.19) is None and policy.every_secs == pytest.approx(0.185 / 0.018)
    assert policy.observe_save_cost(5.0) is None  # one outlier moves the median a little, unreported
    assert policy.every_secs == pytest.approx(0.19 / 0.018)
    for _ in range(5):
        policy.observe_save_cost(50.0)
    assert policy.every_secs == 100.0 and policy.bound == "max_secs"  # how much a crash may lose at most
    for _ in range(5):
        policy.observe_save_cost(0.0)
    assert policy.every_secs == 1.0 and policy.bound == "min_secs"


def test_the_budget_is_spent_below_the_old_ten_second_floor() -> None:
    """The default policy starts at start_secs (10 s) and, once a save is measured at
    0.03 s, saves every 0.03 / (0.9 * 2 %) = 1.67 s: the budget decides, not a 10 s floor
    (a SIGKILL then loses ~0.8 s of training on average, not ~5 s)."""
    policy = asv.OverheadBudget()
    assert (policy.min_secs, policy.start_secs, policy.max_write_share) == (1.0, 10.0, 0.5)
    assert policy.every_secs == 10.0 and policy.bound is None
    assert policy.observe_save_cost(0.03, write_secs=0.2) == pytest.approx(0.03 / 0.018)
    assert policy.bound == "budget" and policy.write_secs == 0.2
    assert policy.observe_save_cost(0.001) == 1.0 and policy.bound == "min_secs"  # median 0.0155 s: 0.86 s
    assert policy.observe_save_cost(0.0005) is None and policy.every_secs == 1.0  # the floor for the disk


def test_start_secs_is_the_interval_until_a_cost_is_measured_clipped_to_the_bounds() -> None:
    """start_secs holds until the first measurement; it is clipped into [min_secs,
    max_secs] and shown in the repr."""
    assert asv.OverheadBudget(0.02, min_secs=2.0, max_secs=5.0).every_secs == 5.0  # 10 s clipped
    assert asv.OverheadBudget(0.02, min_secs=2.0, start_secs=0.5).every_secs == 2.0
    policy = asv.OverheadBudget(0.05, start_secs=30.0)
    assert policy.every_secs == 30.0 and policy.start_secs == 30.0
    assert "start_secs=30.0" in repr(policy) and "max_write_share=0.5" in repr(policy)
    assert policy.observe_save_cost(0.09) == pytest.approx(2.0)  # 0.09 / (0.9 * 5 %)


def test_the_write_share_floor_keeps_the_writer_busy_at_most_half_the_time() -> None:
    """The interval is at least median(last 5 write times) / max_write_share, however
    cheap the saves are for training; a save without a write time keeps the ones before."""
    policy = asv.OverheadBudget(0.02)
    assert policy.observe_save_cost(0.03, write_secs=4.0) == pytest.approx(8.0)  # 4 s / 0.5 > 1.67 s
    assert policy.bound == "write_share"
    assert policy.observe_save_cost(0.03) is None and policy.every_secs == pytest.approx(8.0)  # still 4 s
    for _ in range(3):
        policy.observe_save_cost(0.03, write_secs=0.1)  # writes of 4, 0.1, 0.1, 0.1: median 0.1 s
    assert policy.every_secs == pytest.approx(0.03 / 0.018) and policy.bound == "budget"
    policy.observe_save_cost(0.03, write_secs=5000.0)
    policy.observe_save_cost(0.03, write_secs=5000.0)
    policy.observe_save_cost(0.03, write_secs=5000.0)  # median of the last five: 5000 s
    assert policy.every_secs == 3600.0 and policy.bound == "max_secs"  # max_secs still caps it
    whole = asv.OverheadBudget(0.02, max_write_share=1.0)
    assert whole.observe_save_cost(0.03, write_secs=3.0) == pytest.approx(3.0) and whole.bound == "write_share"


def test_bad_budgets_and_save_model_secs_are_errors_naming_the_value() -> None:
    for bad in (0, 1, -0.1, 1.5, "2%", True, math.nan):
        with pytest.raises(ValueError, match="max_overhead"):
            asv.OverheadBudget(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"max_secs=1\.0"):
        asv.OverheadBudget(0.02, min_secs=5, max_secs=1.0)
    with pytest.raises((TypeError, ValueError), match="min_secs"):
        asv.OverheadBudget(0.02, min_secs=0)
    for bad_start in (0, -1.0, math.inf, "10"):
        with pytest.raises(ValueError, match=rf"start_secs.*got {re.escape(repr(bad_start))}"):
            asv.OverheadBudget(0.02, start_secs=bad_start)  # type: ignore[arg-type]
    for bad_share in (0, -0.5, 1.5, True, math.nan, "half"):
        with pytest.raises(ValueError, match=rf"max_write_share.*got {re.escape(repr(bad_share))}"):
            asv.OverheadBudget(0.02, max_write_share=bad_share)  # type: ignore[arg-type]
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
    assert policy.every_secs == budgets[0].start_secs == 10.0
    assert policy.observe_save_cost(1.8) == pytest.approx(100.0)
    assert policy.every_secs == pytest.approx(100.0) and interval_bound(policy) == "budget"
    assert policy.observe_save_cost(1.8, write_secs=60.0) == pytest.approx(120.0)  # handed on
    assert interval_bound(policy) == "write_share"
    multi = save_policy_for("auto", 100, multi_worker=True)  # no timer in multi-worker training
    assert isinstance(multi, asv.AnySavePolicy)
    assert not any(isinstance(p, asv.OverheadBudget) for p in multi.policies)


def test_write_secs_reaches_only_the_policies_that_take_it() -> None:
    """AnySavePolicy hands write_secs to an observe_save_cost that takes it and the cost
    alone to one written before write_secs existed; its bound is that of the policy
    whose interval it uses."""
    seen: list[float] = []

    class CostOnly(asv.EverySeconds):
        def observe_save_cost(self, cost_secs: float) -> float | None:
            seen.append(cost_secs)
            return None

    budget = asv.OverheadBudget(0.02)
    policy = asv.AnySavePolicy(CostOnly(3600.0), budget, asv.OnStop())
    assert policy.observe_save_cost(0.03, write_secs=2.0) == pytest.approx(4.0)
    assert seen == [0.03] and budget.write_secs == 2.0 and interval_bound(policy) == "write_share"
    assert takes_write_secs(budget.observe_save_cost) and not takes_write_secs(CostOnly(1.0).observe_save_cost)
    assert takes_write_secs(lambda cost, **kw: None) and not takes_write_secs(len)
    cheap = asv.AnySavePolicy(asv.EverySeconds(0.5), asv.OverheadBudget(0.02))
    cheap.observe_save_cost(0.03)
    assert interval_bound(cheap) is None  # EverySeconds' 0.5 s is used: no bound to name


class _Meter:
    def committed(self, snap: Snapshot) -> float:
        return 0.03


def _cadence(policy: asv.SavePolicy) -> Cadence:
    """The cadence of ``policy``, its meter measuring every save at 0.03 s."""
    cadence = Cadence(policy, lambda kind: SaveMoment(kind, 0), lambda: 0)
    assert cadence.adaptive
    cadence.meter = _Meter()  # type: ignore[assignment]
    return cadence


@pytest.mark.parametrize("commit_secs", [3.0, None])
def test_the_saver_hands_the_write_time_over_and_logs_the_bound(commit_secs: float | None) -> None:
    """CheckpointSaver._measure passes the checkpointer's last commit time as write_secs
    and logs checkpoint.interval at info with bound=; without a commit time it passes the
    cost alone."""
    budget = asv.OverheadBudget(0.02)
    ctx = SimpleNamespace(global_step=0)
    checkpointer = SimpleNamespace(last_commit_secs=commit_secs, write=None)
    saver = CheckpointSaver(ctx, checkpointer, cadence=_cadence(budget))  # type: ignore[arg-type]
    with capture_logs() as logs:
        saver._measure(_snap(7, 0.0, 0.0))
    (moved,) = [e for e in logs if e["event"] == "checkpoint.interval"]
    assert moved["log_level"] == "info" and moved["step"] == 7 and moved["write_secs"] == commit_secs
    if commit_secs is None:
        assert moved["bound"] == "budget" and moved["secs"] == pytest.approx(1.67, abs=0.01)
    else:
        assert moved["bound"] == "write_share" and moved["secs"] == 6.0  # 3 s / 0.5


def test_the_saver_calls_an_observer_without_write_secs_with_the_cost_alone() -> None:
    """A policy's observe_save_cost written before write_secs existed still works."""
    calls: list[float] = []

    class CostOnly(asv.EverySeconds):
        def observe_save_cost(self, cost_secs: float) -> float | None:
            calls.append(cost_secs)
            return 5.0

    checkpointer = SimpleNamespace(last_commit_secs=3.0, write=None)
    saver = CheckpointSaver(SimpleNamespace(global_step=0), checkpointer, cadence=_cadence(CostOnly(10.0)))  # type: ignore[arg-type]
    with capture_logs() as logs:
        saver._measure(_snap(3, 0.0, 0.0))
    assert calls == [0.03]
    assert [(e["secs"], e["bound"]) for e in logs if e["event"] == "checkpoint.interval"] == [(5.0, None)]


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
    last one, not at start_secs (the timer waits for each timed save's commit, so that its
    cost decides the very next interval)."""
    state = big_state()
    clock = ManualClock()

    class Recording(asv.OverheadBudget):
        """Sees each measured cost; adds 0.09 s to it, so that the interval surely moves
        off start_secs (a tiny step may well lose nothing to a save)."""

        costs: ClassVar[list[float]] = []
        writes: ClassVar[list[float | None]] = []

        def observe_save_cost(self, cost_secs: float, *, write_secs: float | None = None) -> float | None:
            self.costs.append(cost_secs)
            self.writes.append(write_secs)
            return super().observe_save_cost(cost_secs + 0.09)  # the budget alone: a known interval

    budget = Recording(0.02, min_secs=0.001, max_secs=1e6, start_secs=0.001)
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
                assert moved[0]["bound"] == "budget" and moved[0]["log_level"] == "info"
                commit_secs = [e["secs"] for e in logs if e["event"] == "checkpoint.saved"][1]
                assert budget.writes[0] == pytest.approx(commit_secs, abs=1e-4)  # the measured save's write
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
