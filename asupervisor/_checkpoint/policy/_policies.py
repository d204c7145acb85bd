"""When to save and what to keep: checkpoint policies as small objects.

**When to save.** A :class:`SavePolicy` has one method, :meth:`~SavePolicy.should_save`,
asked at the moments it can want — never per step: at the multiples of its
``every_steps`` (the step trigger stays one integer compare per step), at the ticks of
its ``every_secs`` timer, at start-up, at the stop. :class:`EverySteps`,
:class:`EverySeconds`, :class:`OnStartup` (after an init, not a restore),
:class:`OnStop` (the final checkpoint; in multi-worker training only for a stop every
worker reaches) and :class:`AnySavePolicy` are the stock ones; the ``Supervisor``
keywords ``save_model_secs``/``save_model_steps`` build them and ``save_policy=`` takes
one's own. What a due save does while the previous one is still being written
(``checkpoint_when_busy``: wait or skip) is the saver's setting, not a policy: it is
about how to save, not whether.

**What to keep.** Modelled on orbax's preservation policies. A :class:`KeepPolicy` has one method,
:meth:`~KeepPolicy.decide`: given the checkpoints retention may act on (this supervisor's
own, oldest first, the latest excluded — it is always kept), it says of each whether to
``KEEP`` it (it stays in the ``checkpoint`` state file and counts next time), keep it
``FOREVER`` (it stays on disk, no longer managed: never deleted, never counted, as
``tf.train.CheckpointManager`` does with ``keep_checkpoint_every_n_hours``) or ``DROP`` it
(deleted). The stock policies:

* :class:`LatestN` — keep the newest ``n`` checkpoints (the latest included);
* :class:`EveryNHours` — of the checkpoints nothing else keeps, keep one per ``hours``
  forever;
* :class:`KeepBest` — keep the best ``n`` checkpoints by a metric each one records
  (``val_loss``, ``loss``; see :mod:`..snapshot._metrics`);
* :class:`KeepAll` — keep everything (``max_to_keep=None``);
* :class:`AnyKeepPolicy` — a checkpoint is kept if any of its policies keeps it; of the
  ones none keeps, those any keeps forever are kept forever.

Files the supervisor did not write (plain ``tf.train.Checkpoint.save``'s, another
basename's, stamped in the future) are never offered to a policy: they stay. The
``Supervisor`` keywords ``max_to_keep`` and ``keep_checkpoint_every_n_hours`` build
``AnyKeepPolicy(LatestN(max_to_keep), EveryNHours(hours))``; ``keep_policy=`` takes a
policy of one's own. While another save is in flight, the writer adds ``LatestN(2)``.

Plain decisions: no file work here (:mod:`..store._commit` applies them).
"""

from __future__ import annotations

import enum
import inspect
import math
import statistics
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = [
    "AGREED_STOP_REASONS",
    "AnyKeepPolicy",
    "AnySavePolicy",
    "CheckpointRecord",
    "EveryNHours",
    "EverySeconds",
    "EverySteps",
    "Keep",
    "KeepAll",
    "KeepBest",
    "KeepPolicy",
    "LatestN",
    "OnStartup",
    "OnStop",
    "OverheadBudget",
    "SaveMoment",
    "SavePolicy",
]

#: stop reasons every worker reaches at the same step: a final save is taken on them
AGREED_STOP_REASONS = frozenset({"completed", "max_steps", "end_of_data", "hook"})


