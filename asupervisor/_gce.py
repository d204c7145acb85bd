"""``asv.GcePreemptionNotice``: a preemption notice that is not a signal, from GCE.

Spot and preemptible Compute Engine VMs, and TPU VMs, announce a preemption or a host
maintenance through the metadata server before (or instead of) a SIGTERM reaching the
training: ``instance/preempted`` turns ``TRUE``, ``instance/maintenance-event`` turns
from ``NONE`` to e.g. ``TERMINATE_ON_HOST_MAINTENANCE``. This service watches both keys
with hanging GETs (``wait_for_change=true`` with ``last_etag``, so no change between two
polls is missed) and on a notice requests the graceful stop a SIGTERM would: the final
checkpoint is saved and ``exit_code()`` answers 143, "preempted, run me again".

The HTTP is the standard library's ``http.client``, each key's GET blocking on a
dedicated thread of its own (joined before the session ends); a stop interrupts a GET
that hangs by shutting its socket down. No new dependency, no TensorFlow.

What it must never do: fail the session. Off GCE (nothing answers at the metadata
host, or something that is not Google's metadata server does) it logs once at info and
stops watching; an error once the server has answered is retried with a backoff.
"""

from __future__ import annotations

import http.client
import os
import socket
import threading
from dataclasses import dataclass
from urllib.parse import quote

import anyio
from anyio.abc import TaskStatus

from ._core._services import EngineContext, Service, ServiceContext, engine_context
from ._core._threads import DedicatedThread
from ._logging import describe, get_logger

__all__ = ["STOP_REASON", "GcePreemptionNotice"]

log = get_logger(__name__)

#: the stop reason a notice requests (``exit_code()`` maps ``preempted:*`` to 143)
STOP_REASON = "preempted:gce"
#: the host Google's client libraries use unless ``GCE_METADATA_HOST`` says otherwise
DEFAULT_HOST = "metadata.google.internal"
HOST_ENV = "GCE_METADATA_HOST"
_PREEMPTED = "instance/preempted"
_MAINTENANCE = "instance/maintenance-event"
_CONNECT_SECS = 3.0  # the metadata server is on the VM's own link: it connects at once
_MAX_BODY = 4096


class _Aborted(Exception):
    """The GET was aborted by a stop before it was sent."""


@dataclass(frozen=True)
class _Answer:
    status: int
    value: str
    etag: str | None
    google: bool  # the answer carries ``Metadata-Flavor: Google``: it is GCE's server


class _HangingGet:
    """One GET, run on a dedicated thread; :meth:`abort` (any thread) interrupts it."""

    def __init__(self, host: str, path: str, read_secs: float) -> None:
        self._host = host
        self._path = path
        self._read_secs = read_secs
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._aborted = False

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked on it
                except OSError:
                    pass  # already closed by the peer: the GET ends by itself

    def __call__(self) -> _Answer:
        conn = http.client.HTTPConnection(self._host, timeout=_CONNECT_SECS)
        response: http.client.HTTPResponse | None = None
        try:
            with self._lock:
                if self._aborted:
                    raise _Aborted(self._path)
            conn.connect()
            assert conn.sock is not None
            with self._lock:
                if self._aborted:
                    raise _Aborted(self._path)
                self._sock = conn.sock
            conn.sock.settimeout(self._read_secs)
            conn.request("GET", self._path, headers={"Metadata-Flavor": "Google"})
            response = conn.getresponse()
            body = response.read(_MAX_BODY)
            return _Answer(
                status=response.status,
                value=body.decode("utf-8", "replace").strip(),
                etag=response.getheader("ETag"),
                google=response.getheader("Metadata-Flavor") == "Google",
            )
        finally:
            with self._lock:
                self._sock = None
            if response is not None:  # a read cut short (an abort): the response's file
                response.close()  # holds the socket open past conn.close() until collected
            conn.close()


