"""Retention: which committed checkpoints a keep policy drops, for every store.

:func:`select_retention` is the only place a :class:`~..policy._policies.KeepPolicy` is
applied: the local commit (:class:`.._manager.Checkpointer`) and the remote tier's state
object both call it, with :func:`managed_by` saying which checkpoints are retention's to
drop. It decides only: the caller writes the new state and deletes what it returns.
Pure; no file work.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from ..policy._policies import CheckpointRecord, Keep, KeepPolicy
from . import _state_file

__all__ = ["managed_by", "select_retention"]


def managed_by(
    basename: str, *, now: float | None = None, pinned: Collection[str] = ()
) -> Callable[[str, float], bool]:
    """Which checkpoints retention may drop: ours (``<basename>-<step>``, not plain
    ``tf.train.Checkpoint.save``'s nor another basename's), not stamped after ``now`` (a
    clock reset; as ``tf.train.CheckpointManager``), and not ``pinned`` (an upload reads
    them)."""
    prefix = f"{basename}-"

    def managed(path: str, stamp: float) -> bool:
        return (
            path.startswith(prefix)
            and path[len(prefix) :].isdigit()
            and (now is None or stamp <= now)
            and path not in pinned
        )

    return managed


def select_retention(
    state: _state_file.CheckpointState,
    *,
    policy: KeepPolicy,
    managed: Callable[[str, float], bool] | None = None,
    metrics: Callable[[str], Mapping[str, float]] | None = None,
) -> tuple[_state_file.CheckpointState, list[str]]:
    """Apply retention to ``state`` (just committed); returns the new state and what to delete.

    Only the checkpoints ``managed(name, timestamp)`` accepts are offered to ``policy``
    (all by default); the others stay named and on disk, as ``tf.train.CheckpointManager``
    leaves alone what it does not manage. The latest checkpoint is never offered (never
    deleted). A checkpoint the policy keeps ``FOREVER`` is dropped from the state file's
    list but not deleted, and the state remembers when (``last_preserved``).
    ``metrics(name)``: the metrics recorded with each checkpoint offered
    (:attr:`CheckpointRecord.metrics`; none by default).
    """
    last_preserved = state.last_preserved
    entries = list(zip(state.paths, state.timestamps))
    ours = [i for i, (p, t) in enumerate(entries) if p != state.latest and (managed is None or managed(p, t))]
    records = [
        CheckpointRecord(*entries[i]) if metrics is None else CheckpointRecord(*entries[i], metrics(entries[i][0]))
        for i in ours
    ]
    decisions = list(policy.decide(records, last_forever=last_preserved))
    if len(decisions) != len(ours) or not all(isinstance(d, Keep) for d in decisions):
        raise TypeError(f"{policy!r}.decide() must return one Keep per checkpoint ({len(ours)}), got {decisions!r}")
    dropped: set[int] = set()
    delete: list[str] = []
    for i, decision in zip(ours, decisions):
        if decision is Keep.KEEP:
            continue
        dropped.add(i)
        path, stamp = entries[i]
        if decision is Keep.FOREVER:
            last_preserved = max(last_preserved, stamp)
        else:
            delete.append(path)
    kept = [e for i, e in enumerate(entries) if i not in dropped]
    return _state_file.named(state.latest, kept, last_preserved), delete