class Keep(enum.Enum):
    """A retention decision for one checkpoint."""

    DROP = "drop"
    KEEP = "keep"
    FOREVER = "forever"


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint retention may act on.

    Attributes:
        path: its name in the state file (``model.ckpt-1200``).
        time: when it was committed (``time.time()``).
        metrics: the metrics recorded with it (``{"loss": 0.31, "val_loss": 0.4}``;
            empty when it has none): the last step's scalar outputs, and an epoch's logs
            when it was taken at the step that epoch ended.
    """

    path: str
    time: float
    metrics: Mapping[str, float] = field(default_factory=dict, hash=False)


@runtime_checkable
class KeepPolicy(Protocol):
    """Retention: which checkpoints to keep (see the module docstring)."""

    def decide(self, checkpoints: Sequence[CheckpointRecord], *, last_forever: float) -> Sequence[Keep]:
        """One decision per checkpoint of ``checkpoints`` (oldest first; the latest
        checkpoint is not among them: it is always kept).

        Args:
            checkpoints: this supervisor's checkpoints retention may act on.
            last_forever: when the last checkpoint kept forever was committed (or when
                the log directory was first used).
        """
        ...


def _check_positive(name: str, value: object, *, integer: bool) -> None:
    ok = (
        (isinstance(value, int) and not isinstance(value, bool))
        if integer
        else (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))
    )
    if not ok or value <= 0:  # type: ignore[operator]
        kind = "an int >= 1" if integer else "a positive number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")


@dataclass(frozen=True)
class LatestN:
    """Keep the newest ``n`` checkpoints, the latest one included.

    Args:
        n: how many (``>= 1``).
    """

    n: int

    def __post_init__(self) -> None:
        _check_positive("LatestN(n)", self.n, integer=True)

    def decide(self, checkpoints: Sequence[CheckpointRecord], *, last_forever: float) -> Sequence[Keep]:
        """``KEEP`` for the newest ``n - 1`` (the latest makes ``n``), ``DROP`` for the rest."""
        older = max(0, len(checkpoints) - (self.n - 1))
        return [Keep.DROP] * older + [Keep.KEEP] * (len(checkpoints) - older)


@dataclass(frozen=True)
class EveryNHours:
    """Keep one checkpoint per ``hours`` forever (TF's ``keep_checkpoint_every_n_hours``).

    Args:
        hours: the spacing (``> 0``).
    """

    hours: float

    def __post_init__(self) -> None:
        _check_positive("EveryNHours(hours)", self.hours, integer=False)

    def decide(self, checkpoints: Sequence[CheckpointRecord], *, last_forever: float) -> Sequence[Keep]:
        """Oldest first: ``FOREVER`` for one at least ``hours`` after the last one kept
        forever, ``DROP`` otherwise."""
        spacing = self.hours * 3600
        decisions = []
        for record in checkpoints:
            if record.time - last_forever >= spacing:
                last_forever = record.time
                decisions.append(Keep.FOREVER)
            else:
                decisions.append(Keep.DROP)
        return decisions


@dataclass(frozen=True)
class KeepBest:
    """Keep the best ``n`` checkpoints by the metric ``metric`` (besides the latest one,
    which retention always keeps).

    The metric is one a checkpoint records when it is taken
    (:attr:`CheckpointRecord.metrics`): a scalar the step function returns (``loss``),
    or an epoch's log (``val_loss``, ``val_accuracy``) for a checkpoint taken at the end
    of that epoch. A checkpoint without it (or with NaN) is never among the best, and
    ties go to the newer one. Alone, this policy drops every other checkpoint; to keep
    the recent ones too, combine it::

        keep_policy=asv.AnyKeepPolicy(asv.LatestN(3), asv.KeepBest("val_loss"))

    Args:
        metric: the metric's name (``"val_loss"``).
        mode: ``"min"`` (lower is better) or ``"max"``.
        n: how many to keep (``>= 1``).
    """

    metric: str
    mode: str = "min"
    n: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"KeepBest(metric) must be a metric's name (a non-empty str), got {self.metric!r}")
        if self.mode not in ("min", "max"):
            raise ValueError(f"KeepBest(mode) must be 'min' or 'max', got {self.mode!r}")
        _check_positive("KeepBest(n)", self.n, integer=True)

    def decide(self, checkpoints: Sequence[CheckpointRecord], *, last_forever: float) -> Sequence[Keep]:
        """``KEEP`` for the best ``n`` that have the metric (ties: the newer), ``DROP``
        for the rest."""
        sign = 1.0 if self.mode == "min" else -1.0
        ranked = []
        for i, record in enumerate(checkpoints):
            value = record.metrics.get(self.metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
                ranked.append((sign * float(value), -i))  # ties: the newer (higher i) first
        best = {-i for _, i in sorted(ranked)[: self.n]}
        return [Keep.KEEP if i in best else Keep.DROP for i in range(len(checkpoints))]


@dataclass(frozen=True)
class KeepAll:
    """Keep every checkpoint (``max_to_keep=None``)."""

    def decide(self, checkpoints: Sequence[CheckpointRecord], *, last_forever: float) -> Sequence[Keep]:
        """``KEEP`` for all."""
        return [Keep.KEEP] * len(checkpoints)


class AnyKeepPolicy:
    """A checkpoint is kept if any policy keeps it; of those none keeps, the ones any
    policy keeps forever (asked about those alone, oldest first) are kept forever.

    Args:
        policies: the policies (at least one).
    """

    def __init__(self, *policies: KeepPolicy) -> None:
        if not policies:
            raise ValueError("AnyKeepPolicy needs at least one policy")
        for policy in policies:
            if not isinstance(policy, KeepPolicy):
                raise TypeError(f"AnyKeepPolicy takes KeepPolicy objects (with a decide() method), got {policy!r}")
        self.policies = policies

    def __repr__(self) -> str:
        return f"AnyKeepPolicy({', '.join(map(repr, self.policies))})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnyKeepPolicy) and other.policies == self.policies

    def __hash__(self) -> int:
        return hash(self.policies)

    def decide(self, checkpoints: Sequence[CheckpointRecord], *, last_forever: float) -> Sequence[Keep]:
        """See the class docstring."""
        kept = [False] * len(checkpoints)
        for policy in self.policies:
            for i, decision in enumerate(_checked(policy, checkpoints, last_forever)):
                kept[i] = kept[i] or decision is Keep.KEEP
        rest = [i for i, k in enumerate(kept) if not k]
        forever = [False] * len(checkpoints)
        offered = [checkpoints[i] for i in rest]
        for policy in self.policies:
            for i, decision in zip(rest, _checked(policy, offered, last_forever)):
                forever[i] = forever[i] or decision is Keep.FOREVER
        return [Keep.KEEP if k else Keep.FOREVER if f else Keep.DROP for k, f in zip(kept, forever)]


def _checked(policy: KeepPolicy, checkpoints: Sequence[CheckpointRecord], last_forever: float) -> list[Keep]:
    """``policy``'s decisions, checked: one ``Keep`` per checkpoint, or a clear error."""
    decisions = list(policy.decide(checkpoints, last_forever=last_forever))
    if len(decisions) != len(checkpoints) or not all(isinstance(d, Keep) for d in decisions):
        raise TypeError(
            f"{policy!r}.decide() must return one Keep per checkpoint ({len(checkpoints)}), got {decisions!r}"
        )
    return decisions


def keep_policy_for(max_to_keep: int | None, keep_every_n_hours: float | None) -> KeepPolicy:
    """The policy the ``Supervisor`` keywords describe."""
    if max_to_keep is None:
        return KeepAll()
    if keep_every_n_hours is None:
        return LatestN(max_to_keep)
    return AnyKeepPolicy(LatestN(max_to_keep), EveryNHours(keep_every_n_hours))


# -- when to save -------------------------------------------------------------------------


@dataclass(frozen=True)
class SaveMoment:
    """A moment at which a checkpoint may be taken.

    Attributes:
        kind: ``"step"`` (a step boundary the policy's ``every_steps`` names), ``"tick"``
            (a tick of its ``every_secs`` timer), ``"startup"`` (the session has just
            started) or ``"stop"`` (the final checkpoint).
        step: the global step.
        restored: whether the session started from a checkpoint.
        stop_reason: at ``"stop"``, why the session stops (``signal:SIGTERM``, ...).
        multi_worker: whether every worker of a cluster saves at the same steps.
        agreed: at ``"stop"``, whether every worker of the cluster stops at this same
            step (a preemption the workers agreed on).
    """

    kind: str
    step: int
    restored: bool = False
    stop_reason: str | None = None
    multi_worker: bool = False
    agreed: bool = False


@runtime_checkable
class SavePolicy(Protocol):
    """When to save: one decision per :class:`SaveMoment` (see the module docstring).

    A policy is asked only at moments it can want: at every multiple of its
    ``every_steps`` attribute (if it has one; never per step otherwise), at every tick of
    its ``every_secs`` attribute, at start-up and at the stop.
    """

    def should_save(self, moment: SaveMoment) -> bool:
        """Whether to save at ``moment``."""
        ...


@dataclass(frozen=True)
class EverySteps:
    """Save at every multiple of ``n`` global steps (``save_model_steps``).

    Args:
        n: the step interval (``>= 1``).
    """

    n: int

    def __post_init__(self) -> None:
        _check_positive("EverySteps(n)", self.n, integer=True)

    @property
    def every_steps(self) -> int:
        """When to be asked: every ``n`` steps."""
        return self.n

    def should_save(self, moment: SaveMoment) -> bool:
        """At step moments that are multiples of ``n``."""
        return moment.kind == "step" and moment.step % self.n == 0


@dataclass(frozen=True)
class EverySeconds:
    """Save every ``secs`` seconds of the session's clock (``save_model_secs``).

    Args:
        secs: the interval (``> 0``).
    """

    secs: float

    def __post_init__(self) -> None:
        _check_positive("EverySeconds(secs)", self.secs, integer=False)

    @property
    def every_secs(self) -> float:
        """When to be asked: every ``secs`` seconds."""
        return float(self.secs)

    def should_save(self, moment: SaveMoment) -> bool:
        """At every tick."""
        return moment.kind == "tick"


class OverheadBudget:
    """Save as often as keeps training's measured slowdown under ``max_overhead``
    (``save_model_secs="auto"``: 2 %).

    CheckFreq's idea (FAST '21): measure what a save costs training, then pick the
    interval. After every save, the saver measures the training time it cost: the
    steps done from the snapshot to the commit against the step rate before it, measured
    from halfway between saves (the snapshot's blocked time, the next step's
    copy-on-write and the background write's interference with the step loop, all
    together), and how long the write took (the snapshot handed over to the commit).

    The interval spends the budget, it does not hoard it: it is the median of the last
    five costs divided by the budget (aiming at 90 % of it), raised to two floors — the
    median of the last five writes divided by ``max_write_share`` (so that the writer and
    the disk are busy at most that share of the time) and ``min_secs`` — and capped at
    ``max_secs``; ``start_secs`` until a cost has been measured. The saver logs
    ``checkpoint.interval`` when the interval changes by more than 10 %, with ``bound=``
    naming what chose it (``"budget"``, ``"write_share"``, ``"min_secs"`` or
    ``"max_secs"``). A save during which training made no progress (paused, waiting for
    data) is not a measurement.

    Args:
        max_overhead: the share of training time checkpoints may cost (``0 < x < 1``).
        min_secs: the shortest interval (``> 0``), whatever the budget allows: a floor
            for the disk and a remote tier (a small model would otherwise be saved every
            fraction of a second).
        max_secs: the longest interval (``>= min_secs``): how much work a crash may lose
            at most, however costly the saves.
        start_secs: the interval until a first cost is measured (``> 0``, clipped into
            ``[min_secs, max_secs]``).
        max_write_share: the share of the time the writer may spend writing
            (``0 < x <= 1``): the interval is at least the median write time over it.
    """

    def __init__(
        self,
        max_overhead: float = 0.02,
        *,
        min_secs: float = 1.0,
        max_secs: float = 3600.0,
        start_secs: float = 10.0,
        max_write_share: float = 0.5,
    ) -> None:
        if isinstance(max_overhead, bool) or not isinstance(max_overhead, (int, float)) or not 0 < max_overhead < 1:
            raise ValueError(f"OverheadBudget(max_overhead) must be a number in (0, 1), got {max_overhead!r}")
        _check_positive("OverheadBudget(min_secs)", min_secs, integer=False)
        _check_positive("OverheadBudget(max_secs)", max_secs, integer=False)
        _check_positive("OverheadBudget(start_secs)", start_secs, integer=False)
        if max_secs < min_secs:
            raise ValueError(f"OverheadBudget(max_secs={max_secs!r}) is below min_secs={min_secs!r}")
        if (
            isinstance(max_write_share, bool)
            or not isinstance(max_write_share, (int, float))
            or not 0 < max_write_share <= 1
        ):
            raise ValueError(f"OverheadBudget(max_write_share) must be a number in (0, 1], got {max_write_share!r}")
        self.max_overhead = float(max_overhead)
        self.min_secs = float(min_secs)
        self.max_secs = float(max_secs)
        self.start_secs = min(self.max_secs, max(self.min_secs, float(start_secs)))
        self.max_write_share = float(max_write_share)
        self._costs: deque[float] = deque(maxlen=5)
        self._writes: deque[float] = deque(maxlen=5)
        self._interval = self.start_secs
        self._bound: str | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"OverheadBudget({self.max_overhead!r}, min_secs={self.min_secs!r}, max_secs={self.max_secs!r}, "
            f"start_secs={self.start_secs!r}, max_write_share={self.max_write_share!r})"
        )

    @property
    def every_secs(self) -> float:
        """The current interval (it changes as saves are measured)."""
        return self._interval

    @property
    def bound(self) -> str | None:
        """What chose the current interval: ``"budget"``, ``"write_share"``,
        ``"min_secs"`` or ``"max_secs"``; ``None`` before a cost is measured
        (``start_secs``)."""
        return self._bound

    def should_save(self, moment: SaveMoment) -> bool:
        """At every tick of the (adaptive) timer."""
        return moment.kind == "tick"

    def observe_save_cost(self, cost_secs: float, *, write_secs: float | None = None) -> float | None:
        """Take one save's measured cost to training and, if known, how long its write
        took (snapshot handed over to commit); the new interval if it moved by more than
        10 %, else ``None`` (the interval may still have moved a little)."""
        with self._lock:
            self._costs.append(max(float(cost_secs), 0.0))
            if write_secs is not None:
                self._writes.append(max(float(write_secs), 0.0))
            interval = statistics.median(self._costs) / (0.9 * self.max_overhead)
            bound = "budget"
            if self._writes and (floor := statistics.median(self._writes) / self.max_write_share) > interval:
                interval, bound = floor, "write_share"
            if self.min_secs > interval:
                interval, bound = self.min_secs, "min_secs"
            if interval > self.max_secs:
                interval, bound = self.max_secs, "max_secs"
            old, self._interval, self._bound = self._interval, interval, bound
        return interval if abs(interval - old) > 0.1 * old else None

    @property
    def save_cost_secs(self) -> float | None:
        """The cost estimate behind the interval (median of the last five), if measured."""
        with self._lock:
            return statistics.median(self._costs) if self._costs else None

    @property
    def write_secs(self) -> float | None:
        """The write time behind the write-share floor (median of the last five), if measured."""
        with self._lock:
            return statistics.median(self._writes) if self._writes else None


