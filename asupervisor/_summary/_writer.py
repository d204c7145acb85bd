"""TensorBoard summaries: one event-file writer per session and the timed summary service.

:class:`SummaryWriter` owns a dedicated thread (``asv-summary``) and an event file,
opened and written only there. Events hold the protos ``tf.summary`` writes (tensors
with the scalars/histograms/text plugin metadata), built by TensorBoard's own ``*_pb``
helpers and framed by ``tf.io.TFRecordWriter``: a write costs tens of microseconds
instead of the ~0.4 ms of eager ``tf.summary`` ops (which also hold the GIL the step
thread needs), and no per-thread default writer is involved. Anyone may queue values from any thread with
:meth:`SummaryWriter.write`: the services and ``Supervisor.summary_computed`` from the
event loop; the stock hooks use :meth:`SummaryWriter.post` (no waiter, so no event-loop
wake-up per write) from the step thread. Values may be eager tensors: they are
read (``.numpy()``) on the summary thread, so the step thread never waits for a device
sync to log a value. Variables are never read here: they are read on the step thread
first.

:class:`SummaryService` runs every ``save_summaries_secs`` on the chief when ``logdir`` is
set. At each tick it takes, at a step boundary, the step count and the scalar entries of
the last step's output mapping (no device sync: only references are taken), and queues
them with the values of the session parts' ``scalars``. ``global_step/sec`` is written
when the step-counter service measures it (see :mod:`._part`).

Nothing here runs TensorFlow or touches a file on the event loop thread. The writer is
flushed and closed in the session's ``aclose`` phase, after one last summary of the
steps run since the last tick.
"""

from __future__ import annotations

import collections
import itertools
import math
import numbers
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core._abc import SessionAttribute
from .._core._clock import interval_ticks
from .._core._outputs import is_variable, scalar_entries
from .._core._services import Service
from .._logging import describe, get_logger
from .._tf import tf

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from .._core._abc import SessionContext
    from .._core._handoff import Waiter
    from .._core._services import ServiceContext
    from .._core._threads import DedicatedThread

__all__ = ["SummaryService", "SummaryWriter"]

log = get_logger(__name__)


_file_counter = itertools.count()

#: :meth:`SummaryWriter.post` wakes the summary thread at most this often (seconds) ...
POST_BATCH_SECS = 1.0
#: ... unless this many posts are waiting
POST_BATCH_SIZE = 1000


_scalar_metadata: Any = None


def _scalar_summary(name: str, value: float) -> Any:
    """The ``Summary`` TensorBoard's ``scalar_pb(name, value)`` builds, built directly.

    ``scalar_pb`` goes through ``make_tensor_proto`` (~18 µs of Python holding the GIL
    the step thread needs); this is ~2 µs for the same proto (a float32 scalar tensor
    with the scalars plugin's metadata; a test compares the two).
    """
    global _scalar_metadata
    from tensorboard.compat.proto import summary_pb2, types_pb2

    if _scalar_metadata is None:
        from tensorboard.plugins.scalar import metadata

        _scalar_metadata = metadata.create_summary_metadata(display_name=None, description=None)
    summary = summary_pb2.Summary()
    entry = summary.value.add(tag=name)
    entry.metadata.CopyFrom(_scalar_metadata)
    entry.tensor.dtype = types_pb2.DT_FLOAT
    entry.tensor.tensor_shape.SetInParent()
    entry.tensor.float_val.append(value)
    return summary


def _summary_value(name: str, value: Any) -> Any:
    """On the summary thread: one value as a scalar, histogram or text ``Summary``.

    The protos are those ``tf.summary`` writes (tensors with plugin metadata), built by
    TensorBoard's own ``*_pb`` helpers without running TensorFlow ops.
    """
    import numpy as np

    if hasattr(value, "numpy"):
        value = value.numpy()
    array = np.asarray(value)
    kind = array.dtype.kind
    if kind in "biuf":
        if array.ndim == 0:
            return _scalar_summary(name, float(array))
        from tensorboard.plugins.histogram.summary_v2 import histogram_pb

        return histogram_pb(name, array.astype(np.float64))
    if kind in "SUO":
        from tensorboard.plugins.text.summary_v2 import text_pb

        return text_pb(name, array.astype(str) if kind != "U" else array)
    raise TypeError(f"cannot write summary {name!r}: unsupported value {value!r}")


