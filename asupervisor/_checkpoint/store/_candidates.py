"""Which checkpoints a restore tries, in order: the state file trusted when sound, the
complete checkpoints on disk as fallbacks, every one newest step first when the state file
is damaged. Names and files only: nothing is read but the state file and directory
listings, nothing written (:mod:`.._restore` loads them; the writer repairs the file).
"""

from __future__ import annotations

import os
from pathlib import Path

from . import _names, _state_file

__all__ = ["absolute", "restore_candidates"]


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