class RamTierBudget(OverheadBudget):
    """The RAM tier's ``ram_save_secs="auto"``: :class:`OverheadBudget` (2 %) between
    ``min_secs`` (0.5 s) and ``max_secs`` (10 s: what a crash loses at most, however
    costly the saves), except that the write-share floor wins over ``max_secs``: a state
    whose RAM write takes longer than 5 s is saved every two write times, never back to
    back."""

    def __init__(self) -> None:
        super().__init__(0.02, min_secs=0.5, max_secs=10.0, start_secs=1.0)

    def observe_save_cost(self, cost_secs: float, *, write_secs: float | None = None) -> float | None:
        """As :meth:`OverheadBudget.observe_save_cost`, the write-share floor over the cap."""
        moved = super().observe_save_cost(cost_secs, write_secs=write_secs)
        writes = self.write_secs
        with self._lock:
            if writes is not None and (floor := writes / self.max_write_share) > self._interval:
                old, self._interval, self._bound = self._interval, floor, "write_share"
                return floor if abs(floor - old) > 0.1 * old else moved
        return moved


def observes_save_cost(policy: SavePolicy) -> bool:
    """Whether ``policy``'s timer adapts to measured save costs (``observe_save_cost``)."""
    if isinstance(policy, AnySavePolicy):
        return any(observes_save_cost(p) for p in policy.policies)
    return callable(getattr(policy, "observe_save_cost", None))


