"""Which ``tf.data`` iterator a checkpoint holds: :class:`IteratorTracker`.

``run_loop(fn, data=dataset, checkpoint_iterator=...)`` asks for an iterator over its
dataset; the tracker gives the same one again within a session (a retried or second
``run_loop`` goes on where the last stopped), checks once per new iterator whether
TensorFlow can serialise it (:func:`._iterator_state.serialisation_problem`), attaches it
to the checkpoint (restoring a saved position) or leaves it out, and after the first
commit that holds it reports once how much of the checkpoint it is. On the step thread
(:meth:`IteratorTracker.track`) and the writer thread (:meth:`IteratorTracker.report_share`);
no file work but reading a committed checkpoint's index.
"""

from __future__ import annotations

from typing import Any

from ... import _tf_internals as internals
from ..._logging import describe, get_logger
from ..._tf import tf
from ._iterator_state import ITERATOR_ATTR, PIPELINE_ATTR

__all__ = ["IteratorTracker"]

log = get_logger(__name__)


class IteratorTracker:
    """``run_loop``'s data iterator in one ``tf.train.Checkpoint`` (see the module docstring).

    Args:
        checkpoint: the checkpoint the iterator is attached to (``asv_data_iterator``).
    """

    def __init__(self, checkpoint: Any) -> None:
        self.checkpoint = checkpoint
        self._iterator_source: Any = None
        self._iterator: Any = None
        self._iterator_problem: str | None = None  # why TF cannot serialise it
        self._iterator_checked = False
        self._iterator_logged: Any = None  # the iterator whose skip was logged
        self._share_pending = False  # an iterator was attached; its share not yet logged
        self._share_logged = False  # once per session

    def track(self, dataset: Any, mode: bool | None = None, restored: str | None = None, *, fresh: bool = False) -> Any:
        """An iterator over ``dataset``, part of the checkpoint as ``mode`` says
        (``restored``: the checkpoint restored, named if its position does not fit).

        ``mode`` is ``run_loop``'s ``checkpoint_iterator``: ``None`` tracks the iterator
        when TensorFlow can serialise it, else logs ``checkpoint.iterator_skipped`` once
        and leaves it out; ``True`` raises :class:`CheckpointError` instead; ``False``
        leaves it out. The check (:func:`._iterator_state.serialisation_problem`) runs
        once per new iterator, before its position is restored and before any step.

        The iterator of the same dataset object is reused within a session (so a retried
        or second ``run_loop`` goes on where the last stopped), unless ``fresh`` (a new
        epoch: a new iterator, which takes the place of the last in the checkpoint); if
        the restored checkpoint holds an iterator position, the first tracked iterator
        resumes from it.
        """
        from ._iterator_state import serialisation_problem, untrackable_error

        if self._iterator_source is dataset and self._iterator is not None and not fresh:
            iterator = self._iterator
        elif fresh and self._iterator_source is dataset and self._iterator_checked:
            iterator = self._iterator = iter(dataset)  # the next epoch of a pipeline already checked
        else:
            iterator = iter(dataset)
            self._iterator_source, self._iterator = dataset, iterator
            self._iterator_problem = None if mode is False else serialisation_problem(iterator)
            self._iterator_checked = mode is not False
        if mode is not False and not self._iterator_checked:  # reused, never checked
            self._iterator_problem = serialisation_problem(iterator)
            self._iterator_checked = True
        track = mode is not False
        if track and self._iterator_problem is not None:
            if mode:
                raise untrackable_error(self._iterator_problem)
            if self._iterator_logged is not iterator:
                self._iterator_logged = iterator
                log.warning(
                    "checkpoint.iterator_skipped",
                    reason=self._iterator_problem,
                    action="left out of checkpoints: a resumed run restarts the data",
                )
            track = False
        if track:
            if getattr(self.checkpoint, ITERATOR_ATTR, None) is not iterator:
                self._check_pipeline(dataset, restored)
                try:
                    setattr(self.checkpoint, ITERATOR_ATTR, iterator)  # restores a deferred position
                except tf().errors.OpError as exc:
                    from ._iterator_state import restore_mismatch_error

                    _untrack(self.checkpoint, ITERATOR_ATTR)
                    self._iterator_source = self._iterator = None
                    raise restore_mismatch_error(exc, restored) from exc
                self._share_pending = not self._share_logged
        elif getattr(self.checkpoint, ITERATOR_ATTR, None) is not None:
            _untrack(self.checkpoint, ITERATOR_ATTR)  # an earlier run_loop's iterator
            _untrack(self.checkpoint, PIPELINE_ATTR)
            self._share_pending = False
        return iterator

    def close(self) -> None:
        """At the session's end, on the step thread: the tracked iterator let go (its
        prefetch threads with it)."""
        if getattr(self.checkpoint, ITERATOR_ATTR, None) is not None:
            _untrack(self.checkpoint, ITERATOR_ATTR)
        self._iterator_source = self._iterator = self._iterator_logged = None

    def rewind_unless_held(self, path: str) -> None:
        """On the step thread, after the session restored the checkpoint ``path`` into a
        state its tracked iterator is attached to (a recovery, a divergence rollback):
        when that checkpoint holds no iterator position (it was taken before the
        iterator was attached: the start-up checkpoint), the restore left the iterator
        where it was; a new iterator over the same dataset, from its start, takes its
        place: where the data stood at that checkpoint's step."""
        iterator = self._iterator
        if iterator is None or getattr(self.checkpoint, ITERATOR_ATTR, None) is not iterator:
            return
        try:
            held = any(name.startswith(f"{ITERATOR_ATTR}/") for name, _ in tf().train.list_variables(path))
        except Exception as exc:  # unreadable here: leave the iterator as the restore left it
            log.warning("checkpoint.iterator_unknown", path=path, error=describe(exc))
            return
        if held:
            return
        fresh = self._iterator = iter(self._iterator_source)
        setattr(self.checkpoint, ITERATOR_ATTR, fresh)
        log.info("checkpoint.iterator_rewound", path=path, why="the checkpoint holds no data position")

    def _check_pipeline(self, dataset: Any, restored: str | None) -> None:
        """Before ``dataset``'s iterator takes a saved position: the pipeline described in
        the restored checkpoint (if any) must be ``dataset``'s; then ``dataset``'s
        description goes into the checkpoint with its iterator.

        Raises:
            CheckpointError: naming both pipelines (:func:`._iterator_state.describe_pipeline`).
        """
        from ._iterator_state import describe_pipeline, pipeline_changed_error

        now = describe_pipeline(dataset)
        held = getattr(self.checkpoint, PIPELINE_ATTR, None)
        if held is None:  # the first pipeline tracked since the restore (another one later is fine)
            held = tf().Variable("", dtype=tf().string, trainable=False, name="asv_data_pipeline")
            setattr(self.checkpoint, PIPELINE_ATTR, held)  # takes a saved description, if restored
            saved = held.numpy().decode(errors="replace")
            if saved and saved != now:
                _untrack(self.checkpoint, PIPELINE_ATTR)
                self._iterator_source = self._iterator = None
                raise pipeline_changed_error(saved, now, restored)
        held.assign(now)

    def report_share(self, prefix: str) -> None:
        """On the writer thread, after a commit: log once per session how much of the
        checkpoint the data iterator's state is (``checkpoint.iterator_state``); a
        warning when it is most of it (a large shuffle buffer). Never fails a save."""
        if not self._share_pending:
            return
        try:
            self._log_share(prefix)
        except Exception:  # a report only: the checkpoint is committed, never fail the save
            self._share_pending = False

    def _log_share(self, prefix: str) -> None:
        from ._iterator_state import DOMINANT_BYTES, DOMINANT_SHARE, iterator_share

        try:
            share = iterator_share(prefix)
        except Exception as exc:  # an index this reader does not know (compressed, ...)
            self._share_pending = False
            log.debug("checkpoint.iterator_state_unknown", path=prefix, error=describe(exc))
            return
        if share is None:  # taken before the iterator was attached: the next one will tell
            return
        self._share_pending = False
        self._share_logged = True
        mine, total = share
        ratio = round(mine / total, 3) if total else 0.0
        if ratio > DOMINANT_SHARE and mine >= DOMINANT_BYTES:
            log.warning(
                "checkpoint.iterator_state",
                bytes=mine,
                checkpoint_bytes=total,
                share=ratio,
                path=prefix,
                hint="the data iterator's buffers (shuffle, prefetch) are most of each checkpoint; a "
                "smaller shuffle buffer, or checkpoint_iterator=False (of run_loop or fit; a resume then restarts "
                "the data), makes checkpoints smaller",
            )
        else:
            log.info("checkpoint.iterator_state", bytes=mine, checkpoint_bytes=total, share=ratio, path=prefix)


def _untrack(checkpoint: Any, name: str) -> None:
    """Remove attribute ``name`` from ``checkpoint`` and from what it saves."""
    internals.untrack(checkpoint, name)
