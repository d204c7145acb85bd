"""The notice window in real processes: how many steps a notice with a deadline loses.

Runs ``tests/core/scripts/notice_window.py`` (one session per phase: steady training, a
long first ``tf.function`` trace, ``fit``'s validation, the wait for the first batch, a
200 MB periodic save being written),
sends each phase a SIGUSR1 carrying a deadline, and counts the trials in which every
phase ended before its deadline with its final checkpoint at most one step short of the
last step that fits (``1.2 x`` the measured save time plus 2 s for the wind-down and the
process's exit kept before the deadline)::

    python bench/notice_window.py --trials 20 [--backend asyncio]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "core" / "scripts" / "notice_window.py"
#: phase -> the notice's deadline in seconds
PHASES = {"warmup": 3.0, "first_trace": 4.0, "validation": 4.0, "steady": 4.0, "save_in_flight": 4.0}
#: phases whose step thread cannot step during the notice (no step could fit after it)
BLOCKED = {"validation", "warmup"}
WIND_DOWN_SECS = 2.0  # the wind-down and the process's exit (asupervisor._core._notice)
SAVE_MARGIN = 1.2


def run_trial(backend: str, root: str, phases: dict[str, float]) -> tuple[list[dict[str, Any]], int, float]:
    """One process through ``phases``; each phase's result (with ``sent``, the notice's
    time), the exit status, and when the process ended (``time.monotonic()``)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    args = [sys.executable, str(SCRIPT), backend, root, *(f"{p}:{d}" for p, d in phases.items())]
    results: list[dict[str, Any]] = []
    sent: dict[str, float] = {}
    with (
        open(Path(root) / "stderr.log", "w") as err,
        subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True, env=env) as proc,
    ):
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("ready "):
                    phase = line.split()[1]
                    if phase in phases and phase not in sent:
                        sent[phase] = time.monotonic()
                        proc.send_signal(signal.SIGUSR1)
                elif line.startswith("{"):
                    result = json.loads(line)
                    result["sent"] = sent.get(result["phase"])
                    results.append(result)
            proc.wait(timeout=60)
        finally:
            proc.kill()
    return results, proc.returncode, time.monotonic()


def judge(result: dict[str, Any], deadline_secs: float) -> dict[str, Any]:
    """A phase's figures: ``fits`` (the last step whose end leaves the reserve before the
    deadline, steps not taken projected at the median step time), ``lost`` (``fits`` less
    the final checkpoint's step; below 0: steps past the rule, made with the save time
    measured then) and ``ended_before`` (seconds to spare at the session's end)."""
    deadline = result["sent"] + deadline_secs
    save = result["save_secs"] or 0.0
    limit = deadline - (SAVE_MARGIN * save + WIND_DOWN_SECS)
    ends = result["step_ends"]
    final = result["final_step"]
    first = final - len(ends)  # the step count before the first end recorded
    fits = first + sum(1 for e in ends if e <= limit)
    if result["phase"] not in BLOCKED and len(ends) >= 3 and fits == final:
        step = statistics.median(b - a for a, b in itertools.pairwise(ends[1:]))
        fits = final + max(0, int((limit - ends[-1]) // step))
    return {
        "phase": result["phase"],
        "final": final,
        "checkpoint": result["last_checkpoint"],
        "fits": fits,
        "lost": fits - (result["last_checkpoint"] if result["last_checkpoint"] is not None else -1),
        "ended_before": round(deadline - result["ended_at"], 3),
        "reason": result["reason"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--backend", default="asyncio", choices=("asyncio", "trio"))
    args = parser.parse_args()
    good = 0
    worst: dict[str, int] = {}
    for trial in range(args.trials):
        with tempfile.TemporaryDirectory() as root:
            results, code, ended = run_trial(args.backend, root, PHASES)
            figures = [judge(r, PHASES[r["phase"]]) for r in results]
            last = results[-1] if results else None
            in_time = last is not None and ended < last["sent"] + PHASES[last["phase"]]
            ok = (
                len(figures) == len(PHASES)
                and code == 128 + signal.SIGUSR1
                and in_time
                and all(f["lost"] <= 1 and f["ended_before"] > 0 for f in figures)
            )
            good += ok
            for f in figures:
                worst[f["phase"]] = max(worst.get(f["phase"], 0), f["lost"])
            print(json.dumps({"trial": trial, "ok": ok, "exit": code, "phases": figures}), flush=True)
    print(f"notice window: {good} of {args.trials} trials within 1 step of the deadline; worst lost {worst}")


if __name__ == "__main__":
    main()