def takes_write_secs(observe: Callable[..., object]) -> bool:
    """Whether an ``observe_save_cost`` takes the ``write_secs`` keyword (one written
    before it was added takes the cost alone)."""
    try:
        params = inspect.signature(observe).parameters.values()
    except (TypeError, ValueError):  # no signature to read: call it the old way
        return False
    named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.kind is inspect.Parameter.VAR_KEYWORD or (p.name == "write_secs" and p.kind in named) for p in params)


def interval_bound(policy: object) -> str | None:
    """What chose an adaptive policy's current interval (:attr:`OverheadBudget.bound`);
    of an :class:`AnySavePolicy`, that of the policy whose interval it uses now."""
    if isinstance(policy, AnySavePolicy):
        current = policy.every_secs
        for p in policy.policies:
            if every_secs(p) == current and (bound := interval_bound(p)) is not None:
                return bound
        return None
    bound = getattr(policy, "bound", None)
    return bound if isinstance(bound, str) else None


@dataclass(frozen=True)
class OnStartup:
    """Save once at start-up when the state was initialised, not restored."""

    def should_save(self, moment: SaveMoment) -> bool:
        """At start-up, unless restored."""
        return moment.kind == "startup" and not moment.restored


@dataclass(frozen=True)
class OnStop:
    """Save the final checkpoint at the stop; in multi-worker training only for a stop
    every worker reaches at the same step (:data:`AGREED_STOP_REASONS`:
    ``max_steps``, end of data, the body returned, a hook; or a preemption signal the
    workers agreed on, :mod:`._cluster_stop`)."""

    def should_save(self, moment: SaveMoment) -> bool:
        """At the stop (see the class docstring)."""
        if moment.kind != "stop":
            return False
        return not moment.multi_worker or moment.agreed or moment.stop_reason in AGREED_STOP_REASONS


