"""``Supervisor.status()``: a frozen snapshot of what the supervisor is doing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._input._queue_runner import QueueStatistics

__all__ = ["CheckpointInfo", "Status"]


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
