"""What a step returned: the scalar entries of its output, as references (no device sync).

Read by the summary service (each tick) and the stock hooks. Never imports TensorFlow at
import time; :func:`scalar_entries` reads no device value (tensors are kept as
references and read later on the thread that writes them); :func:`float_entries` is that
later read, one host read per entry.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from .._tf import tf

__all__ = ["float_entries", "is_variable", "scalar_entries"]


def is_variable(value: Any) -> bool:
    """Whether ``value`` is a ``tf.Variable``."""
    tf_ = tf()
    return isinstance(value, tf_.Variable)


def scalar_entries(output: Any) -> dict[str, Any]:
    """The scalar entries of a step's output mapping, as references (no device sync).

    Call on the step thread: variables among the values are read (``read_value()``, an
    op, not a sync) so that no other thread ever reads a variable. Non-scalar and
    non-numeric values are left out; a non-mapping output gives ``{}``.
    """
    if not isinstance(output, Mapping):
        return {}
    scalars: dict[str, Any] = {}
    for name, value in output.items():
        if isinstance(value, bool) or not isinstance(name, str):
            continue
        if isinstance(value, numbers.Real):
            scalars[name] = value
            continue
        shape = getattr(value, "shape", None)
        dtype = getattr(value, "dtype", None)
        if shape is None or dtype is None or len(shape) != 0:
            continue
        if not (getattr(dtype, "is_floating", False) or getattr(dtype, "is_integer", False)):
            kind = getattr(dtype, "kind", None)  # numpy
            if kind not in ("f", "i", "u"):
                continue
        scalars[name] = value.read_value() if is_variable(value) else value
    return scalars


def float_entries(values: Mapping[str, Any]) -> dict[str, float]:
    """The entries of ``values`` that convert to ``float`` (one host read each), by name
    as a string; the others are left out. For ``status().metrics``, a checkpoint's
    metrics and Keras's epoch logs."""
    out: dict[str, float] = {}
    for name, value in values.items():
        try:
            out[str(name)] = float(value)
        except (TypeError, ValueError):
            continue
    return out