class AnySavePolicy:
    """Save when any of ``policies`` would; asked at the moments any of them can want
    (``every_steps``: the greatest common divisor of theirs; ``every_secs``: the
    smallest).

    Args:
        policies: the policies (at least one).
    """

    def __init__(self, *policies: SavePolicy) -> None:
        if not policies:
            raise ValueError("AnySavePolicy needs at least one policy")
        for policy in policies:
            if not isinstance(policy, SavePolicy):
                raise TypeError(f"AnySavePolicy takes SavePolicy objects (with should_save()), got {policy!r}")
        self.policies = policies
        steps = [s for p in policies if (s := every_steps(p)) is not None]
        self.every_steps = math.gcd(*steps) if steps else None
        every_secs(self)  # validated now

    @property
    def every_secs(self) -> float | None:
        """The smallest ``every_secs`` of the policies now (an adaptive one's changes)."""
        secs = [t for p in self.policies if (t := every_secs(p)) is not None]
        return min(secs) if secs else None

    def observe_save_cost(self, cost_secs: float, *, write_secs: float | None = None) -> float | None:
        """Hand a save's measured cost (and its write time, to the policies that take
        ``write_secs``) to the policies that adapt to it; the new ``every_secs`` if one
        of them moved (see :class:`OverheadBudget`)."""
        moved = False
        for policy in self.policies:
            observe = getattr(policy, "observe_save_cost", None)
            if not callable(observe):
                continue
            if write_secs is not None and takes_write_secs(observe):
                moved = observe(cost_secs, write_secs=write_secs) is not None or moved
            else:
                moved = observe(cost_secs) is not None or moved
        return self.every_secs if moved else None

    def __repr__(self) -> str:
        return f"AnySavePolicy({', '.join(map(repr, self.policies))})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnySavePolicy) and other.policies == self.policies

    def __hash__(self) -> int:
        return hash(self.policies)

    def should_save(self, moment: SaveMoment) -> bool:
        """Whether any policy would save at ``moment``."""
        return any(policy.should_save(moment) for policy in self.policies)


