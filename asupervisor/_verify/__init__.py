"""``asupervisor verify-resume``: a user's script killed at random moments and resumed,
its final state compared bitwise with an uninterrupted run (``docs/cli.md``)."""

from __future__ import annotations

from ._tool import run

__all__ = ["run"]
