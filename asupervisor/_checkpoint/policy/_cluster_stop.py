"""A preemption the whole cluster agrees on: every worker stops, and saves, at one step.

In multi-worker training (``MultiWorkerMirroredStrategy``) a signal usually reaches one
worker: the node that is being preempted. That worker cannot stop alone: the others
would wait for it in the next step's collectives, and a checkpoint needs every worker's
snapshot at the same step (:mod:`._multi_worker`). So the first SIGTERM/SIGINT is turned
into a stop every worker agrees on, over TensorFlow's coordination service key-value
store (the service ``MultiWorkerMirroredStrategy`` starts, and TF's own
``PreemptionCheckpointHandler`` uses):

1. The worker that got the signal (the *leader*), at its next step boundary ``s`` on the
   step thread, publishes ``<key> = "<S> <task> <signal> <N>"``: ``S = s+1``, or, for a notice
   with a deadline and time to spare (:mod:`..._core._notice`), the last step whose end
   leaves the final save's time before the deadline; then ``N = s+2`` when ``S > N``
   (the notice's save at once, taken by every worker at step ``N``), else ``0``. The key
   can be set once: a worker that finds it set already follows the stop it names.
2. Every other worker has a watcher thread blocked on that key. It queues "stop at
   ``S``" for its step thread's next boundary, then acknowledges
   (``<key>/ack/<task>``).
3. The leader waits for every acknowledgement before it takes step ``s+1``. Workers step
   together (each step is a collective), so no worker can finish step ``s+1 <= S`` before the
   leader takes it: every worker knows its stop step before it gets there.
4. At step ``S`` every worker stops with ``stop_reason = "signal:<NAME>"`` (or the
   notice's ``preempted:<source>``, when a preemption notice started it), marked
   agreed: the final checkpoint is taken by all of them (the chief commits it) and
   every process exits with the same status (``asv.exit_code``: 143 after SIGTERM).

If an acknowledgement does not come within :func:`ack_timeout` (a worker is gone), the
leader stops alone, without a final checkpoint: saving would wait for a collective that
never completes. A second signal abandons the agreement the way it abandons a final
save. Without a coordination service the signal stops this worker alone, as before.

The step thread only blocks in the leader's boundary job (the acknowledgements, a few
milliseconds when all workers are up); the watcher's blocking reads release the GIL.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from typing import TYPE_CHECKING, Any

from ... import _tf_internals as internals
from ..._core._abc import SessionAttribute, SessionPart
from ..._logging import describe, get_logger
from ..._tf import tf

if TYPE_CHECKING:
    from ..._cluster import ClusterInfo
    from ..._core._abc import SessionContext

__all__ = ["ClusterStopPart", "ack_timeout"]

log = get_logger(__name__)

#: a process's multi-worker sessions, in order (every worker creates them in the same
#: order, so the n-th session of each uses the same key)
_sessions = itertools.count()

_WATCH_POLL_MS = 250  # the watcher's blocking read, between checks for the session's end


def _reason(name: str) -> str:
    """The stop reason of what started the stop: ``signal:<NAME>`` for a signal's name, a
    preemption notice's own (``preempted:gce``) as it is. Published without spaces."""
    return name if ":" in name else f"signal:{name}"


def ack_timeout(stop_grace_secs: float) -> float:
    """How long the leader waits for the other workers' acknowledgements."""
    return max(1.0, min(10.0, stop_grace_secs / 3))


def _coordination() -> Any:
    """TensorFlow's eager context when a coordination service runs, else ``None``."""
    return internals.coordination_service_context()