def every_steps(policy: SavePolicy) -> int | None:
    """The step interval at which ``policy`` wants to be asked, if any (validated)."""
    value = getattr(policy, "every_steps", None)
    if value is None:
        return None
    _check_positive(f"{policy!r}.every_steps", value, integer=True)
    return int(value)


def every_secs(policy: SavePolicy) -> float | None:
    """The interval in seconds at which ``policy`` wants to be asked, if any (validated)."""
    value = getattr(policy, "every_secs", None)
    if value is None:
        return None
    _check_positive(f"{policy!r}.every_secs", value, integer=False)
    return float(value)


def save_policy_for(save_secs: float | str, save_steps: int | None, *, multi_worker: bool) -> SavePolicy | None:
    """The policy the ``Supervisor`` keywords describe (``None``: saving disabled).

    ``save_secs="auto"`` is :class:`OverheadBudget` (2 %). In multi-worker training the
    timer is not used (every worker must snapshot at the same steps) and there is no
    start-up save.
    """
    auto = save_secs == "auto"
    if not auto and float(save_secs) <= 0 and save_steps is None:
        return None
    policies: list[SavePolicy] = []
    if save_steps is not None:
        policies.append(EverySteps(save_steps))
    if auto and not multi_worker:
        policies.append(OverheadBudget())
    elif not auto and float(save_secs) > 0 and not multi_worker:
        policies.append(EverySeconds(float(save_secs)))
    if not multi_worker:
        policies.append(OnStartup())
    policies.append(OnStop())
    return AnySavePolicy(*policies)
