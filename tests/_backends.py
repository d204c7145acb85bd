"""Both anyio backends over a parametrized test's cases, each case once: :func:`in_turn`.

A test whose cases differ in what the training does (a step count, a planted NaN), not
in how the event loop runs it, gains nothing from running every case on both backends:
the cases take the backends in turn, so both run and each case runs once. A test whose
subject is the loop (signals, cancellation, services) keeps the full product.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

BACKENDS = ("asyncio", "trio")


def in_turn(cases: Sequence[Any], ids: Sequence[str] | None = None) -> list[Any]:
    """``pytest.param(backend, *case)`` for each case, the backends taken in turn; for
    ``@pytest.mark.parametrize(("anyio_backend", ...), in_turn(...))`` (a case that is not
    a tuple is one argument)."""
    params = []
    for i, case in enumerate(cases):
        backend = BACKENDS[i % len(BACKENDS)]
        args = case if isinstance(case, tuple) else (case,)
        params.append(pytest.param(backend, *args, id=f"{backend}-{ids[i] if ids else case}"))
    return params
