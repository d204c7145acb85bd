"""``asupervisor verify-resume SCRIPT [ARGS]``: does a user's script resume exactly?

It runs the script to its end (the reference), then again in a second log directory,
SIGKILLing it ``--kills`` times at moments chosen by a seeded random generator and
aimed by the library's events at the phases where resume goes wrong (the first trace
after a start, a save in flight, an evaluation at an epoch's end, plain training), each
time starting it again until a run ends by itself. The two final checkpoints are then
compared value by value (:mod:`._compare`). On a difference the script is run once more
without kills: whether that run matches the reference tells a non-deterministic script
from a resume that is not exact.

Each run gets its log directory through ``ASUPERVISOR_LOGDIR`` and ``{logdir}`` in ARGS,
its last step through ``ASUPERVISOR_MAX_STEPS`` (``--steps``) and a checkpoint cadence
through ``ASUPERVISOR_SAVE_STEPS`` (:mod:`asupervisor._overrides`). Exit status: 0 the
same state, 1 a difference (or a resumed run that failed), 2 a script that cannot be
verified (missing, failing without kills, leaving no checkpoint).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _compare
from ._runs import KillPlan, Run, run_script

__all__ = ["LOGDIR_ENV", "MAX_STEPS_ENV", "SAVE_STEPS_ENV", "run"]

# What asupervisor._overrides reads in each run (a front door, which this feature may not
# import; tests/test_verify_resume.py checks the names agree).
LOGDIR_ENV = "ASUPERVISOR_LOGDIR"
MAX_STEPS_ENV = "ASUPERVISOR_MAX_STEPS"
SAVE_STEPS_ENV = "ASUPERVISOR_SAVE_STEPS"


def _say(line: str) -> None:
    print(line, flush=True)  # noqa: T201


def _fail(line: str, code: int, run: Run | None = None) -> int:
    if run is not None and run.stderr_tail():
        print(run.stderr_tail(), file=sys.stderr)  # noqa: T201
    _say(f"verify-resume: {line}")
    return code


def _latest(logdir: Path) -> str | None:
    from .._tf import tf

    found: str | None = tf().train.latest_checkpoint(str(logdir))
    return found


def _step_of(prefix: str) -> int | None:
    from .._tf import tf

    reader = tf().train.load_checkpoint(prefix)
    return (
        int(reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE"))
        if reader.has_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE")
        else None
    )


class _Phases:
    """The kill plans, timed from what the reference run showed."""

    def __init__(self, reference: Run, final_step: int, save_steps: int, rng: random.Random) -> None:
        self.rng = rng
        started = reference.first("session.started")
        self.train_secs = max(0.05, reference.secs - (started["t"] if started else 0.0))
        self.final_step = max(1, final_step)
        self.save_steps = max(1, save_steps)
        saves = [e for e in reference.all("checkpoint.saved") if 0 < e.get("step", 0) < final_step]
        gaps = [(b["t"] - a["t"]) / max(1, b["step"] - a["step"]) for a, b in itertools.pairwise(saves)]
        secs = [float(e.get("secs", 0.0)) for e in reference.all("checkpoint.saved")]
        self.save_secs = statistics.median(secs) if secs else 0.05
        per_step = statistics.median(gaps) if gaps else self.train_secs / self.final_step
        self.save_gap = per_step * self.save_steps
        epochs = reference.all("fit.epoch")
        epoch_gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(epochs)]
        self.epoch_gap = statistics.median(epoch_gaps) if epoch_gaps else None

    def _remaining(self, event: dict[str, Any]) -> float:
        done = int(event.get("global_step", 0) or 0)
        return self.train_secs * max(0.05, 1 - done / self.final_step)

    def plans(self, kills: int) -> list[KillPlan]:
        """``kills`` plans: training between two saves, a save in flight, an epoch's end
        (when the script has epochs), shuffled, with the first trace after a restore
        second (a kill before any checkpoint past the start tests nothing of a resume)."""
        rng, last = self.rng, self.final_step

        def after_save(delay: Callable[[], float]) -> Callable[[dict[str, Any]], float | None]:
            # after a save past a random step: the run then has a checkpoint to resume from
            every = self.save_steps
            target = rng.choice(range(every, last, every)) if every < last else 1
            return lambda e: delay() if target <= e.get("step", 0) < last else None

        gap, secs = self.save_gap, self.save_secs
        menu = [
            KillPlan("training", "checkpoint.saved", after_save(lambda: rng.uniform(0, 0.9 * gap))),
            KillPlan("a save in flight", "checkpoint.saved", after_save(lambda: gap - rng.uniform(0, secs))),
        ]
        if self.epoch_gap is not None:
            epoch = self.epoch_gap
            menu.append(KillPlan("an epoch's end (evaluation)", "fit.epoch", lambda e: epoch * rng.uniform(0.85, 1.0)))
        first_trace = KillPlan(
            "first trace", "session.started", lambda e: rng.uniform(0, min(1.0, 0.2 * self._remaining(e)))
        )
        rng.shuffle(menu)
        # the first trace after a restore, not the first of all: a kill before any
        # checkpoint past the start tests nothing of the resume
        menu.insert(1, first_trace)
        return [menu[i % len(menu)] for i in range(kills)]


def _describe(run: Run) -> str:
    started = run.first("session.started")
    start = f"from step {started.get('global_step', 0)}" if started else "before its session started"
    saved = [e.get("step") for e in run.all("checkpoint.saved")]
    last = f", last saved step {saved[-1]}" if saved else ""
    if run.code is None:
        return f"{start}, killed after {run.killed_at:.2f} s ({run.phase}){last}"
    return f"{start}, ended after {run.secs:.2f} s, exit {run.code}{last}"


def run(args: argparse.Namespace) -> int:
    """The command; its exit status (see the module docstring)."""
    script = Path(args.script)
    if not script.is_file():
        return _fail(f"no such script: {str(script)!r}", 2)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="asv-verify-"))
    if workdir.exists() and any(workdir.iterdir()):
        return _fail(f"--workdir {str(workdir)!r} is not empty", 2)
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    save_steps = args.save_steps or (max(1, args.steps // 8) if args.steps else None)
    ours = (LOGDIR_ENV, MAX_STEPS_ENV, SAVE_STEPS_ENV)
    base = {k: v for k, v in os.environ.items() if k not in ours}
    base.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    def start(label: str, logdir: Path, plan: KillPlan | None = None) -> Run:
        env = {**base, LOGDIR_ENV: str(logdir)}
        if args.steps:
            env[MAX_STEPS_ENV] = str(args.steps)
        if save_steps:
            env[SAVE_STEPS_ENV] = str(save_steps)
        values = {"logdir": str(logdir), "steps": str(args.steps or "")}
        command = [
            str(script),
            *(a.replace("{logdir}", values["logdir"]).replace("{steps}", values["steps"]) for a in args.args),
        ]
        return run_script(label, command, env, workdir, timeout=args.timeout, plan=plan)

    reference = start("reference", workdir / "reference")
    _say(f"run 1, reference: {_describe(reference)}")
    if reference.timed_out:
        return _fail(f"the reference run took over --timeout {args.timeout:g} s", 2, reference)
    if reference.code != 0:
        return _fail(f"the script fails without kills (exit {reference.code}); its stderr is above", 2, reference)
    ref_ckpt = _latest(workdir / "reference")
    if ref_ckpt is None:
        return _fail(
            "the reference run left no checkpoint: does the script make an asv.Supervisor "
            "(its logdir comes from ASUPERVISOR_LOGDIR, or {logdir} in ARGS)?",
            2,
        )
    final_step = _step_of(ref_ckpt) or 0
    if save_steps is None:  # the script's own cadence may leave nothing to resume from
        save_steps = max(1, final_step // 8)
    phases = _Phases(reference, final_step, save_steps, rng)
    resumed_dir = workdir / "resumed"
    kills = 0
    number = 1
    last: Run | None = None
    resumed_runs: list[Run] = []
    for plan in phases.plans(args.kills):
        number += 1
        last = start(f"run-{number}", resumed_dir, plan)
        resumed_runs.append(last)
        _say(f"run {number}: {_describe(last)}")
        if last.timed_out:
            return _fail(f"run {number} took over --timeout {args.timeout:g} s", 1, last)
        if last.code is not None:
            break  # it ended before its kill came: nothing left to resume
        kills += 1
    if last is None or last.code is None:
        number += 1
        last = start(f"run-{number}", resumed_dir)
        resumed_runs.append(last)
        _say(f"run {number}: {_describe(last)}")
        if last.timed_out:
            return _fail(f"run {number} took over --timeout {args.timeout:g} s", 1, last)
    if last.code != 0:
        return _fail(f"the resumed run failed (exit {last.code}); its stderr is above", 1, last)
    resumed_ckpt = _latest(resumed_dir)
    if resumed_ckpt is None:
        return _fail("the resumed run left no checkpoint", 1)
    differences = _compare.compare(ref_ckpt, resumed_ckpt)

    def exact(why: str = "") -> int:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        resumed_from = [int(ev.get("global_step", 0) or 0) for r in resumed_runs for ev in r.all("session.started")]
        if not any(resumed_from):
            _say("note: no run resumed from a checkpoint past step 0; --save-steps lower or --steps higher")
        plural = "kill" if kills == 1 else "kills"
        _say(
            f"verify-resume: exact ({kills} {plural}): the final state at step {final_step} is bitwise the reference's"
            + why
        )
        return 0

    if not differences:
        return exact()
    deterministic = None
    if args.control:
        number += 1
        control = start(f"run-{number}", workdir / "control")
        _say(f"run {number}, reference again: {_describe(control)}")
        control_ckpt = _latest(workdir / "control") if control.code == 0 else None
        if control_ckpt is not None:
            unsteady = _compare.compare(ref_ckpt, control_ckpt)
            if _compare.only_iterator_bytes(differences) and _compare.only_iterator_bytes(unsteady):
                # a prefetch buffer (an explicit one, or the one tf.data injects) is saved
                # as filled at the save: its bytes differ between runs at the same position
                return exact(
                    " (the data iterator's saved bytes differ between two uninterrupted runs too,"
                    " a prefetch buffer's fill: its position is judged by the state it fed)"
                )
            deterministic = not unsteady
    cause = _compare.likely_cause(
        differences, iterator_saved=_compare.has_iterator(ref_ckpt), deterministic=deterministic
    )
    first = differences[0]
    return _fail(
        f"differs at {first.key} ({first.kind}, {len(differences)} values differ; runs in {workdir}): {cause}", 1
    )
