"""Which checkpoints a restore tries, and the state file it leaves.

:func:`restore_candidates`: the state file trusted when sound, the complete checkpoints
on disk as fallbacks, every one newest step first when the state file is damaged.
:func:`repaired_state`: after a restore that skipped damaged checkpoints (or found the
state file damaged), what the state file must say. Names and files only: nothing is
read but the state file and directory listings, nothing written (:mod:`.._restore`
loads the checkpoints; the ``Checkpointer`` writes the repaired file and sets the
damaged ones aside under the store's commit lock).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from . import _names, _state_file

__all__ = ["absolute", "repaired_state", "restore_candidates"]


def restore_candidates(
    logdir: Path, basename: str | None
) -> tuple[list[str], _state_file.CheckpointState | None, str | None]:
    """Checkpoint prefixes (absolute) to try, newest first; the state read; its problem.

    A readable state file naming an existing latest checkpoint is trusted: its
    checkpoints come first, in its order. The complete checkpoints on disk
    (``<basename>-<step>`` with its index and every data shard; with ``basename``
    ``None`` only when the state file is damaged) follow as fallbacks. A damaged state
    file (unreadable, naming nothing, or its latest gone), or a missing one while
    checkpoints exist: every checkpoint, newest step first.
    """
    state, problem = _state_file.inspect_state(logdir)
    names: list[str] = []
    if state is not None:
        names = [n for n in state.paths if n != state.latest] + ([state.latest] if state.latest is not None else [])
        names.reverse()
        if state.latest is None:
            problem = "it names no checkpoint"
        elif not os.path.exists(absolute(logdir, state.latest) + ".index"):
            problem = f"it names {state.latest}, whose files are gone"
    on_disk = _names.scan_checkpoints(logdir, basename) if (basename is not None or problem is not None) else []
    if state is None or problem is not None:
        # unnamed and incomplete (an index alone, a shard missing): not a checkpoint of
        # ours (with a sound state file, restore_newest checks only those it reaches)
        on_disk = [n for n in on_disk if n in names or _names.missing_files(logdir / n) is None]
    if state is None and problem is None and on_disk:
        problem = "it is missing"
    if problem is None:
        ordered = names + [n for n in on_disk if n not in names]
    else:
        steps = {n: _names.step_of(Path(n).name) for n in {*names, *on_disk}}
        stepped = sorted((n for n in steps if steps[n] is not None), key=lambda n: -(steps[n] or 0))
        ordered = stepped + [n for n in names if steps[n] is None]
    return [absolute(logdir, n) for n in ordered], state, problem


def absolute(logdir: Path, name: str) -> str:
    """``name`` (as the state file holds it) as a path: relative names are in ``logdir``."""
    return name if os.path.isabs(name) else str(logdir / name)


def repaired_state(
    state: _state_file.CheckpointState | None,
    latest: str,
    *,
    bad: Collection[str],
    on_disk: Sequence[str],
    committed_at: Callable[[str], float],
    last_preserved: float,
) -> _state_file.CheckpointState:
    """The state file after restoring ``latest`` (its name in the state file).

    Args:
        state: the state file, when sound: its checkpoints are kept, but for ``bad``
            (damaged or gone), with ``latest`` added in step order if it was not named.
            ``None`` (damaged or missing): it is rebuilt from ``on_disk``.
        latest: the checkpoint restored: the latest from now on.
        bad: names to drop.
        on_disk: the complete checkpoints on disk, newest step first (used when
            ``state`` is ``None``): those up to ``latest``'s step, oldest first.
        committed_at: when the checkpoint of a name was committed (its index's time).
        last_preserved: the state file's ``last_preserved`` to keep.
    """
    if state is None:
        latest_step = _names.step_of(Path(latest).name)
        names = [
            n
            for n in reversed(on_disk)
            if n not in bad and (latest_step is None or (_names.step_of(n) or 0) <= latest_step)
        ]
        if latest not in names:
            names.append(latest)
        return _state_file.named(latest, [(n, committed_at(n)) for n in names], last_preserved)
    kept = [(p, t) for p, t in zip(state.paths, state.timestamps) if p not in bad]
    if latest not in [p for p, _ in kept]:
        kept.append((latest, committed_at(latest)))
        kept.sort(key=lambda pt: _names.step_of(Path(pt[0]).name) or -1)
    return _state_file.named(latest, kept, last_preserved)
