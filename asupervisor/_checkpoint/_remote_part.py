"""The remote tier's part of a session with a URL logdir: uploads beside the step loop,
the lease's renewal, the final upload, ``status().remote``.

Start-up's work (prove the remote, take its lease, bring its newest checkpoint down) is
done by :class:`._part.CheckpointPart` before its restore, on the step thread, through
the same :class:`.store.TieredStore`. Here: the upload service, woken by the store's
local commits, copies the newest committed checkpoint up on its own thread
(``asv-upload``) as the cadence says (every ``upload_every``-th, or once
``upload_every_secs`` passed), with the metrics and checksums its write produced,
retrying with backoff after an error while training goes on. The checkpoint being uploaded is pinned against local retention until the upload
ends; when uploads fall behind, the newest local checkpoint goes up next (the ones in
between are skipped, ``remote.behind``). The lease service renews the lease
(``asv-lease``); a lost lease (:class:`LeaseLostError`, from either service) stops the
session with ``lease_lost`` and nothing more is written to the remote. At the stop, after
the final checkpoint, the newest local checkpoint is uploaded within what is left of
``stop_grace_secs``, else the log says what was left where; then what cut uploads left is
removed. Never imports another feature.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from .._core._abc import SessionAttribute, SessionPart
from .._core._services import Service, engine_context
from .._core._status import RemoteStatus
from .._exceptions import LeaseLostError
from .._logging import describe, get_logger

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from .._core._abc import CheckpointSaving, SessionContext
    from .._core._services import EngineContext, ServiceContext
    from .._core._status import CheckpointInfo
    from .._core._threads import DedicatedThread
    from .store import TieredStore, Uploaded

__all__ = ["RemotePart"]

log = get_logger(__name__)

#: how often the upload service looks for a new local checkpoint
#: backoff after a failed upload: doubling from the first to the last, then the last
_RETRY_SECS = (1.0, 60.0)


class RemotePart(SessionPart):
    """The remote tier of a session (see the module docstring).

    Args:
        store: the URL logdir's tiered store (opened by the checkpoint part at start-up).
        upload_every: upload every this-many-th local checkpoint...
        upload_every_secs: ...or the newest once this many seconds passed (``None``: no).
    """

    name = "remote"

    def __init__(self, store: TieredStore, *, upload_every: int = 1, upload_every_secs: float | None = None) -> None:
        self.store = store
        self.tier = store.tier
        self.upload_every = upload_every
        self.upload_every_secs = upload_every_secs
        self._thread: DedicatedThread | None = None
        self._commits_at_upload = 0  # the store's commits when the last upload began
        self._last_upload_at: float | None = None  # session clock
        self._uploading = False
        self._error: str | None = None
        self._lease_error: str | None = None
        self._behind_said = False  # the last upload said the remote is behind
        self._ctx: SessionContext | None = None
        self._started_wall = time.time()
        self._committed: anyio.Event | None = None  # set (on the loop) by a local commit

    # -- status ------------------------------------------------------------------------

    def extra_attributes(self, ctx: SessionContext) -> Mapping[Any, Callable[[], Any]]:
        """``SessionAttribute.remote``: the tier's status."""
        return {SessionAttribute.remote: self.status}

    def status(self) -> RemoteStatus:
        """The remote tier's lag and errors, now (any thread)."""
        tier = self.tier
        uploaded = tier.uploaded
        local = self._local()
        now = time.time()
        lag_steps = 0
        lag_secs = 0.0
        if local is not None and (uploaded is None or local.step > uploaded.step):
            lag_steps = local.step - (uploaded.step if uploaded is not None else 0)
            # the training the remote lacks: since its newest checkpoint was taken
            lag_secs = max(0.0, now - (uploaded.time if uploaded is not None else self._started_wall))
        error = self._error or self._lease_error
        if tier.fenced and tier.lease is not None:
            error = tier.lease.lost
        elif tier.stalled:
            error = f"the upload made no progress for {tier.timeout:g} s (stalled)"
        committed = tier.committed_wall
        return RemoteStatus(
            url=tier.url,
            local_dir=str(tier.local_dir),
            uploaded_step=None if uploaded is None else uploaded.step,
            uploaded_at=None if uploaded is None else uploaded.time,
            lag_steps=lag_steps,
            lag_secs=lag_secs,
            uploading=self._uploading,
            error=error,
            last_commit_age_secs=None if committed is None else max(0.0, now - committed),
            stalled=tier.stalled,
            fenced=tier.fenced,
        )

    # -- services ----------------------------------------------------------------------

    def start(self, ctx: SessionContext) -> None:
        """Keep the session: the checkpoint part's newest committed checkpoint is watched."""
        self._ctx = ctx

    def _checkpoints(self) -> CheckpointSaving | None:
        return None if self._ctx is None else self._ctx.extra(SessionAttribute.checkpoints, None)

    def _local(self) -> CheckpointInfo | None:
        """The local tier's newest committed checkpoint: the store's (told at its commit,
        before the checkpointer records it), or the one restored or promoted."""
        checkpoints = self._checkpoints()
        last = None if checkpoints is None else checkpoints.last
        newest = self.store.newest
        if last is None or (newest is not None and newest.step > last.step):
            return newest
        return last

    def services(self, ctx: SessionContext) -> Iterable[Service]:
        """The upload and lease services (the owner of the remote only)."""
        if not self.tier.owner or self.tier.io is None:
            return []
        self._thread = ctx.new_thread("asv-upload")
        services: list[Service] = [_UploadService(self)]
        if self.tier.lease is not None:
            services.append(_LeaseService(self, ctx.new_thread("asv-lease")))
        return services

    def _due(self, commits: int, now: float) -> bool:
        """Whether the newest local checkpoint is to be uploaded now: the first one, each
        ``upload_every``-th local commit since the last upload, or once
        ``upload_every_secs`` passed since it."""
        if self._last_upload_at is None or commits - self._commits_at_upload >= self.upload_every:
            return True
        every = self.upload_every_secs
        return every is not None and now - self._last_upload_at >= every

    def _upload(self, local: CheckpointInfo, metrics: Mapping[str, float] | None = None) -> Uploaded | None:
        """On the upload thread: upload ``local`` unless the remote has it already; it is
        pinned against local retention meanwhile."""
        uploaded = self.tier.uploaded
        if uploaded is not None and uploaded.step >= local.step:
            return uploaded
        checkpoints = self._checkpoints()
        self._uploading = True
        started = time.perf_counter()
        try:
            with contextlib.ExitStack() as stack:
                if checkpoints is not None and not stack.enter_context(checkpoints.pinned(local.path)):
                    return None  # retired before it could be pinned: the newest goes up next
                done = self.store.upload(local, metrics)
        finally:
            self._uploading = False
        if done is not None:
            self._error = self._lease_error = None  # the remote answered: nothing is wrong now
            if self._ctx is not None:
                self._ctx.observe_save_secs("upload", time.perf_counter() - started)
        return done

    def _wake(self) -> None:
        """On the loop: a local checkpoint was committed."""
        if self._committed is not None:
            self._committed.set()

    async def next_commit(self, ctx: EngineContext) -> None:
        """Wait for the next local commit (one made since the last wait returns at once),
        or until ``upload_every_secs`` passed since the last upload (the session clock)."""
        event = self._committed
        assert event is not None
        every = self.upload_every_secs
        if not event.is_set():
            if every is None or self._last_upload_at is None:
                await event.wait()
            else:
                async with anyio.create_task_group() as tg:

                    async def timer() -> None:
                        assert self._last_upload_at is not None
                        await ctx.clock.sleep_until(self._last_upload_at + every)
                        tg.cancel_scope.cancel()

                    tg.start_soon(timer)
                    await event.wait()
                    tg.cancel_scope.cancel()
        self._committed = anyio.Event()

    async def upload_newest(self, ctx: EngineContext, *, force: bool) -> bool:
        """Upload the newest local checkpoint if due (or ``force``); whether one went up."""
        checkpoints = self._checkpoints()
        local = self._local()
        uploaded = self.tier.uploaded
        if checkpoints is None or local is None or (uploaded is not None and uploaded.step >= local.step):
            return False
        if self.tier.fenced:
            return False  # said once: nothing more goes there
        commits = self.store.commits
        if not force and not self._due(commits, ctx.clock.now()):
            return False
        skipped = commits - self._commits_at_upload - 1
        behind = self._last_upload_at is not None and skipped >= max(1, self.upload_every)
        if behind:
            age = self.tier.committed_wall
            (log.info if self._behind_said else log.warning)(  # a warning when it falls behind, then info
                "remote.behind",
                url=self.tier.url,
                lag_steps=local.step - (uploaded.step if uploaded is not None else 0),
                last_commit_age_secs=None if age is None else round(max(0.0, time.time() - age), 1),
                skipped=skipped,
                hint="uploads are slower than saves: the newest local checkpoint goes up next",
            )
        self._behind_said = behind
        assert self._thread is not None
        metrics = checkpoints.recorded_metrics(local.path)  # as the write had them: no reopening
        done = await self._thread.submit(self._upload, local, metrics).wait_cancellable()
        self._error = None
        self._commits_at_upload = commits
        self._last_upload_at = ctx.clock.now()
        return done is not None

    # -- the end -----------------------------------------------------------------------

    async def final(self, ctx: SessionContext) -> None:
        """After the final checkpoint: upload the newest local checkpoint within the grace."""
        if self._thread is None:
            return
        if self.tier.fenced:
            return  # said once: this training's checkpoints stay in local_dir
        try:
            await self.upload_newest(ctx, force=True)
        except anyio.get_cancelled_exc_class():
            self._left_behind("the stop's deadline came first")
            raise
        except self.tier.Abandoned:
            self._left_behind("the upload was abandoned")
        except Exception as exc:
            self._left_behind(describe(exc))
            raise

    def _left_behind(self, why: str) -> None:
        local = self._local()
        uploaded = self.tier.uploaded
        log.warning(
            "remote.left_behind",
            url=self.tier.url,
            local=None if local is None else local.path,
            remote_latest=None if uploaded is None else uploaded.name,
            why=why,
            hint="the next start on this machine uploads it; elsewhere the remote's latest is resumed",
        )

    async def aclose(self, ctx: SessionContext) -> None:
        """An upload still in flight stops at its next part; then, on the upload thread
        (after it), what cut uploads left is removed while the remote answers."""
        self.tier.abandon()
        tier = self.tier
        if self._thread is not None and self._error is None and not tier.stalled and not tier.fenced:
            await self._thread.submit(tier.finish).wait_cancellable()

    def release(self) -> None:
        """The lease released and the connection closed (the step thread, at the end)."""
        self.tier.close()


