"""Lazy access to TensorFlow: importing asupervisor must not import it.

Functions here import TensorFlow on first use (a session start), or only look at it if
the application already imported it. Nothing else in the package imports TensorFlow at
module level.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from ._exceptions import EndOfData

__all__ = ["is_end_of_data", "is_recoverable", "is_tf_error", "is_tf_iterator", "tf"]


def tf() -> ModuleType:
    """The ``tensorflow`` module, imported on first call."""
    module = sys.modules.get("tensorflow")
    if module is None:
        import tensorflow

        module = tensorflow
    return module


def _tf_errors() -> Any:
    module = sys.modules.get("tensorflow")
    return None if module is None else module.errors


def is_end_of_data(exc: BaseException) -> bool:
    """``StopIteration`` or ``tf.errors.OutOfRangeError``: the data ran out (a clean stop)."""
    if isinstance(exc, (StopIteration, EndOfData)):
        return True
    errors = _tf_errors()
    return errors is not None and isinstance(exc, errors.OutOfRangeError)


def is_tf_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a TensorFlow runtime error (``tf.errors.OpError``)."""
    errors = _tf_errors()
    return errors is not None and isinstance(exc, errors.OpError)


def is_recoverable(exc: BaseException) -> bool:
    """``tf.errors.AbortedError`` or ``UnavailableError``: restore and retry may help."""
    errors = _tf_errors()
    return errors is not None and isinstance(exc, (errors.AbortedError, errors.UnavailableError))


def is_tf_iterator(obj: Any) -> bool:
    """Whether ``obj`` is a ``tf.data`` iterator (``iter(dataset)``)."""
    module = sys.modules.get("tensorflow")
    return module is not None and isinstance(obj, module.data.Iterator)
