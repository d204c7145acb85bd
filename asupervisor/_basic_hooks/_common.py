"""Helpers the stock hooks share: their timers and gates, reading a step's named results.

Per-step cost rules (the hooks run on the step thread around every step): the fire check
is an int compare (or one clock read for ``*_secs`` timers); nothing is allocated and no
tensor is read (no ``.numpy()``, no device sync) on steps where a hook does not fire.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._core._clock import Clock
from .._core._hooks import Gate
from ._timer import SecondOrStepTimer, check_every

if TYPE_CHECKING:
    pass

__all__ = ["_hook_timer", "_lookup", "_timer_gate", "_to_python"]


def _to_python(value: Any) -> Any:
    """A value for a log line: numbers and lists, read on the calling thread."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value


def _timer_gate(timer: SecondOrStepTimer) -> Gate:
    """The hook runner's gate of a hook that acts only when ``timer`` fires."""
    step, at = timer.due()
    return step, at, timer.clock


def _hook_timer(
    secs_name: str, secs: float | None, steps_name: str, steps: int | None, clock: Clock | None
) -> SecondOrStepTimer:
    """A hook's timer; a bad period is an error naming the hook's own argument."""
    if (secs is None) == (steps is None):
        raise ValueError(
            f"give exactly one of {steps_name} and {secs_name} (got {steps_name}={steps!r}, {secs_name}={secs!r})"
        )
    check_every(steps_name, steps, kind="steps")
    check_every(secs_name, secs, kind="secs")
    return SecondOrStepTimer(every_secs=secs, every_steps=steps, clock=clock)


def _lookup(results: Any, key: str, hook: str) -> Any:
    if not isinstance(results, Mapping):
        raise TypeError(
            f"{hook} reads {key!r} from the step's result, which must be a mapping of named "
            f"tensors (e.g. return {{{key!r}: ...}} from the step); got {type(results).__name__}"
        )
    try:
        return results[key]
    except KeyError:
        raise KeyError(f"{hook}: the step's result has no {key!r} (it has {sorted(map(str, results))})") from None
