"""``await sv.export(model, path, best=None)``: the trained model in Keras's or TF's format.

``path`` ending in ``.keras`` gets Keras's single-file format (``model.save``); any
other path a SavedModel directory (``model.export``, an inference SavedModel that
``tf.saved_model.load`` and TF Serving read). Either way the export is written next to
its final name and renamed into place only when complete and synced, as a checkpoint is
committed: a crash leaves the previous export or the new one, never a torn one (a
SavedModel directory replaces the previous one by two renames; a crash between them
leaves the previous one as ``.<name>.asv-old-<pid>``, which the next export removes). A
URL ``path`` (``s3://...``, ``gs://...``) is written locally, then uploaded: a ``.keras``
file as one object, a SavedModel's files with ``saved_model.pb`` last (the previous
one's removed first), so that a reader never finds a SavedModel whose entry point names
files not there yet.

``best="val_loss"`` exports the committed checkpoint of the logdir with the best value of
that metric as recorded at its save (:class:`~asupervisor.KeepBest`'s records; ``mode``
``"min"`` or ``"max"``) instead of the model's current weights, which are put back
afterwards. Only the chief exports. The work runs on a thread of its own
(``asv-export``), never on the event loop.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ._logging import get_logger
from ._tf import tf

__all__ = ["export"]

log = get_logger(__name__)

_MODES = ("min", "max")


async def export(sv: Any, model: Any, path: str | os.PathLike[str], *, best: str | None, mode: str) -> str | None:
    """See :meth:`asupervisor.Supervisor.export` (``sv``: the supervisor)."""
    from ._checkpoint.store import check_url, is_url
    from ._core._handoff import LoopHandle
    from ._core._threads import DedicatedThread

    target = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not target:
        raise TypeError(f"export() path must be a file path or a URL, got {path!r}")
    if target.endswith((".h5", ".hdf5")):
        raise ValueError(f"export() writes .keras files or SavedModel directories, not HDF5: {target!r}")
    if not callable(getattr(model, "save", None)):
        raise TypeError(f"export() exports a Keras model, got {model!r}")
    if mode not in _MODES:
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
    if best is not None and (not isinstance(best, str) or not best):
        raise ValueError(f"best must be a metric name such as 'val_loss', got {best!r}")
    if sv.status().running:
        raise RuntimeError("export() runs after managed_session() has ended (the step thread owns the model meanwhile)")
    if best is not None and sv.config.logdir is None:
        raise ValueError(f"export(best={best!r}) needs a logdir whose checkpoints recorded {best!r}")
    if is_url(target):
        target = check_url(target)
    if not sv.is_chief:
        log.info("export.skipped", path=target, why="not the chief")
        return None
    thread = DedicatedThread("asv-export", LoopHandle())
    thread.start()
    try:
        written: str = await thread.call(_export, sv, model, target, best, mode)
    finally:
        await thread.aclose()
    return written


def _export(sv: Any, model: Any, target: str, best: str | None, mode: str) -> str:
    """On the export thread: the weights chosen, written, put back."""
    from ._checkpoint.store import is_url

    saved = None
    source = "current weights"
    if best is not None:
        prefix, value = _best_checkpoint(Path(str(sv.config.logdir)), best, mode)
        saved = [v.numpy() for v in model.weights]
        _restore_model(sv.config.state, model, prefix)
        source = f"{os.path.basename(prefix)} ({best}={value:.6g})"
    try:
        if is_url(target):
            _export_remote(model, target)
        else:
            _export_local(model, Path(target))
    finally:
        if saved is not None:
            for variable, value in zip(model.weights, saved, strict=True):
                variable.assign(value)
    log.info("export.written", path=target, source=source)
    return target


def _best_checkpoint(logdir: Path, metric: str, mode: str) -> tuple[str, float]:
    """The committed checkpoint of ``logdir`` with the best recorded ``metric``."""
    from ._checkpoint.snapshot import _metrics
    from ._checkpoint.store import state_file

    state = state_file.read_state(logdir)
    names = [] if state is None else [n for n in dict.fromkeys([*state.paths, state.latest]) if n]
    scored: list[tuple[float, int, str]] = []  # (value, age rank, prefix): a tie goes to the newer
    for i, name in enumerate(names):
        prefix = str(logdir / name)
        value = _metrics.read(prefix).get(metric)
        if value is not None and not math.isnan(value):
            scored.append((value if mode == "max" else -value, i, prefix))
    if not scored:
        raise ValueError(
            f"export(best={metric!r}): no checkpoint in {str(logdir)!r} recorded {metric!r} "
            f"(checkpoints: {', '.join(names) or 'none'})"
        )
    value, _, prefix = max(scored)
    return prefix, value if mode == "max" else -value


def _restore_model(state: Any, model: Any, prefix: str) -> None:
    """Read ``model``'s values from the checkpoint ``prefix``, under the name the
    supervisor's state gives it."""
    items = state.items() if isinstance(state, dict) else vars(state).items() if state is not None else ()
    name = next((key for key, value in items if value is model), None)
    if name is None:
        raise ValueError("export(best=...): the model is not in the supervisor's state, so no checkpoint holds it")
    tf().train.Checkpoint(**{name: model}).read(prefix).expect_partial()


