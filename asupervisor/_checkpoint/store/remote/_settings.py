"""The remote tier's two settings, from the environment: how long a lease lasts without
renewal (``ASUPERVISOR_LEASE_SECS``, 60 s) and the bound on every wait for the remote
(``ASUPERVISOR_REMOTE_TIMEOUT_SECS``, 60 s). Read when a tier is made; a value that is not
a positive number of seconds is a ``ValueError`` naming the variable and the value.
"""

from __future__ import annotations

import os

__all__ = ["DEFAULT_LEASE_SECS", "DEFAULT_TIMEOUT_SECS", "lease_secs", "timeout_secs"]

#: seconds a lease lasts without renewal (``ASUPERVISOR_LEASE_SECS`` overrides it)
DEFAULT_LEASE_SECS = 60.0
#: the default bound on a remote wait (``ASUPERVISOR_REMOTE_TIMEOUT_SECS`` overrides it)
DEFAULT_TIMEOUT_SECS = 60.0


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {raw!r}")
    return value


def lease_secs() -> float:
    """How long a lease lasts without renewal: ``ASUPERVISOR_LEASE_SECS``, else 60 s."""
    return _seconds("ASUPERVISOR_LEASE_SECS", DEFAULT_LEASE_SECS)


def timeout_secs() -> float:
    """The bound on remote waits: ``ASUPERVISOR_REMOTE_TIMEOUT_SECS``, else 60 s."""
    return _seconds("ASUPERVISOR_REMOTE_TIMEOUT_SECS", DEFAULT_TIMEOUT_SECS)
