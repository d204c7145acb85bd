"""Helpers shared by the benchmarks: medians, ratios, a machine line, the two test steps."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def machine() -> str:
    """One line describing where the figures come from."""
    import tensorflow as tf

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, TensorFlow {tf.__version__}"


def median(xs: list[float]) -> float:
    """The median."""
    return statistics.median(xs)


def tiny_step() -> tuple[Callable[[], Any], Any]:
    """A ``tf.function`` doing one scalar ``assign_add``, and its variable."""
    import tensorflow as tf

    v = tf.Variable(0.0)

    @tf.function
    def step() -> Any:
        v.assign_add(1.0)

    return step, v


def mlp_step(
    batch: int = 64, hidden: tuple[int, ...] = (256, 256), optimizer: Any = None
) -> tuple[Callable[[], Any], Any]:
    """A ``tf.function`` training an MLP (784, ``hidden``, 10) on one fixed batch, and its
    state; SGD(0.01) unless ``optimizer`` is given."""
    import tensorflow as tf

    tf.random.set_seed(0)
    model = tf.keras.Sequential(
        [tf.keras.Input((784,))]
        + [tf.keras.layers.Dense(width, activation="relu") for width in hidden]
        + [tf.keras.layers.Dense(10)]
    )
    opt = optimizer if optimizer is not None else tf.keras.optimizers.SGD(0.01)
    x = tf.random.normal((batch, 784))
    y = tf.random.uniform((batch,), maxval=10, dtype=tf.int32)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step() -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss}

    return step, {"model": model, "optimizer": opt}
