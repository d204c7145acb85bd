"""A checkpoint's metrics: recorded in the checkpoint itself, read back for retention.

Each checkpoint the checkpointer snapshots carries the metrics of the state it holds
(``SessionContext.current_metrics()``: the last step's scalars such as ``loss``, an
epoch's ``val_loss`` at the step that epoch ended) as one more value of its tensor
bundle: the scalar string :data:`METRICS_KEY`, JSON of ``{name: float}``. It is
committed with the checkpoint's other bytes, so a restarted training, the remote tier
(which copies it into its commit marker) and ``asupervisor inspect`` all find it there,
and :class:`~._policies.KeepBest` can rank checkpoints of earlier runs.

Why a bundle key and not a ``tf.Variable`` on the state: a key outside the object graph
(as TF's own ``_CHECKPOINTABLE_OBJECT_GRAPH``) is never matched against the model by a
restore, so the restore stays the direct one of the fast store (a string variable would
send every restore to TF's), older checkpoints without it restore as before, and
``tf.train.Checkpoint.save`` of the same state (another directory, the application's
own) carries no stale value. Plain TensorFlow ignores it.

Recording never fails a save (a metric that cannot be read is logged at debug; the
checkpoint is then saved without metrics), and reading back never fails retention
(unreadable: no metrics). :func:`record` runs on the step thread, :func:`read` on the
writer or upload thread; never on the event loop.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..._logging import describe, get_logger
from ..._tf import tf

__all__ = ["METRICS_KEY", "Recorded", "clean", "decode", "encode", "read", "record"]

log = get_logger(__name__)

#: the tensor-bundle key of a checkpoint's metrics (a scalar string: JSON ``{name: float}``)
METRICS_KEY = "_ASV_METRICS"


def encode(metrics: Mapping[str, float]) -> bytes:
    """``metrics`` as the JSON bytes a checkpoint holds (names sorted)."""
    return json.dumps({str(k): float(v) for k, v in sorted(metrics.items())}).encode()


def decode(data: bytes | str) -> dict[str, float]:
    """The metrics of :func:`encode`'s bytes; ``ValueError``/``TypeError`` if they are not."""
    body: Any = json.loads(data)
    if not isinstance(body, dict):
        raise TypeError(f"metrics must be a JSON object, got {type(body).__name__}")
    return {str(k): float(v) for k, v in body.items()}


def clean(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The entries of ``metrics`` that are numbers (NaN kept: it is never best)."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            out[str(name)] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def record(source: Callable[[], Mapping[str, float]] | None, step: int) -> tuple[Any, dict[str, float]]:
    """On the step thread, before a snapshot: the value of :data:`METRICS_KEY` for the
    metrics ``source()`` gives now (a scalar string tensor), and those metrics.
    ``(None, {})`` when there is no source, no metric, or ``source`` fails (logged at
    debug: the checkpoint is saved without metrics)."""
    if source is None:
        return None, {}
    try:
        metrics = clean(source())
        if not metrics:
            return None, {}
        with tf().device("/cpu:0"):
            return tf().constant(encode(metrics)), metrics
    except Exception as exc:  # a metric that cannot be read: the save goes on without metrics
        log.debug("checkpoint.metrics_failed", step=step, error=describe(exc))
        return None, {}


def read(prefix: str) -> dict[str, float]:
    """The metrics recorded in the checkpoint ``prefix``; empty when it has none or
    cannot be read (logged at debug)."""
    try:
        reader = tf().train.load_checkpoint(prefix)
        if not reader.has_tensor(METRICS_KEY):
            return {}
        value = reader.get_tensor(METRICS_KEY)
        return decode(value if isinstance(value, (bytes, str)) else bytes(value))
    except Exception as exc:  # damaged, gone, another format: retention goes on without
        log.debug("checkpoint.metrics_unreadable", path=prefix, error=describe(exc))
        return {}


class Recorded(Mapping[str, float]):
    """The metrics of one checkpoint, read by ``load()`` when first looked at (once).

    What retention offers a policy for a checkpoint of an earlier run: a policy that
    never looks at :attr:`~._policies.CheckpointRecord.metrics` costs no read.
    """

    def __init__(self, load: Callable[[], dict[str, float]]) -> None:
        self._load: Callable[[], dict[str, float]] | None = load
        self._value: dict[str, float] = {}
        self._lock = threading.Lock()

    def _get(self) -> dict[str, float]:
        with self._lock:
            if self._load is not None:
                load, self._load = self._load, None
                self._value = load()
            return self._value

    def __getitem__(self, name: str) -> float:
        return self._get()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return repr(self._get())
