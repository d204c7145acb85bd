"""Three environment variables that re-aim a training without editing its script, read
once when a ``Supervisor`` (or ``MonitoredTrainingSession``) is made. They are what
``asupervisor verify-resume`` sets for each run of a user's script (``docs/cli.md``); a
scheduler may set them too.

* ``ASUPERVISOR_LOGDIR`` — the log directory, in place of the one the script gives.
* ``ASUPERVISOR_MAX_STEPS`` — stop (a clean, completed stop, final checkpoint taken) once
  the global step reaches this, whatever loop the script runs (a ``StopAtStepHook``).
* ``ASUPERVISOR_SAVE_STEPS`` — a checkpoint every this many steps as well as the
  script's own cadence.

Unset or empty: nothing changes. A value that is not a whole number >= 1 is a
``ValueError`` naming the variable and the value. This module never imports TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ._basic_hooks._stop import StopAtStepHook
from ._checkpoint.policy._policies import AnySavePolicy, EverySteps
from ._core._hooks import SessionRunHook

__all__ = ["LOGDIR_ENV", "MAX_STEPS_ENV", "SAVE_STEPS_ENV", "logdir", "save_settings", "stop_hooks"]

LOGDIR_ENV = "ASUPERVISOR_LOGDIR"
MAX_STEPS_ENV = "ASUPERVISOR_MAX_STEPS"
SAVE_STEPS_ENV = "ASUPERVISOR_SAVE_STEPS"


def _count(name: str, environ: Mapping[str, str]) -> int | None:
    """The whole number >= 1 in ``environ[name]``, or ``None`` when unset or empty."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"the environment variable {name} must be a whole number >= 1, got {raw!r}")
    return value


def logdir(given: Any, environ: Mapping[str, str] | None = None) -> Any:
    """``ASUPERVISOR_LOGDIR`` when set, else ``given``."""
    return (os.environ if environ is None else environ).get(LOGDIR_ENV) or given


def stop_hooks(environ: Mapping[str, str] | None = None) -> list[SessionRunHook]:
    """A ``StopAtStepHook`` at ``ASUPERVISOR_MAX_STEPS`` when set, else nothing."""
    last = _count(MAX_STEPS_ENV, os.environ if environ is None else environ)
    return [] if last is None else [StopAtStepHook(last_step=last)]


def save_settings(settings: dict[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The supervisor's flat settings with ``ASUPERVISOR_SAVE_STEPS`` folded in: added to
    a ``save_policy`` the script gave, else as ``save_model_steps``."""
    every = _count(SAVE_STEPS_ENV, os.environ if environ is None else environ)
    if every is None:
        return settings
    if settings.get("save_policy") is not None:
        return {**settings, "save_policy": AnySavePolicy(settings["save_policy"], EverySteps(every))}
    return {**settings, "save_model_steps": every}
