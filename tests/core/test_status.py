"""``sv.status()``: what a dashboard needs, as plain JSON with ``to_dict()``."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
import tensorflow as tf
from _timing import scaled

import asupervisor as asv
from asupervisor.testing import ManualClock

pytestmark = pytest.mark.anyio


async def test_status_reports_metrics_max_steps_rate_eta_and_is_json(tmp_path: Path) -> None:
    """While ``run_loop(max_steps=...)`` runs: the latest scalars of the step output
    (read at a boundary, not per step), ``max_steps``, a rate from the first seconds (the
    step counter has not ticked), an ETA, the start time, from the loop or any thread;
    ``to_dict()`` is plain JSON, the last checkpoint included."""
    clock = ManualClock()
    v = tf.Variable(0.0)
    sv = asv.Supervisor(
        tmp_path, state={"v": v}, handle_signals=False, save_model_secs=0, save_summaries_secs=120, clock=clock
    )
    steps = 0
    seen: dict[str, Any] = {}
    release = anyio.Event()
    token = None

    def step() -> dict[str, Any]:
        nonlocal steps
        steps += 1
        v.assign_add(1.0)
        if steps == 10:
            anyio.from_thread.run_sync(release.set, token=token)
        return {"loss": tf.constant(10.0 / steps), "lr": 0.1, "name": "not a scalar"}

    async with sv.managed_session() as sess:
        token = anyio.lowlevel.current_token()
        before = sv.status()
        assert before.steps_per_sec is None and before.metrics == {} and before.started_at is not None
        info = await sv.save_now()

        async def watch() -> None:
            await release.wait()
            status = sv.status()  # the step loop samples its output about once a second
            with anyio.fail_after(scaled(30)):
                while status.metrics.get("loss", 99.0) > 1.0:  # a sample after step 10
                    await anyio.sleep(0.001)  # polling a condition, with a deadline
                    status = sv.status()
            seen["status"] = status
            reader = threading.Thread(target=lambda: seen.update(from_thread=sv.status()))
            reader.start()  # any thread may ask
            reader.join()
            sess.request_stop()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await sess.run_loop(step, max_steps=1_000_000)
    status = seen["status"]
    assert seen["from_thread"].running and seen["from_thread"].global_step >= status.global_step
    assert status.running and status.max_steps == 1_000_000
    assert set(status.metrics) == {"loss", "lr"} and status.metrics["lr"] == pytest.approx(0.1)
    assert 0 < status.metrics["loss"] <= 1.0  # a recent step's loss, as a float
    assert status.steps_per_sec is not None and status.steps_per_sec > 0
    assert status.eta_secs == pytest.approx((1_000_000 - status.global_step) / status.steps_per_sec)
    data = json.loads(json.dumps(status.to_dict()))
    assert data["last_checkpoint"] == {"path": info.path, "step": info.step, "time": info.time}
    assert data["metrics"]["lr"] == pytest.approx(0.1) and data["max_steps"] == 1_000_000
    assert data["services"]["step_counter"] == "running" and data["restarts"] == {}
    after = sv.status()
    assert not after.running and after.max_steps is None and after.eta_secs is None


async def test_restarts_are_counted() -> None:
    """A service restarted under its policy is counted in ``status().restarts``."""
    clock = ManualClock()
    failures = 0
    done = anyio.Event()

    async def flaky() -> None:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise ConnectionError("flaky")
        done.set()

    sv = asv.Supervisor(None, handle_signals=False, save_summaries_secs=0, clock=clock)
    sv.loop(1.0, flaky, name="flaky", restart=asv.RestartPolicy(max_restarts=5, backoff_secs=0))
    async with sv.managed_session():
        await done.wait()
        assert sv.status().restarts == {"flaky": 2}


async def test_metrics_are_the_last_steps_once_run_loop_returns(tmp_path: Path) -> None:
    """``status().metrics`` is not a poll behind: right after ``run_loop`` returns (here at
    the end of its data) it holds the last step's values, read once, not per step."""
    sv = asv.Supervisor(handle_signals=False)
    steps = 0

    def step(batch: int) -> dict[str, Any]:
        nonlocal steps
        steps += 1
        return {"loss": tf.constant(1.0 / steps)}

    async with sv.managed_session() as sess:
        await sess.run_loop(step, data=range(300))
    assert sv.status().metrics == {"loss": pytest.approx(1.0 / 300)}


async def test_a_status_copies_pickles_and_goes_through_asdict(tmp_path: Path) -> None:
    """A finished session's status (its mappings filled: services, metrics, save costs):
    ``dataclasses.asdict``, ``copy.deepcopy`` and pickle take it and keep every value; its
    mappings still refuse changes."""
    import copy
    import dataclasses
    import pickle

    v = tf.Variable(0.0)
    sv = asv.Supervisor(tmp_path, state={"v": v}, handle_signals=False, save_model_secs=0, save_model_steps=2)
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: {"loss": v.assign_add(1.0)}, max_steps=3)
    status = sv.status()
    assert status.services and status.metrics and status.save_seconds, status
    plain = dataclasses.asdict(status)
    assert plain["services"] == dict(status.services) and plain["metrics"] == dict(status.metrics)
    assert plain["save_seconds"]["commit"]["count"] == status.save_seconds["commit"].count
    assert copy.deepcopy(status) == status == pickle.loads(pickle.dumps(status))
    with pytest.raises(TypeError, match="cannot be changed"):
        status.services["x"] = "running"  # type: ignore[index]
    with pytest.raises(TypeError, match="cannot be changed"):
        status.metrics.update(loss=0.0)  # type: ignore[attr-defined]
