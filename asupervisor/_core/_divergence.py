"""Divergence rollback: ``sess.run_loop(fn, data=ds, on_divergence=asv.Rollback(...))``.

A divergence is a step whose loss is not finite (NaN, ±inf) or, with
``Rollback.spike_factor``, a spike: above ``spike_factor`` times the median of the last
``Rollback.window`` losses. :class:`DivergenceWatch` finds it on the step thread without
waiting for the device, as ``NanTensorHook`` does: each step's loss is kept by reference;
every ``check_every_n_steps`` steps they are stacked by one op (dispatched, not waited
for) and the batch stacked the time before is read in one go.

**No checkpoint of a diverged state.** While a watch is installed (``Runtime.divergence``),
every snapshot of the state, whoever asks for it (step, timed, RAM, hook, final saves),
first reads every loss not read yet (``Runtime.check_before_snapshot`` calls
:meth:`DivergenceWatch.refuse`), so a checkpoint is only ever taken of a state whose own
step and every step before it were judged good; a diverged one is refused
(:class:`SnapshotRefused`, which the saver logs as a skipped checkpoint). The batching
delay therefore never lets a bad state into the logdir: the newest committed checkpoint
is always older than the bad step. The watch stays installed, refusing, until the
rollback is done.

**The rollback** (``Session.run_loop``): the loop's leg ends at the step boundary where the
divergence was found; on the event loop, writes in flight settle and the newest
checkpoint is restored on the step thread (the recovery machinery of
:mod:`._step_errors`, which also puts the ``tf.data`` iterator back to that checkpoint's
position); the next leg drops the batches of the skipped window
(:meth:`DivergenceWatch.skip`) and goes on. This module never touches the event loop.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from .._exceptions import DivergenceError, NanLossDuringTrainingError
from .._tf import tf

__all__ = ["Divergence", "DivergenceWatch", "Rollback", "RollbackCounts", "SnapshotRefused", "stack_losses"]


def _positive_int(name: str, value: object, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"Rollback.{name} must be an int >= {minimum}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Rollback:
    """Roll a diverged training back to its last good checkpoint and skip the data that
    led there: ``sess.run_loop(fn, data=ds, on_divergence=asv.Rollback())``.

    A step diverges when its loss is not finite (NaN, ±inf) or, with ``spike_factor``,
    when it exceeds ``spike_factor`` times the median of the last ``window`` good losses
    (once ``window`` are known; a median <= 0 never makes a spike). The session then
    restores the newest checkpoint (never one of a diverged state: each checkpoint is
    taken only after every loss up to it was read), puts the ``tf.data`` iterator back
    at that checkpoint's position, drops the skipped batches and trains on.

    Attributes:
        loss_key: the name of the loss in the mapping each step returns.
        spike_factor: a spike is a loss above this many times the moving median (> 1);
            ``None``: only a non-finite loss diverges.
        window: how many of the latest good losses the median is taken over.
        skip_steps: the data window dropped after a rollback from step ``R`` (the
            restored checkpoint's) for a divergence at step ``k``. ``None``: every batch
            from the checkpoint to the bad one, steps ``R+1 .. k``. ``n``: the ``n``
            batches ending with the bad one, steps ``max(R, k-n)+1 .. k``; the steps
            before them are trained again on their own batches.
        max_retries: rollbacks allowed per ``run_loop`` call; the next divergence raises
            :class:`~asupervisor.NanLossDuringTrainingError` (non-finite) or
            :class:`~asupervisor.DivergenceError` (a spike).
        check_every_n_steps: steps between reads of the kept losses (each read is one
            device sync); every checkpoint reads them all first.

    Raises:
        ValueError: a field out of range, naming it and the value.
    """

    loss_key: str = "loss"
    spike_factor: float | None = None
    window: int = 100
    skip_steps: int | None = None
    max_retries: int = 3
    check_every_n_steps: int = 100

    def __post_init__(self) -> None:
        if not isinstance(self.loss_key, str) or not self.loss_key:
            raise ValueError(f"Rollback.loss_key must be a non-empty string, got {self.loss_key!r}")
        factor = self.spike_factor
        if factor is not None and (
            isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 1
        ):
            raise ValueError(f"Rollback.spike_factor must be a finite number > 1 or None, got {factor!r}")
        _positive_int("window", self.window)
        if self.skip_steps is not None:
            _positive_int("skip_steps", self.skip_steps)
        _positive_int("max_retries", self.max_retries, minimum=0)
        _positive_int("check_every_n_steps", self.check_every_n_steps)


@dataclass(frozen=True)
class Divergence:
    """A diverged step: ``kind`` is ``"non_finite"`` or ``"spike"``; ``median`` the moving
    median a spike exceeded; ``at`` when it was found (``time.monotonic()``)."""

    step: int
    kind: str
    value: float
    median: float | None
    at: float

    def error(self, rollback: Rollback) -> DivergenceError:
        """The error a divergence that is not rolled back raises."""
        key = rollback.loss_key
        if self.kind == "non_finite":
            return NanLossDuringTrainingError(
                f"NaN loss during training (step {self.step}, key {key!r}: {self.value})."
            )
        return DivergenceError(
            f"loss spike during training (step {self.step}, key {key!r}: {self.value:g} > "
            f"{rollback.spike_factor:g} x the moving median {self.median:g})."
        )


@dataclass
class RollbackCounts:
    """What rollbacks cost a session (``status().rollbacks``; the goodput ledger's
    ``divergence_rollback``): how many, the seconds from finding each divergence to
    training on (settling writes, the restore, dropping the skipped batches), and the
    steps undone (trained, then rolled back)."""

    count: int = 0
    secs: float = 0.0
    steps_undone: int = 0


class SnapshotRefused(Exception):
    """Internal: a snapshot of a diverged state was refused (the step loop rolls back)."""


def stack_losses(losses: list[Any]) -> Any:
    """The losses (of consecutive steps) as one tensor, by one op; the list if they differ.

    The op is dispatched, not waited for: on a device, its result is read a batch later.
    """
    try:
        return tf().raw_ops.Pack(values=losses, axis=0)  # tf.stack's own op, without its Python checks
    except Exception:  # mixed shapes, dtypes or devices: read them one by one
        return losses


def _values(losses: Any) -> list[Any]:
    """One host value per loss: a stacked tensor read at once, or a list read one by one."""
    if not isinstance(losses, list):
        return list(losses.numpy())
    return [loss.numpy() if hasattr(loss, "numpy") else loss for loss in losses]


class DivergenceWatch:
    """The losses of one ``run_loop`` call, judged in step order (see the module docstring).

    Used on the step thread only, except that the session reads :attr:`found` and calls
    :meth:`rolled_back` through the step thread once a leg has ended.

    Args:
        rollback: the settings.
        counts: the session's rollback counts (the skipping time is added there).
    """

    def __init__(self, rollback: Rollback, counts: RollbackCounts) -> None:
        self.rollback = rollback
        self.counts = counts
        self._key = rollback.loss_key
        self._every = rollback.check_every_n_steps
        self._pending: list[Any] = []  # losses not stacked yet, of consecutive steps
        self._first_step = 0  # the step of _pending[0]
        self._stacked: tuple[int, Any] | None = None  # (first step, batch) stacked, not read
        #: (step, loss) of the latest good losses, for the moving median (spikes only)
        self._recent: deque[tuple[int, float]] | None = (
            None if rollback.spike_factor is None else deque(maxlen=rollback.window)
        )
        #: the divergence found, until the rollback is done
        self.found: Divergence | None = None
        self.retries = 0  # rollbacks done in this run_loop call
        self.skip_at = -1  # before the step after this one, drop ``skip_count`` batches
        self.skip_count = 0

    def keep(self, step: int, results: Any) -> None:
        """After step ``step``: keep its loss; every ``check_every_n_steps`` steps, stack
        the batch and judge the one stacked before (a Python number: judged at once)."""
        try:
            loss = results[self._key]
        except (KeyError, TypeError, IndexError):
            raise _missing(results, self._key) from None
        if self.found is not None:
            return
        if not hasattr(loss, "numpy"):
            self.check()
            self._judge(step, [loss])
            return
        pending = self._pending
        if not pending:
            self._first_step = step
        pending.append(loss)
        if len(pending) >= self._every:
            self._collect()  # the previous batch, computed long ago
            self._pending = []
            self._stacked = (self._first_step, stack_losses(pending))

    def check(self) -> Divergence | None:
        """Judge every loss kept and not read yet (a device sync); the divergence found."""
        self._collect()
        pending = self._pending
        if pending:
            self._pending = []
            self._judge(self._first_step, _values(stack_losses(pending)))
        return self.found

    def refuse(self) -> None:
        """Before a snapshot: judge every unread loss; a diverged state is not saved.

        Raises:
            SnapshotRefused: a divergence was found (now or before the rollback is done).
        """
        found = self.found or self.check()
        if found is not None:
            raise SnapshotRefused(f"step {found.step} diverged ({found.kind}, {self._key}={found.value}): rolling back")

    def _collect(self) -> None:
        stacked = self._stacked
        if stacked is not None:
            self._stacked = None
            self._judge(stacked[0], _values(stacked[1]))

    def _judge(self, first_step: int, values: Any) -> None:
        import numpy as np

        if self.found is not None:
            return
        recent = self._recent
        factor = self.rollback.spike_factor
        for i, value in enumerate(values):
            array = np.asarray(value, dtype=np.float64)
            loss = float(array.mean()) if array.size else 0.0
            step = first_step + i
            if not np.all(np.isfinite(array)):
                bad = float(array.flat[np.argmax(~np.isfinite(array.ravel()))])
                self.found = Divergence(step, "non_finite", bad, None, time.monotonic())
                return
            if recent is not None and factor is not None:
                if len(recent) == recent.maxlen:
                    median = float(np.median([v for _, v in recent]))
                    if median > 0 and loss > factor * median:
                        self.found = Divergence(step, "spike", loss, median, time.monotonic())
                        return
                recent.append((step, loss))

    def rolled_back(self, restored: int, skip_at: int, skip_count: int) -> None:
        """On the step thread, once the state of step ``restored`` is back: forget what was
        kept after it, and drop ``skip_count`` batches before the step after ``skip_at``."""
        self.found = None
        self._pending = []
        self._stacked = None
        if self._recent is not None:
            kept = [(s, v) for s, v in self._recent if s <= restored]
            self._recent.clear()
            self._recent.extend(kept)
        self.retries += 1
        self.skip_at = skip_at
        self.skip_count = skip_count

    def skip(self, iterator: Any) -> None:
        """On the step thread, at step ``skip_at``: drop the skipped window's batches
        (the end of the data there is a clean stop, as always)."""
        t0 = time.monotonic()
        count, self.skip_at, self.skip_count = self.skip_count, -1, 0
        try:
            for _ in range(count):
                next(iterator)
        finally:
            self.counts.secs += time.monotonic() - t0


def _missing(results: Any, key: str) -> Exception:
    from collections.abc import Mapping

    if not isinstance(results, Mapping):
        return TypeError(
            f"on_divergence=Rollback(loss_key={key!r}) reads the loss from the step's result, which must be a "
            f"mapping of named tensors (return {{{key!r}: loss}} from the step); got {type(results).__name__}"
        )
    return KeyError(f"on_divergence=Rollback(loss_key={key!r}): the step returned no {key!r}; it has {sorted(results)}")
