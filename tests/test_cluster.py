"""``lost_peers``: which task a TensorFlow error of a multi-worker step says is gone,
read off the messages TensorFlow 2 gives when a peer is SIGKILLed (as seen on the chief
and on the worker in tests/checkpoint/test_multi_worker.py)."""

from __future__ import annotations

import pytest

from asupervisor._cluster import ClusterInfo, lost_peers

CHIEF = ClusterInfo(
    task_type="chief", task_index=0, num_workers=3, is_chief=True, workers=("chief:0", "worker:0", "worker:1")
)
PAIR = ClusterInfo(task_type="chief", task_index=0, num_workers=2, is_chief=True, workers=("chief:0", "worker:0"))
WORKER = ClusterInfo(task_type="worker", task_index=0, num_workers=3, is_chief=False, workers=CHIEF.workers)

HEARTBEATS = (
    "Collective ops is aborted by: Error reported from /job:worker/task:0: The following tasks are unhealthy "
    "(stopped sending heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have crashed. Check the task logs.\n"
    "The error could be from a previous operation. Restart your program to reset. [[{{node CollectiveReduceV2}}]]"
)
RESET = (
    "{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/task:0/device:CPU:0}} Collective ops "
    "is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error information from remote target "
    "/job:chief/replica:0/task:0"
)


@pytest.mark.parametrize(
    ("message", "own", "expected"),
    [
        (HEARTBEATS, CHIEF, ("worker:1",)),  # the unhealthy one, not the task that reported it
        (RESET, WORKER, ("chief:0",)),  # this task's own name is never a lost peer
        ("Collective ops is aborted by: something", CHIEF, ()),  # lost, but no task named
        ("Failed to connect to all addresses", CHIEF, ()),
        ("Graph execution error: Incompatible shapes: [2] vs. [3]", CHIEF, None),  # not about a peer
        ("heartbeat timeout of /job:ps/replica:0/task:0", CHIEF, ()),  # not a training worker
        # a cluster of two: the other task, whether or not the message names it (a busy
        # machine's survivor saw "Collective ops is aborted by: ..." without a task)
        ("Collective ops is aborted by: something", PAIR, ("worker:0",)),
        ("heartbeat timeout of /job:ps/replica:0/task:0", PAIR, ("worker:0",)),
    ],
)
def test_the_lost_task_is_read_off_the_message(
    message: str, own: ClusterInfo, expected: tuple[str, ...] | None
) -> None:
    assert lost_peers(message, own) == expected
