"""asupervisor: a structured-concurrency supervisor for TensorFlow 2 training.

Importing this package is cheap and has no side effects: it does not import TensorFlow,
configure logging or touch an event loop. See ``docs/`` for the concepts.

The package is built in five layers; each imports only from the layers above it in this
list (``tests/test_layers.py`` enforces it, type-only imports and import circles
included; ``docs/architecture.md`` draws it):

1. leaves — ``_exceptions``, ``_tf``, ``_cluster``, ``_logging``: nothing of ours but
   ``_exceptions``.
2. ``_core`` — the engine: threads, stop, services, hooks, parts, the step loop, the
   session's lifetime, status. Leaves and itself; never a feature. Features reach it only
   through ``_core/_abc.py`` (``SessionContext``, ``SessionPart``).
3. features — ``_checkpoint``, ``_summary``, ``_input``, ``_basic_hooks``: ``_core`` and
   leaves, never each other (what one offers another goes through typed attributes).
4. front doors — ``_supervisor``, ``_monitored_session``, ``_session_manager``,
   ``_keras`` (``sess.fit``, offered to the session through ``_assembly``), ``_config``,
   ``_assembly``, ``testing``: anything below; ``_assembly`` alone names the session
   parts of the features.
5. this ``__init__`` — re-exports only.
"""

from __future__ import annotations

import gc as _gc

# A garbage collection during these imports walks the whole heap, TensorFlow's too when it
# was imported first (0.15 s of a start on the 2-vCPU VMs measured): paused until they are done.
_gc_was_enabled = _gc.isenabled()
_gc.disable()
try:
    from ._basic_hooks._checkpoint import CheckpointSaverHook as CheckpointSaverHook
    from ._basic_hooks._checkpoint import CheckpointSaverListener as CheckpointSaverListener
    from ._basic_hooks._final_ops import FinalOpsHook as FinalOpsHook
    from ._basic_hooks._logging import LoggingTensorHook as LoggingTensorHook
    from ._basic_hooks._nan import NanTensorHook as NanTensorHook
    from ._basic_hooks._profiler import ProfilerHook as ProfilerHook
    from ._basic_hooks._step_counter import StepCounterHook as StepCounterHook
    from ._basic_hooks._stop import StopAtStepHook as StopAtStepHook
    from ._basic_hooks._summary import SummarySaverHook as SummarySaverHook
    from ._basic_hooks._timer import SecondOrStepTimer as SecondOrStepTimer
    from ._basic_hooks._waiter import GlobalStepWaiterHook as GlobalStepWaiterHook
    from ._checkpoint._watch import CheckpointWatcher as CheckpointWatcher
    from ._checkpoint._watch import watch_checkpoints as watch_checkpoints
    from ._checkpoint.policy._policies import AnyKeepPolicy as AnyKeepPolicy
    from ._checkpoint.policy._policies import AnySavePolicy as AnySavePolicy
    from ._checkpoint.policy._policies import CheckpointRecord as CheckpointRecord
    from ._checkpoint.policy._policies import EveryNHours as EveryNHours
    from ._checkpoint.policy._policies import EverySeconds as EverySeconds
    from ._checkpoint.policy._policies import EverySteps as EverySteps
    from ._checkpoint.policy._policies import Keep as Keep
    from ._checkpoint.policy._policies import KeepAll as KeepAll
    from ._checkpoint.policy._policies import KeepBest as KeepBest
    from ._checkpoint.policy._policies import KeepPolicy as KeepPolicy
    from ._checkpoint.policy._policies import LatestN as LatestN
    from ._checkpoint.policy._policies import OnStartup as OnStartup
    from ._checkpoint.policy._policies import OnStop as OnStop
    from ._checkpoint.policy._policies import OverheadBudget as OverheadBudget
    from ._checkpoint.policy._policies import SaveMoment as SaveMoment
    from ._checkpoint.policy._policies import SavePolicy as SavePolicy
    from ._cluster import ClusterInfo as ClusterInfo
    from ._cluster import cluster_info as cluster_info
    from ._core._clock import Clock as Clock
    from ._core._clock import MonotonicClock as MonotonicClock
    from ._core._divergence import Rollback as Rollback
    from ._core._exit import exit_now as exit_now
    from ._core._hooks import SessionRunContext as SessionRunContext
    from ._core._hooks import SessionRunHook as SessionRunHook
    from ._core._hooks import SessionRunValues as SessionRunValues
    from ._core._services import LoopedService as LoopedService
    from ._core._services import RestartPolicy as RestartPolicy
    from ._core._services import Service as Service
    from ._core._services import ServiceContext as ServiceContext
    from ._core._services import WorkerThread as WorkerThread
    from ._core._session import Session as Session
    from ._core._session import StepContext as StepContext
    from ._core._signals import catch_stop_signals as catch_stop_signals
    from ._core._status import CheckpointInfo as CheckpointInfo
    from ._core._status import Goodput as Goodput
    from ._core._status import Histogram as Histogram
    from ._core._status import QueueStatistics as QueueStatistics
    from ._core._status import RemoteStatus as RemoteStatus
    from ._core._status import Status as Status
    from ._core._status import exit_code as exit_code
    from ._core._watchdog import WatchdogOptions as WatchdogOptions
    from ._core._watchdog import collective_options as collective_options
    from ._exceptions import CheckpointError as CheckpointError
    from ._exceptions import DeadlineExceededError as DeadlineExceededError
    from ._exceptions import DivergenceError as DivergenceError
    from ._exceptions import LeaseLostError as LeaseLostError
    from ._exceptions import NanLossDuringTrainingError as NanLossDuringTrainingError
    from ._exceptions import ServiceError as ServiceError
    from ._exceptions import StopRequestedError as StopRequestedError
    from ._exceptions import StorageUnreachableError as StorageUnreachableError
    from ._exceptions import SupervisorError as SupervisorError
    from ._gce import GcePreemptionNotice as GcePreemptionNotice
    from ._input._queue_runner import QueueRunner as QueueRunner
    from ._logging import configure_logging as configure_logging
    from ._monitored_session import MonitoredTrainingSession as MonitoredTrainingSession
    from ._options import CheckpointOptions as CheckpointOptions
    from ._options import StopOptions as StopOptions
    from ._options import SummaryOptions as SummaryOptions
    from ._session_manager import SessionManager as SessionManager
    from ._supervisor import Supervisor as Supervisor
