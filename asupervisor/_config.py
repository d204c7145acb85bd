"""The supervisor's configuration: a frozen, validated record of its keyword arguments.

Every field is checked in ``__post_init__`` and a bad value is a ``ValueError`` (or
``TypeError``) that names the field and the value. Validation must not touch the disk
beyond reading what ``logdir`` is, and must not import TensorFlow.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _tf_internals
from ._cluster import ClusterInfo
from ._core._clock import Clock, MonotonicClock
from ._core._hooks import SessionRunHook
from ._core._watchdog import WatchdogOptions

__all__ = ["SupervisorConfig"]


def _check_secs(
    name: str, value: object, *, allow_none: bool = False, allow_inf: bool = False, unit: str = "seconds"
) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of {unit}, got {value!r}")
    if math.isnan(value) or value < 0 or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{name} must be a number of {unit} >= 0, got {value!r}")


def _check_callable(name: str, value: object) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class SupervisorConfig:
    """All of ``Supervisor``'s settings; see :class:`asupervisor.Supervisor` for meanings."""

    logdir: Path | None
    #: a URL logdir's local working directory (``None``: under the user's cache)
    local_dir: str | os.PathLike[str] | None = None
    #: the remote tier of a URL logdir gets every ``upload_every``-th local checkpoint...
    upload_every: int = 1
    #: ...or the newest one once ``upload_every_secs`` passed since the last upload
    upload_every_secs: float | None = None
    #: the URL of a URL logdir (``logdir`` is then its local working directory)
    remote_url: str | None = field(default=None, init=False)
    state: Any = None
    global_step: Any = None
    is_chief: bool | None = None
    init_fn: Callable[[], Any] | None = None
    local_init_fn: Callable[[], Any] | None = None
    ready_fn: Callable[[], Iterable[str]] | None = None
    checkpoint_basename: str = "model.ckpt"
    save_model_secs: float | str = 600  # or "auto": OverheadBudget()
    save_model_steps: int | None = None
    max_to_keep: int | None = 5
    keep_checkpoint_every_n_hours: float | None = None
    #: retention as a policy object (replaces the two settings above)
    keep_policy: Any = None
    #: when to save as a policy object (replaces save_model_secs / save_model_steps)
    save_policy: Any = None
    save_summaries_secs: float = 120
    recovery_wait_secs: float = 30
    stop_grace_secs: float = 120
    #: what a periodic save does while the previous write is in flight: "wait" or "skip"
    checkpoint_when_busy: str = "wait"
    checkpoint_staging: bool = True
    #: "auto", "fast", "plain" or None (the environment's choice); see checkpoint_fast_path
    checkpoint_store: str | None = None
    #: a store object (``Supervisor(store=...)``) the checkpoints of ``logdir`` go through
    store: Any = None
    #: the RAM tier below the disk: ``False``, ``True`` (``/dev/shm``) or its root directory
    ram_tier: Any = False
    #: seconds between RAM saves, or ``"auto"`` (the 2 % overhead budget)
    ram_save_secs: float | str = "auto"
    hooks: Sequence[SessionRunHook] = ()
    #: a live progress display on stderr
    progress: bool = False
    handle_signals: bool = True
    #: serve Prometheus text at http://127.0.0.1:<port>/metrics while a session lives
    metrics_port: int | str | None = None
    #: the signals that request a graceful stop (names or numbers; ``signal.Signals`` once checked)
    stop_signals: Sequence[Any] = ("SIGINT", "SIGTERM")
    #: the hang watchdog's settings (``StopOptions(watchdog=...)``)
    watchdog: WatchdogOptions = field(default_factory=WatchdogOptions)
    #: seconds from a stop notice to its deadline, per source (``StopOptions.deadline_secs``)
    stop_deadline_secs: Any = None
    queue_runners: Sequence[Any] = ()
    clock: Clock = field(default_factory=MonotonicClock)
    #: the cluster from ``TF_CONFIG`` (``None``: a single worker); see :attr:`multi_worker`
    cluster: ClusterInfo | None = None

    @property
    def checkpoint_fast_path(self) -> Any:
        """The checkpoint store chosen for :attr:`checkpoint_store` (a ``FastPath``; all
        off: the plain store), decided once per session."""
        from ._checkpoint.store import resolve_store

        return resolve_store(self.checkpoint_store)

    @property
    def multi_worker(self) -> bool:
        """Whether this process is one of several training workers (chief included).

        Then every worker takes part in every save at the same steps (see
        ``docs/checkpoints.md``, "Multi-worker training").
        """
        cluster = self.cluster
        return cluster is not None and cluster.num_workers > 1 and cluster.task_type in ("chief", "master", "worker")

    def _check_remote(self) -> None:
        """A URL logdir: checked (its scheme served), and ``logdir`` set to its local
        working directory."""
        from ._checkpoint.store import check_not_mistyped, check_url, default_local_dir, is_url

        check_not_mistyped(self.logdir)
        if is_url(self.logdir):
            url = check_url(str(self.logdir))
            object.__setattr__(self, "remote_url", url)
            if self.local_dir is not None:
                if not isinstance(self.local_dir, (str, os.PathLike)) or is_url(self.local_dir):
                    raise TypeError(f"local_dir must be a local path or None, got {self.local_dir!r}")
                local: Path = Path(self.local_dir)
            else:
                cluster = self.cluster
                task = None if self.is_chief or cluster is None else f"{cluster.task_type}-{cluster.task_index}"
                local = default_local_dir(url, task)
            object.__setattr__(self, "logdir", local)
        elif self.local_dir is not None:
            raise ValueError(
                f"local_dir={str(self.local_dir)!r} is the local working directory of a URL logdir "
                f"(s3://, gs://, ...); logdir {str(self.logdir)!r} is local"
            )
        if isinstance(self.upload_every, bool) or not isinstance(self.upload_every, int) or self.upload_every < 1:
            raise ValueError(f"upload_every must be an int >= 1, got {self.upload_every!r}")
        _check_secs("upload_every_secs", self.upload_every_secs, allow_none=True)

    def __post_init__(self) -> None:
        self._check_remote()
        if self.logdir is not None:
            if not isinstance(self.logdir, (str, os.PathLike)):
                raise TypeError(f"logdir must be a path, a URL or None, got {self.logdir!r}")
            logdir = Path(self.logdir)
            if logdir.exists() and not logdir.is_dir():
                raise ValueError(f"logdir {str(logdir)!r} exists and is not a directory")
            object.__setattr__(self, "logdir", logdir)
        if self.state is not None and not isinstance(self.state, dict):
            if not all(hasattr(self.state, m) for m in ("write", "read", "restore")):
                raise TypeError(
                    "state must be a tf.train.Checkpoint or a dict of trackables "
                    f"(models, optimizers, variables), got {type(self.state).__name__}; "
                    "wrap a single object in a dict, e.g. state={'model': model}"
                )
        check_state_values(self.state)
        if self.is_chief is not None and not isinstance(self.is_chief, bool):
            raise TypeError(f"is_chief must be True, False or None, got {self.is_chief!r}")
        for name in ("init_fn", "local_init_fn", "ready_fn"):
            _check_callable(name, getattr(self, name))
        if (
            not isinstance(self.checkpoint_basename, str)
            or not self.checkpoint_basename
            or (os.sep in self.checkpoint_basename)
        ):
            raise ValueError(f"checkpoint_basename must be a file name, got {self.checkpoint_basename!r}")
        if isinstance(self.save_model_secs, str):
            if self.save_model_secs != "auto":
                raise TypeError(
                    f"save_model_secs must be a number of seconds or 'auto' (an overhead budget), "
                    f"got {self.save_model_secs!r}"
                )
        else:
            _check_secs("save_model_secs", self.save_model_secs)
        _check_secs("save_summaries_secs", self.save_summaries_secs)
        _check_secs("recovery_wait_secs", self.recovery_wait_secs)
        _check_secs("stop_grace_secs", self.stop_grace_secs, allow_inf=True)
        _check_secs("keep_checkpoint_every_n_hours", self.keep_checkpoint_every_n_hours, allow_none=True, unit="hours")
        if self.save_model_steps is not None and (
            isinstance(self.save_model_steps, bool)
            or not isinstance(self.save_model_steps, int)
            or self.save_model_steps <= 0
        ):
            raise ValueError(f"save_model_steps must be a positive int or None, got {self.save_model_steps!r}")
        if self.max_to_keep is not None and (
            isinstance(self.max_to_keep, bool) or not isinstance(self.max_to_keep, int) or self.max_to_keep < 1
        ):
            raise ValueError(f"max_to_keep must be an int >= 1 or None (keep all), got {self.max_to_keep!r}")
        if self.keep_policy is not None:
            from ._checkpoint.policy._policies import KeepPolicy

            if not isinstance(self.keep_policy, KeepPolicy):
                raise TypeError(
                    f"keep_policy must be a KeepPolicy (an object with decide(checkpoints, *, last_forever)), "
                    f"got {self.keep_policy!r}"
                )
            if self.max_to_keep != 5 or self.keep_checkpoint_every_n_hours is not None:
                raise ValueError(
                    f"give keep_policy={self.keep_policy!r} or max_to_keep / keep_checkpoint_every_n_hours, "
                    f"not both (got max_to_keep={self.max_to_keep!r}, "
                    f"keep_checkpoint_every_n_hours={self.keep_checkpoint_every_n_hours!r})"
                )
        if self.save_policy is not None:
            from ._checkpoint.policy._policies import SavePolicy

            if not isinstance(self.save_policy, SavePolicy):
                raise TypeError(
                    f"save_policy must be a SavePolicy (an object with should_save(moment)), got {self.save_policy!r}"
                )
            if self.save_model_secs != 600 or self.save_model_steps is not None:
                raise ValueError(
                    f"give save_policy={self.save_policy!r} or save_model_secs / save_model_steps, not both "
                    f"(got save_model_secs={self.save_model_secs!r}, save_model_steps={self.save_model_steps!r})"
                )
        if self.metrics_port is not None:
            from ._prometheus import parse_address

            parse_address(self.metrics_port)  # a bad port or host: an error now, naming it
        from ._core._signals import stop_signals_from

        object.__setattr__(self, "stop_signals", stop_signals_from(self.stop_signals))
        if not isinstance(self.progress, bool):
            raise TypeError(f"progress must be True or False, got {self.progress!r}")
        if not isinstance(self.checkpoint_staging, bool):
            raise TypeError(f"checkpoint_staging must be True or False, got {self.checkpoint_staging!r}")
        from ._checkpoint.store import resolve_store

        resolve_store(self.checkpoint_store)  # a bad value, or "fast" off Linux: an error now
        if self.ram_tier is True:
            from ._checkpoint.store import ram_tier_root

            ram_tier_root(True)  # no /dev/shm here: an error now, not at the start
        if self.store is not None:
            missing = [
                m
                for m in ("prepare", "write", "commit", "restore_newest")
                if not callable(getattr(self.store, m, None))
            ]
            if missing:
                raise TypeError(
                    f"store must be a store name or a checkpoint store object (asupervisor.testing's "
                    f"CheckpointStore protocol), got {self.store!r}: it lacks {', '.join(missing)}"
                )
        if self.checkpoint_when_busy not in ("wait", "skip"):
            raise ValueError(f"checkpoint_when_busy must be 'wait' or 'skip', got {self.checkpoint_when_busy!r}")
        hooks = tuple(self.hooks)
        for hook in hooks:
            if not isinstance(hook, SessionRunHook) and not any(
                callable(getattr(hook, m, None)) for m in ("before_run", "after_run", "begin", "end")
            ):
                raise TypeError(f"hooks must be SessionRunHook objects, got {hook!r}")
        object.__setattr__(self, "hooks", hooks)
        object.__setattr__(self, "queue_runners", tuple(self.queue_runners))
        if not isinstance(self.clock, Clock):
            raise TypeError(f"clock must have now() and sleep_until(), got {self.clock!r}")
        if self.cluster is not None and not isinstance(self.cluster, ClusterInfo):
            raise TypeError(f"cluster must be a ClusterInfo or None, got {self.cluster!r}")
        if (
            self.multi_worker
            and self.save_policy is None
            and self.logdir is not None
            and (isinstance(self.save_model_secs, str) or self.save_model_secs > 0)
            and self.save_model_steps is None
        ):
            assert self.cluster is not None
            raise ValueError(
                f"save_model_secs={self.save_model_secs!r} without save_model_steps: in multi-worker "
                f"training (TF_CONFIG names {self.cluster.num_workers} workers) every worker must "
                "snapshot at the same steps, which a timer cannot promise; set save_model_steps "
                "(the timer is then not used) or save_model_secs=0 to disable saving"
            )


