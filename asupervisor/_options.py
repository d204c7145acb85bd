"""``Supervisor``'s grouped settings: small frozen objects, one per concern.

``Supervisor(checkpoint=CheckpointOptions(...), summaries=SummaryOptions(...),
stop=StopOptions(...))`` is the primary form of a feature's settings; the flat keywords
(``save_model_secs=``, ``stop_grace_secs=``, ...) say the same and keep working. A new
stock service adds a field to a group, not a keyword to ``Supervisor``. Each field names
the flat keyword it stands for (``metadata["flat"]``): :func:`flat_defaults` lists them
(what ``Supervisor(**flat)`` accepts), :func:`merge_options` folds the groups into them,
and :class:`~asupervisor._config.SupervisorConfig` then checks them as a whole.

This module must not import TensorFlow.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from ._checkpoint.policy._policies import KeepPolicy, SavePolicy
from ._core._watchdog import WatchdogOptions

__all__ = ["CheckpointOptions", "StopOptions", "SummaryOptions", "flat_defaults", "merge_options", "options_only"]


def _number(
    where: str, value: object, *, allow_none: bool = False, allow_inf: bool = False, unit: str = "seconds"
) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where} must be a number of {unit}{' or None' if allow_none else ''}, got {value!r}")
    if math.isnan(value) or value < 0 or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{where} must be a number of {unit} >= 0, got {value!r}")


def _bool(where: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{where} must be True or False, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class CheckpointOptions:
    """When checkpoints are saved, which are kept, and how they are written.

    ``Supervisor(checkpoint=asv.CheckpointOptions(save_steps=1000, max_to_keep=3))``; the
    same is ``Supervisor(save_model_steps=1000, max_to_keep=3)``: each field's flat
    keyword is named in parentheses below.

    Attributes:
        save_secs: seconds between checkpoints; 0 disables timed checkpoints. ``"auto"``:
            as often as keeps training's measured slowdown under 2 %
            (``asv.OverheadBudget``; its own ``save_policy`` for another budget). Not
            used in multi-worker training, which needs ``save_steps``
            (``save_model_secs``).
        save_steps: steps between checkpoints, or ``None`` (``save_model_steps``).
        save_policy: when to save as a policy object (``asv.EverySteps``,
            ``asv.EverySeconds``, ``asv.OnStartup``, ``asv.OnStop``, ``asv.AnySavePolicy``,
            or one's own ``SavePolicy``) instead of ``save_secs`` and ``save_steps`` (give
            one or the other) (``save_policy``).
        max_to_keep: the newest checkpoints kept (never fewer than 2 while a save is in
            flight); ``None`` keeps every checkpoint. Only this supervisor's own
            checkpoints (``<basename>-<step>``) are counted and deleted (``max_to_keep``).
        keep_every_n_hours: also keep one checkpoint per this many hours
            (``keep_checkpoint_every_n_hours``).
        keep_policy: retention as a policy object (``asv.LatestN``, ``asv.EveryNHours``,
            ``asv.KeepBest``, ``asv.AnyKeepPolicy``, or one's own ``KeepPolicy``) instead
            of ``max_to_keep`` and ``keep_every_n_hours`` (give one or the other)
            (``keep_policy``).
        basename: files are ``<logdir>/<basename>-<step>.*`` (``checkpoint_basename``).
        when_busy: ``"wait"`` (default): a step save due while the previous write is in
            flight waits for it (back-pressure), so every multiple of ``save_steps`` is
            saved; timed saves coalesce into one once the writer is free. ``"skip"``:
            such saves are skipped, logged ``checkpoint.skipped``
            (``checkpoint_when_busy``).
        staging: copy the state into buffers kept for the session at each snapshot (one
            memcpy at the step boundary, no copy-on-write in the next step); costs the
            state's size in host memory. ``False``: copy-on-write snapshots only (no
            extra memory, a slower next step after each save) (``checkpoint_staging``).
        store: where checkpoint bytes go through: ``"auto"`` (the fast local store on
            Linux, the plain one elsewhere), ``"fast"`` (Linux only: the native bundle
            writer, direct I/O, idle-priority I/O, the project's own restore) or
            ``"plain"`` (TensorFlow's own ``SaveV2``/``RestoreV2`` and portable file
            calls; the same files, commit protocol and promises). ``None``: the
            environment variable ``ASUPERVISOR_CHECKPOINT_STORE``, else ``"auto"``
            (``checkpoint_store``; ``Supervisor(store=)`` takes the same names).
        local_dir: a URL logdir's local working directory, where checkpoints commit
            before they are uploaded (default: under ``$XDG_CACHE_HOME/asupervisor``)
            (``local_dir``).
        upload_every: a URL logdir gets every this-many-th local checkpoint (the final
            one always) (``upload_every``)...
        upload_every_secs: ...or the newest one once this many seconds passed since the
            last upload; ``None``: by count alone (``upload_every_secs``).
        ram_tier: a RAM tier below the disk (options only, no flat keyword): checkpoints
            saved to memory that outlives the process, often, so that a SIGKILL, an OOM
            kill or a crash loses seconds of training, not minutes; a restart on the same
            machine restores the newest intact checkpoint of either tier. ``True``:
            ``/dev/shm`` (Linux); a path: a directory on a RAM file system (a tmpfs);
            ``False`` (default): none. It holds two checkpoints at most (twice the
            state's size, plus one being written); single-worker training only. See
            ``docs/checkpoints.md``.
        ram_save_secs: seconds between RAM saves, or ``"auto"`` (default): as often as
            keeps their measured cost to training under 2 % (0.5 to 10 s apart).

    Raises:
        TypeError: a field has the wrong type (the message names it and the value).
        ValueError: a field is out of range, or a policy object is given with the
            settings it replaces.
    """

    save_secs: float | str = field(default=600, metadata={"flat": "save_model_secs"})
    save_steps: int | None = field(default=None, metadata={"flat": "save_model_steps"})
    save_policy: SavePolicy | None = field(default=None, metadata={"flat": "save_policy"})
    max_to_keep: int | None = field(default=5, metadata={"flat": "max_to_keep"})
    keep_every_n_hours: float | None = field(default=None, metadata={"flat": "keep_checkpoint_every_n_hours"})
    keep_policy: KeepPolicy | None = field(default=None, metadata={"flat": "keep_policy"})
    basename: str = field(default="model.ckpt", metadata={"flat": "checkpoint_basename"})
    when_busy: str = field(default="wait", metadata={"flat": "checkpoint_when_busy"})
    staging: bool = field(default=True, metadata={"flat": "checkpoint_staging"})
    store: str | None = field(default=None, metadata={"flat": "checkpoint_store"})
    local_dir: str | os.PathLike[str] | None = field(default=None, metadata={"flat": "local_dir"})
    upload_every: int = field(default=1, metadata={"flat": "upload_every"})
    upload_every_secs: float | None = field(default=None, metadata={"flat": "upload_every_secs"})
    ram_tier: bool | str | os.PathLike[str] = field(default=False, metadata={"flat": "ram_tier", "options_only": True})
    ram_save_secs: float | str = field(default="auto", metadata={"flat": "ram_save_secs", "options_only": True})

    def __post_init__(self) -> None:
        where = "CheckpointOptions."
        ram = self.ram_tier
        if not isinstance(ram, (bool, str, os.PathLike)) or (isinstance(ram, str) and not ram.strip()):
            raise TypeError(f"{where}ram_tier must be True, False or a directory, got {ram!r}")
        if isinstance(self.ram_save_secs, str):
            if self.ram_save_secs != "auto":
                raise TypeError(
                    f"{where}ram_save_secs must be a number of seconds or 'auto', got {self.ram_save_secs!r}"
                )
        else:
            _number(f"{where}ram_save_secs", self.ram_save_secs)
            if self.ram_save_secs == 0:
                raise ValueError(f"{where}ram_save_secs must be > 0 (ram_tier=False turns the tier off), got 0")
        if isinstance(self.save_secs, str):
            if self.save_secs != "auto":
                raise TypeError(f"{where}save_secs must be a number of seconds or 'auto', got {self.save_secs!r}")
        else:
            _number(f"{where}save_secs", self.save_secs)
        steps = self.save_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0):
            raise ValueError(f"{where}save_steps must be a positive int or None, got {steps!r}")
        if self.save_policy is not None:
            if not isinstance(self.save_policy, SavePolicy):
                raise TypeError(f"{where}save_policy must be a SavePolicy or None, got {self.save_policy!r}")
            if self.save_secs != 600 or steps is not None:
                raise ValueError(
                    f"give {where}save_policy={self.save_policy!r} or save_secs / save_steps, not both "
                    f"(got save_secs={self.save_secs!r}, save_steps={steps!r})"
                )
        keep = self.max_to_keep
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ValueError(f"{where}max_to_keep must be an int >= 1 or None (keep all), got {keep!r}")
        _number(f"{where}keep_every_n_hours", self.keep_every_n_hours, allow_none=True, unit="hours")
        if self.keep_policy is not None:
            if not isinstance(self.keep_policy, KeepPolicy):
                raise TypeError(f"{where}keep_policy must be a KeepPolicy or None, got {self.keep_policy!r}")
            if keep != 5 or self.keep_every_n_hours is not None:
                raise ValueError(
                    f"give {where}keep_policy={self.keep_policy!r} or max_to_keep / keep_every_n_hours, not both "
                    f"(got max_to_keep={keep!r}, keep_every_n_hours={self.keep_every_n_hours!r})"
                )
        if not isinstance(self.basename, str) or not self.basename or os.sep in self.basename:
            raise ValueError(f"{where}basename must be a file name, got {self.basename!r}")
        if self.when_busy not in ("wait", "skip"):
            raise ValueError(f"{where}when_busy must be 'wait' or 'skip', got {self.when_busy!r}")
        _bool(f"{where}staging", self.staging)
        from ._checkpoint.store import check_store_kind

        check_store_kind(self.store, f"{where}store")
        if self.local_dir is not None and not isinstance(self.local_dir, (str, os.PathLike)):
            raise TypeError(f"{where}local_dir must be a local path or None, got {self.local_dir!r}")
        every = self.upload_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"{where}upload_every must be an int >= 1, got {every!r}")
        _number(f"{where}upload_every_secs", self.upload_every_secs, allow_none=True)


@dataclass(frozen=True, kw_only=True)
class SummaryOptions:
    """How often summaries are written.

    ``Supervisor(summaries=asv.SummaryOptions(save_secs=60))``; the same is
    ``Supervisor(save_summaries_secs=60)``.

    Attributes:
        save_secs: seconds between summaries and step-rate measurements; 0 disables both
            (``save_summaries_secs``).

    Raises:
        TypeError: ``save_secs`` is not a number.
        ValueError: ``save_secs`` is negative, infinite or NaN.
    """

    save_secs: float = field(default=120, metadata={"flat": "save_summaries_secs"})

    def __post_init__(self) -> None:
        _number("SummaryOptions.save_secs", self.save_secs)


@dataclass(frozen=True, kw_only=True)
class StopOptions:
    """How a session stops: its time bound and the signals that stop it.

    ``Supervisor(stop=asv.StopOptions(grace_secs=60, signals=("SIGTERM", "SIGUSR1")))``;
    the same is ``Supervisor(stop_grace_secs=60, stop_signals=("SIGTERM", "SIGUSR1"))``.

    Attributes:
        grace_secs: the longest a stop may take, final checkpoint included; a final save
            that cannot commit in time is abandoned (the previous checkpoint stays the
            latest) and overrunning phases are logged; ``math.inf``: unbounded
            (``stop_grace_secs``).
        signals: the signals that request a graceful stop, by name (``"SIGUSR1"`` or
            ``"USR1"``) or number; e.g. add ``"SIGUSR1"`` for SLURM's
            ``--signal=USR1@90``. The exit status after one is ``asv.exit_code``'s: 130
            for SIGINT, 143 for SIGTERM, 128 + its number for another (``stop_signals``).
        handle_signals: whether those signals are handled: a first one requests a
            graceful stop, a second one abandons the final checkpoint; the application's
            own handler is called too and put back at the end (main thread only)
            (``handle_signals``).
        watchdog: the hang watchdog's settings (``asv.WatchdogOptions``; options only, no
            flat keyword): on by default; ``WatchdogOptions(enabled=False)`` turns it off.
        deadline_secs: the seconds from a notice to the machine's end (options only):
            one number for every notice, or per source: a signal's name (``"SIGUSR1"``)
            or a ``preempted:<source>`` notice's source (``"gce"``: GCE gives 30 s).
            With time to spare the training saves at once, trains on and stops with a
            final save before the deadline (``docs/operations.md``). ``None`` (default),
            or a source not named: no window, the notice stops the training at once.

    Raises:
        TypeError: a field has the wrong type (the message names it and the value).
        ValueError: ``grace_secs`` is negative or NaN, or a signal is unknown or cannot
            be caught.
    """

    grace_secs: float = field(default=120, metadata={"flat": "stop_grace_secs"})
    signals: Sequence[str | int] = field(default=("SIGINT", "SIGTERM"), metadata={"flat": "stop_signals"})
    handle_signals: bool = field(default=True, metadata={"flat": "handle_signals"})
    watchdog: WatchdogOptions = field(default=WatchdogOptions(), metadata={"flat": "watchdog", "options_only": True})
    deadline_secs: float | Mapping[str, float] | None = field(
        default=None, metadata={"flat": "stop_deadline_secs", "options_only": True}
    )

    def __post_init__(self) -> None:
        _number("StopOptions.grace_secs", self.grace_secs, allow_inf=True)
        if not isinstance(self.watchdog, WatchdogOptions):
            off = " (off: asv.WatchdogOptions(enabled=False))" if self.watchdog is False else ""
            raise TypeError(f"StopOptions.watchdog must be an asv.WatchdogOptions, got {self.watchdog!r}{off}")
        from ._core._signals import stop_signals_from

        try:
            stop_signals_from(self.signals)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"StopOptions.signals: {exc}") from None
        if isinstance(self.signals, list):  # frozen and hashable, like the other fields
            object.__setattr__(self, "signals", tuple(self.signals))
        _bool("StopOptions.handle_signals", self.handle_signals)
        object.__setattr__(self, "deadline_secs", _deadlines("StopOptions.deadline_secs", self.deadline_secs))


def _deadlines(where: str, value: object) -> float | Mapping[str, float] | None:
    """``StopOptions.deadline_secs`` checked: a number of seconds > 0, or a mapping of
    sources to them, signal names spelled ``SIGUSR1``."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        _number(where, value)
        if value == 0:
            raise ValueError(f"{where} must be > 0 (None: no window), got 0")
        return value  # type: ignore[return-value]
    import signal

    out: dict[str, float] = {}
    for key, secs in value.items():
        if not isinstance(key, str) or not key.strip() or ":" in key:
            raise ValueError(f"{where}: a source is a signal's name or a notice's source ('gce'), got {key!r}")
        name = key.upper() if key.upper().startswith("SIG") else "SIG" + key.upper()
        source = name if name in signal.Signals.__members__ else key
        _number(f"{where}[{key!r}]", secs)
        if secs == 0:
            raise ValueError(f"{where}[{key!r}] must be > 0 (leave the source out: no window), got 0")
        out[source] = float(secs)
    return MappingProxyType(out)


def _same(a: object, b: object) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        a, b = tuple(a), tuple(b)
    try:
        return a is b or bool(a == b)
    except Exception:  # an object whose == is not a truth value
        return False


def merge_options(flat: Mapping[str, Any], defaults: Mapping[str, Any], **groups: object) -> dict[str, Any]:
    """The flat keywords with the groups folded in.

    A group's field left at its default changes nothing; another value replaces the flat
    keyword, unless that keyword was given a different value too.

    Args:
        flat: ``Supervisor``'s flat keywords, as called.
        defaults: their defaults (a keyword equal to its default counts as not given).
        groups: ``checkpoint=``, ``summaries=``, ``stop=``: an options object or ``None``.

    Raises:
        TypeError: a group is not its options type.
        ValueError: a flat keyword and a group's field were both given, with different
            values (the message names both).
    """
    merged = dict(flat)
    for group_name, group in groups.items():
        kind = _GROUPS[group_name]
        if group is None:
            continue
        if not isinstance(group, kind):
            raise TypeError(f"{group_name} must be an asv.{kind.__name__} or None, got {group!r}")
        for f in fields(kind):
            value = getattr(group, f.name)
            if _same(value, f.default):
                continue
            name = f.metadata["flat"]
            given = flat[name]
            if not _same(given, defaults[name]) and not _same(given, value):
                raise ValueError(
                    f"{name}={given!r} and {group_name}={kind.__name__}({f.name}={value!r}) disagree: "
                    f"give the setting once, as {name}= or as {kind.__name__}.{f.name}"
                )
            merged[name] = value
    return merged


_GROUPS: dict[str, type] = {"checkpoint": CheckpointOptions, "summaries": SummaryOptions, "stop": StopOptions}


@functools.cache
def options_only() -> frozenset[str]:
    """The settings an options object alone takes (no flat keyword of ``Supervisor``)."""
    return frozenset(
        f.metadata["flat"] for kind in _GROUPS.values() for f in fields(kind) if f.metadata.get("options_only")
    )


def flat_defaults() -> Mapping[str, Any]:
    """Every flat keyword an options field stands for, with the field's default (which
    is the keyword's): ``{"save_model_secs": 600, "max_to_keep": 5, ...}``."""
    return MappingProxyType({f.metadata["flat"]: f.default for kind in _GROUPS.values() for f in fields(kind)})
