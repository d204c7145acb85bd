"""``asv.exit_code``: the status a command exits with, from real sessions' ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import tensorflow as tf
from _timing import ExitTimer, scaled

import asupervisor as asv

pytestmark = pytest.mark.anyio


def make_sv(**kwargs: Any) -> asv.Supervisor:
    return asv.Supervisor(None, state={"v": tf.Variable(0.0)}, handle_signals=False, save_summaries_secs=0, **kwargs)


async def test_completed_runs_exit_0() -> None:
    """``max_steps``, the end of the data, the body returning and a requested stop exit 0."""
    for body in ("max_steps", "end_of_data", "returned", "requested"):
        sv = make_sv()
        async with sv.managed_session() as sess:
            if body == "max_steps":
                await sess.run_loop(lambda: None, max_steps=3)
            elif body == "end_of_data":
                await sess.run_loop(lambda x: None, data=[1, 2])
            elif body == "requested":
                sess.request_stop()
                await anyio.sleep(0)  # the body ends at its next await
            else:
                await sess.run(lambda: None)
        assert asv.exit_code(sv.status()) == 0, body


async def test_an_error_exits_1() -> None:
    """A step that raised ends the session with status 1."""
    sv = make_sv()

    def bad() -> None:
        raise ArithmeticError("bad step")

    with pytest.raises(ArithmeticError):
        async with sv.managed_session() as sess:
            await sess.run(bad)
    assert sv.status().stop_reason == "error:ArithmeticError"
    assert asv.exit_code(sv.status()) == 1


async def test_a_cancelled_session_is_interrupted() -> None:
    """An application cancelling the session (its own shutdown) is an interruption: 130."""
    sv = make_sv()
    with anyio.CancelScope() as scope:
        async with sv.managed_session() as sess:
            await sess.run(lambda: None)
            scope.cancel()
            await anyio.sleep(0)
    assert sv.status().stop_reason == "cancelled"
    assert asv.exit_code(sv.status()) == 130


def test_signal_reasons_map_to_128_plus_the_signal() -> None:
    """Preemption by SIGTERM is 143, SIGINT 130, another signal 128 + its number, a
    failed service 1; a status still running or not a Status is a clear error."""
    import signal

    def ended(reason: str) -> asv.Status:
        return asv.Status(running=False, global_step=5, stop_reason=reason)

    assert asv.exit_code(ended("signal:SIGTERM")) == 143
    assert asv.exit_code(ended("signal:SIGINT")) == 130
    assert asv.exit_code(ended("signal:SIGHUP")) == 128 + signal.SIGHUP
    assert asv.exit_code(ended("service:summary")) == 1
    assert asv.exit_code(asv.Status(running=False, global_step=0)) == 0  # never started
    with pytest.raises(ValueError, match="still running"):
        asv.exit_code(asv.Status(running=True, global_step=5))
    with pytest.raises(TypeError, match="takes a Status"):
        asv.exit_code("completed")  # type: ignore[arg-type]


@pytest.mark.parametrize("reason", ["peer_lost:worker:1", "peer_lost:chief:0,worker:2", "peer_lost"])
def test_a_lost_peer_exits_75(reason: str) -> None:
    """A multi-worker training that lost a peer: 75, "restart the whole job" (the real
    cluster case is in tests/checkpoint/test_multi_worker.py)."""
    assert asv.exit_code(asv.Status(running=False, global_step=3, stop_reason=reason)) == 75


async def test_outside_a_cluster_a_message_about_unhealthy_tasks_is_an_error_like_any() -> None:
    """Only a multi-worker session reads a step error as a lost peer."""
    sv = make_sv()

    def bad() -> None:
        raise tf.errors.UnavailableError(None, None, "The following tasks are unhealthy:\n/job:worker/replica:0/task:1")

    with pytest.raises(tf.errors.UnavailableError):
        async with sv.managed_session() as sess:
            await sess.run(bad)
    assert sv.status().stop_reason == "error:UnavailableError"
    assert asv.exit_code(sv.status()) == 1


async def test_a_services_preemption_notice_is_a_preemption() -> None:
    """A service of the user's own reporting another platform's notice (AWS's spot
    interruption, say) with ``ctx.request_stop(reason="preempted:aws")``: 143."""

    class SpotNotice(asv.Service):
        name = "spot-notice"

        async def run(self, ctx: asv.ServiceContext, *, task_status: Any) -> None:
            task_status.started()
            ctx.request_stop(reason="preempted:aws")
            await anyio.sleep_forever()

    sv = make_sv()
    sv.add_service(SpotNotice())
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: None)  # until the notice stops it
    assert sv.status().stop_reason == "preempted:aws"
    assert asv.exit_code(sv.status()) == 143


EXIT_NOW_SCRIPT = """
import sys, anyio, tensorflow as tf, asupervisor as asv

asv.configure_logging()
w = tf.Variable(tf.zeros([256, 256]))
sv = asv.Supervisor(sys.argv[1], state={"w": w}, stop_grace_secs=25)

def step():
    w.assign_add(tf.ones([256, 256]))
    if sv.global_step == 50:
        print("ready", flush=True)

async def main():
    async with sv.managed_session() as sess:
        await sess.run_loop(step)

anyio.run(main)
print("stopped at", sv.global_step, flush=True)
asv.exit_now(sv.status())
"""


def test_exit_now_ends_a_preempted_training_within_a_spot_notice(tmp_path: Path) -> None:
    """A SIGTERM with ``stop_grace_secs=25`` and ``asv.exit_now``: the process is gone with
    status 143 well within a spot VM's 30 s, its final checkpoint committed and readable by
    plain TensorFlow, and what it printed and logged last flushed (nothing lost to
    ``os._exit``)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    logdir = tmp_path / "run"
    with subprocess.Popen(
        [sys.executable, "-c", EXIT_NOW_SCRIPT, str(logdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        exited = ExitTimer(proc.pid)
        out, err = proc.communicate(timeout=scaled(60))
        took = exited.secs()
    assert proc.returncode == 143, err
    assert took < 26, f"{took:.1f} s from SIGTERM to exit"
    step = int(out.split()[-1])
    assert out.strip() == f"stopped at {step}" and "session.stopped" in err, (out, err)
    latest = tf.train.latest_checkpoint(str(logdir))
    assert latest is not None and latest.endswith(f"model.ckpt-{step}")
    assert tf.train.load_variable(latest, "w/.ATTRIBUTES/VARIABLE_VALUE")[0, 0] == step


def test_exit_now_refuses_what_is_not_a_status() -> None:
    """``exit_now`` takes a Status or an int status; anything else is a TypeError naming it
    (and the process goes on)."""
    with pytest.raises(TypeError, match="'143'"):
        asv.exit_now("143")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="True"):
        asv.exit_now(True)
