"""The library's own exceptions, in one place.

Class tree::

    Exception
    └── SupervisorError                 base of everything asupervisor raises itself
        ├── CheckpointError             a checkpoint cannot be written, read or matched
        │   ├── LeaseLostError          another training took a URL logdir over (exit 77)
        │   └── StorageUnreachableError object storage did not answer in time (exit 69)
        ├── DivergenceError             the loss diverged (a spike, under asv.Rollback)
        │   └── NanLossDuringTrainingError  a NaN loss (NanTensorHook, asv.Rollback)
        ├── ServiceError                a service failed more often than its policy allows
        ├── StopRequestedError          a stop signal ended a wait outside a session
        └── DeadlineExceededError       (also a TimeoutError) waited too long

Errors raised by user code (steps, hooks, services) are never wrapped: they come out of
``managed_session()`` as themselves. This module must never import TensorFlow.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "DeadlineExceededError",
    "DivergenceError",
    "LeaseLostError",
    "NanLossDuringTrainingError",
    "ServiceError",
    "StopRequestedError",
    "StorageUnreachableError",
    "SupervisorError",
]


class SupervisorError(Exception):
    """Base class of the errors asupervisor raises on its own behalf."""

    #: the session's ``stop_reason`` when this error stops it (``None``: ``error:<Type>``)
    stop_reason: str | None = None


class CheckpointError(SupervisorError):
    """A checkpoint could not be written, read, or does not match the model's state."""


class LeaseLostError(CheckpointError):
    """Another training holds the lease of this URL logdir (this one was cut off longer
    than the lease lasts and was presumed dead): this training writes nothing more to
    the remote, keeps its local checkpoints and stops (stop reason ``lease_lost``,
    ``exit_code`` 77)."""

    stop_reason = "lease_lost"


class StorageUnreachableError(CheckpointError):
    """Object storage did not answer within its deadline (stop reason
    ``storage_unreachable``, ``exit_code`` 69)."""

    stop_reason = "storage_unreachable"


class DivergenceError(SupervisorError):
    """The training diverged: a loss spike that ``run_loop(on_divergence=asv.Rollback(...))``
    found after its ``max_retries`` rollbacks (a non-finite loss is the subclass
    :class:`NanLossDuringTrainingError`)."""


class NanLossDuringTrainingError(DivergenceError):
    """Raised by ``NanTensorHook`` when the loss became NaN, and by ``run_loop`` with
    ``on_divergence=asv.Rollback(...)`` for a non-finite loss once its rollbacks are spent."""


class ServiceError(SupervisorError):
    """A service failed more often than its restart policy allows.

    The last failure of the service is chained as ``__cause__``.
    """


class StopRequestedError(SupervisorError):
    """A stop signal came while ``SessionManager`` waited for a checkpoint (a non-chief
    waiting for the chief's): the wait ended at once, nothing was restored.

    Attributes:
        signal: the signal's name (``"SIGTERM"``).
        stop_reason: ``"signal:<NAME>"``, as a session stopped by it would have.
        exit_status: what the process should exit with (``128 +`` the signal's number:
            143 after SIGTERM), so a scheduler runs the job again.
    """

    def __init__(self, message: str, *, signal: str) -> None:
        import signal as signals

        super().__init__(message)
        self.signal = signal
        self.stop_reason = f"signal:{signal}"
        try:
            self.exit_status = 128 + int(signals.Signals[signal])
        except KeyError:
            self.exit_status = 143


class DeadlineExceededError(SupervisorError, TimeoutError):
    """Waiting for something (a checkpoint, a ready model) ran out of time."""


class EndOfData(Exception):
    """Internal: a ``StopIteration`` carried across a thread hand-off.

    A ``StopIteration`` cannot be raised through a coroutine (PEP 479), so a job that
    raises one hands this over instead, with the original as ``__cause__``.
    """
