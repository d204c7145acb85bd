"""Ended passes' ``tf.data`` iterators, let go off the step thread: :class:`Retired`.

``run_loop(..., epochs=)`` makes a new iterator for each pass over a ``tf.data.Dataset``.
Destroying the ended pass's iterator waits for its background work (its prefetch thread,
tf.data's autotuner) to wind down: nothing, or hundreds of milliseconds, seconds on a
loaded machine, which ``model.fit`` pays on its training thread at some epochs' starts.
Here the step thread hands the ended iterator to :class:`Retired`, which drops it on a
thread of its own (``asv-release``, started at the first one, joined with the session's
threads) once nothing else holds it: a checkpoint's remembered object walk keeps the
iterator it saved until the next snapshot, so each epoch's end looks again at those still
held (``sys.getrefcount``: only this list's reference is left). What is still held at the
stop is dropped on the step thread with the session's spent iterators.

Only ``tf.data`` iterators are retired: a Python generator's ``finally`` must run on the
step thread. This module never calls into TensorFlow and never blocks the step thread.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._tf import is_tf_iterator

if TYPE_CHECKING:
    from ._threads import DedicatedThread

__all__ = ["Retired"]

#: ``sys.getrefcount(held[i])`` of an iterator only ``held`` refers to: the list's
#: reference and the call's argument
_ONLY_HELD_HERE = 2


def _drop(items: list[Any]) -> None:
    """On the release thread: the last references to ``items`` go (their destructors run here)."""
    items.clear()


class Retired:
    """Iterators of ended passes, waiting to be dropped off the step thread.

    Args:
        new_thread: starts a thread joined when the session ends (``Runtime.new_thread``).
        stopping: whether the session is stopping (no thread is started then).
    """

    def __init__(self, new_thread: Callable[[str], DedicatedThread], stopping: Callable[[], bool]) -> None:
        self._new_thread = new_thread
        self._stopping = stopping
        self._thread: DedicatedThread | None = None
        #: retired iterators something else still held at the last look
        self.held: list[Any] = []

    def add(self, iterator: Any) -> None:
        """On the step thread: ``iterator``'s pass ended. Those of the retired iterators
        that nothing else holds any more go to the release thread (``iterator`` itself,
        still in the caller's hands, at a later call)."""
        if not is_tf_iterator(iterator):
            return
        held = self.held
        held.append(iterator)
        del iterator
        free = {i for i in range(len(held)) if sys.getrefcount(held[i]) <= _ONLY_HELD_HERE}
        if not free or self._stopping():
            return
        if self._thread is None:
            self._thread = self._new_thread("asv-release")
        items = [held[i] for i in sorted(free)]
        self.held = [it for i, it in enumerate(held) if i not in free]
        held.clear()  # (the step thread's last references but ``items``')
        self._thread.submit_nowait(_drop, items)

    def clear(self) -> None:
        """Drop what is held, on the calling thread (the stop's)."""
        self.held.clear()
