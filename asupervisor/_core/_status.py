"""``Supervisor.status()``: a frozen snapshot of what the supervisor is doing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, NoReturn, TypeVar

__all__ = [
    "EXIT_ERROR",
    "EXIT_HANG",
    "EXIT_INTERRUPTED",
    "EXIT_LEASE_LOST",
    "EXIT_OK",
    "EXIT_PEER_LOST",
    "EXIT_PREEMPTED",
    "EXIT_STORAGE_UNREACHABLE",
    "CheckpointInfo",
    "Goodput",
    "Histogram",
    "QueueStatistics",
    "ReadOnlyDict",
    "RemoteStatus",
    "Status",
    "exit_code",
]

_K = TypeVar("_K")
_V = TypeVar("_V")


class ReadOnlyDict(dict[_K, _V]):
    """A dict that refuses changes: the mappings of a :class:`Status`. Unlike a
    ``MappingProxyType`` it copies, pickles and goes through ``dataclasses.asdict``."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a Status is a snapshot: its mappings cannot be changed (copy one with dict(...))")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))

    def __copy__(self) -> ReadOnlyDict[_K, _V]:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ReadOnlyDict[_K, _V]:
        import copy

        return type(self)({copy.deepcopy(k, memo): copy.deepcopy(v, memo) for k, v in self.items()})


@dataclass(frozen=True, kw_only=True)
class CheckpointInfo:
    """The last committed checkpoint.

    Attributes:
        path: checkpoint prefix (``<logdir>/model.ckpt-<step>``).
        step: global step it holds.
        time: wall-clock time (``time.time()``) it was committed.
    """

    path: str
    step: int
    time: float


