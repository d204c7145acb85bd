"""``TF_CONFIG``: which task this process is in a multi-worker training.

Reads the environment only; never imports TensorFlow. A missing ``TF_CONFIG`` is a
single-worker job, whose only worker is the chief.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ClusterInfo", "cluster_info", "lost_peers"]

_TASK = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")
# what TensorFlow's errors say when a peer is gone (its coordination service's heartbeat
# check, a collective aborted by it, a channel to it that broke)
_LOSS = re.compile(
    r"unhealthy|stopped sending heartbeats|heartbeat timeout|collective ops is aborted|"
    r"failed to connect to all addresses|connection reset|socket closed|task has crashed|tasks have crashed",
    re.IGNORECASE,
)


@dataclass(frozen=True, kw_only=True)
class ClusterInfo:
    """This process's place in the cluster.

    Attributes:
        task_type: ``"chief"``, ``"worker"``, ``"evaluator"``, ``"ps"``, or ``None``
            without ``TF_CONFIG``.
        task_index: index within its task type.
        num_workers: chief plus workers (1 without ``TF_CONFIG``).
        is_chief: whether this process writes checkpoints and summaries.
        workers: the training tasks of the cluster (chief and workers) as
            ``"type:index"``, this one included; empty without ``TF_CONFIG``.
    """

    task_type: str | None
    task_index: int
    num_workers: int
    is_chief: bool
    workers: tuple[str, ...] = ()

    @property
    def task_id(self) -> str:
        """This task as ``"type:index"`` (``"worker:0"`` without ``TF_CONFIG``)."""
        return f"{self.task_type or 'worker'}:{self.task_index}"


def cluster_info(environ: Mapping[str, str] | None = None) -> ClusterInfo:
    """Read ``TF_CONFIG`` (from ``environ``, default ``os.environ``).

    The chief is the ``chief`` task if the cluster has one, else worker 0 (TF's rule).

    Raises:
        ValueError: ``TF_CONFIG`` is not valid JSON or lacks the ``task`` it describes.
    """
    env = os.environ if environ is None else environ
    raw = env.get("TF_CONFIG", "").strip()
    if not raw:
        return ClusterInfo(task_type=None, task_index=0, num_workers=1, is_chief=True)
    try:
        config = json.loads(raw)
        cluster = config.get("cluster", {}) or {}
        task = config.get("task", {}) or {}
        task_type = task.get("type")
        task_index = int(task.get("index", 0))
    except (ValueError, AttributeError, TypeError) as exc:
        raise ValueError(f"TF_CONFIG is not a valid cluster description: {raw!r} ({exc})") from exc
    num_workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    if task_type in ("chief", "master"):
        is_chief = True
    elif task_type == "worker":
        is_chief = "chief" not in cluster and task_index == 0
    else:
        is_chief = False
    workers = tuple(f"{kind}:{i}" for kind in ("chief", "worker") for i in range(len(cluster.get(kind, []))))
    return ClusterInfo(
        task_type=task_type, task_index=task_index, num_workers=max(num_workers, 1), is_chief=is_chief, workers=workers
    )


def lost_peers(message: str, own: ClusterInfo) -> tuple[str, ...] | None:
    """The peers a multi-worker step error says are lost, as ``"type:index"``, from the
    error's ``message``; ``()`` when it says a peer is lost without naming one (in a
    cluster of two, the other task: there is no other to lose); ``None`` when it is not
    about a lost peer.

    TensorFlow names a dead task in its errors (``/job:worker/replica:0/task:1``) once
    its coordination service misses the task's heartbeats, or a collective fails on the
    broken channel to it. Where the message lists the unhealthy tasks, those are the
    lost ones; else every task it names. This task itself and tasks outside the
    cluster's workers are left out.
    """
    if not _LOSS.search(message):
        return None
    named: list[str] = []
    lines = message.splitlines()
    marked = [i for i, line in enumerate(lines) if "unhealthy" in line.lower()]
    if marked:  # the list of unhealthy tasks, one a line (the task reporting it is not one)
        listed = lines[marked[0] + 1 :]
        lines = listed[: next((i for i, line in enumerate(listed) if not _TASK.search(line)), len(listed))]
    for line in lines:
        for job, index in _TASK.findall(line):
            task = f"{'chief' if job == 'master' else job}:{int(index)}"
            if task != own.task_id and (not own.workers or task in own.workers) and task not in named:
                named.append(task)
    others = [task for task in own.workers if task != own.task_id]
    if not named and len(others) == 1:  # a message that names no task (a reset seen first)
        named = others
    return tuple(named)
