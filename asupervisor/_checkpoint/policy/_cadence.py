"""When one session saves: the single place its save policy is asked.

A session's save moments all come through one :class:`Cadence`:

* the step trigger: :meth:`Cadence.next_step` is the next multiple of the policy's
  ``every_steps`` (the step loop compares one integer per step), where the step thread
  asks :meth:`Cadence.due` ``("step")``;
* the timer: :meth:`Cadence.interval_secs` is the policy's ``every_secs`` now, fixed or
  adaptive (:attr:`Cadence.adaptive`: it moves as saves are measured); the checkpoint
  service asks :meth:`Cadence.due` ``("tick")`` at each tick;
* start-up and the stop: :meth:`Cadence.due` ``("startup")`` / ``("stop")``;
* what each committed save cost training (:class:`SaveCostMeter`), which an adaptive
  policy turns into its next interval (:meth:`Cadence.committed`, logged as
  ``checkpoint.interval`` at info when it moves).

The saver (:mod:`._saver`) and the service only act on these answers: they decide how to
save (wait for a write in flight or skip it), never whether. Plain decisions: no threads,
no file work.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from ..._logging import get_logger
from ._policies import (
    SaveMoment,
    SavePolicy,
    every_secs,
    every_steps,
    interval_bound,
    observes_save_cost,
    takes_write_secs,
)

if TYPE_CHECKING:
    from ..snapshot._snapshot import Snapshot

__all__ = ["Cadence", "MomentKind", "SaveCostMeter"]

log = get_logger(__name__)

#: the moments a save policy is asked at (:attr:`SaveMoment.kind`)
MomentKind = Literal["step", "tick", "startup", "stop"]


class SaveCostMeter:
    """The training time a save cost, measured by the step count (writer thread).

    From the snapshot's start to the commit, training made ``s1 - s0`` steps; at the
    step rate measured before the save they would have taken ``(s1 - s0 + 0.5) *
    secs_per_step`` (the half step: the commit falls inside a step on average). The
    difference is what the save cost: the snapshot's blocked time, the next step's
    copy-on-write, the background write's interference. The rate before is taken from
    the last :meth:`sample` (the adaptive timer takes one halfway between saves, after
    the previous save's after-effects) or else from the previous commit. ``None`` when
    there is no baseline yet or training was not stepping (fewer than 3 steps in it).
    """

    def __init__(self, steps: Callable[[], int], clock: Callable[[], float] = time.perf_counter) -> None:
        self._steps = steps
        self._clock = clock
        self._last: tuple[float, int] | None = None  # (time, step) at the last commit
        self._mark: tuple[float, int] | None = None  # (time, step) of the last sample

    def sample(self) -> None:
        """From any thread: the baseline's start is now (training undisturbed since)."""
        self._mark = (self._clock(), self._steps())

    def committed(self, snapshot: Snapshot) -> float | None:
        """At a commit of ``snapshot``: its cost to training in seconds, if measurable."""
        now, s1 = self._clock(), self._steps()
        start, s0 = snapshot.taken_at - snapshot.blocked_secs, snapshot.step
        last, self._last = self._last, (now, s1)
        mark = self._mark
        if mark is not None and (last is None or mark[0] > last[0]) and mark[0] < start and s0 - mark[1] >= 3:
            last = mark  # the later baseline: clear of the previous save's after-effects
        if last is None or s0 - last[1] < 3 or start <= last[0]:
            return None
        secs_per_step = (start - last[0]) / (s0 - last[1])
        return max(0.0, (now - start) - (s1 - s0 + 0.5) * secs_per_step)


class Cadence:
    """When one session saves (see the module docstring).

    Args:
        policy: the save policy; ``None``: no moment is due (this session saves only on
            ``save_now`` and for hooks).
        moment: makes the :class:`SaveMoment` of a kind, now (step, stop reason, ...).
        steps: the global step now, for the save-cost meter of an adaptive policy.
        warmup: the first this-many measured saves are not measurements (a process's
            first save checks the native writer and has no staging buffers yet: after a
            restart, with no start-up save, it would set the interval for a while).
    """

    def __init__(
        self,
        policy: SavePolicy | None,
        moment: Callable[[MomentKind], SaveMoment],
        steps: Callable[[], int],
        *,
        warmup: int = 0,
    ) -> None:
        self.policy = policy
        self._warmup = warmup
        self._moment = moment
        self.every_steps = None if policy is None else every_steps(policy)
        #: whether the timer's interval follows measured save costs (``observe_save_cost``)
        self.adaptive = policy is not None and observes_save_cost(policy)
        self.meter = SaveCostMeter(steps) if self.adaptive else None

    def due(self, kind: MomentKind) -> bool:
        """Whether the policy saves at this moment of ``kind``."""
        return self.policy is not None and self.policy.should_save(self._moment(kind))

    def next_step(self, step: int) -> float:
        """The step after ``step`` at which the policy is asked next (``inf``: never)."""
        n = self.every_steps
        return math.inf if n is None else (step // n + 1) * n

    def interval_secs(self) -> float:
        """Seconds from one timer tick to the next, now (``inf``: no timer). An adaptive
        policy's changes after each measured save."""
        secs = None if self.policy is None else every_secs(self.policy)
        return math.inf if secs is None else secs

    def sample_baseline(self) -> None:
        """From any thread: the step-rate baseline of the next save's cost starts now."""
        if self.meter is not None:
            self.meter.sample()

    def committed(self, snapshot: Snapshot, write_secs: float | None) -> None:
        """On the writer thread, after ``snapshot``'s commit (its write took
        ``write_secs``, if known): feed its measured cost to an adaptive policy and log
        the new interval if it moved."""
        if self.meter is None:
            return
        cost = self.meter.committed(snapshot)
        if cost is None:
            return
        if self._warmup > 0:
            self._warmup -= 1
            log.debug("checkpoint.save_cost", secs=round(cost, 4), step=snapshot.step, warmup=True)
            return
        write_rounded = None if write_secs is None else round(write_secs, 4)
        log.debug("checkpoint.save_cost", secs=round(cost, 4), write_secs=write_rounded, step=snapshot.step)
        observe: Callable[..., float | None] = getattr(self.policy, "observe_save_cost")  # noqa: B009
        if write_secs is not None and takes_write_secs(observe):
            interval = observe(cost, write_secs=write_secs)
        else:  # an observer written before write_secs: the cost alone
            interval = observe(cost)
        if interval is not None:
            log.info(
                "checkpoint.interval",
                secs=round(interval, 2),
                bound=interval_bound(self.policy),
                save_cost_secs=round(cost, 4),
                write_secs=write_rounded,
                step=snapshot.step,
            )
