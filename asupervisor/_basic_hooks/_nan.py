"""``NanTensorHook``: a NaN loss stops training, and is never checkpointed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._core._abc import SessionPart, context_of
from .._core._divergence import stack_losses as _stack
from .._core._hooks import SessionRunContext, SessionRunHook, SessionRunValues
from .._exceptions import NanLossDuringTrainingError
from .._logging import get_logger
from ._timer import check_every

if TYPE_CHECKING:
    from .._core._abc import SessionContext
    from .._core._session import Session
from ._common import _lookup

__all__ = ["NanTensorHook"]

log = get_logger(__name__)


class NanTensorHook(SessionRunHook):
    """Checks the step's loss for NaN; raises (or stops) when it is.

    A host read of a step's loss costs 3-7 µs on the step thread (on a CPU; a device
    sync elsewhere), more than all other per-step hook work together, and a TF op per
    step (``tf.math.is_nan``) costs more still. So by default the losses are kept
    (references, no read), and every ``check_every_n_steps`` steps the batch is stacked
    into one tensor by one op (dispatched, not waited for), while the batch stacked the
    time before, long computed, is read in one go: the step thread never waits for the
    device and no other thread is involved. The losses not read yet are all checked at
    once before any checkpoint of the state (hook saves, the checkpoint service, the
    final checkpoint: a NaN is never saved) and at the end. A NaN is raised on the step
    thread, naming the first step that produced one, up to ``2 * check_every_n_steps - 1``
    steps after it. ``immediate=True`` reads every loss right after its step (TF1's
    timing).

    Args:
        loss_key: the name of the loss in the mapping the step returns.
        fail_on_nan_loss: raise :class:`~asupervisor.NanLossDuringTrainingError` (stopping
            training, without a final checkpoint); else log a warning and stop cleanly.
        immediate: check each loss right after its step.
        check_every_n_steps: without ``immediate``, steps between reads.
    """

    def __init__(
        self,
        loss_key: str = "loss",
        fail_on_nan_loss: bool = True,
        *,
        immediate: bool = False,
        check_every_n_steps: int = 100,
    ) -> None:
        if not isinstance(loss_key, str) or not loss_key:
            raise ValueError(f"loss_key must be a non-empty string, got {loss_key!r}")
        check_every("check_every_n_steps", check_every_n_steps, kind="steps")
        self._key = loss_key
        self._fail = bool(fail_on_nan_loss)
        self._immediate = bool(immediate)
        self._every = check_every_n_steps
        self._pending: list[Any] = []  # losses not stacked yet (tensors), consecutive
        self._first_step = 0  # the step of _pending[0]
        self._stacked: tuple[int, Any] | None = None  # (first step, stacked batch) not read yet
        self._ctx: SessionContext | None = None

    def begin(self) -> None:
        """Forget losses left from an earlier session."""
        self._pending = []
        self._stacked = None

    def after_create_session(self, session: Session) -> None:
        """Check the unread losses before any checkpoint of the state."""
        self._ctx = context_of(session)

    def _asv_part(self) -> SessionPart:
        return _NanCheck(self)

    def after_run(self, run_context: SessionRunContext, run_values: SessionRunValues) -> None:
        """Keep the loss; stack a full batch and read the one before (or check now: ``immediate``)."""
        results = run_values.results
        try:
            loss = results[self._key]
        except (KeyError, TypeError, IndexError):
            loss = _lookup(results, self._key, "NanTensorHook")
        if self._immediate or not hasattr(loss, "numpy"):
            self._check_all(run_context)  # keep the order of steps
            self._check(loss, run_values.global_step, run_context)
            return
        pending = self._pending
        if not pending:
            self._first_step = run_values.global_step
        pending.append(loss)
        if len(pending) >= self._every:
            self._collect(run_context)  # the previous batch, computed long ago
            self._pending = []
            self._stacked = (self._first_step, _stack(pending))

    def _collect(self, run_context: SessionRunContext | None) -> None:
        """On the step thread: read the stacked batch; raise (or stop) on a NaN."""
        stacked = self._stacked
        if stacked is None:
            return
        self._stacked = None
        step = _first_nan(*stacked)
        if step is not None:
            self._nan(step, run_context)

    def _check_all(self, run_context: SessionRunContext | None = None) -> None:
        """On the step thread: every loss not checked yet, in step order."""
        self._collect(run_context)
        pending = self._pending
        if pending:
            self._pending = []
            step = _first_nan(self._first_step, _stack(pending))
            if step is not None:
                self._nan(step, run_context)

    def _check(self, loss: Any, step: int, run_context: SessionRunContext | None) -> None:
        value = loss.numpy() if hasattr(loss, "numpy") else loss
        if value == value:  # not NaN (also for a NaN inside a numpy scalar)
            return
        self._nan(step, run_context)

    def _nan(self, step: int, run_context: SessionRunContext | None) -> None:
        self._pending = []
        self._stacked = None
        message = f"NaN loss during training (step {step}, key {self._key!r})."
        if self._fail:
            log.error("nan_loss.detected", global_step=step, action="raise")
            if self._ctx is not None:
                self._ctx.mark_state_suspect()  # no checkpoint of NaN weights
            raise NanLossDuringTrainingError(message)
        log.warning("nan_loss.detected", global_step=step, action="stop")
        if run_context is not None:
            run_context.request_stop()
        elif self._ctx is not None:
            self._ctx.control.request_stop(reason="hook")

    def end(self, session: Session) -> None:
        """Check the losses not checked yet."""
        self._check_all()


class _NanCheck(SessionPart):
    """NanTensorHook's part in the session: before any checkpoint of the state (and
    before the final one) the losses not read yet are checked; a NaN stops that save."""

    name = "nan_check"

    def __init__(self, hook: NanTensorHook) -> None:
        self._hook = hook

    def before_snapshot(self) -> None:
        self._hook._check_all()


def _has_nan(value: Any) -> bool:
    import numpy as np

    return not bool(np.all(value == value))  # numpy scalars and arrays, Python numbers


def _first_nan(first_step: int, losses: Any) -> int | None:
    """The step of the first loss with a NaN.

    Args:
        first_step: the step of the first loss.
        losses: a stacked tensor (one loss per row, read at once) or a list of losses
            (tensors or numbers, read one by one).
    """
    if not isinstance(losses, list):
        values = losses.numpy()
        if not _has_nan(values):
            return None
        losses = list(values)
    for i, loss in enumerate(losses):
        if _has_nan(loss.numpy() if hasattr(loss, "numpy") else loss):
            return first_step + i
    return None
