"""The suite's TensorFlow processes share a GPU: each takes device memory as it needs it
(``TF_FORCE_GPU_ALLOW_GROWTH``, set by ``conftest.py`` before TensorFlow is imported and
inherited by every process the suite starts), so a second process on the GPU finds room."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import tensorflow as tf
from _timing import scaled

GPUS = tf.config.list_physical_devices("GPU")

#: a child that makes a tensor on the first GPU and says where it lives
CHILD = "import tensorflow as tf\nwith tf.device('/gpu:0'):\n    x = tf.ones([1 << 20])\nprint(x.device)\n"


def test_memory_growth_is_on_for_the_suite_and_its_children() -> None:
    """This process, and the children it starts (they inherit its environment), take GPU
    memory as they need it."""
    given = os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")
    assert given == "true", f"TF_FORCE_GPU_ALLOW_GROWTH={given!r}: the suite's processes would not share a GPU"


@pytest.mark.skipif(not GPUS, reason="needs a GPU visible to TensorFlow (this machine has none)")
def test_a_child_process_finds_room_on_the_gpu_this_process_holds() -> None:
    """With a tensor of this process on the GPU, a child TensorFlow process makes one there
    too: without memory growth the first process holds nearly all the GPU's memory and the
    second fails to start its device."""
    with tf.device("/gpu:0"):
        held = tf.ones([1 << 20])
    assert "GPU" in held.device.upper()
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GPU:0" in done.stdout.upper(), done.stdout
