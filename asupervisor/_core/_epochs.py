"""Epochs: ``run_loop(fn, data=dataset, epochs=N)`` and where the loop is within them.

:class:`EpochCounter` holds the epoch position of a session: how many passes over the
data are complete (``epoch``, which is also the 0-based index of the pass in progress, as
Keras counts) and the global step at which the pass in progress began. Both change only
at an epoch boundary, so they live in one ``int64[2]`` variable attached to the state's
checkpoint (``asv_epoch``) and are assigned there, at the boundary, on the step thread:
a checkpoint holds them consistent with the step count and the data iterator's position,
and a restore (at start-up, or after a recovered step error) brings them back with the
rest of the state, so a resumed run goes on mid-epoch exactly. The steps into the
current pass are ``global_step - first_step``: nothing is counted per step.

Python mirrors of the two numbers serve ``status()`` and the summary writer, which must
not read TensorFlow variables off the step thread; they are refreshed from the variable
whenever a ``run_loop`` leg starts (after any restore).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._tf import tf
from ._abc import SessionPart

__all__ = ["EPOCH_ATTR", "KERAS_ATTR", "EpochCounter"]

#: the attribute of the state's ``tf.train.Checkpoint`` holding ``[epoch, start step]``
EPOCH_ATTR = "asv_epoch"
#: the attribute of the state's checkpoint holding what Keras 3 keeps out of TF
#: checkpoints and an exact resume of ``sess.fit`` mid-epoch needs (its seed generators,
#: the epoch's running metrics); the Keras front door fills it, a restore allows it missing
KERAS_ATTR = "asv_keras"


class EpochCounter(SessionPart):
    """The session's epoch position (see the module docstring).

    Attributes:
        epoch: passes completed; the 0-based index of the pass in progress.
        first_step: the global step at which the pass in progress began.
        epochs: the ``epochs`` of the ``run_loop`` running now (``None``: none).
        steps_per_epoch: steps in one pass, once known (the dataset's cardinality, or
            counted over a whole pass).
        active: whether a ``run_loop`` with ``epochs`` ran in this session.
    """

    name = "epochs"

    def __init__(self) -> None:
        self.epoch = 0
        self.first_step = 0
        self.epochs: int | None = None
        self.steps_per_epoch: int | None = None
        self.active = False
        self._var: Any = None
        self._restart_pending = False

    def attach(self, state: Any, step: int, *, consume: bool = True) -> bool:
        """On the step thread, as a ``run_loop`` with epochs starts: the variable made
        part of ``state`` (a checkpoint restored earlier gives it its saved value) and
        the mirrors read from it. Returns whether the position went back to the start
        (a restore to a checkpoint without it): the data must then begin a new pass.
        ``consume=False`` (a look before ``run_loop``'s own): that answer is kept for the
        next call."""
        if self._var is None:
            tf_ = tf()
            var = tf_.Variable([0, 0], dtype=tf_.int64, trainable=False, name=EPOCH_ATTR)
            if state is not None:
                setattr(state, EPOCH_ATTR, var)  # takes a deferred saved value, if any
            self._var = var
        epoch, start = (int(v) for v in self._var.numpy())
        restarted = start > step or self._restart_pending
        self._restart_pending = restarted and not consume
        if start > step:
            # A restore went back before the pass began, to a checkpoint without an epoch
            # position (one taken before epochs were counted: the start-up one): from the start.
            epoch, start = 0, 0
            self._var.assign([0, 0])
        self.epoch, self.first_step = epoch, start
        self.active = True
        return restarted

    def begin(self, epoch: int, step: int) -> None:
        """On the step thread, at an epoch boundary: pass ``epoch`` begins at ``step``."""
        self.epoch, self.first_step = epoch, step
        if self._var is not None:
            self._var.assign([epoch, step])

    def end_step(self) -> float:
        """The global step that completes the pass in progress (``math.inf`` while its
        length is unknown: its end is then found when its iterator runs out)."""
        if not self.steps_per_epoch:
            return math.inf
        return self.first_step + self.steps_per_epoch

    def learn_size(self, dataset: Any) -> None:
        """The steps per epoch from ``dataset``'s cardinality, when TensorFlow knows it."""
        try:
            n = int(dataset.cardinality())
        except Exception:  # not a tf.data.Dataset, or no cardinality
            try:
                n = len(dataset)
            except TypeError:
                return
        if n > 0:
            self.steps_per_epoch = n

    def scalars(self) -> Mapping[str, float]:
        """``epoch`` for the summary writer, once epochs are counted: passes completed,
        with the fraction of the current one when its length is known."""
        if not self.active:
            return {}
        return {"epoch": float(self.epoch)}
