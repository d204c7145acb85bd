"""What to keep of a log directory's checkpoints: retention as small policy objects.

Modelled on orbax's preservation policies. A :class:`KeepPolicy` has one method,
:meth:`~KeepPolicy.decide`: given the checkpoints retention may act on (this supervisor's
own, oldest first, the latest excluded — it is always kept), it says of each whether to
``KEEP`` it (it stays in the ``checkpoint`` state file and counts next time), keep it
``FOREVER`` (it stays on disk, no longer managed: never deleted, never counted, as
``tf.train.CheckpointManager`` does with ``keep_checkpoint_every_n_hours``) or ``DROP`` it
(deleted). The stock policies:

* :class:`LatestN` — keep the newest ``n`` checkpoints (the latest included);
* :class:`EveryNHours` — of the checkpoints nothing else keeps, keep one per ``hours``
  forever;
* :class:`KeepAll` — keep everything (``max_to_keep=None``);
* :class:`AnyKeepPolicy` — a checkpoint is kept if any of its policies keeps it; of the
  ones none keeps, those any keeps forever are kept forever.

Files the supervisor did not write (plain ``tf.train.Checkpoint.save``'s, another
basename's, stamped in the future) are never offered to a policy: they stay. The
``Supervisor`` keywords ``max_to_keep`` and ``keep_checkpoint_every_n_hours`` build
``AnyKeepPolicy(LatestN(max_to_keep), EveryNHours(hours))``; ``keep_policy=`` takes a
policy of one's own. While another save is in flight, the writer adds ``LatestN(2)``.

Plain decisions: no file work here (:mod:`.files._commit` applies them).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "AnyKeepPolicy",
    "CheckpointRecord",
    "EveryNHours",
    "Keep",
    "KeepAll",
    "KeepPolicy",
    "LatestN",
]


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
    """

    path: str
    time: float


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
    ok = (isinstance(value, int) and not isinstance(value, bool)) if integer else (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
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
