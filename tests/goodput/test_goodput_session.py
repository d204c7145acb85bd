"""The goodput ledger of real sessions: ``status().goodput``, the Prometheus text, the
TensorBoard scalars, the ledger file in the logdir, and a second session of the run."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

import asupervisor as asv
from asupervisor._core._abc import context_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from eventfiles import read_events

pytestmark = pytest.mark.usefixtures("no_new_threads")


def _supervisor(logdir: Path, v: tf.Variable) -> asv.Supervisor:
    return asv.Supervisor(
        logdir, state={"v": v}, save_model_steps=10, save_model_secs=0, save_summaries_secs=60, handle_signals=False
    )


async def _train(sv: asv.Supervisor, v: tf.Variable, max_steps: int, lost: int = 0) -> asv.Goodput:
    """Train to ``max_steps`` on a dataset; ``lost`` steps then recorded lost to a
    ``divergence_rollback`` the way a feature records it; the goodput seen while the
    session lives."""

    @tf.function
    def step(x: tf.Tensor) -> dict[str, Any]:
        v.assign_add(x)
        return {"loss": v}

    data = tf.data.Dataset.range(1000).map(lambda i: tf.cast(i, tf.float32))
    async with sv.managed_session() as sess:
        await sess.run_loop(step, data=data, max_steps=max_steps)
        if lost:
            context_of(sess).record_badput("divergence_rollback", steps=lost)
        live = sv.status().goodput
    assert live is not None
    return live


@pytest.mark.anyio
async def test_status_prometheus_tensorboard_and_the_ledger_file_show_the_goodput(tmp_path: Path) -> None:
    """While the session lives ``status().goodput`` holds productive time and badput by
    cause adding up to the wall time, a recorded cause among them (5 steps' time moved out
    of productive time); after it, the totals stop growing and equal the ledger's file,
    which names the stop reason; the Prometheus text and the event file carry them."""
    v = tf.Variable(0.0)
    sv = _supervisor(tmp_path, v)
    live = await _train(sv, v, 30, lost=5)
    assert live.productive_secs > 0 and 0 < live.goodput < 1 and live.restarts == 0
    assert live.badput["divergence_rollback"] > 0 and live.badput["training_prep"] > 0
    assert live.badput["data_loading_sync"] > 0 and live.badput["unproductive_checkpoint_save_time"] > 0
    assert live.productive_secs + sum(live.badput.values()) == pytest.approx(live.wall_secs)

    final = sv.status().goodput
    assert final is not None and final == sv.status().goodput  # no longer growing
    assert final.wall_secs >= live.wall_secs
    ledger = json.loads((tmp_path / "asupervisor-goodput.json").read_text())
    assert ledger["ended"] == "max_steps" and ledger["step"] == 30 and ledger["steps"] == 25
    assert ledger["wall_secs"] == final.wall_secs and ledger["badput"] == dict(final.badput)

    text = sv.metrics_text()
    assert f"asupervisor_goodput_ratio {final.goodput!r}" in text
    rollback = final.badput["divergence_rollback"]
    assert f'asupervisor_badput_time_seconds{{badput_source="divergence_rollback"}} {rollback!r}' in text
    assert "asupervisor_elapsed_time_seconds " in text
    events = read_events(tmp_path)  # the summary written at the stop
    assert events["goodput/ratio"][-1][1] > 0 and events["goodput/badput/divergence_rollback"][-1][1] > 0


@pytest.mark.anyio
async def test_a_second_session_of_a_completed_run_counts_a_restart_and_not_the_time_between(
    tmp_path: Path,
) -> None:
    """A session into the logdir of a completed run carries its totals on as a restart
    (nothing redone: it resumes from the last step); the time between the two sessions is
    no one's and not in the wall time."""
    v = tf.Variable(0.0)
    first = await _train(_supervisor(tmp_path, v), v, 20)
    ended = json.loads((tmp_path / "asupervisor-goodput.json").read_text())
    sv = _supervisor(tmp_path, v)
    started = time.time()
    await _train(sv, v, 40)
    took = time.time() - started
    second = sv.status().goodput
    assert second is not None and second.restarts == 1 and second.redone_steps == 0
    assert "infrastructure_recovery_from_disruption" not in second.badput
    assert ended["wall_secs"] >= first.wall_secs
    assert ended["wall_secs"] < second.wall_secs <= ended["wall_secs"] + took


@pytest.mark.anyio
async def test_a_preemption_counts_its_stop_and_the_time_until_the_restart(tmp_path: Path) -> None:
    """A session stopped by a preemption notice (``preempted:<source>``) counts its stop's
    wind-down as ``preemption_stop`` and ends its ledger with that reason; the next
    session of the run counts the time between as lost to the disruption, and redoes
    nothing (the final checkpoint holds the last step)."""
    v = tf.Variable(0.0)
    sv = _supervisor(tmp_path, v)
    async with sv.managed_session() as sess:

        def step() -> None:
            v.assign_add(1.0)
            if sv.global_step == 4:
                context_of(sess).request_stop(reason="preempted:test")

        await sess.run_loop(step)
    first = sv.status().goodput
    assert first is not None and first.badput["preemption_stop"] > 0
    assert asv.exit_code(sv.status()) == 143
    ended = json.loads((tmp_path / "asupervisor-goodput.json").read_text())
    assert ended["ended"] == "preempted:test" and ended["step"] == 5
    await _train(sv := _supervisor(tmp_path, v), v, 10)
    second = sv.status().goodput
    assert second is not None and second.restarts == 1 and second.redone_steps == 0
    assert second.badput["infrastructure_recovery_from_disruption"] > 0
    assert second.productive_secs + sum(second.badput.values()) == pytest.approx(second.wall_secs)
