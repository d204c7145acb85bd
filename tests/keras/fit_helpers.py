"""What the ``sess.fit`` tests share: a supervisor over a Keras model, quiet by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras

import asupervisor as asv


def supervisor(logdir: Path, model: keras.Model, **kwargs: Any) -> asv.Supervisor:
    """A supervisor whose state is ``model``: no timed checkpoints or summaries unless
    ``kwargs`` ask for them, signals left to the test."""
    kwargs.setdefault("save_model_secs", 0)
    kwargs.setdefault("save_summaries_secs", 0)
    return asv.Supervisor(logdir, state={"model": model}, handle_signals=False, **kwargs)