@dataclass(frozen=True, kw_only=True)
class Histogram:
    """Durations observed in this session, bucketed as Prometheus does (``Status.save_seconds``).

    Attributes:
        bounds: each bucket's upper bound in seconds, ascending (the last bucket, above
            them all, is implied: ``+Inf``).
        counts: observations in each bucket, one more entry than ``bounds`` (the last is
            the ``+Inf`` bucket's); not cumulative.
        count: all observations.
        sum: their total in seconds.
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    count: int
    sum: float


@dataclass(frozen=True, kw_only=True)
class QueueStatistics:
    """A snapshot of a queue runner's queue (``QueueRunner.statistics()``).

    Attributes:
        size: items queued now.
        capacity: the most items the queue holds.
        produced: items put by the producers in this session.
        consumed: items taken by the consumer in this session.
        consumer_wait_secs: total time the consumer waited for an empty queue to fill.
        fraction_full: ``size / capacity`` (TF1's ``queue/<name>/fraction_full``).
        max_size: the largest size seen in this session (never above ``capacity``).
    """

    size: int
    capacity: int
    produced: int
    consumed: int
    consumer_wait_secs: float
    fraction_full: float
    max_size: int


@dataclass(frozen=True, kw_only=True)
class RemoteStatus:
    """The remote tier of a URL logdir (``Status.remote``).

    Attributes:
        url: the logdir's URL.
        local_dir: its local working directory.
        uploaded_step: the step of the newest checkpoint committed on the remote
            (``None``: none yet).
        uploaded_at: when that checkpoint was committed (``time.time()``).
        lag_steps: how many steps the remote's newest checkpoint is behind the local one.
        lag_secs: how much training the remote lacks, in seconds: since its newest
            checkpoint was taken (0 when it has the local newest).
        uploading: whether an upload is in flight.
        error: what is wrong now, until it is not: the last upload's error, a stalled
            upload, a failed lease renewal, a lost lease (``None``: nothing).
        last_commit_age_secs: seconds since the newest commit on the remote (``None``:
            none known yet).
        stalled: whether the upload in flight made no progress for
            ``ASUPERVISOR_REMOTE_TIMEOUT_SECS`` (60 s by default).
        fenced: whether another training took the logdir over: this one writes nothing
            more there (it stops with ``LeaseLostError``).
    """

    url: str
    local_dir: str
    uploaded_step: int | None = None
    uploaded_at: float | None = None
    lag_steps: int = 0
    lag_secs: float = 0.0
    uploading: bool = False
    error: str | None = None
    last_commit_age_secs: float | None = None
    stalled: bool = False
    fenced: bool = False


@dataclass(frozen=True, kw_only=True)
class Goodput:
    """The goodput ledger of a run, across its restarts (``Status.goodput``); see
    ``docs/goodput.md`` for what each cause measures.

    Attributes:
        wall_secs: the run's wall time: from the start of its first process to now (or
            to its last ledger write), less the time between a completed run and its
            next start.
        productive_secs: time spent in steps whose work was kept.
        goodput: ``productive_secs / wall_secs`` (0 before any time passed).
        badput: the rest of the wall time by cause, seconds (names as Google's
            ``ml-goodput-measurement`` has them, lowercased, where one fits):
            ``training_prep``, ``program_startup``, ``data_loading_sync``,
            ``unproductive_checkpoint_save_time``, ``unproductive_checkpoint_restore_time``,
            ``wasted_progress_from_disruption``, ``infrastructure_recovery_from_disruption``,
            ``preemption_stop``, ``hang``, ``divergence_rollback``, ``other``; a cause
            appears once it counted time.
        restarts: how many times the run was started again (processes or sessions after
            the first).
        redone_steps: steps run again after a restart because the checkpoint restored was
            older than the last step the ledger had recorded.
    """

    wall_secs: float
    productive_secs: float
    goodput: float
    badput: Mapping[str, float] = field(default_factory=ReadOnlyDict)
    restarts: int = 0
    redone_steps: int = 0


@dataclass(frozen=True, kw_only=True)
class Status:
    """A snapshot of a supervisor, safe to keep and to read from any thread.

    Attributes:
        running: whether a managed session is active.
        global_step: steps completed (restored step included).
        steps_per_sec: the step counter's last measurement; before its first one, the
            rate since the session started (``None`` until a step ran).
        last_checkpoint: the last committed checkpoint, if any.
        stop_reason: why the session stopped or is stopping, ``None`` while running.
        services: each service's state (``starting``, ``running``, ``backoff``,
            ``failed``, ``finished``, ``stopped``).
        queues: statistics of each queue runner, by name.
        metrics: the latest scalar values of the step's output (``loss``, ...), sampled
            by the step loop at a step boundary about once a second and when
            ``run_loop`` returns, never per step (empty before the first step).
        max_steps: the ``max_steps`` of the ``run_loop`` running now, else ``None``.
        started_at: when the session started (``time.time()``), ``None`` before.
        eta_secs: seconds until ``max_steps`` at ``steps_per_sec``, else ``None``.
        restarts: how many times each service was restarted after a failure.
        remote: a URL logdir's remote tier (its lag and errors), else ``None``.
        epoch: once ``run_loop(..., epochs=)`` ran in this session: the passes over the
            data completed, which is the 0-based index of the one in progress (as Keras
            counts); else ``None``.
        epochs: the ``epochs`` of the ``run_loop`` running now, else ``None``.
        epoch_step: steps into the epoch in progress (with ``epoch``), else ``None``.
        steps_per_epoch: steps in one epoch once known (the dataset's cardinality, or
            counted over a pass), else ``None``.
        save_seconds: what this session's checkpoints cost, by phase: ``blocked`` (the
            step thread held while a snapshot is taken), ``write`` (its files written and
            synced, in the background), ``commit`` (made the latest: renames and the
            state file) and, for a URL logdir, ``upload``; a phase appears once observed.
        tiers: each checkpoint tier's newest committed step: ``disk`` (the logdir),
            ``ram`` (with ``CheckpointOptions(ram_tier=...)``), ``remote`` (a URL logdir);
            a tier appears once it holds a checkpoint.
        rollbacks: divergence rollbacks in this session
            (``run_loop(on_divergence=asv.Rollback(...))``).
        goodput: the run's goodput ledger across restarts (:class:`Goodput`; kept in the
            logdir by the chief), ``None`` before a session started.
    """

    running: bool
    global_step: int
    steps_per_sec: float | None = None
    last_checkpoint: CheckpointInfo | None = None
    stop_reason: str | None = None
    services: Mapping[str, str] = field(default_factory=ReadOnlyDict)
    queues: Mapping[str, QueueStatistics] = field(default_factory=ReadOnlyDict)
    metrics: Mapping[str, float] = field(default_factory=ReadOnlyDict)
    max_steps: int | None = None
    started_at: float | None = None
    eta_secs: float | None = None
    restarts: Mapping[str, int] = field(default_factory=ReadOnlyDict)
    remote: RemoteStatus | None = None
    epoch: int | None = None
    epochs: int | None = None
    epoch_step: int | None = None
    steps_per_epoch: int | None = None
    save_seconds: Mapping[str, Histogram] = field(default_factory=ReadOnlyDict)
    tiers: Mapping[str, int] = field(default_factory=ReadOnlyDict)
    rollbacks: int = 0
    goodput: Goodput | None = None

    def to_dict(self) -> dict[str, Any]:
        """This status as plain JSON types (``json.dumps`` takes it as it is)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                value = {k: asdict(v) if is_dataclass(v) and not isinstance(v, type) else v for k, v in value.items()}
            elif is_dataclass(value) and not isinstance(value, type):
                value = asdict(value)
            out[f.name] = value
        return out


