"""Checkpoint cadence by overhead budget: ``save_model_secs="auto"`` against no checkpoints.

Run from the repository root::

    python bench/overhead_budget.py              # 3 rounds of 2 x 120 s
    python bench/overhead_budget.py --secs 60 --rounds 2

An MLP (784-2176-2176-2176-10, Adam: a 128 MB state with its slots) trains on one fixed
batch through ``Supervisor.run_loop``, alternately with no checkpoints (``save_model_secs
=0``) and with ``save_model_secs="auto"`` (``OverheadBudget(0.02)``: start-up save, then
as often as keeps the measured slowdown under 2 %), each for ``--secs`` seconds of
training, in the same process. It prints steps/sec of each round, the slowdown of each
auto round against the mean of the no-checkpoint rounds around it, the median and range
of the slowdowns, an in-run measure that drift between rounds cannot move (each round's
mean step over its median step, the auto rounds' minus the no-checkpoint rounds' around
them: what the work at the saves' step boundaries costs), the median step of the auto
rounds against the rounds around them (drift, or a cost on every step), and what the
policy did: saves written, the intervals it chose
(``checkpoint.interval``) and the save costs it measured (``checkpoint.save_cost``).
``--min-secs`` sets the policy's floor (default 1 s, the first interval 10 s until a save is measured). CheckFreq (FAST '21) reports
<= 3.5 % overhead with its tuned frequency.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, mlp_step


def mlp(width: int = 2176) -> tuple[Any, Any]:
    """A training step of the 128 MB MLP and its state (Adam's slots built)."""
    import tensorflow as tf

    step, state = mlp_step(hidden=(width, width, width), optimizer=tf.keras.optimizers.Adam(1e-4))
    step()  # builds the optimizer's slots: the state is complete before the first save
    return step, state


def state_mb(state: dict[str, Any]) -> float:
    variables = list(state["model"].variables) + list(state["optimizer"].variables)
    return sum(int(v.numpy().nbytes) for v in variables) / (1 << 20)


def run(
    mode: str, secs: float, step: Any, state: dict[str, Any], root: Path, min_secs: float | None = None
) -> dict[str, Any]:
    """Train ``secs`` seconds; steps/sec and what the checkpoint policy logged."""
    import anyio

    import asupervisor as asv
    from asupervisor.testing import capture_logs

    logdir = root / f"{mode}-{time.monotonic_ns()}"
    policy: dict[str, Any] = {"save_model_secs": "auto" if mode == "auto" else 0}
    if mode == "auto" and min_secs is not None:  # the same policy with another floor
        policy = {
            "save_policy": asv.AnySavePolicy(asv.OverheadBudget(0.02, min_secs=min_secs), asv.OnStartup(), asv.OnStop())
        }
    sv = asv.Supervisor(
        logdir,
        state=state,
        **policy,
        save_summaries_secs=0,
        handle_signals=False,
        max_to_keep=2,
    )
    out: dict[str, Any] = {}
    ends: list[float] = []  # when each step ended (on the step thread)

    def timed_step() -> Any:
        result = step()
        ends.append(time.perf_counter())
        return result

    async def main() -> None:
        async with sv.managed_session() as sess:
            await sess.run(step)  # the start-up save (auto) is behind us, the step warm
            t0 = time.perf_counter()
            s0 = sess.global_step
            with anyio.move_on_after(secs):
                await sess.run_loop(timed_step)
            out["steps_per_sec"] = (sess.global_step - s0) / (time.perf_counter() - t0)

    with capture_logs() as events:
        anyio.run(main)
    gaps = [b - a for a, b in itertools.pairwise(ends)]  # a step and what ran at its boundary
    out["median_step"] = statistics.median(gaps) if gaps else float("nan")
    out["excess"] = statistics.mean(gaps) / statistics.median(gaps) - 1 if len(gaps) > 1 else float("nan")
    out["saves"] = sum(1 for e in events if e["event"] == "checkpoint.saved")
    out["intervals"] = [e["secs"] for e in events if e["event"] == "checkpoint.interval"]
    out["costs"] = [e["secs"] for e in events if e["event"] == "checkpoint.save_cost"]
    shutil.rmtree(logdir, ignore_errors=True)
    return out


def paired(rows: list[tuple[str, dict[str, Any]]], key: str) -> list[tuple[float, float]]:
    """Each auto round's ``key`` and the mean of it over the no-checkpoint rounds around it."""
    pairs = []
    for i, (mode, r) in enumerate(rows):
        if mode == "auto":
            around = [rows[j][1][key] for j in (i - 1, i + 1) if 0 <= j < len(rows) and rows[j][0] == "none"]
            pairs.append((r[key], statistics.mean(around)))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--secs", type=float, default=120.0, help="seconds of training per round (120)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (none, auto) (3)")
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    parser.add_argument("--min-secs", type=float, help="OverheadBudget's min_secs (default: the policy's 1 s)")
    args = parser.parse_args()
    logging.getLogger("asupervisor").propagate = False
    step, state = mlp()
    root = Path(tempfile.mkdtemp(prefix="asv-bench-budget-", dir=args.dir))
    print(machine())
    print(f"MLP state {state_mb(state):.0f} MB; {args.rounds} rounds of {args.secs:.0f} s per mode, alternating")
    try:
        rows: list[tuple[str, dict[str, Any]]] = []
        for _ in range(args.rounds):
            for mode in ("none", "auto"):
                r = run(mode, args.secs, step, state, root, args.min_secs)
                rows.append((mode, r))
                extra = f"  median step {1000 * r['median_step']:6.2f} ms  excess {100 * r['excess']:5.2f} %"
                if mode == "auto":
                    extra += f"  saves {r['saves']}  intervals {r['intervals']}  costs {r['costs']}"
                print(f"  {mode:>4}: {r['steps_per_sec']:7.2f} steps/s{extra}", flush=True)
        r_none = [r["steps_per_sec"] for m, r in rows if m == "none"]
        slowdowns = [1 - auto / none for auto, none in paired(rows, "steps_per_sec")]
        print(
            f"\nno checkpoints: median {statistics.median(r_none):.2f} steps/s\n"
            f"auto (2 % budget): slowdown median {100 * statistics.median(slowdowns):.1f} % "
            f"(range {100 * min(slowdowns):.1f} to {100 * max(slowdowns):.1f} %); CheckFreq: <= 3.5 %"
        )
        # within each round: the mean step (boundary work included) over the median step;
        # the auto rounds' excess minus that of the no-checkpoint rounds around them is
        # what the saves cost, free of the drift between rounds that moves both alike
        in_run = [auto - none for auto, none in paired(rows, "excess")]
        print(
            f"auto: in-run overhead (mean / median step, minus the no-checkpoint rounds') median "
            f"{100 * statistics.median(in_run):.2f} % (range {100 * min(in_run):.2f} to {100 * max(in_run):.2f} %)"
        )
        shifts = [auto / none - 1 for auto, none in paired(rows, "median_step")]
        print(
            f"      median step, auto / no-checkpoint rounds around it: median {100 * statistics.median(shifts):+.2f} % "
            f"(range {100 * min(shifts):+.2f} to {100 * max(shifts):+.2f} %): drift between rounds, or a cost on every step"
        )
        chosen = [x for _, r in rows for x in r["intervals"]]
        if chosen:
            print(
                f"intervals chosen: median {statistics.median(chosen):.1f} s (range {min(chosen):.1f}-{max(chosen):.1f})"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