class GcePreemptionNotice(Service):
    """Stops the training gracefully when GCE's metadata server announces a preemption.

    Add it to a supervisor (``sv.add_service(asv.GcePreemptionNotice())``). It watches
    ``instance/preempted`` and ``instance/maintenance-event`` with hanging GETs; when
    the VM is preempted (``TRUE``) or a maintenance event other than ``NONE`` is
    announced, it logs ``preemption.notice source=gce notice=...`` once and requests a
    graceful stop with reason ``preempted:gce``: the final checkpoint is saved and
    ``exit_code(sv.status())`` is 143, as after a SIGTERM. Off GCE it logs
    ``preemption.no_metadata_server`` once at info and stops watching; the training
    goes on. Errors once the server has answered are retried with a backoff; this
    service never fails the session.

    Args:
        host: the metadata server, ``host[:port]``; default: the ``GCE_METADATA_HOST``
            environment variable (as Google's client libraries honour it), else
            ``metadata.google.internal``.
        maintenance: whether a maintenance event stops the training too (a live
            migration, ``MIGRATE_ON_HOST_MAINTENANCE``, included); ``False`` watches
            ``instance/preempted`` alone.
        wait_secs: how long the server holds one GET (``timeout_sec``) before answering
            that nothing changed; a stop interrupts a GET at once whatever its length.
        backoff_secs: the wait after a failed GET; doubles at each failure in a row.
        max_backoff_secs: the longest wait between two tries.
    """

    name = "gce_preemption"
    restart = None  # it never raises: errors are retried, off GCE it finishes

    def __init__(
        self,
        host: str | None = None,
        *,
        maintenance: bool = True,
        wait_secs: int = 60,
        backoff_secs: float = 1.0,
        max_backoff_secs: float = 60.0,
    ) -> None:
        if host is None:
            host = os.environ.get(HOST_ENV) or DEFAULT_HOST
        if not isinstance(host, str) or not host or "/" in host:
            raise ValueError(f"host must be a host name with an optional port (host[:port]), got {host!r}")
        if isinstance(wait_secs, bool) or not isinstance(wait_secs, int) or wait_secs < 1:
            raise ValueError(f"wait_secs must be an int >= 1 (the server's timeout_sec), got {wait_secs!r}")
        for field, value in (("backoff_secs", backoff_secs), ("max_backoff_secs", max_backoff_secs)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{field} must be a number of seconds >= 0, got {value!r}")
        self.host = host
        self.maintenance = bool(maintenance)
        self.wait_secs = wait_secs
        self.backoff_secs = float(backoff_secs)
        self.max_backoff_secs = float(max_backoff_secs)
        self._noticed = False

    def __repr__(self) -> str:
        return f"GcePreemptionNotice(host={self.host!r}, maintenance={self.maintenance})"

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Probe the metadata server, then watch its keys until a notice or the stop."""
        task_status.started()  # the session never waits for the network
        await self._run(engine_context(ctx))

    async def _run(self, ctx: EngineContext) -> None:
        self._noticed = False
        thread = ctx.new_thread("asv-gce-preempted")
        try:
            try:
                first = await self._get(ctx, thread, _PREEMPTED, etag=None)
            except (OSError, http.client.HTTPException) as exc:
                log.info("preemption.no_metadata_server", source="gce", host=self.host, error=describe(exc))
                return
            if not first.google:  # something answers, but not Google's metadata server
                log.info("preemption.no_metadata_server", source="gce", host=self.host, http_status=first.status)
                return
            ctx.set_service_state(self.name, "running")
            log.info("preemption.watching", source="gce", host=self.host, maintenance=self.maintenance)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch, ctx, thread, _PREEMPTED, first, tg.cancel_scope)
                if self.maintenance:
                    tg.start_soon(self._watch_maintenance, ctx, tg.cancel_scope)
        finally:
            await thread.aclose_within(ctx.stop_grace_secs)

    async def _watch_maintenance(self, ctx: EngineContext, scope: anyio.CancelScope) -> None:
        thread = ctx.new_thread("asv-gce-maintenance")
        try:
            await self._watch(ctx, thread, _MAINTENANCE, None, scope)
        finally:
            await thread.aclose_within(ctx.stop_grace_secs)

    async def _watch(
        self, ctx: EngineContext, thread: DedicatedThread, key: str, answer: _Answer | None, scope: anyio.CancelScope
    ) -> None:
        """Follow ``key`` (``answer``: its value known already); ends at a notice."""
        failures = 0
        while True:
            if answer is not None:
                if answer.status == 404:  # a metadata server without this key (an emulator)
                    log.info("preemption.key_not_served", source="gce", key=key)
                    return
                if answer.status == 200 and answer.google:
                    failures = 0
                    event = self._event(key, answer.value)
                    if event is not None:
                        self._notice(ctx, event, scope)
                        return
                else:
                    status, answer = answer.status, None
                    failures += 1
                    await self._back_off(ctx, key, f"HTTP {status}", failures)
            # Once a value is known, wait for a change from it; else (at first, after a
            # failure) ask for the value now, so that a change meanwhile is not missed.
            etag = answer.etag if answer is not None else None
            try:
                answer = await self._get(ctx, thread, key, etag=etag, wait=answer is not None)
            except Exception as exc:  # never fail the training: retried after a backoff
                answer = None
                failures += 1
                await self._back_off(ctx, key, describe(exc), failures)

    def _event(self, key: str, value: str) -> str | None:
        """What ``value`` of ``key`` announces (``None``: nothing)."""
        if key == _PREEMPTED:
            return "preempted" if value.upper() == "TRUE" else None
        return value if value and value.upper() != "NONE" else None

    def _notice(self, ctx: EngineContext, event: str, scope: anyio.CancelScope) -> None:
        if not self._noticed:
            self._noticed = True
            log.warning("preemption.notice", source="gce", notice=event)
            ctx.notice_preemption(STOP_REASON)  # agreed with the cluster, as a signal is
        scope.cancel()  # the other key's watch ends too

    async def _back_off(self, ctx: EngineContext, key: str, error: str, failures: int) -> None:
        secs = min(self.max_backoff_secs, self.backoff_secs * 2 ** min(failures - 1, 30))
        if failures == 1:
            log.warning("preemption.poll_failed", source="gce", key=key, error=error, retry_in_secs=secs)
        else:
            log.debug(
                "preemption.poll_failed", source="gce", key=key, error=error, retry_in_secs=secs, failures=failures
            )
        await ctx.clock.sleep_until(ctx.clock.now() + secs)

    async def _get(
        self, ctx: EngineContext, thread: DedicatedThread, key: str, *, etag: str | None, wait: bool = False
    ) -> _Answer:
        path = f"/computeMetadata/v1/{key}"
        if wait:
            path += f"?wait_for_change=true&timeout_sec={self.wait_secs}"
            if etag:
                path += f"&last_etag={quote(etag, safe='')}"
        get = _HangingGet(self.host, path, read_secs=self.wait_secs + 10.0)
        answer: _Answer = await thread.submit(get).wait(get.abort, grace_secs=ctx.stop_grace_secs)
        return answer
