"""Restoring checkpoints: the newest good one, with fallback, checked against the model.

:func:`restore_latest` (also used by ``SessionManager``) tries the newest
checkpoint named in the state file first and falls back to older ones, then to the
complete checkpoints on disk, when one is missing files or fails to load with a data
error (``checkpoint.corrupt`` is logged with the reason). A damaged state file (garbled,
binary, empty, dangling, missing) is not trusted: the checkpoints on disk are tried
newest first and the writer repairs the file. Every value is read and checksummed before
the restore returns, including those TF defers to their objects' creation (optimizer
slots). Checkpoint files of which none loads are a :class:`~asupervisor.CheckpointError`
listing each; transient errors (``AbortedError``, ``UnavailableError``) and other
non-data errors propagate as themselves, for the caller to retry or report, and never
mark a checkpoint corrupt. A checkpoint of a different model (a variable missing or of
another shape or dtype) is a :class:`~asupervisor.CheckpointError` naming the variables,
raised before anything is restored. A checkpoint of plain variables that all exist is read
straight into them (:mod:`._direct_restore`: the files read while the model is checked,
each value's checksum verified before any variable changes); anything else goes through
TF's ``Checkpoint.restore``. This module never runs on the event loop thread.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from .... import _tf_internals as internals
from ...._core._epochs import EPOCH_ATTR, KERAS_ATTR
from ...._exceptions import CheckpointError
from ...._logging import describe, get_logger
from ...._tf import tf
from ...snapshot import _graph
from ...snapshot._iterator_state import ITERATOR_ATTR, PIPELINE_ATTR
from .. import _candidates, _names
from .._types import DirectReader, RestoreOutcome

__all__ = ["RestoreOutcome", "check_matches", "restore_latest", "restore_newest", "restore_path"]

log = get_logger(__name__)


#: keys a checkpoint may lack without being "another model"
_OPTIONAL_KEYS = ("save_counter/.ATTRIBUTES/VARIABLE_VALUE", "global_step/.ATTRIBUTES/VARIABLE_VALUE")


def _object_graph(reader: Any) -> Any:
    """The checkpoint's object graph (how its objects connect, and their keys)."""
    graph = internals.proto_module(internals.OBJECT_GRAPH_PB2).TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return graph


def _surely_matches(checkpoint: Any, matched: dict[int, str], with_values: set[int], shapes: Any, dtypes: Any) -> bool:
    """True if every object of the state with values has them in the checkpoint, each
    variable with its shape and dtype. Cheap: TF's walk of the object graph, no value read.

    ``False`` only means "not sure": :func:`check_matches` then compares key by key, as
    TF's own save would name them (a walk that reads every variable, ~10x the cost).
    """
    variable = tf().Variable
    for obj in _graph.live_objects(checkpoint):
        if id(obj) not in with_values:
            if internals.holds_own_values(obj) is not False:  # None: not known, compare key by key
                return False  # values of its own that the checkpoint lacks (or keeps elsewhere)
            continue  # holds no value of its own (a container, a model, ...)
        key = matched.get(id(obj))
        if key is None:
            if isinstance(obj, variable):
                return False
            continue  # another kind of saveable (an iterator, ...) that the checkpoint has
        if key not in shapes:
            return False
        shape = getattr(obj, "shape", None)
        dtype = getattr(obj, "dtype", None)
        if shape is None or dtype is None or not shape.is_fully_defined() or list(shape) != list(shapes[key]):
            return False
        if dtypes[key] != getattr(dtype, "base_dtype", dtype):
            return False
    return True