class SummaryWriter:
    """The session's event-file writer; :meth:`write` may be called from any thread.

    The summary part creates it on the chief when ``logdir`` is set; its thread is joined
    and the event file flushed and closed when the session ends.

    Args:
        logdir: the directory of the event files.
        thread: the dedicated thread all writes run on.
        ctx: the session (write errors stop it).
    """

    def __init__(self, logdir: Path, thread: DedicatedThread, ctx: SessionContext) -> None:
        self.logdir = logdir
        self._thread = thread
        self._ctx = ctx
        self._writer: Any = None
        self._closed = False
        # post(): values queued without waking the summary thread; handed over in batches
        self._posted: collections.deque[tuple[int, dict[str, Any]]] = collections.deque()
        self._handed_at = -math.inf  # time.monotonic() of the last hand-off
        #: the step of the last periodic summary (the summary service keeps it up to date);
        #: at close, a final summary is written if steps ran since
        self.last_step_written: int | None = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` has begun (later writes are dropped)."""
        return self._closed

    def write(
        self,
        step: int,
        values: Mapping[str, Any],
        sources: tuple[Callable[[], Mapping[str, float]], ...] = (),
    ) -> Waiter[Any] | None:
        """Queue ``values`` (and the values the ``sources`` return) for ``step``.

        Non-blocking; callable from any thread. Values are written as scalars (numbers,
        scalar tensors), histograms (numeric arrays) or text (strings); tensors are read
        on the summary thread. A write error stops the session and is raised out of
        ``managed_session()``.

        Returns:
            A waiter for the write (``None`` once the writer is closed).
        """
        if self._closed:
            log.debug("summary.dropped", step=step, reason="closed")
            return None
        return self._thread.submit(self._write_job, int(step), dict(values), sources)

    def post(self, step: int, values: Mapping[str, Any]) -> None:
        """Queue ``values`` for ``step`` like :meth:`write`, without a waiter, in batches.

        The cheap way for the step thread (the stock hooks) to hand over values: nothing
        wakes the event loop, and the summary thread is woken once per
        :data:`POST_BATCH_SECS` (or :data:`POST_BATCH_SIZE` values), not per call —
        waking another Python thread costs the step thread more than the write itself.
        What is queued is written at the latest by the next :meth:`write`, flush or
        close (TF1's ``FileWriter`` flushed every 120 s). A write error still stops the
        session.
        """
        if self._closed:
            log.debug("summary.dropped", step=step, reason="closed")
            return
        posted = self._posted
        posted.append((int(step), dict(values)))
        now = time.monotonic()
        if len(posted) >= POST_BATCH_SIZE or now - self._handed_at >= POST_BATCH_SECS:
            self._handed_at = now
            self._thread.submit_nowait(self._write_posted)

    def _write_posted(self) -> None:
        """On the summary thread: write what :meth:`post` queued, in order."""
        posted = self._posted
        while posted:
            step, values = posted.popleft()
            try:
                self._job(step, values, ())
            except Exception:  # reported by _job: logged, and the session stops with it
                return

    def _write_job(
        self, step: int, values: dict[str, Any], sources: tuple[Callable[[], Mapping[str, float]], ...]
    ) -> None:
        self._write_posted()  # keep the order of the writes
        self._job(step, values, sources)

    def _job(self, step: int, values: dict[str, Any], sources: tuple[Callable[[], Mapping[str, float]], ...]) -> None:
        try:
            for source in sources:
                values.update(source())
            if not values:
                return
            from tensorboard.compat.proto import event_pb2, summary_pb2

            summary = summary_pb2.Summary()
            for name, value in values.items():
                summary.value.extend(_summary_value(name, value).value)
            self._record(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
        except Exception as exc:
            log.error("summary.write_failed", step=step, error=describe(exc))
            self._ctx.request_stop(exc, reason="service:summary")
            raise

    def _record(self, event: Any) -> None:
        """On the summary thread: append one ``Event`` to this session's event file."""
        if self._writer is None:
            from tensorboard.compat.proto import event_pb2

            self.logdir.mkdir(parents=True, exist_ok=True)
            name = (
                f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.{next(_file_counter)}.v2"
            )
            self._writer = tf().io.TFRecordWriter(str(self.logdir / name))
            header = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
            self._writer.write(header.SerializeToString())
        self._writer.write(event.SerializeToString())

    def _close_job(self) -> None:
        self._write_posted()
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None

    async def aclose(self) -> None:
        """Write what is queued, then flush and close the event file (a session closer)."""
        if self._closed:
            return
        ctx = self._ctx
        if self.last_step_written is not None and ctx.global_step != self.last_step_written:
            # the steps since the last tick are not lost: one last summary at stop
            step, scalars = await ctx.run_on_step_thread(_snapshot, ctx)
            waiter = self.write(step, scalars, ctx.scalar_sources())
            if waiter is not None:
                await waiter.wait()
        self._closed = True
        await self._thread.call(self._close_job)
        log.debug("summary.closed", logdir=str(self.logdir))


def _snapshot(ctx: SessionContext) -> tuple[int, dict[str, Any]]:
    """On the step thread, at a boundary: the step and its output's scalars (references)."""
    return ctx.global_step, scalar_entries(ctx.last_output)


class SummaryService(Service):
    """Writes the last step's scalars and the scalar sources every ``interval_secs``.

    Args:
        interval_secs: seconds between summaries (> 0).
        writer: the session's summary writer.
        ctx: the session (its step count, last output and scalar sources).
    """

    name = "summary"

    def __init__(self, interval_secs: float, writer: SummaryWriter, ctx: SessionContext) -> None:
        if not (interval_secs > 0 and math.isfinite(interval_secs)):
            raise ValueError(f"interval_secs must be a positive number, got {interval_secs!r}")
        self.interval_secs = float(interval_secs)
        self.writer = writer
        self._ctx = ctx

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Tick every ``interval_secs``, the first tick one interval after start."""
        session = self._ctx
        task_status.started()
        ctx.set_service_state(self.name, "running")
        last_written = -1
        self.writer.last_step_written = session.global_step
        first = ctx.clock.now() + self.interval_secs
        async for _ in interval_ticks(ctx.clock, self.interval_secs, first_at=first):
            step, scalars = await ctx.run_on_step_thread(_snapshot, session)
            if step == last_written:  # no step since the last tick: the same values again
                scalars = {}
            sources = session.scalar_sources()
            if not scalars and not sources:
                continue
            waiter = self.writer.write(step, scalars, sources)
            if waiter is not None:
                await waiter.wait(grace_secs=ctx.stop_grace_secs)
            last_written = self.writer.last_step_written = step


def summary_computed(ctx: SessionContext | None, values: Mapping[str, Any], global_step: int | None = None) -> None:
    """``Supervisor.summary_computed``: queue ``values`` for the event file (``ctx``:
    the running session, ``None`` when there is none).

    Without a summary writer (no ``logdir``, or not the chief) this does nothing.
    Variables among the values are read at the next step boundary, on the step thread.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"values must be a mapping of name -> value, got {type(values).__name__}")
    for name in values:
        if not isinstance(name, str) or not name:
            raise TypeError(f"summary names must be non-empty strings, got {name!r}")
    if global_step is not None and (isinstance(global_step, bool) or not isinstance(global_step, numbers.Integral)):
        raise TypeError(f"global_step must be an int or None, got {global_step!r}")
    if ctx is None:
        raise RuntimeError("summary_computed() needs a running managed_session()")
    writer = ctx.extra(SessionAttribute.summary_writer, None)
    if writer is None:
        log.debug("summary.skipped", reason="no summary writer (no logdir, or not the chief)")
        return
    step = ctx.global_step if global_step is None else int(global_step)
    values = dict(values)
    if any(is_variable(v) for v in values.values()):

        def read_variables() -> None:
            writer.write(step, {k: (v.read_value() if is_variable(v) else v) for k, v in values.items()})

        ctx.step_thread.submit_at_boundary(read_variables)
        return
    writer.write(step, values)
