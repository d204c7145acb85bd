"""The seam between ``CheckpointSaverHook`` and the checkpoint writer.

``CheckpointSaverHook`` runs on the step thread and, when it fires, calls
``Runtime.save_checkpoint_from_step_thread(directory=..., basename=...)``, which must
write a checkpoint of the session's state *now* (the step thread is at a step boundary),
make it the latest one in ``directory`` and return its path prefix. The checkpoint
service (atomic publishing, retention, multi-worker) is meant to replace what
``Runtime.save_checkpoint_from_step_thread`` calls; until it does, this module is the
fallback: a plain synchronous ``tf.train.CheckpointManager`` save (TF's own checkpoint
state file, relative paths, ``max_to_keep``).

This must only ever be called on the step thread.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["write_checkpoint_now"]


def write_checkpoint_now(
    checkpoint: Any,
    directory: str | os.PathLike[str],
    basename: str,
    step: int,
    *,
    max_to_keep: int,
    keep_checkpoint_every_n_hours: float | None = None,
) -> str:
    """On the step thread: save ``checkpoint`` as ``<directory>/<basename>-<step>``.

    Args:
        checkpoint: the ``tf.train.Checkpoint`` holding the session's state.
        directory: where to write; created if missing.
        basename: the checkpoint file prefix (``model.ckpt``).
        step: the global step, the checkpoint's number.
        max_to_keep: how many checkpoints the ``checkpoint`` state file keeps.
        keep_checkpoint_every_n_hours: also keep one per this many hours.

    Returns:
        The path prefix of the written checkpoint (what ``tf.train.latest_checkpoint``
        now returns).
    """
    from ._tf import tf

    tf_ = tf()
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    manager = tf_.train.CheckpointManager(
        checkpoint,
        directory,
        max_to_keep=max(2, max_to_keep),
        keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
        checkpoint_name=basename,
    )
    return str(manager.save(checkpoint_number=step))
