"""Multi-worker saving: a non-chief's part in every save, and when saves may happen.

In multi-worker training (``tf.distribute.MultiWorkerMirroredStrategy``, ``TF_CONFIG``
naming several workers) reading a SyncOnRead variable (a Keras metric, an
``ON_READ``/``SUM`` variable) is a collective all-reduce that every worker must issue in
the same order. A snapshot reads every variable, so every worker snapshots, at the same
steps: the chief writes its snapshot to ``logdir``; every other worker writes its own to
a temporary directory (:class:`WorkerTempWriter`) that is removed right after.

The temporary directories live under the system's temporary directory
(``tempfile.gettempdir()``, so ``TMPDIR``), not in ``logdir``: ``logdir`` is often shared
or remote storage that the chief alone writes and that evaluators and TensorBoard read.
Their names hold the task and a hash of ``logdir``, so a worker removes the leftovers of
its own earlier runs at start-up and never touches another job's.

When saves happen, on every worker alike (the rule ``_checkpoint_service`` applies):

* at multiples of ``save_model_steps`` (required; ``save_model_secs`` is not used, a
  timer fires at different steps on different workers), and never skipped because an
  earlier write is still in flight (that depends on each worker's disk);
* no start-up save after an init (a non-chief starting late could otherwise restore the
  chief's fresh start-up checkpoint and take different steps from then on);
* the final save only when the stop came from the training itself (``max_steps``, end of
  data, a hook, the session body returning), which every worker reaches at the same
  step; not on a signal, a cancellation, an error or a ``request_stop()`` from elsewhere;
* ``save_now()`` is refused.

This module does file work on the checkpoint writer thread and the step thread; it never
runs on the event loop thread and never writes ``logdir``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..._cluster import ClusterInfo
from ..._logging import describe, get_logger
from ..policy._policies import AGREED_STOP_REASONS
from ..snapshot._snapshot import Snapshot
from ..store import FastPath, open_store, resolve_store

if TYPE_CHECKING:
    from ..store import IdleIO

__all__ = ["AGREED_STOP_REASONS", "WorkerTempWriter"]

log = get_logger(__name__)


class WorkerTempWriter:
    """Writes a non-chief's snapshots to a temporary directory and removes it.

    Args:
        logdir: the chief's log directory (only its name is used, for the hash).
        cluster: this worker's place in the cluster.
        basename: checkpoint basename (files are ``<basename>-<step>.*``).
        root: where the temporary directories go; ``tempfile.gettempdir()`` by default.
        fast_path: the chief's store choice (the same writer, so the same work per save).
    """

    def __init__(
        self,
        logdir: Path,
        cluster: ClusterInfo,
        *,
        basename: str,
        root: Path | None = None,
        fast_path: FastPath | None = None,
    ) -> None:
        self.root = Path(tempfile.gettempdir() if root is None else root)
        self.fast = resolve_store() if fast_path is None else fast_path
        self.prefix = temp_prefix(logdir, cluster)
        self.basename = basename

    def clean_leftovers(self) -> list[str]:
        """Remove this task's temporary directories left by an earlier run; their names."""
        removed = []
        try:
            entries = os.listdir(self.root)
        except FileNotFoundError:
            return []
        for entry in entries:
            if entry.startswith(self.prefix):
                shutil.rmtree(self.root / entry, ignore_errors=True)
                removed.append(entry)
        if removed:
            log.info("checkpoint.worker_leftovers_removed", root=str(self.root), names=removed)
        return removed

    def write(self, snapshot: Snapshot, *, min_keep: int = 1, io: IdleIO | None = None) -> None:
        """On the writer thread: write ``snapshot`` to a new temporary directory, remove it.

        ``min_keep`` is accepted for the same call as ``Checkpointer.write`` and unused;
        ``io`` writes the data at idle priority.
        """
        del min_keep
        t0 = time.perf_counter()
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=self.prefix, dir=self.root))
        try:
            # the chief's store writes it, so each worker does the same work per save
            open_store(tmp, self.fast).write(
                snapshot, tmp / f"{self.basename}-{snapshot.step}", _go_on, io, durable=False
            )
        finally:
            try:
                shutil.rmtree(tmp)
            except OSError as exc:  # left for the next start-up's clean-up
                log.error("checkpoint.worker_tmp_not_removed", tmp=str(tmp), error=describe(exc))
        log.info(
            "checkpoint.worker_saved",
            step=snapshot.step,
            tmp=str(tmp),
            secs=round(time.perf_counter() - t0, 4),
            blocked_secs=round(snapshot.blocked_secs, 4),
        )


def _go_on() -> None:
    """A worker's temporary save is never abandoned half-way (it is removed anyway)."""


def temp_prefix(logdir: Path, cluster: ClusterInfo) -> str:
    """``asv-worker-<task type>-<index>-<hash of logdir>-``: this task's temporary names."""
    digest = hashlib.sha256(os.path.realpath(logdir).encode()).hexdigest()[:12]
    return f"asv-worker-{cluster.task_type}-{cluster.task_index}-{digest}-"
