"""A trio-native embedding: a nursery that runs training jobs side by side.

A small job runner, as a trio application would have: each job is a supervised training
(its own logdir, checkpoints, resume) started in the runner's nursery, and a reporter task
prints every job's ``status()`` while they run. One Ctrl-C stops every job gracefully,
each with a final checkpoint (each session chains to the handler installed before it),
and running the command again resumes each job where it stopped::

    python examples/trio_jobs.py --logdir runs/jobs --steps 300

uvicorn (``examples/web_app.py``) runs on asyncio only; this example shows the same
library on trio.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf
import trio

import asupervisor as asv


def make_job(logdir: Path, seed: int) -> tuple[asv.Supervisor, object]:
    """A supervisor and a step function fitting ``w`` to ``target`` (one job)."""
    target = tf.constant(float(seed))
    w = tf.Variable(0.0)
    optimizer = tf.keras.optimizers.SGD(0.05)

    @tf.function
    def step() -> dict[str, tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = (w - target) ** 2
        optimizer.apply_gradients([(tape.gradient(loss, w), w)])
        return {"loss": loss}

    sv = asv.Supervisor(logdir, state={"w": w, "optimizer": optimizer}, save_model_secs=30, save_summaries_secs=5)
    return sv, step


async def run_job(name: str, sv: asv.Supervisor, step: object, max_steps: int) -> None:
    async with sv.managed_session() as sess:
        if sess.global_step:
            print(f"{name}: resumed at step {sess.global_step}", flush=True)
        await sess.run_loop(step, max_steps=max_steps)  # type: ignore[arg-type]
    print(f"{name}: stopped at step {sv.global_step} ({sv.status().stop_reason})", flush=True)


async def report(jobs: dict[str, asv.Supervisor], every: float) -> None:
    while True:
        await trio.sleep(every)
        line = "  ".join(f"{name} {sv.status().global_step}" for name, sv in jobs.items())
        print(f"progress: {line}", flush=True)


async def main(args: argparse.Namespace) -> int:
    jobs = {f"job{i}": make_job(Path(args.logdir) / f"job{i}", seed=i + 1) for i in range(args.jobs)}
    async with trio.open_nursery() as runner:
        runner.start_soon(report, {name: sv for name, (sv, _) in jobs.items()}, args.report_secs)
        async with trio.open_nursery() as training:
            for name, (sv, step) in jobs.items():
                training.start_soon(run_job, name, sv, step, args.steps)
        runner.cancel_scope.cancel()  # every job has ended: stop the reporter
    # the worst status among the jobs: a preempted runner is run again
    return max(asv.exit_code(sv.status()) for sv, _ in jobs.values())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="training jobs in a trio nursery")
    parser.add_argument("--logdir", default="runs/jobs")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300, help="each job trains up to this global step")
    parser.add_argument("--report-secs", type=float, default=1.0)
    sys.exit(trio.run(main, parser.parse_args()))
