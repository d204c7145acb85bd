"""A ``tf.data`` iterator's place in checkpoints: can it be saved, and what does it cost.

``run_loop(fn, data=dataset, checkpoint_iterator=...)`` puts the dataset's iterator into
the checkpoint so that a resumed run goes on with the next batch. Two things can go wrong
with that, and both are found here:

* **TensorFlow cannot serialise the pipeline.** ``Dataset.from_generator``,
  ``py_function``/``numpy_function`` and other stateful ops (``tf.random.uniform`` in a
  ``map``, a captured variable) hold state outside the graph; TF's ``SerializeIterator``
  refuses them (``FailedPreconditionError: PyFunc is stateful``). Left in the checkpoint,
  such an iterator would fail the first periodic save, minutes or hours in.
  :func:`serialisation_problem` serialises a *new* iterator once, before the first step
  (cheap then: no buffer is filled yet), with the policy every checkpoint will use, and
  returns TF's reason.
* **The iterator's state is large.** A shuffle buffer is saved element by element: a
  360 KB model with ``.shuffle(10_000)`` over 32x32x3 images writes ~74 MB checkpoints.
  :func:`iterator_share` reads a written checkpoint's index (no data) and tells how many
  of its bytes the iterator holds, which the checkpointer logs once per session.

Runs on the step thread (:func:`serialisation_problem`) or the checkpoint writer thread
(:func:`iterator_share`), never on the event loop. Never imports TensorFlow at import.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ... import _tf_internals as internals
from ..._exceptions import CheckpointError
from ..._tf import tf

__all__ = [
    "ITERATOR_ATTR",
    "PIPELINE_ATTR",
    "describe_pipeline",
    "iterator_share",
    "pipeline_changed_error",
    "restore_mismatch_error",
    "serialisation_problem",
    "untrackable_error",
]

#: the checkpoint attribute holding ``run_loop``'s iterator (``<attr>/.ATTRIBUTES/ITERATOR_STATE``)
ITERATOR_ATTR = "asv_data_iterator"

#: the checkpoint attribute holding the description of the pipeline that iterator belongs
#: to (:func:`describe_pipeline`, a string variable)
PIPELINE_ATTR = "asv_data_pipeline"

#: an iterator's share of a checkpoint's bytes above which ``checkpoint.iterator_state``
#: is a warning rather than information (when it is also at least ``DOMINANT_BYTES``:
#: a small model's checkpoint is mostly a small iterator's few hundred bytes)
DOMINANT_SHARE = 0.5
DOMINANT_BYTES = 1 << 20


def serialisation_problem(iterator: Any) -> str | None:
    """Why TensorFlow cannot checkpoint ``iterator``'s position, or ``None`` if it can.

    Serialises it the way every checkpoint will (``OwnedIterator._serialize_to_tensors``:
    the dataset's ``experimental_external_state_policy`` when set, else ``FAIL``). Call it
    on a new iterator: its buffers are empty, so this costs little.
    """
    tf_ = tf()
    serialize = internals.serialize_iterator(iterator)
    if serialize is None:
        if not internals.is_trackable(iterator):
            return f"a {type(iterator).__name__} has no checkpointable state"
        serialize = functools.partial(internals.serialize_iterator_public, iterator)  # public, slower
    try:
        serialize()
    except (tf_.errors.OpError, ValueError, TypeError) as exc:
        return _reason(exc)
    return None


def _reason(exc: BaseException) -> str:
    """TF's message without its ``{{function_node ...}}`` prefix and ``[Op:...]`` suffix."""
    text = str(getattr(exc, "message", None) or exc).strip()
    if text.startswith("{{") and "}}" in text:
        text = text[text.index("}}") + 2 :].strip()
    text = text.split(" [Op:", 1)[0].strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:500]


def untrackable_error(reason: str) -> CheckpointError:
    """The error of ``checkpoint_iterator=True`` when the position cannot be saved."""
    return CheckpointError(
        f"checkpoint_iterator=True, but the data iterator's position cannot be checkpointed ({reason}); "
        "make the pipeline serialisable (tf.data ops only, stateless random ops), set "
        "tf.data.Options().experimental_external_state_policy to IGNORE or WARN, or pass "
        "checkpoint_iterator=None (leave it out, logged) or False (a resumed run restarts the data)"
    )