#: training completed: ``max_steps``, the end of the data, the body returned, a stop
#: requested by the program or a hook
EXIT_OK = 0
#: the session ended on an error (a step, a hook, a service, start-up)
EXIT_ERROR = 1
#: interrupted by the user: SIGINT (Ctrl-C), or the application cancelled the session
#: (128 + SIGINT, what a shell reports for a Ctrl-C'd program)
EXIT_INTERRUPTED = 130
#: preempted: SIGTERM or another termination signal from a scheduler (128 + SIGTERM), or
#: a preemption notice that is not a signal (stop reason ``preempted:<source>``);
#: non-zero so Kubernetes and SLURM count the job as not finished and run it again
EXIT_PREEMPTED = 143

#: a peer of a multi-worker training was lost (stop reason ``peer_lost:<task>``): every
#: task must be restarted, and resumes from the last checkpoint (sysexits' EX_TEMPFAIL,
#: "a temporary failure: try again")
EXIT_PEER_LOST = 75
#: object storage did not answer within its deadline (stop reason ``storage_unreachable``,
#: ``StorageUnreachableError``): sysexits' EX_UNAVAILABLE, run the job again later
EXIT_STORAGE_UNREACHABLE = 69
#: another training took the URL logdir over (stop reason ``lease_lost``,
#: ``LeaseLostError``): this one wrote nothing more there; do not run it again as is
EXIT_LEASE_LOST = 77
#: the hang watchdog found a phase stuck (stop reason ``hang:<phase>``, the phase also in
#: the log's ``hang.detected``): run the job again; it resumes from its last checkpoint
#: (124, as ``timeout(1)`` exits)
EXIT_HANG = 124

_COMPLETED = frozenset({"completed", "max_steps", "epochs", "stop_training", "end_of_data", "requested", "hook"})


def exit_code(status: Status) -> int:
    """The status a command should exit with after the session ``status`` describes.

    ``0`` when training completed (``max_steps``, end of data, the body returned, a stop
    requested by the program or a hook); ``130`` when interrupted (SIGINT, or the
    application cancelled the session); ``143`` when preempted (SIGTERM; another signal
    ``128 + its number``; a notice that is not a signal, ``preempted:<source>`` such as
    ``GcePreemptionNotice``'s ``preempted:gce``), so a scheduler runs the job again and it
    resumes from its last checkpoint; ``75`` when a peer of a multi-worker training was
    lost (``peer_lost:<task>``: restart every task of the job); ``69`` when object storage
    did not answer in time (``storage_unreachable``); ``77`` when another training took
    a URL logdir over (``lease_lost``: this one stopped writing it); ``124`` when the
    hang watchdog found a phase stuck (``hang:<phase>``); ``1`` on an error (``error:<Type>``, a failed service). See
    ``docs/sessions.md`` ("Exit status") for how Kubernetes and SLURM treat them.

    Args:
        status: ``Supervisor.status()`` after ``managed_session()`` exited.

    Raises:
        TypeError: ``status`` is not a :class:`Status`.
        ValueError: the session is still running.
    """
    if not isinstance(status, Status):
        raise TypeError(f"exit_code() takes a Status (sv.status()), got {status!r}")
    if status.running:
        raise ValueError("exit_code() needs a finished session; this one is still running")
    reason = status.stop_reason
    if reason is None or reason in _COMPLETED:
        return EXIT_OK
    if reason == "cancelled" or reason == "signal:SIGINT":
        return EXIT_INTERRUPTED
    if reason == "peer_lost" or reason.startswith("peer_lost:"):
        return EXIT_PEER_LOST
    if reason == "storage_unreachable":
        return EXIT_STORAGE_UNREACHABLE
    if reason == "lease_lost":
        return EXIT_LEASE_LOST
    if reason.startswith("hang:"):
        return EXIT_HANG
    if reason.startswith("preempted:"):  # a notice that is not a signal (GCE's metadata server)
        return EXIT_PREEMPTED
    if reason.startswith("signal:"):
        import signal

        try:
            return 128 + int(signal.Signals[reason.removeprefix("signal:")])
        except (KeyError, ValueError):
            return EXIT_PREEMPTED
    return EXIT_ERROR
