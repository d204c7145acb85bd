"""Checkpoint cadence: back-pressure by default, skipping as an opt-in, timed saves coalesce."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf
from eventfiles import tick

import asupervisor as asv
from asupervisor._checkpoint.store import _state_file
from asupervisor._core._abc import SessionAttribute
from asupervisor.testing import ManualClock, capture_logs

# 32 MB: its write and fsync take far longer than ten of the steps below
BIG = 8 << 20


def big_state() -> dict[str, Any]:
    return {"big": tf.Variable(tf.zeros([BIG])), "w": tf.Variable(0.0)}


def bump(state: dict[str, Any]) -> Any:
    def step() -> None:
        state["w"].assign_add(1.0)

    return step


def saved_steps(logdir: Path) -> list[int]:
    return sorted(
        int(n[len("model.ckpt-") : -len(".index")])
        for n in os.listdir(logdir)
        if n.startswith("model.ckpt-") and n.endswith(".index") and ".asv-tmp-" not in n
    )


@pytest.mark.anyio
async def test_every_multiple_of_save_model_steps_is_saved_under_back_pressure(tmp_path: Path) -> None:
    """save_model_steps=10 over 50 fast steps with writes slower than the steps: a
    checkpoint at every multiple of 10 is committed; the step thread waited (logged
    checkpoint.waited) instead of skipping."""
    state = big_state()
    sv = asv.Supervisor(
        tmp_path,
        state=state,
        save_model_secs=0,
        save_model_steps=10,
        max_to_keep=None,
        save_summaries_secs=0,
        handle_signals=False,
    )
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            await sess.run_loop(bump(state), max_steps=50)
    assert {10, 20, 30, 40, 50} <= set(saved_steps(tmp_path))
    assert not [e for e in logs if e["event"] == "checkpoint.skipped"]
    assert [e for e in logs if e["event"] == "checkpoint.waited"]
    named = _state_file.read_state(tmp_path)
    assert named is not None and {f"model.ckpt-{s}" for s in (10, 20, 30, 40, 50)} <= set(named.paths)


@pytest.mark.anyio
async def test_skip_policy_skips_saves_while_busy_and_says_so(tmp_path: Path) -> None:
    """checkpoint_when_busy="skip": with writes slower than the steps, some due saves are
    skipped, each logged checkpoint.skipped."""
    state = big_state()
    sv = asv.Supervisor(
        tmp_path,
        state=state,
        save_model_secs=0,
        save_model_steps=10,
        max_to_keep=None,
        checkpoint_when_busy="skip",
        save_summaries_secs=0,
        handle_signals=False,
    )
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            await sess.run_loop(bump(state), max_steps=50)
    skipped = [e["step"] for e in logs if e["event"] == "checkpoint.skipped"]
    assert skipped
    assert not {10, 20, 30, 40} <= set(saved_steps(tmp_path))  # (the final save may save step 50)


@pytest.mark.anyio
async def test_timed_saves_coalesce_while_the_writer_is_busy(tmp_path: Path) -> None:
    """A timer tick while a write is in flight is not skipped: it waits for the writer
    (logged checkpoint.waited) and then saves once, however many ticks were missed; the
    steps are not held up meanwhile."""
    state = {"w": tf.Variable(0.0)}
    clock = ManualClock()
    sv = asv.Supervisor(
        tmp_path, state=state, save_model_secs=60, save_summaries_secs=0, handle_signals=False, clock=clock
    )
    gate = threading.Event()
    with capture_logs() as logs:
        async with sv.managed_session() as sess:
            try:
                await sv.save_now()  # step 0 committed
                saver = sv._runtime.extra(SessionAttribute.checkpoints).saver  # type: ignore[union-attr, attr-defined]
                saver._writer.submit(gate.wait)  # the writer is busy until the gate opens
                await sess.run(bump(state))
                await tick(clock, 60, 1, settle=False)  # step 1 snapshotted, its write queued behind the gate
                await clock.wait_for_sleepers(1)
                await sess.run(bump(state))
                await tick(clock, 60, 1, settle=False)  # due while busy: waits for the writer
                clock.advance(600)  # ten more ticks missed meanwhile
                await sess.run(bump(state))  # steps go on
                assert sess.global_step == 3
                assert not [e for e in logs if e["event"] == "checkpoint.skipped"]
            finally:
                gate.set()
            await clock.wait_for_sleepers(1)  # the coalesced save is handed over, the timer sleeps
            await saver.drain()
            saved = [e["step"] for e in logs if e["event"] == "checkpoint.saved"]
            assert saved == [0, 1, 3]  # one save for the missed ticks, at the step it ran
    assert not [e for e in logs if e["event"] == "checkpoint.skipped"]
    assert [e for e in logs if e["event"] == "checkpoint.waited" and e.get("reason") == "timer"]


@pytest.mark.anyio
async def test_monitored_training_session_saves_every_n_steps(tmp_path: Path) -> None:
    """MonitoredTrainingSession(save_checkpoint_steps=10, max_to_keep=None) over 50 fast
    steps with a large state keeps a checkpoint at every multiple of 10."""
    state = big_state()
    async with asv.MonitoredTrainingSession(
        tmp_path,
        state=state,
        save_checkpoint_steps=10,
        save_summaries_steps=None,
        log_step_count_steps=None,
        max_to_keep=None,
        handle_signals=False,
    ) as sess:
        while sess.global_step < 50:
            await sess.run(bump(state))
    assert {10, 20, 30, 40, 50} <= set(saved_steps(tmp_path))


def test_checkpoint_when_busy_is_validated() -> None:
    """checkpoint_when_busy accepts "wait" and "skip"; anything else is a ValueError naming it."""
    for value in ("wait", "skip"):
        asv.Supervisor(None, checkpoint_when_busy=value, handle_signals=False)
    with pytest.raises(ValueError, match="'sometimes'"):
        asv.Supervisor(None, checkpoint_when_busy="sometimes", handle_signals=False)


def test_one_cadence_answers_every_save_moment_from_its_policy() -> None:
    """The session's Cadence is where the save policy is asked: the step trigger (the next
    multiple of every_steps), the timer's interval (fixed or adaptive), and each moment's
    decision with the moment made as it is asked; no policy: nothing is ever due."""
    from asupervisor._checkpoint.policy._cadence import Cadence
    from asupervisor._checkpoint.policy._policies import save_policy_for

    step = [0]
    asked: list[asv.SaveMoment] = []

    def moment(kind: Any) -> asv.SaveMoment:
        asked.append(asv.SaveMoment(kind, step[0], restored=True))
        return asked[-1]

    cadence = Cadence(save_policy_for(30.0, 100, multi_worker=False), moment, lambda: step[0])
    assert not cadence.adaptive and cadence.meter is None
    assert [cadence.next_step(s) for s in (0, 99, 100, 250)] == [100, 100, 200, 300]
    assert cadence.interval_secs() == 30.0
    step[0] = 200
    assert cadence.due("step") and cadence.due("tick") and cadence.due("stop")
    assert not cadence.due("startup")  # restored: no start-up save
    step[0] = 201
    assert not cadence.due("step")  # not a multiple of 100
    assert [m.step for m in asked] == [200, 200, 200, 200, 201]

    auto = Cadence(save_policy_for("auto", None, multi_worker=False), moment, lambda: step[0])
    assert auto.adaptive and auto.meter is not None and auto.next_step(5) == float("inf")
    assert auto.interval_secs() == asv.OverheadBudget().start_secs

    never = Cadence(None, moment, lambda: 0)
    assert never.next_step(0) == never.interval_secs() == float("inf")
    assert not any(never.due(kind) for kind in ("step", "tick", "startup", "stop"))