class ClusterStopPart(SessionPart):
    """Turns the first signal into a stop every worker agrees on (see the module docstring).

    Args:
        cluster: this worker's place in the cluster.
    """

    name = "cluster-stop"

    def __init__(self, cluster: ClusterInfo) -> None:
        self.cluster = cluster
        self.key = f"asupervisor/stop/{next(_sessions)}"
        self._kv: Any = None
        self._signalled = False
        self._decided = False  # the stop step is known (led or followed)
        self._lock = threading.Lock()
        self._target: float = math.inf
        self._save_at: float = math.inf  # a notice's save at once, agreed
        self._signal = "SIGTERM"
        self._closing = threading.Event()

    # -- loop ------------------------------------------------------------------------

    def start(self, ctx: SessionContext) -> None:
        """Find the coordination service and start watching for another worker's stop."""
        try:
            self._kv = _coordination()
        except Exception as exc:  # no eager context: a worker without TensorFlow's cluster runtime
            log.warning("cluster.stop_unavailable", why=describe(exc))
            return
        if self._kv is None:
            log.warning(
                "cluster.stop_unavailable",
                why="no coordination service (is the strategy MultiWorkerMirroredStrategy?): "
                "a signal stops this worker alone, without a final checkpoint",
            )
            return
        ctx.new_thread("asv-cluster-stop").submit_nowait(self._watch, ctx)

    def on_signal(self, ctx: SessionContext, name: str) -> bool:
        """The first signal (or a preemption notice, ``preempted:<source>``): lead an
        agreed stop at the next step boundary. A later one joins the stop under way
        (a GCE notice, then the VM's SIGTERM: one agreed stop, not a second, lone one)."""
        if self._kv is None:
            return False
        if self._signalled:
            log.info("cluster.stop_under_way", signal=name)
            return True
        self._signalled = True
        ctx.step_thread.submit_at_boundary_nowait(self._lead, ctx, name)
        return True

    async def aclose(self, ctx: SessionContext) -> None:
        """End the watcher (within one poll)."""
        self._closing.set()

    # -- step thread -----------------------------------------------------------------

    def next_trigger(self, step: int) -> float:
        """The agreed save at once and the agreed stop step, once known."""
        return min(s for s in (self._save_at, self._target, math.inf) if s > step)

    def on_step(self, ctx: SessionContext) -> None:
        """At the agreed save step: every worker saves (in the background, the chief
        commits); at the agreed stop step: stop, marked agreed (every worker takes the
        final checkpoint)."""
        step = ctx.global_step
        if step == self._save_at:
            checkpoints = ctx.extra(SessionAttribute.checkpoints, None)
            saved = None if checkpoints is None else checkpoints.save_in_background("notice", agreed=True)
            log.info("cluster.saved_now", step=step, saved=saved is not None)
        if step >= self._target:
            self._stop(ctx)

    def _stop(self, ctx: SessionContext) -> None:
        log.warning("cluster.stopped_together", step=ctx.global_step, signal=self._signal)
        ctx.control.request_stop(reason=_reason(self._signal), agreed=True)

    def _stop_at(self, ctx: SessionContext, step: int, signal: str, save_at: int = 0) -> None:
        """Stop at ``step`` (now, if this worker is there already); save at ``save_at``
        first (every worker learns of it before it gets there)."""
        self._signal = signal
        if save_at > ctx.global_step:
            self._save_at = save_at
        if ctx.global_step >= step:
            self._stop(ctx)
            return
        self._target = step
        ctx.rearm()

    def _decide(self) -> bool:
        with self._lock:
            first = not self._decided
            self._decided = True
        return first

    def _lead(self, ctx: SessionContext, name: str) -> None:
        """The boundary job of the worker that got the signal (must not raise)."""
        try:
            self._lead_or_follow(ctx, name)
        except Exception as exc:  # the cluster runtime failed: stop alone, unsaved
            log.error("cluster.stop_not_agreed", error=describe(exc))
            ctx.control.request_stop(reason=_reason(name))

    def _lead_or_follow(self, ctx: SessionContext, name: str) -> None:
        errors = tf().errors
        me = self.cluster.task_id
        target = ctx.notice_stop_step()  # the next step; with a notice's window, the last that fits
        save_at = ctx.global_step + 2  # a step every worker learns of the stop before
        if target <= save_at:
            save_at = 0  # no window: the final save is the one
        try:
            self._kv.set_config_key_value(self.key, f"{target} {me} {name} {save_at}")
        except errors.AlreadyExistsError:  # another worker leads: follow it
            self._follow(ctx, self._kv.get_config_key_value(self.key, 0))
            self._ack()
            return
        if not self._decide():  # the watcher followed another worker meanwhile
            return
        log.warning("cluster.stop_proposed", step=target, signal=name, save_at=save_at or None)
        deadline = time.monotonic() + ack_timeout(ctx.stop_grace_secs)
        missing = []
        for task in self.cluster.workers:
            if task == me:
                continue
            wait_ms = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                self._kv.get_config_key_value(f"{self.key}/ack/{task}", wait_ms)
            except errors.DeadlineExceededError:
                missing.append(task)
        if missing:
            log.error("cluster.stop_not_agreed", missing=missing, why="no acknowledgement: stopping alone, unsaved")
            ctx.control.request_stop(reason=_reason(name))
            return
        self._stop_at(ctx, target, name, save_at)

    def _follow(self, ctx: SessionContext, value: str) -> None:
        """On the step thread: stop at the step another worker published."""
        step, leader, signal, *more = value.split(" ")
        save_at = int(more[0]) if more else 0
        if self._decide():
            log.warning("cluster.stop_agreed", step=int(step), leader=leader, signal=signal, save_at=save_at or None)
            self._stop_at(ctx, int(step), signal, save_at)

    def _ack(self) -> None:
        """Tell the leader this worker knows the stop step (any thread)."""
        try:
            self._kv.set_config_key_value(f"{self.key}/ack/{self.cluster.task_id}", "1")
        except tf().errors.AlreadyExistsError:
            pass  # acknowledged already

    # -- watcher thread --------------------------------------------------------------

    def _watch(self, ctx: SessionContext) -> None:
        """Until the session ends: wait for another worker's stop and follow it."""
        errors = tf().errors
        while not self._closing.is_set():
            try:
                value = self._kv.get_config_key_value(self.key, _WATCH_POLL_MS)
            except errors.DeadlineExceededError:
                continue
            except Exception as exc:  # the cluster is shutting down
                log.debug("cluster.stop_watch_ended", error=describe(exc))
                return
            if value.split(" ", 2)[1] == self.cluster.task_id:
                return  # this worker leads
            # The stop is queued for the step thread *before* the leader hears of it: this
            # worker's step thread may be inside step s+1 now, waiting for the leader.
            try:
                ctx.step_thread.submit_at_boundary_nowait(self._follow_job, ctx, value)
            except RuntimeError:  # the session is closing its threads
                return
            try:
                self._ack()
            except Exception as exc:
                log.error("cluster.stop_not_agreed", error=describe(exc))
            return

    def _follow_job(self, ctx: SessionContext, value: str) -> None:
        """The boundary job of a worker told by another (must not raise)."""
        try:
            self._follow(ctx, value)
        except Exception as exc:
            log.error("cluster.stop_not_agreed", error=describe(exc))
