"""``asupervisor inspect LOGDIR``: what a log directory holds, read without trusting it.

For each checkpoint on disk (``<basename>-<step>.index`` with its data files): its step,
commit time, size, whether plain TensorFlow loads every value of it (TF's own reader,
which checks the CRCs), the metrics it records (``loss``, ``val_loss``: what
``KeepBest`` ranks), whether the state file names it and which one is the latest; the
leftovers of interrupted saves (``*.asv-tmp-*``); a damaged ``checkpoint`` state file;
the data iterator's share of the latest checkpoint; the RAM tier (its directory and
checkpoints, when ``CheckpointOptions(ram_tier=...)`` made one); the last value of each scalar
summary (TensorBoard's ``EventAccumulator``); the goodput ledger (wall time, productive
time, badput by cause, restarts). Nothing is written. A front door.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ._checkpoint.snapshot import _metrics
from ._checkpoint.snapshot._iterator_state import iterator_share
from ._checkpoint.store import inspect_ram_tier, inspect_remote
from ._checkpoint.store import names as _names
from ._checkpoint.store import state_file as _state_file
from ._goodput._ledger import LEDGER_FILE, read_ledger

__all__ = ["inspect_logdir", "run"]


def _loads(prefix: str) -> str | None:
    """``None`` if TensorFlow reads every value of checkpoint ``prefix``, else why not."""
    from ._tf import tf

    try:
        reader = tf().train.load_checkpoint(prefix)
        for key, dtype in reader.get_variable_to_dtype_map().items():
            if dtype != tf().variant:  # a data iterator's state: not readable as an array
                reader.get_tensor(key)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first}"[:300]
    return None


def _scalars(logdir: Path) -> dict[str, dict[str, float]]:
    """The last value of each scalar summary in the event files of ``logdir``."""
    if not any(logdir.glob("events.out.tfevents.*")):
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(logdir), size_guidance={"tensors": 0, "scalars": 0})
    accumulator.Reload()
    out: dict[str, dict[str, float]] = {}
    tags = accumulator.Tags()
    for tag in tags.get("scalars", []):
        event = accumulator.Scalars(tag)[-1]
        out[tag] = {"step": event.step, "value": float(event.value)}
    for tag in tags.get("tensors", []):
        event = accumulator.Tensors(tag)[-1]
        try:
            from tensorboard.util import tensor_util

            value = tensor_util.make_ndarray(event.tensor_proto)
            if value.ndim == 0 and value.dtype.kind in "fiu":
                out[tag] = {"step": event.step, "value": float(value)}
        except Exception:  # a histogram or text summary: not a scalar
            continue
    return out


def _goodput(logdir: Path) -> dict[str, Any] | None:
    """The goodput ledger of ``logdir`` (``Status.goodput``'s fields, with ``step`` and
    ``ended``), ``{"error": ...}`` if it cannot be read, ``None`` if there is none."""
    try:
        totals = read_ledger(logdir / LEDGER_FILE)
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}
    if totals is None:
        return None
    g = totals.goodput()
    return {
        "wall_secs": g.wall_secs,
        "productive_secs": g.productive_secs,
        "goodput": g.goodput,
        "badput": dict(g.badput),
        "restarts": g.restarts,
        "redone_steps": g.redone_steps,
        "step": totals.step,
        "ended": totals.ended,
        "updated_at": totals.updated_at,
    }


def inspect_logdir(logdir: str | os.PathLike[str]) -> dict[str, Any]:
    """A report of ``logdir`` (plain JSON types); ``ok`` is whether nothing is wrong and
    a training wrote there (``empty``: nothing of a training at all). A URL logdir is reported from its objects (see ``docs/storage.md``).

    Raises:
        FileNotFoundError: ``logdir`` does not exist, is not a directory, or (a URL)
            cannot be read.
        ValueError: a URL nothing serves.
    """
    from ._checkpoint.store import is_url

    if is_url(logdir):
        return inspect_remote(str(logdir))
    root = Path(logdir)
    if not root.is_dir():
        raise FileNotFoundError(f"no log directory at {str(root)!r}")
    state, problem = _state_file.inspect_state(root)
    named = set(state.paths) if state is not None else set()
    latest = state.latest if state is not None else None
    checkpoints = []
    for name in sorted(_names.scan_checkpoints(root, None), key=lambda n: (_names.step_of(n) or -1, n)):
        prefix = root / name
        files = _names.checkpoint_files(prefix)
        index = Path(str(prefix) + ".index")
        error = _names.missing_files(prefix) or _loads(str(prefix))
        checkpoints.append(
            {
                "name": name,
                "step": _names.step_of(name),
                "time": index.stat().st_mtime if index.exists() else None,
                "bytes": sum(f.stat().st_size for f in files if f.exists()),
                "loads": error is None,
                "error": error,
                "metrics": _metrics.read(str(prefix)) if error is None else {},
                "named_in_state_file": name in named,
                "latest": name == latest,
            }
        )
    leftovers = sorted(p.name for p in root.iterdir() if _names.TMP_MARKER in p.name)
    share = None
    if latest is not None and any(c["name"] == latest and c["loads"] for c in checkpoints):
        measured = iterator_share(str(root / latest))
        if measured is not None:
            share = {"iterator_bytes": measured[0], "checkpoint_bytes": measured[1]}
    report: dict[str, Any] = {
        "logdir": str(root),
        "state_file": {"latest": latest, "problem": problem},
        "checkpoints": checkpoints,
        "leftovers": leftovers,
        "iterator_share": share,
        "scalars": _scalars(root),
        "ram_tier": inspect_ram_tier(root),
        "goodput": _goodput(root),
    }
    report["empty"] = state is None and problem is None and not checkpoints and not leftovers and not report["scalars"]
    report["ok"] = problem is None and all(c["loads"] for c in checkpoints) and not report["empty"]
    return report


def _text(report: dict[str, Any]) -> str:
    lines = [f"log directory {report['logdir']}"]
    state = report["state_file"]
    if state["problem"]:
        lines.append(f"  state file: DAMAGED ({state['problem']})")
    else:
        lines.append(f"  state file: latest {state['latest']}")
    if not report["checkpoints"]:
        lines.append("  no checkpoints")
    for c in report["checkpoints"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c["time"])) if c["time"] else "-"
        mark = " latest" if c["latest"] else ("" if c["named_in_state_file"] else " (not in the state file)")
        health = "loads" if c["loads"] else f"DOES NOT LOAD: {c['error']}"
        recorded = "".join(f"  {k}={v:.6g}" for k, v in sorted((c.get("metrics") or {}).items()))
        lines.append(
            f"  {c['name']:<28} step {c['step']!s:>8}  {when}  {c['bytes'] / 2**20:9.2f} MiB  {health}{mark}{recorded}"
        )
    for name in report["leftovers"]:
        lines.append(f"  leftover of an interrupted save: {name}")
    ram = report.get("ram_tier")
    if ram is not None:
        if ram["newest_step"] is not None:
            held = ", ".join(f"{c['name']} ({c['bytes'] / 2**20:.2f} MiB)" for c in ram["checkpoints"])
            lines.append(f"  ram tier: {ram['dir']}  newest step {ram['newest_step']}: {held}")
        else:
            lines.append(f"  ram tier: {ram['dir']}  empty (a reboot, another machine, or nothing saved yet)")
    if report.get("owner"):
        lines.append(f"  in use by a training: {report['owner']}")
    if report["iterator_share"]:
        share = report["iterator_share"]
        lines.append(
            f"  data iterator: {share['iterator_bytes']} of {share['checkpoint_bytes']} bytes of the latest checkpoint"
        )
    goodput = report.get("goodput")
    if goodput is not None and "error" in goodput:
        lines.append(f"  goodput ledger: UNREADABLE ({goodput['error']})")
    elif goodput is not None:
        lines.append(
            f"  goodput {goodput['goodput']:.1%}: {goodput['productive_secs']:.1f} s productive of"
            f" {goodput['wall_secs']:.1f} s, {goodput['restarts']} restarts, {goodput['redone_steps']} steps redone,"
            f" step {goodput['step']}, {goodput['ended'] or 'running or killed'}"
        )
        for cause, secs in goodput["badput"].items():
            lines.append(f"    badput {cause:<40} {secs:10.1f} s")
    for tag, last in sorted(report["scalars"].items()):
        lines.append(f"  {tag} = {last['value']:.6g} at step {last['step']}")
    if report.get("empty"):
        lines.append("  NOTHING OF A TRAINING HERE: no checkpoint, state file or summaries (a mistyped path?)")
    else:
        lines.append("  ok" if report["ok"] else "  PROBLEMS FOUND")
    return "\n".join(lines)


def run(logdir: str, *, as_json: bool = False) -> int:
    """``asupervisor inspect``: print the report; 0 when nothing is wrong, else 1."""
    try:
        report = inspect_logdir(logdir)
    except (FileNotFoundError, ValueError) as exc:
        print(f"asupervisor inspect: {exc}", file=sys.stderr)  # noqa: T201 - a command's output
        return 1
    print(json.dumps(report, indent=2) if as_json else _text(report))  # noqa: T201 - a command's output
    return 0 if report["ok"] else 1
