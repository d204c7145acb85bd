"""The ``checkpoint`` state file: reading it (trusting nothing), writing it atomically.

A damaged state file (garbled, binary, empty, dangling) is reported by
:func:`inspect_state`, never trusted. :func:`write_state` replaces it atomically
(temporary file, fsync, rename, directory fsync), so a crash leaves the old or the new
file, each naming only complete checkpoints. The proto comes from TensorFlow, imported
lazily. Plain file work; never on the event loop thread.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import _tf_internals
from ..._logging import get_logger
from . import _names, _writeback

__all__ = [
    "CheckpointState",
    "adding",
    "dropping",
    "inspect_state",
    "named",
    "parse_state_text",
    "read_own_state",
    "read_state",
    "set_aside_state",
    "state_text",
    "write_state",
]

log = get_logger(__name__)


@dataclass
class CheckpointState:
    """The content of the ``checkpoint`` state file, with paths relative to the logdir.

    Attributes:
        latest: the newest committed checkpoint (a prefix name), or ``None``.
        paths: the checkpoints retention manages, oldest first (``latest`` last).
        timestamps: the wall-clock commit time of each of ``paths``.
        last_preserved: time of the last checkpoint kept by ``keep_checkpoint_every_n_hours``.
    """

    latest: str | None = None
    paths: list[str] = field(default_factory=list)
    timestamps: list[float] = field(default_factory=list)
    last_preserved: float = 0.0


# -- edits: every change of what a state names is one of these ------------------------


def named(latest: str | None, entries: Sequence[tuple[str, float]], last_preserved: float = 0.0) -> CheckpointState:
    """A state naming ``entries`` (name, commit time), oldest first; ``latest`` the latest."""
    return CheckpointState(latest, [p for p, _ in entries], [t for _, t in entries], last_preserved)


def adding(state: CheckpointState, name: str, committed_at: float) -> CheckpointState:
    """``state`` with the checkpoint ``name`` just committed: named once, and the latest,
    unless a newer checkpoint is the latest (an older snapshot committed after it: a
    hook's synchronous save): then in step order, and the newer one stays the latest."""
    keep = [(p, t) for p, t in zip(state.paths, state.timestamps) if p != name]
    step = _names.step_of(name)
    latest_step = _names.step_of(state.latest) if state.latest else None
    if step is not None and latest_step is not None and latest_step > step and state.latest in state.paths:
        at = next((i for i, (p, _) in enumerate(keep) if (_names.step_of(p) or -1) > step), len(keep))
        keep.insert(at, (name, committed_at))
        return named(state.latest, keep, state.last_preserved)
    keep.append((name, committed_at))
    return named(name, keep, state.last_preserved)


def dropping(state: CheckpointState, names: Collection[str]) -> CheckpointState:
    """``state`` without ``names``; the latest stays, or, dropped, the newest left is."""
    keep = [(p, t) for p, t in zip(state.paths, state.timestamps) if p not in names]
    latest = state.latest if state.latest not in names else (keep[-1][0] if keep else None)
    return named(latest, keep, state.last_preserved)


def _state_proto() -> Any:
    return _tf_internals.proto_module(_tf_internals.CHECKPOINT_STATE_PB2).CheckpointState


_STATE_FIELDS = {
    "model_checkpoint_path": str,
    "all_model_checkpoint_paths": str,
    "all_model_checkpoint_timestamps": float,
    "last_preserved_timestamp": float,
}


_STATE_LINE = re.compile(r'(\w+): (?:"((?:[^"\\]|\\.)*)"|([-+.\w]+))')


def _parse_state(text: str) -> dict[str, list[object]] | None:
    """The fields of a state file as TF and this module write it (one ``name: value`` a
    line); ``None`` for anything else, which :func:`read_state` leaves to protobuf."""
    from google.protobuf import text_encoding

    fields: dict[str, list[object]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _STATE_LINE.fullmatch(line.strip())
        if m is None or m.group(1) not in _STATE_FIELDS:
            return None
        kind = _STATE_FIELDS[m.group(1)]
        try:
            if kind is str:
                if m.group(2) is None:
                    return None
                value: object = text_encoding.CUnescape(m.group(2)).decode()
            else:
                value = float(m.group(3))
        except (TypeError, ValueError, UnicodeDecodeError):
            return None
        fields.setdefault(m.group(1), []).append(value)
    return fields


def read_state(logdir: Path) -> CheckpointState | None:
    """Parse ``<logdir>/checkpoint``; ``None`` if there is none or it is unreadable."""
    return inspect_state(logdir)[0]


def inspect_state(logdir: Path) -> tuple[CheckpointState | None, str | None]:
    """Parse ``<logdir>/checkpoint``: ``(state, None)``, ``(None, None)`` when there is no
    state file, or ``(None, why)`` when it cannot be read as one (garbled text, binary
    garbage); never raises for the file's content.
    """
    path = logdir / _names.STATE_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        why = f"not text ({exc.reason} at byte {exc.start} of {len(raw)})"
        log.error("checkpoint.state_corrupt", path=str(path), reason=why)
        return None, why
    state, problem = _parse_text(text, logdir)
    if problem is not None:
        log.error("checkpoint.state_corrupt", path=str(path), reason=problem)
    return state, problem


def parse_state_text(text: str) -> CheckpointState | None:
    """A state file's text (a remote state object's) as a :class:`CheckpointState`, names
    as written; ``None`` if it is not one."""
    return _parse_text(text, None)[0]


def state_text(state: CheckpointState) -> str:
    """The text of a state file naming ``state`` (relative names, as TF writes it)."""
    return _proto_text(state)


def _parse_text(text: str, logdir: Path | None) -> tuple[CheckpointState | None, str | None]:
    """``(state, None)`` or ``(None, why)``; names made relative to ``logdir`` when given."""

    def relative(name: str) -> str:
        return name if logdir is None else _names._relative(logdir, name)

    fields = _parse_state(text)  # the usual file, without protobuf's (slower) text parser
    if fields is None or any(len(fields.get(k, ())) > 1 for k in ("model_checkpoint_path", "last_preserved_timestamp")):
        from google.protobuf import text_format

        proto = _state_proto()()
        try:
            text_format.Merge(text, proto)
        except (text_format.ParseError, UnicodeDecodeError, ValueError) as exc:
            return None, f"garbled ({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})"
        fields = {
            "model_checkpoint_path": [proto.model_checkpoint_path],
            "all_model_checkpoint_paths": list(proto.all_model_checkpoint_paths),
            "all_model_checkpoint_timestamps": list(proto.all_model_checkpoint_timestamps),
            "last_preserved_timestamp": [proto.last_preserved_timestamp],
        }
    named = str((fields.get("model_checkpoint_path") or [""])[0])
    paths = [relative(str(p)) for p in fields.get("all_model_checkpoint_paths", [])]
    latest = relative(named) if named else None
    if latest is not None and latest not in paths:
        paths.append(latest)
    stamps = [float(t) for t in fields.get("all_model_checkpoint_timestamps", [])]  # type: ignore[arg-type]
    if len(stamps) != len(paths):
        stamps = [0.0] * len(paths)
    preserved = float((fields.get("last_preserved_timestamp") or [0.0])[0])  # type: ignore[arg-type]
    return CheckpointState(latest, paths, stamps, preserved), None


def _proto_text(state: CheckpointState) -> str:
    from google.protobuf import text_format

    proto = _state_proto()(
        model_checkpoint_path=state.latest or "",
        all_model_checkpoint_paths=state.paths,
        all_model_checkpoint_timestamps=state.timestamps,
        last_preserved_timestamp=state.last_preserved,
    )
    return str(text_format.MessageToString(proto))


# What this process last wrote to each state file, with the file's identity then
# (inode, size, mtime, ctime): a commit reads its own previous write back from here
# instead of parsing the file again, as long as nobody replaced it since.
_written: dict[str, tuple[tuple[int, int, int, int], CheckpointState]] = {}


_written_lock = threading.Lock()


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _copy(state: CheckpointState) -> CheckpointState:
    return CheckpointState(state.latest, list(state.paths), list(state.timestamps), state.last_preserved)


def read_own_state(logdir: Path) -> CheckpointState | None:
    """:func:`read_state`, without parsing the file again if it is still what this process wrote."""
    try:
        st = os.stat(logdir / _names.STATE_FILE)
    except FileNotFoundError:
        return None
    with _written_lock:
        known = _written.get(os.path.realpath(logdir))
    if known is not None and known[0] == _identity(st):
        return _copy(known[1])
    return read_state(logdir)


def _stage_state(logdir: Path, state: CheckpointState) -> Path:
    """Write and fsync the state file's temporary copy; returns its path."""
    tmp = logdir / f"{_names.STATE_FILE}{_names.TMP_MARKER}{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(_proto_text(state))
            f.flush()
            os.fsync(f.fileno())
    except BaseException as exc:
        if isinstance(exc, OSError):
            exc.filename = exc.filename or str(tmp)
        tmp.unlink(missing_ok=True)  # a failed save leaves nothing behind
        raise
    return tmp


def _install_state(logdir: Path, staged: Path, state: CheckpointState) -> None:
    """Rename the staged copy over the state file and fsync the directory."""
    target = logdir / _names.STATE_FILE
    os.replace(staged, target)
    _writeback.fsync_path(logdir)
    with _written_lock:
        _written[os.path.realpath(logdir)] = (_identity(os.stat(target)), _copy(state))


def write_state(logdir: Path, state: CheckpointState) -> None:
    """Atomically replace ``<logdir>/checkpoint`` (temp file, fsync, rename, dir fsync)."""
    _install_state(logdir, _stage_state(logdir, state), state)


def set_aside_state(logdir: Path, tag: str) -> str | None:
    """Rename a damaged state file to ``checkpoint.<tag>`` (kept for inspection, durably);
    its new name, or ``None`` if there is no state file."""
    source = logdir / _names.STATE_FILE
    target = logdir / f"{_names.STATE_FILE}.{tag}"
    try:
        os.replace(source, target)
    except FileNotFoundError:
        return None
    _writeback.fsync_path(logdir)
    return target.name