def check_matches(
    checkpoint: Any,
    path: str,
    *,
    allow_missing: tuple[str, ...] = (),
    reader: Any = None,
    match: _graph.SavedGraphMatch | None = None,
    index: tuple[dict[str, list[int]], dict[str, Any]] | None = None,
) -> None:
    """Raise :class:`CheckpointError` if ``path`` holds another model than ``checkpoint``.

    Compares the index and object graph of ``path`` (no data read) with the variables the
    state holds now: a variable the checkpoint lacks, or has with another shape or dtype,
    is named. Checkpoint values the state has no object for yet are allowed (objects
    created later, such as optimizer slots, are restored when they are created).
    ``reader``: the checkpoint's ``tf.train.load_checkpoint`` reader, if already open;
    ``match``: its object graph matched to the live one and ``index``: ``(shapes,
    dtypes)`` by key, if already read (then no reader is opened).
    """
    if index is not None and match is not None:
        shapes, dtypes = index
    else:
        if reader is None:
            reader = tf().train.load_checkpoint(path)
        shapes = reader.get_variable_to_shape_map()
        dtypes = reader.get_variable_to_dtype_map()
    if match is None:
        match = _graph.SavedGraphMatch(checkpoint, _object_graph(reader))
    matched, with_values = match.keys()
    if _surely_matches(checkpoint, matched, with_values, shapes, dtypes):
        return
    serialized, _ = _graph.serialized(checkpoint)
    missing, wrong = [], []
    for obj, tensor_dict in serialized.items():
        if obj is None:
            continue
        obj = internals.unwrap_converted(obj)  # a tf.distribute variable
        live_keys = [k for k in tensor_dict if k.endswith("/.ATTRIBUTES/VARIABLE_VALUE")]
        if not live_keys:
            continue
        live_key = live_keys[0]
        name = str(getattr(obj, "name", None) or type(obj).__name__)
        key = matched.get(id(obj))
        if key is None or key not in shapes:
            if live_key not in _OPTIONAL_KEYS and not any(live_key.startswith(p) for p in allow_missing):
                missing.append(f"{live_key} ({name})")
            continue
        shape = getattr(obj, "shape", None)
        dtype = getattr(obj, "dtype", None)
        if shape is not None and shape.is_fully_defined() and list(shape) != list(shapes[key]):
            wrong.append(f"{live_key} ({name}): checkpoint shape {list(shapes[key])}, model shape {list(shape)}")
        elif dtype is not None and dtypes[key] != getattr(dtype, "base_dtype", dtype):
            wrong.append(f"{live_key} ({name}): checkpoint dtype {dtypes[key].name}, model dtype {dtype.name}")
    missing.sort()
    wrong.sort()
    if missing or wrong:
        parts = []
        if missing:
            parts.append(f"missing from the checkpoint: {', '.join(missing)}")
        if wrong:
            parts.append(f"different in the checkpoint: {'; '.join(wrong)}")
        raise CheckpointError(
            f"checkpoint {path} was written by a different model ({' | '.join(parts)}); "
            "point logdir at this model's checkpoints or start from an empty directory"
        )


def _deferred_keys(status: Any) -> list[str]:
    """The checkpoint keys a restore left for later: values of checkpoint objects that
    matched no live object yet (a Keras optimizer's slots before its first apply, a
    ``tf.data`` iterator not created yet). TF restores them when those objects appear."""
    found = internals.restore_coordinator(status)
    if found is None:  # another TF: nothing known to be deferred
        return []
    graph, matched = found
    keys: list[str] = []
    for node_id, node in enumerate(graph.nodes):
        if node.attributes and node_id not in matched:
            keys.extend(attr.checkpoint_key for attr in node.attributes)
    return keys


def _verify_values(path: str, keys: list[str], reader: Any) -> None:
    """Read ``keys`` of the checkpoint ``path`` now (one ``RestoreV2``), checking each
    value's checksum; raises TF's ``DataLossError`` (or another data error) if one is bad."""
    if not keys:
        return
    restore_v2 = tf().raw_ops.RestoreV2
    dtypes = reader.get_variable_to_dtype_map()
    found: list[str] = []
    for key in keys:
        if key in dtypes:
            found.append(key)
        else:  # a saveable's tensors are named after its attribute: ITERATOR -> ITERATOR_STATE
            found.extend(k for k in dtypes if k.startswith(key))
    if not found:
        return
    shapes = reader.get_variable_to_shape_map()
    batch: list[str] = []
    size = 0
    with tf().device("/cpu:0"):
        for i, key in enumerate(found):
            batch.append(key)
            dtype = dtypes[key]
            size += _prod(shapes.get(key) or []) * max(int(dtype.size), 1)
            if size >= _VERIFY_BATCH_BYTES or i == len(found) - 1:
                # the values are dropped at once: memory stays bounded by one batch
                restore_v2(
                    prefix=path,
                    tensor_names=batch,
                    shape_and_slices=[""] * len(batch),
                    dtypes=[dtypes[k] for k in batch],
                )
                batch, size = [], 0


#: values read per ``RestoreV2`` when checking deferred values (bounds the memory held)
_VERIFY_BATCH_BYTES = 64 << 20