class _UploadService(Service):
    """Uploads the local tier's new checkpoints (see :class:`RemotePart`)."""

    name = "upload"
    restart = None  # it never fails: errors are retried here, with backoff

    def __init__(self, part: RemotePart) -> None:
        self.part = part

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Upload when a local commit wakes it (or ``upload_every_secs`` passed), retry
        after an error, until cancelled. No polling: the commit's listener wakes it."""
        part = self.part
        engine = engine_context(ctx)
        part._committed = anyio.Event()
        loop = engine.loop

        def committed() -> None:  # on the committing thread
            loop.call_if_running(part._wake)

        part.store.on_commit(committed)
        task_status.started()
        ctx.set_service_state(self.name, "running")
        failures = 0
        while True:
            try:
                await part.upload_newest(engine, force=False)
                failures = 0
            except LeaseLostError:
                raise  # another training holds the logdir: the session stops (lease_lost)
            except Exception as exc:
                failures += 1
                wait = min(_RETRY_SECS[1], _RETRY_SECS[0] * 2 ** (failures - 1))
                part._error = describe(exc)
                log.warning("remote.upload_failed", url=part.tier.url, error=describe(exc), retry_secs=wait)
                ctx.set_service_state(self.name, "backoff")
                await anyio.sleep(wait)
                ctx.set_service_state(self.name, "running")
                continue
            await part.next_commit(engine)


class _LeaseService(Service):
    """Renews the lease every quarter of its time to live; a lost lease stops training."""

    name = "lease"
    restart = None  # a lost lease escalates: the session stops

    def __init__(self, part: RemotePart, thread: DedicatedThread) -> None:
        self.part = part
        self.thread = thread

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Renew until cancelled; a network error is retried at the next renewal (and
        shown in ``status().remote.error`` meanwhile)."""
        tier = self.part.tier
        lease = tier.lease
        assert lease is not None
        task_status.started()
        ctx.set_service_state(self.name, "running")
        while True:
            await anyio.sleep(lease.ttl / 4)
            try:
                await self.thread.submit(tier.renew).wait_cancellable()
            except LeaseLostError:
                raise  # taken over: this training must stop writing the logdir
            except Exception as exc:
                self.part._lease_error = f"the lease's renewal failed: {describe(exc)}"
                log.warning("remote.lease_renewal_failed", url=tier.url, error=describe(exc))
            else:
                self.part._lease_error = None
