"""``FinalOpsHook``: evaluate values once, at a clean end."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._core._hooks import SessionRunHook

if TYPE_CHECKING:
    from .._core._session import Session

__all__ = ["FinalOpsHook"]


class FinalOpsHook(SessionRunHook):
    """Evaluates ``fn()`` at the end of a clean session; keeps the values.

    Args:
        fn: called with no arguments on the step thread in ``end``; tensors in what it
            returns are converted to NumPy values. A (nested) structure of tensors or
            variables is accepted instead of a function and read the same way.
    """

    def __init__(self, fn: Callable[[], Any] | Any) -> None:
        self._fn = fn
        self._values: Any = None

    @property
    def final_ops_values(self) -> Any:
        """What ``fn`` returned at the end (``None`` before it ran)."""
        return self._values

    def end(self, session: Session) -> None:
        """Evaluate and keep the final values."""
        from .._tf import tf

        result = self._fn() if callable(self._fn) else self._fn
        self._values = tf().nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, result)