def _prod(dims: list[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def restore_path(checkpoint: Any, path: str, *, strict: bool = True, direct: DirectReader | None = None) -> None:
    """Restore ``path`` into ``checkpoint`` (checking it matches the model first).

    Every value of the checkpoint is read and checksummed before this returns: the
    values TF restores now, and those it defers until their objects are created
    (optimizer slots), which are read once here so that a corrupt one is found at
    start-up, not at the first step. When :func:`._direct_restore.plan` finds every value
    a plain variable's, the values are read straight into the variables instead of by
    TF's restore (logged at debug: ``checkpoint.read how=direct``). Otherwise the reader
    threads started for that go on reading and checking every plain value ahead of TF's
    restore, which then reads them from the page cache, and only what they did not
    check is read again for the deferred values (``checkpoint.read how=tensorflow
    checked_ahead=N checked_after=M``).

    ``direct``: the fast store's own reader (:class:`.._types.DirectReader`); ``None``
    (the plain store): TF's restore reads every value and ``RestoreV2`` checks the
    deferred ones.
    """
    # what the session attaches to the state after start-up (a checkpoint taken before, the
    # start-up one included, lacks them): the data iterator, its pipeline, the epoch
    # position, Keras's random and metric state
    allow_missing = (f"{ITERATOR_ATTR}/", f"{PIPELINE_ATTR}/", f"{EPOCH_ATTR}/", f"{KERAS_ATTR}/")
    checked = not strict
    prefetch = None if direct is None else direct.start(path)
    try:
        if prefetch is not None and direct is not None:
            graph = prefetch.graph()
            if graph is not None:
                match = _graph.SavedGraphMatch(checkpoint, graph)  # the one walk, for the check and the plan
                if not checked:
                    check_matches(checkpoint, path, allow_missing=allow_missing, match=match, index=prefetch.index())
                    checked = True
                planned = direct.plan(checkpoint, match, prefetch.entries)
                if planned is not None:
                    direct.assign(planned, prefetch.finish())
                    log.debug("checkpoint.read", path=path, how="direct", values=len(planned))
                    return
            prefetch.check_ahead()  # TF's restore reads the files next: the readers check them ahead of it
        reader = tf().train.load_checkpoint(path)
        if not checked:
            check_matches(checkpoint, path, allow_missing=allow_missing, reader=reader)
        try:
            status = checkpoint.restore(path).expect_partial()
            deferred = _deferred_keys(status)
            ahead: set[str] = set()
            if prefetch is not None and deferred:  # its readers checked the values they read: not again
                ahead = prefetch.checked()
                deferred = [k for k in deferred if k not in ahead]
            _verify_values(path, deferred, reader)
            log.debug(
                "checkpoint.read", path=path, how="tensorflow", checked_ahead=len(ahead), checked_after=len(deferred)
            )
        except BaseException as exc:
            _forget_deferred(checkpoint, path)
            internals.quiet_failed_restore(exc.__traceback__)  # reported by the caller, not by TF's warnings
            raise
    finally:
        if prefetch is not None:
            prefetch.cancel()


def _forget_deferred(checkpoint: Any, path: str) -> None:
    """Drop the restores a failed restore of ``path`` left waiting for objects to appear.

    TF keeps them on the live objects (``_deferred_dependencies``) and runs every one
    when the object is created (optimizer slots at the first step): left there, the
    first step would restore values of the checkpoint that failed, or read its files
    after they were set aside.
    """

    def keep(position: Any) -> bool:
        return getattr(getattr(position, "checkpoint", None), "save_path_string", None) != path

    try:
        objects = _graph.live_objects(checkpoint)
    except Exception as exc:  # another TF: nothing more can be done here
        log.debug("checkpoint.deferred_not_cleared", path=path, error=describe(exc))
        return
    for obj in objects:
        deferred, slots = internals.deferred_restorations(obj)
        if isinstance(deferred, dict):
            for name in list(deferred):
                kept = [p for p in deferred[name] if keep(p)]
                if kept:
                    deferred[name] = kept
                else:
                    del deferred[name]
        if isinstance(slots, dict):  # TF1-style optimizers
            for by_variable in slots.values():
                if isinstance(by_variable, dict):
                    for key in list(by_variable):
                        by_variable[key] = [p for p in by_variable[key] if keep(p)]


#: what the checkpoint reader's errors (which carry no error code) say about bad files
_DATA_MESSAGE = re.compile(
    r"checksum|corrupt|truncat|data loss|magic|sstable|invalid proto|unable to open table|"
    r"failed to parse|not found|no such file|out of range|bad |mismatch",
    re.IGNORECASE,
)


def _data_error(exc: BaseException) -> bool:
    """Whether ``exc``, raised restoring a checkpoint, says its files are bad (checksum,
    format, a file missing), as opposed to a transient or environmental failure
    (``AbortedError``, ``UnavailableError``, ``PermissionDeniedError``, ...)."""
    errors = tf().errors
    if isinstance(exc, errors.OpError):
        if type(exc) is errors.OpError:  # tf.train.load_checkpoint's reader loses the code
            return _DATA_MESSAGE.search(str(exc)) is not None
        return isinstance(
            exc, (errors.DataLossError, errors.NotFoundError, errors.InvalidArgumentError, errors.OutOfRangeError)
        )
    from google.protobuf.message import DecodeError

    if isinstance(exc, (FileNotFoundError, IsADirectoryError, DecodeError, UnicodeDecodeError)):
        return True
    return isinstance(exc, (IndexError, ValueError)) and not isinstance(exc, OSError)


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def restore_latest(
    checkpoint: Any,
    logdir: Path,
    *,
    strict: bool = True,
    basename: str | None = None,
    direct: DirectReader | None = None,
) -> str | None:
    """Restore the newest good checkpoint in ``logdir``; returns its path, or ``None``.

    A checkpoint that is missing files or fails to load is reported
    (``checkpoint.corrupt path=... reason=...``) and the one before it is tried; a
    damaged state file is reported and the checkpoints on disk are tried instead.

    Raises:
        CheckpointError: the checkpoint belongs to a different model (``strict`` only),
            or checkpoint files exist and none of them loads (each named with why).
        tf.errors.AbortedError, tf.errors.UnavailableError: a transient failure (the
            caller may retry; nothing is counted as corrupt).
    """
    return restore_newest(checkpoint, logdir, strict=strict, basename=basename, direct=direct).path


def restore_newest(
    checkpoint: Any, logdir: Path, *, strict: bool, basename: str | None = None, direct: DirectReader | None = None
) -> RestoreOutcome:
    """:func:`restore_latest`, with what failed on the way (:class:`RestoreOutcome`).

    Only data errors (checksum, format, missing files) make a checkpoint count as
    corrupt; any other error (transient, permission, resources) propagates as itself.
    """
    paths, state, problem = _candidates.restore_candidates(logdir, basename)
    outcome = RestoreOutcome(state_problem=problem, state=state)
    if problem is not None:
        log.error(
            "checkpoint.state_damaged",
            path=str(logdir / _names.STATE_FILE),
            reason=problem,
            action="restoring the newest checkpoint on disk that loads",
        )
    failures: list[tuple[str, str]] = []
    named = set() if state is None else {_candidates.absolute(logdir, n) for n in (*state.paths, state.latest) if n}
    for path in paths:
        reason = _names.missing_files(Path(path))
        if reason is not None and path not in named:
            log.debug("checkpoint.ignored", path=path, reason=reason)  # not ours: left alone
            continue
        if reason is not None and not os.path.exists(path + ".index") and not _names.checkpoint_files(Path(path)):
            outcome.gone.append(path)
            log.warning("checkpoint.gone", path=path, action="trying the previous one")
            continue
        if reason is None:
            try:
                t0 = time.perf_counter()
                restore_path(checkpoint, path, strict=strict, direct=direct)
            except CheckpointError:
                raise
            except Exception as exc:
                if not _data_error(exc):
                    raise
                reason = _reason(exc)
            else:
                log.info("checkpoint.restored", path=path, secs=round(time.perf_counter() - t0, 4))
                outcome.path = path
                return outcome
        log.error("checkpoint.corrupt", path=path, reason=reason, action="trying the previous one")
        outcome.corrupt.append(path)
        failures.append((path, reason))
    if failures:
        listing = "; ".join(f"{p}: {r}" for p, r in failures)
        raise CheckpointError(
            f"no checkpoint in {logdir} loads ({listing}); nothing was restored, initialised "
            "or changed: move the damaged checkpoints away (or restore them from a copy) "
            "to start again"
        )
    return outcome