finally:
    if _gc_was_enabled:
        _gc.enable()
del _gc, _gc_was_enabled

__version__ = "0.1.0"

__all__ = [
    "AnyKeepPolicy",
    "AnySavePolicy",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointOptions",
    "CheckpointRecord",
    "CheckpointSaverHook",
    "CheckpointSaverListener",
    "CheckpointWatcher",
    "Clock",
    "ClusterInfo",
    "DeadlineExceededError",
    "DivergenceError",
    "EveryNHours",
    "EverySeconds",
    "EverySteps",
    "FinalOpsHook",
    "GcePreemptionNotice",
    "GlobalStepWaiterHook",
    "Goodput",
    "Histogram",
    "Keep",
    "KeepAll",
    "KeepBest",
    "KeepPolicy",
    "LatestN",
    "LeaseLostError",
    "LoggingTensorHook",
    "LoopedService",
    "MonitoredTrainingSession",
    "MonotonicClock",
    "NanLossDuringTrainingError",
    "NanTensorHook",
    "OnStartup",
    "OnStop",
    "OverheadBudget",
    "ProfilerHook",
    "QueueRunner",
    "QueueStatistics",
    "RemoteStatus",
    "RestartPolicy",
    "Rollback",
    "SaveMoment",
    "SavePolicy",
    "SecondOrStepTimer",
    "Service",
    "ServiceContext",
    "ServiceError",
    "Session",
    "SessionManager",
    "SessionRunContext",
    "SessionRunHook",
    "SessionRunValues",
    "Status",
    "StepContext",
    "StepCounterHook",
    "StopAtStepHook",
    "StopOptions",
    "StopRequestedError",
    "StorageUnreachableError",
    "SummaryOptions",
    "SummarySaverHook",
    "Supervisor",
    "SupervisorError",
    "WatchdogOptions",
    "WorkerThread",
    "catch_stop_signals",
    "cluster_info",
    "collective_options",
    "configure_logging",
    "exit_code",
    "exit_now",
    "watch_checkpoints",
]


def _report_public_module() -> None:
    """Public classes and functions name the module users import them from: reprs, tracebacks
    and pickles show ``asupervisor.Supervisor``, not the private module that defines it (as
    httpx does). Pickling still finds each object: every one is an attribute of this module.
    """
    import types

    for name in __all__:
        obj = globals()[name]
        if isinstance(obj, (type, types.FunctionType)):
            obj.__module__ = __name__


_report_public_module()
del _report_public_module
