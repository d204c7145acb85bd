"""Comparing the final checkpoints of two runs of a script, value by value, bitwise, and
naming the likely cause of a difference.

Every saved value is read with TensorFlow's own ops (``RestoreV2``, then
``serialize_tensor``, so a ``tf.data`` iterator's state compares as bytes too) and
compared as bytes. Left out: what differs between runs by design — ``save_counter`` (how
many saves a run made), the object graph (its keys are compared instead) and the last
step's metrics (``_ASV_METRICS``: a step may return timings). Differences are reported
in a fixed order of kinds: the step, the model's weights, optimizer slots, RNG state, the
data iterator, then anything else. Runs on the tool's thread; never on an event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _tf

__all__ = ["Difference", "compare", "has_iterator", "likely_cause", "only_iterator_bytes"]

#: values that differ between runs by design
_SKIPPED = ("save_counter/", "_CHECKPOINTABLE_OBJECT_GRAPH", "_ASV_METRICS")

KINDS = ("step", "weights", "optimizer", "rng", "iterator", "other")


def kind_of(key: str) -> str:
    """Which kind of state the checkpoint key ``key`` holds (one of :data:`KINDS`)."""
    lower = key.lower()
    if "iterator" in lower or lower.startswith("asv_data") or "asv_epoch" in lower:
        return "iterator"
    if (
        lower.startswith("global_step/")
        or "/_iterations/" in lower
        or lower.endswith("/iterations/.attributes/variable_value")
    ):
        return "step"
    if "_state_var" in lower or "rng" in lower or "generator" in lower or "random" in lower:
        return "rng"
    if ".optimizer_slot" in lower or ("optimizer" in lower and "_trainable_variables" not in lower):
        return "optimizer"
    if "variable_value" in lower:
        return "weights"
    return "other"


@dataclass(frozen=True)
class Difference:
    """The first value two checkpoints hold differently: its key and kind, and what
    differs (``"value"``, or ``"only in the reference"`` / ``"only in the resumed run"``)."""

    key: str
    kind: str
    what: str = "value"


def _values(prefix: str) -> dict[str, bytes]:
    """Every compared value of the checkpoint ``prefix``, as bytes, by key."""
    tf = _tf.tf()
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    out: dict[str, bytes] = {}
    for key in sorted(dtypes):
        if key.startswith(_SKIPPED):
            continue
        tensor = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[key], shape_and_slices=[""], dtypes=[dtypes[key]])[0]
        out[key] = tf.io.serialize_tensor(tensor).numpy()
    return out


def has_iterator(prefix: str) -> bool:
    """Whether the checkpoint ``prefix`` holds a data iterator's position."""
    tf = _tf.tf()
    return any(kind_of(key) == "iterator" for key, _ in tf.train.list_variables(prefix))


def _order(key: str) -> tuple[int, str]:
    return KINDS.index(kind_of(key)), key


def compare(reference: str, resumed: str) -> list[Difference]:
    """Every difference between the checkpoints ``reference`` and ``resumed`` (prefixes),
    first the first in the order of :data:`KINDS`; empty when they hold the same state."""
    a, b = _values(reference), _values(resumed)
    found = [Difference(k, kind_of(k), "value") for k in a.keys() & b.keys() if a[k] != b[k]]
    found += [Difference(k, kind_of(k), "only in the reference") for k in a.keys() - b.keys()]
    found += [Difference(k, kind_of(k), "only in the resumed run") for k in b.keys() - a.keys()]
    return sorted(found, key=lambda d: _order(d.key))


def only_iterator_bytes(differences: list[Difference]) -> bool:
    """Whether ``differences`` are only ``tf.data`` iterators' serialized states (their
    values, not their keys; the epoch count and the pipeline's description not among them)."""
    return bool(differences) and all(d.what == "value" and "iterator_state" in d.key.lower() for d in differences)


def likely_cause(differences: list[Difference], *, iterator_saved: bool, deterministic: bool | None) -> str:
    """What most likely made a resumed run end in another state than the reference.

    Args:
        differences: what :func:`compare` found (not empty).
        iterator_saved: whether the reference's checkpoint holds a data iterator.
        deterministic: whether a second uninterrupted run matched the reference
            (``None``: not known).
    """
    if deterministic is False:
        return (
            "two uninterrupted runs differ too: the script is not deterministic (an unseeded "
            "initialiser, shuffle or random op; non-deterministic kernels: see "
            "tf.config.experimental.enable_op_determinism and keras.utils.set_random_seed)"
        )
    kinds = {d.kind for d in differences}
    first = differences[0]
    if first.what != "value":
        return f"the state's structure changes on resume: {first.key} is {first.what}"
    if "step" in kinds and first.kind == "step" and kinds <= {"step"}:
        return "the final step differs: the script's end depends on something the checkpoint does not hold"
    if kinds & {"weights", "optimizer", "step"} and not iterator_saved:
        return (
            "the data iterator is not checkpointed (an untracked iterator or a generator outside "
            "the state): a resumed run reads other batches"
        )
    if kinds == {"rng"}:
        return "only the RNG state differs: a tf.random.Generator drawn from outside the steps, or not in the state"
    if kinds == {"iterator"}:
        return "only the data position differs: the pipeline is rebuilt or advanced differently on resume"
    if "iterator" in kinds:
        return "the data position differs: the iterator is advanced outside the steps, or rebuilt on resume"
    if "rng" in kinds:
        return "the RNG state differs: a random generator outside the state feeds the steps"
    return (
        "the data position and RNG state match: a generator or counter outside the state (Python "
        "or NumPy random, a closure's counter, a file read) feeds the steps"
    )