def _write(model: Any, destination: Path) -> None:
    """``model`` in the format ``destination``'s name asks for (no renaming here)."""
    if destination.suffix == ".keras":
        model.save(str(destination))
    elif callable(getattr(model, "export", None)):
        model.export(str(destination), verbose=False)
    else:
        tf().saved_model.save(model, str(destination))


def _sync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (and ``root``)."""
    from ._checkpoint.store import writeback

    if root.is_file():
        writeback.fsync_path(root)
        return
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            writeback.fsync_path(Path(directory) / name)
        writeback.fsync_path(Path(directory))


def _export_local(model: Any, target: Path) -> None:
    """Write next to ``target``, sync, rename into place, sync the directory."""
    from ._checkpoint.store import writeback

    parent = target.parent
    writeback.make_dirs_durable(parent)
    for leftover in parent.glob(f".{target.name}.asv-*"):  # an earlier export that crashed
        _remove(leftover)
    pid = os.getpid()
    staged = parent / f".{target.name}.asv-new-{pid}{target.suffix if target.suffix == '.keras' else ''}"
    try:
        _write(model, staged)
        _sync_tree(staged)
        if staged.is_dir() and target.exists():
            old = parent / f".{target.name}.asv-old-{pid}"
            os.replace(target, old)
            os.replace(staged, target)
            writeback.fsync_path(parent)
            _remove(old)
        else:
            os.replace(staged, target)
        writeback.fsync_path(parent)
    except BaseException:
        _remove(staged)
        raise


def _remove(path: Path) -> None:
    """Remove a file or a directory tree, if there (best effort)."""
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _export_remote(model: Any, url: str) -> None:
    """Write locally, then upload (see the module docstring)."""
    from ._checkpoint.store import open_remote_fs

    parent, _, name = url.rpartition("/")
    io = open_remote_fs(parent)
    try:
        with tempfile.TemporaryDirectory(prefix="asv-export-") as scratch:
            local = Path(scratch) / name
            _write(model, local)
            remote = io.path(name)
            if local.is_file():
                io.put_file(str(local), remote, lambda: None)
                return
            files = sorted(p for p in local.rglob("*") if p.is_file())
            entry = [p for p in files if p.name == "saved_model.pb"]
            with contextlib.suppress(FileNotFoundError):
                io.fs.rm_file(f"{remote}/saved_model.pb")  # the previous export is no SavedModel meanwhile
            for path in [p for p in files if p not in entry] + entry:
                io.put_file(str(path), f"{remote}/{path.relative_to(local).as_posix()}", lambda: None)
    finally:
        io.close()
