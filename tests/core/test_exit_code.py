"""``asv.exit_code``: the status a command exits with, from real sessions' ends."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import tensorflow as tf

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