def describe_pipeline(dataset: Any) -> str:
    """The shape of a ``tf.data`` pipeline, source first: each stage's kind, a batch's
    size, what each stage yields, and how many elements the whole yields, e.g.
    ``TensorSlice -> int32[] | Shuffle | Map -> float32[] | Batch(32) -> float32[?] | 13``.

    What a saved iterator position depends on and TF's restore does not check: another
    batch size, a transformation added or removed, a source of another length or kind.
    """
    stages: list[str] = []
    node: Any = dataset
    while node is not None:
        kind = type(node).__name__.strip("_").removesuffix("Dataset").removesuffix("V2") or type(node).__name__
        batch = internals.dataset_batch_size(node)
        if batch is not None:
            try:
                kind += f"({int(batch)})"
            except (TypeError, ValueError):
                pass
        try:
            spec = _spec_text(node.element_spec)
        except Exception:  # a stage without a spec of its own
            spec = "?"
        stages.append(f"{kind} -> {spec}")
        try:
            inputs = internals.dataset_inputs(node) or []
        except Exception:
            inputs = []
        node = inputs[0] if len(inputs) == 1 else None
    try:
        size = str(int(dataset.cardinality()))
    except Exception:
        size = "?"
    return " | ".join([*reversed(stages), f"{size} elements"])


def _spec_text(spec: Any) -> str:
    if isinstance(spec, dict):
        return "{" + ", ".join(f"{k}: {_spec_text(v)}" for k, v in sorted(spec.items())) + "}"
    if isinstance(spec, (tuple, list)):
        return "(" + ", ".join(_spec_text(s) for s in spec) + ")"
    shape = getattr(spec, "shape", None)
    dtype = getattr(spec, "dtype", None)
    if shape is None or dtype is None:
        return type(spec).__name__
    dims = "" if shape.rank is None else ",".join("?" if d is None else str(d) for d in shape.as_list())
    return f"{dtype.name}[{dims}]"


def pipeline_changed_error(saved: str, now: str, path: str | None) -> CheckpointError:
    """The error when the pipeline given now is not the one whose position was saved."""
    where = f" {path}" if path else " the restored checkpoint"
    return CheckpointError(
        f"the data pipeline changed since checkpoint{where} was written: it was {saved}; it is {now}. "
        "Its saved position would be restored into another pipeline. Pass checkpoint_iterator=False "
        "(to run_loop or fit) to resume the model with the data from its start, use the "
        "pipeline that wrote the checkpoint, or train into a new logdir"
    )


def restore_mismatch_error(exc: BaseException, path: str | None) -> CheckpointError:
    """The error when the restored checkpoint's iterator position does not fit the
    pipeline given now (its definition changed since the checkpoint was written)."""
    where = f" in {path}" if path else ""
    return CheckpointError(
        f"the data iterator's position{where} cannot be restored into this pipeline ({_reason(exc)}); "
        "the dataset's definition changed since that checkpoint was written. Pass "
        "checkpoint_iterator=False (to run_loop or fit) to resume the model with the data from its start "
        "(later checkpoints then hold no iterator), or use the pipeline that wrote the checkpoint"
    )


# -- reading a checkpoint's index ------------------------------------------------------


# The index reader is the fast store's (``store/fast/_index.py``), handed in by the store
# as it loads (use_index_reader); this module imports nothing of the store.
# ``load_index_reader`` (set by the store's door) loads it on first use.
_read_index: Callable[[str], tuple[Any, dict[str, Any]]] | None = None
load_index_reader: Callable[[], None] | None = None


def use_index_reader(read: Callable[[str], tuple[Any, dict[str, Any]]]) -> None:
    """The store's reader of a checkpoint's ``.index`` (the fast store, as it loads)."""
    global _read_index
    _read_index = read


def index_entries(prefix: str) -> dict[str, Any]:
    """``{checkpoint key: BundleEntryProto}`` read from ``<prefix>.index`` (the fast store's
    reader: TF's reader is not used, and neither is this project's writer).

    Raises:
        ImportError: the fast store's code, which holds the index reader, is not there.
    """
    if _read_index is None and load_index_reader is not None:
        load_index_reader()
    if _read_index is None:
        raise ImportError("reading a checkpoint's index needs the fast store's code")
    return _read_index(prefix)[1]


def entry_sizes(prefix: str) -> dict[str, int]:
    """``{checkpoint key: bytes in the data files}`` read from ``<prefix>.index``."""
    return {key: int(entry.size) for key, entry in index_entries(prefix).items()}


def iterator_share(prefix: str) -> tuple[int, int] | None:
    """``(iterator bytes, all bytes)`` of the checkpoint at ``prefix``; ``None`` if it
    holds no ``run_loop`` iterator (or the index reader is not there)."""
    try:
        sizes = entry_sizes(prefix)
    except ImportError:  # the fast store's code is not installed: the share is not measured
        return None
    mine = [n for key, n in sizes.items() if key.startswith(f"{ITERATOR_ATTR}/")]
    if not mine:
        return None
    return sum(mine), sum(sizes.values())
