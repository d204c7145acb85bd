"""``Supervisor.status()``: a frozen snapshot of what the supervisor is doing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["CheckpointInfo", "QueueStatistics", "Status"]


@dataclass(frozen=True, kw_only=True)
class CheckpointInfo:
    """The last committed checkpoint.

    Attributes:
        path: checkpoint prefix (``<logdir>/model.ckpt-<step>``).
        step: global step it holds.
        time: wall-clock time (``time.time()``) it was committed.
    """

    path: str
    step: int
    time: float


@dataclass(frozen=True, kw_only=True)
class QueueStatistics:
    """A snapshot of a queue runner's queue (``QueueRunner.statistics()``).

    Attributes:
        size: items queued now.
        capacity: the most items the queue holds.
        produced: items put by the producers in this session.
        consumed: items taken by the consumer in this session.
        consumer_wait_secs: total time the consumer waited for an empty queue to fill.
        fraction_full: ``size / capacity`` (TF1's ``queue/<name>/fraction_full``).
        max_size: the largest size seen in this session (never above ``capacity``).
    """

    size: int
    capacity: int
    produced: int
    consumed: int
    consumer_wait_secs: float
    fraction_full: float
    max_size: int


@dataclass(frozen=True, kw_only=True)
class Status:
    """A snapshot of a supervisor, safe to keep and to read from any thread.

    Attributes:
        running: whether a managed session is active.
        global_step: steps completed (restored step included).
        steps_per_sec: the step counter's last measurement, ``None`` before the first.
        last_checkpoint: the last committed checkpoint, if any.
        stop_reason: why the session stopped or is stopping, ``None`` while running.
        services: each service's state (``starting``, ``running``, ``backoff``,
            ``failed``, ``finished``, ``stopped``).
        queues: statistics of each queue runner, by name.
    """

    running: bool
    global_step: int
    steps_per_sec: float | None = None
    last_checkpoint: CheckpointInfo | None = None
    stop_reason: str | None = None
    services: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    queues: Mapping[str, QueueStatistics] = field(default_factory=lambda: MappingProxyType({}))
