"""The goodput ledger of a run: its totals across restarts, and their file in the logdir.

A run is one or more segments (processes, or sessions of one process) training into one
logdir. The chief keeps the run's :class:`Totals` in ``asupervisor-goodput.json``: the
previous segments' totals plus the running segment's figures (``_core._goodput``),
rewritten whole and atomically (temporary file, fsync, rename). When a segment starts,
:func:`resume` carries the file's totals over:

* the time from the previous segment's last write to this segment's start is
  ``infrastructure_recovery_from_disruption`` when that segment was cut short (killed:
  it never wrote its end; a signal, a notice, an error); after a completed training or a
  person's stop it is no one's time and is left out of the wall time;
* the steps between the checkpoint restored and the last step the ledger recorded are
  done again: their time, at the run's mean step time, moves from productive time to
  ``wasted_progress_from_disruption``.

Pure values and arithmetic, and one small file: nothing here knows a session.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .._core._files import replace_file
from .._core._goodput import CAUSES, RECOVERY, WASTED_PROGRESS, Segment, disrupted
from .._core._status import Goodput, ReadOnlyDict

__all__ = ["LEDGER_FILE", "Totals", "read_ledger", "remove_leftovers", "resume", "write_ledger"]

#: the ledger's file name in the logdir (a URL logdir: in its local working directory)
LEDGER_FILE = "asupervisor-goodput.json"
_VERSION = 1


def _order(badput: Mapping[str, float]) -> dict[str, float]:
    """``badput`` in the report order of ``CAUSES`` (recorded causes of other names last)."""
    known = {c: badput[c] for c in CAUSES if c in badput}
    return {**known, **{c: v for c, v in sorted(badput.items()) if c not in known}}


@dataclass(frozen=True, kw_only=True)
class Totals:
    """A run's totals, as the ledger file holds them.

    Attributes:
        first_started_at: when the run's first segment started (``time.time()``).
        updated_at: when these totals were taken (the last write's time).
        wall_secs: the run's wall time (see :class:`~asupervisor.Goodput`).
        productive_secs: time in steps whose work was kept.
        steps: the steps behind ``productive_secs`` (for the mean step time).
        badput: the rest of the wall time by cause.
        restarts: segments after the first.
        redone_steps: steps run again after restarts.
        step: the global step when these totals were taken.
        ended: the stop reason the last segment wrote at its end; ``None`` while it runs,
            or when it was killed before it could.
        segments: the segments counted.
    """

    first_started_at: float | None = None
    updated_at: float | None = None
    wall_secs: float = 0.0
    productive_secs: float = 0.0
    steps: int = 0
    badput: Mapping[str, float] = field(default_factory=ReadOnlyDict)
    restarts: int = 0
    redone_steps: int = 0
    step: int = 0
    ended: str | None = None
    segments: int = 0

    def goodput(self) -> Goodput:
        """These totals as ``status().goodput``."""
        wall = self.wall_secs
        return Goodput(
            wall_secs=wall,
            productive_secs=self.productive_secs,
            goodput=self.productive_secs / wall if wall > 0 else 0.0,
            badput=ReadOnlyDict(_order(self.badput)),
            restarts=self.restarts,
            redone_steps=self.redone_steps,
        )

    def add(self, segment: Segment, *, step: int, ended: str | None = None) -> Totals:
        """These totals (the previous segments', :func:`resume`\\ d) with ``segment``'s
        figures added, taken at global step ``step``."""
        badput = dict(self.badput)
        for cause, secs in segment.badput.items():
            badput[cause] = badput.get(cause, 0.0) + secs
        return Totals(
            first_started_at=segment.started_at if self.first_started_at is None else self.first_started_at,
            updated_at=segment.now,
            wall_secs=self.wall_secs + segment.wall_secs,
            productive_secs=self.productive_secs + segment.productive_secs,
            steps=self.steps + segment.steps,
            badput=ReadOnlyDict(_order(badput)),
            restarts=self.restarts,
            redone_steps=self.redone_steps,
            step=step,
            ended=ended,
            segments=self.segments + 1,
        )

    def to_json(self) -> str:
        """The file's text: these totals, and ``goodput`` (the ratio) for readers."""
        out: dict[str, Any] = {"version": _VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = dict(value) if isinstance(value, Mapping) else value
        out["goodput"] = self.goodput().goodput
        return json.dumps(out, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Totals:
        """Totals from a ledger file's text.

        Raises:
            ValueError: not a ledger this version reads (the message says what is wrong).
        """
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            raise ValueError(f"not a version {_VERSION} goodput ledger")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            if f.name == "badput":
                if not isinstance(value, dict) or not all(_seconds(v) for v in value.values()):
                    raise ValueError(f"badput must map causes to seconds, got {value!r}")
                value = ReadOnlyDict({str(k): float(v) for k, v in value.items()})
            elif f.name in ("wall_secs", "productive_secs") and not _seconds(value):
                raise ValueError(f"{f.name} must be seconds, got {value!r}")
            elif f.name in ("steps", "restarts", "redone_steps", "step", "segments") and not (
                isinstance(value, int) and value >= 0
            ):
                raise ValueError(f"{f.name} must be an int >= 0, got {value!r}")
            values[f.name] = value
        return cls(**values)


def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def resume(previous: Totals | None, *, started_at: float, restored_step: int) -> Totals:
    """The run's totals as a segment starting at ``started_at`` from ``restored_step``
    begins, ``previous`` being the ledger's (see the module docstring)."""
    if previous is None or previous.segments == 0:
        return Totals(first_started_at=started_at, step=restored_step)
    badput = dict(previous.badput)
    wall = previous.wall_secs
    if previous.updated_at is not None and disrupted(previous.ended):
        gap = max(0.0, started_at - previous.updated_at)
        badput[RECOVERY] = badput.get(RECOVERY, 0.0) + gap
        wall += gap
    productive, steps, redone = previous.productive_secs, previous.steps, 0
    if restored_step < previous.step:
        redone = previous.step - restored_step
        mean = productive / steps if steps > 0 else 0.0
        moved = min(productive, redone * mean)
        productive -= moved
        steps = max(0, steps - redone)
        badput[WASTED_PROGRESS] = badput.get(WASTED_PROGRESS, 0.0) + moved
    return Totals(
        first_started_at=previous.first_started_at if previous.first_started_at is not None else started_at,
        updated_at=previous.updated_at,
        wall_secs=wall,
        productive_secs=productive,
        steps=steps,
        badput=ReadOnlyDict(_order(badput)),
        restarts=previous.restarts + 1,
        redone_steps=previous.redone_steps + redone,
        step=restored_step,
        ended=None,
        segments=previous.segments,
    )


def read_ledger(path: Path) -> Totals | None:
    """The ledger at ``path``; ``None`` when there is none.

    Raises:
        ValueError: the file is not a ledger (damaged, another version).
        OSError: it cannot be read.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return Totals.from_json(text)
    except (ValueError, TypeError) as exc:  # json's errors are ValueErrors
        raise ValueError(f"{path}: {exc}") from exc


def write_ledger(path: Path, totals: Totals) -> None:
    """Replace the ledger at ``path`` with ``totals``, atomically and durably.

    Raises:
        OSError: it could not be written (the old one stays).
    """
    path.parent.mkdir(parents=True, exist_ok=True)  # a logdir no checkpoint made yet
    replace_file(path, totals.to_json(), durable=True)


def remove_leftovers(path: Path) -> None:
    """Remove the temporary files of writes of the ledger at ``path`` that a killed
    process left (by the logdir's owner only: another's write may be in flight)."""
    for leftover in path.parent.glob(f"{path.name}.tmp*"):
        leftover.unlink(missing_ok=True)
