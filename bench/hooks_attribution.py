"""Benchmark: what each stock hook costs per step, robust to a noisy machine.

One session holds every stock hook (so each got its ``begin``/``after_create_session``);
between short chunks of steps the benchmark swaps the runtime's :class:`HookRunner` for
one built from a subset of those hooks, and times ``Steps.run_loop`` *on the step
thread* (no hand-off in the figure). Contenders, rotated every round so that a noisy
neighbour hits them all alike:

* ``bare main``: ``for _ in range(n): step()`` on the main thread (the event loop waits);
* ``bare step-thread``: the same loop on the step thread;
* ``loop (no hooks)``: ``run_loop`` with no per-step hook (its fast path);
* ``+ Hook``: ``run_loop`` with that one hook;
* ``all hooks``: ``run_loop`` with all nine.

Each contender's cost is the median over rounds of its difference from ``loop (no
hooks)`` *in the same round* (paired), in µs per step; medians of per-step times are
printed too. ``--step python`` times a step that runs no TF op (the hooks' own Python
cost, with no TF step noise around it). Run: ``python bench/hooks_attribution.py
[--step tiny|mlp|python] [--rounds 40]
[--chunk 400] [--backend trio]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
from hooks_overhead import mlp_step, stock_hooks, tiny_step

import asupervisor as asv
from asupervisor._core._hooks import HookRunner
from asupervisor._core._steps import Halt


def python_step() -> tuple[Callable[[], Any], Any, Any]:
    """A step with no TF op: returns the same ``{"loss": constant}``; shows the hooks' own
    Python cost per step, without a TF step's noise around it."""
    import tensorflow as tf

    v = tf.Variable(0.0)
    out = {"loss": tf.constant(1.0)}
    return (lambda: out), {"v": v}, v


class _NoOp(asv.SessionRunHook):
    def after_run(self, run_context: Any, run_values: Any) -> None:
        pass


def _bare(step: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return time.perf_counter() - t0


def _timed_loop(rt: Any, runner: HookRunner, step: Callable[[], Any], n: int) -> float:
    rt.hooks = runner
    t0 = time.perf_counter()
    rt.steps.run_loop(step, None, rt.step + n, Halt())
    return time.perf_counter() - t0


async def main(kind: str, rounds: int, chunk: int) -> None:
    logging.getLogger("asupervisor").setLevel(logging.WARNING)  # quiet
    step, state, probe = {"tiny": tiny_step, "mlp": mlp_step, "python": python_step}[kind]()
    for _ in range(20):
        step()
    with tempfile.TemporaryDirectory() as logdir:
        hooks = stock_hooks(logdir, probe)
        sv = asv.Supervisor(logdir, state=state, hooks=hooks, handle_signals=False)
        async with sv.managed_session() as sess:
            rt = sess._rt
            for _ in range(5):
                await sess.run(step)
            contenders: dict[str, Callable[[], Any]] = {}
            contenders["bare main"] = lambda: _bare(step, chunk)
            contenders["bare step-thread"] = lambda: rt.step_thread.call(_bare, step, chunk)
            runners = {"loop (no hooks)": HookRunner([]), "loop (no hooks) again": HookRunner([])}
            runners["+ no-op after_run"] = HookRunner([_NoOp()])
            for hook in hooks:
                runners[f"+ {type(hook).__name__}"] = HookRunner([hook])
            runners["all hooks"] = HookRunner(hooks)
            for name, runner in runners.items():
                contenders[name] = lambda runner=runner: rt.step_thread.call(_timed_loop, rt, runner, step, chunk)
            names = [n for n in contenders if not ONLY or n in ONLY or n.startswith("loop (no hooks)")]
            times: dict[str, list[float]] = {name: [] for name in names}
            for r in range(rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    result = contenders[name]()
                    if not isinstance(result, float):
                        result = await result
                    times[name].append(result / chunk)
            rt.hooks = HookRunner(hooks)
    base = times["loop (no hooks)"]
    print(f"{kind} step, {rounds} rounds x {chunk} steps, backend {anyio_backend}")
    print(f"  {'contender':28s} {'median us/step':>14s} {'paired diff us':>15s}")
    for name in names:
        med = statistics.median(times[name]) * 1e6
        diff = statistics.median(t - b for t, b in zip(times[name], base)) * 1e6
        print(f"  {name:28s} {med:14.1f} {diff:+15.2f}")


anyio_backend = "asyncio"
ONLY: set[str] = set()  # --only: these contenders (and the no-hook baseline)

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step", default="tiny", choices=["tiny", "mlp", "python"])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--chunk", type=int, default=400)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help='e.g. "+ NanTensorHook"')
    args = parser.parse_args()
    ONLY.update(args.only)
    anyio_backend = args.backend
    anyio.run(main, args.step, args.rounds, args.chunk, backend=args.backend)
