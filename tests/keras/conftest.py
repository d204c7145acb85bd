"""The Keras front door's tests run on asyncio; the one marked ``both_backends`` runs on
trio too. ``sess.fit`` is ``run_loop`` with Keras's steps on the step thread: what it does
on the event loop is the engine's, which the core tests run on both backends."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