def _trackable(value: object) -> bool:
    # Without importing TensorFlow: every TF trackable (variables, Keras 3 models, layers,
    # optimizers and variables, tf.Module, iterators, ...) (:mod:`._tf_internals`).
    return _tf_internals.is_trackable(value)


def _silently_unsaved(value: object, where: str) -> str | None:
    """What in ``value`` (named ``where``) a ``tf.train.Checkpoint`` would not save, or ``None``.

    TF wraps a list or dict attribute (``ListWrapper``, ``_DictWrapper``) and saves only
    its trackable items: ``[1, 2, 3]`` or ``{"lr": 0.1}`` are accepted and silently
    dropped. A ``tf.data.Dataset`` is trackable and saves nothing either.
    """
    tf_ = sys.modules.get("tensorflow")
    if isinstance(value, (list, tuple)):
        items: Iterable[tuple[str, object]] = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, Mapping):
        items = ((f"{where}[{k!r}]", v) for k, v in value.items())
    elif tf_ is not None and isinstance(value, tf_.data.Dataset):
        return (
            f"{where} is a tf.data.Dataset, whose position a checkpoint does not hold (pass it "
            "as run_loop(fn, data=dataset) to checkpoint its iterator)"
        )
    elif not _trackable(value):
        return f"{where} is a value of type {type(value).__name__} ({value!r:.60})"
    else:
        return None
    for name, item in items:
        problem = _silently_unsaved(item, name)
        if problem is not None:
            return problem
    return None


def check_state_values(state: object) -> None:
    """Raise ``TypeError`` naming the key when ``state`` holds what a checkpoint would not save.

    For a dict state, every value; for a ``tf.train.Checkpoint``, the lists and dicts it
    holds. A plain Python value (``[1, 2, 3]``, a number, a string, an array) is not
    trackable: TensorFlow either refuses it or, inside a list or dict, silently leaves it
    out of every checkpoint, so a resumed run would not get it back.
    """
    if isinstance(state, dict):
        values: Iterable[tuple[str, object]] = state.items()
    elif state is not None and _trackable(state):
        try:
            children = _tf_internals.trackable_children(state)
        except Exception:  # best effort: TF itself reports what it refuses
            return
        values = ((k, v) for k, v in children.items() if isinstance(v, (list, tuple, Mapping)))
    else:
        return
    for key, value in values:
        problem = _silently_unsaved(value, f"state[{key!r}]")
        if problem is not None:
            raise TypeError(
                f"{problem}: it would not be saved in checkpoints (TensorFlow saves only "
                "trackable objects: tf.Variable, Keras models, layers, optimizers and "
                "variables, tf.Module, ...); keep such a value in a tf.Variable "
                "(e.g. tf.Variable([1, 2, 3])) or out of state"
            )
