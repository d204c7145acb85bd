"""The file system of a URL logdir, with an event loop of the session's own.

fsspec's asynchronous implementations (``s3fs``, ``gcsfs``, ``adlfs``) run their
coroutines on a loop in a background thread; by default a process-wide one that is never
joined. :class:`RemoteFS` gives the file system a loop on a thread of its own
(``asv-remote-io``) and :meth:`RemoteFS.close` closes the HTTP sessions on it, stops it and
joins it, so that no thread outlives ``managed_session()``. Synchronous implementations
(``memory://``, ``file://``) need no loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ...._logging import describe, get_logger

__all__ = ["RemoteFS"]

log = get_logger(__name__)


class RemoteFS:
    """An fsspec file system for ``url`` (see the module docstring).

    Attributes:
        fs: the file system.
        root: the logdir's path on it (no protocol, no trailing ``/``).
    """

    def __init__(self, url: str) -> None:
        import fsspec
        from fsspec.asyn import AsyncFileSystem

        scheme = url.split("://", 1)[0]
        cls = fsspec.get_filesystem_class(scheme)
        self.url = url
        self.root = str(cls._strip_protocol(url)).rstrip("/")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        kwargs: dict[str, Any] = {"skip_instance_cache": True}
        if issubclass(cls, AsyncFileSystem):
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=_run_loop, args=(loop,), name="asv-remote-io", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
            kwargs["loop"] = loop
        try:
            self.fs = cls(**kwargs)
        except BaseException:
            self.close()
            raise

    def path(self, name: str) -> str:
        """The full path of ``name`` under the root."""
        return f"{self.root}/{name}"

    def put_file(self, local: str, remote: str, check: Callable[[], None]) -> None:
        """Upload ``local`` to ``remote`` as the implementation does best (multipart, in
        parallel where it can); ``check`` is called every 0.1 s meanwhile, and what it
        raises cancels the upload in flight (an asynchronous implementation's coroutine
        is cancelled mid-file) and propagates."""
        loop = self._loop
        if loop is None:
            check()
            self.fs.put_file(local, remote)
            return
        future = asyncio.run_coroutine_threadsafe(self.fs._put_file(local, remote), loop)
        while True:
            try:
                future.result(timeout=0.1)
            except concurrent.futures.TimeoutError:
                try:
                    check()
                except BaseException:
                    future.cancel()
                    self._abort_partial(remote)
                    raise
            else:
                return

    def _abort_partial(self, remote: str) -> None:
        """After a cancelled upload: abort the multipart upload it left (S3 keeps, and bills,
        the parts of one that is neither completed nor aborted; s3fs aborts only on an
        error, not on a cancellation). Best effort, S3 only."""
        fs, loop = self.fs, self._loop
        if loop is None or not hasattr(fs, "_list_multipart_uploads") or not hasattr(fs, "_abort_mpu"):
            return

        async def abort() -> None:
            bucket, key, _ = fs.split_path(remote)
            for upload in await fs._list_multipart_uploads(bucket):
                if upload.get("Key") == key:
                    await fs._abort_mpu(bucket, key, upload["UploadId"])

        try:
            asyncio.run_coroutine_threadsafe(abort(), loop).result(timeout=10)
        except Exception as exc:  # an S3 lifecycle rule is the backstop
            log.debug("remote.abort_failed", path=remote, error=describe(exc))

    def close(self) -> None:
        """Close the HTTP sessions, stop the loop and join its thread (idempotent)."""
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        fs = getattr(self, "fs", None)

        async def close_sessions() -> None:
            # A cancelled upload's task may still be unwinding (and about to open or close a
            # connection): it ends first, so that nothing opens a connection after the sweep.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            if others:
                await asyncio.wait(others, timeout=2)
            for name, closing in _session_closers(fs):
                try:
                    await closing()
                except Exception as exc:  # the next one still closes, and the sweep still runs
                    log.debug("remote.close_failed", what=name, error=describe(exc))
            await asyncio.sleep(0.05)  # closed connections finish closing (aiohttp's advice) before the loop stops
            await asyncio.get_running_loop().shutdown_default_executor()  # its DNS lookups' threads

        if thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(close_sessions(), loop).result(timeout=5)
            except Exception as exc:  # best effort: the process may be ending anyway
                log.debug("remote.close_failed", error=describe(exc))
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)


def _session_closers(fs: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The coroutine functions that close ``fs``'s HTTP clients, whichever it has."""
    closers: list[tuple[str, Callable[[], Any]]] = []
    close_resources = getattr(fs, "_close_resources", None)  # gcsfs's gRPC clients
    if close_resources is not None:
        closers.append(("resources", close_resources))
    s3 = getattr(fs, "_s3", None)  # s3fs: an aiobotocore client
    if s3 is not None:
        closers.append(("s3 client", lambda: s3.__aexit__(None, None, None)))
    session = getattr(fs, "_session", None)  # gcsfs: an aiohttp session
    if session is not None and hasattr(session, "close") and not getattr(session, "closed", True):
        closers.append(("session", session.close))
    closers.extend(_loop_finalizers(fs))  # adlfs: its service client and credential
    return closers


def _loop_finalizers(fs: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The closers an implementation registered as ``weakref.finalize(fs, fsspec.asyn.sync,
    loop, close, ...)`` (adlfs: its Azure service client and credential), detached and
    returned as coroutine functions to await on the loop now.

    Such a finalizer holds ``fs`` itself, so it runs only at interpreter exit, on a loop
    that :meth:`RemoteFS.close` has stopped by then ("Loop is not running", the clients'
    connections left unclosed). ``weakref.finalize`` lists its finalizers only in a
    private registry; without it nothing is detached (the exit-time noise stays).
    """
    from fsspec.asyn import sync

    registry = getattr(weakref.finalize, "_registry", None)
    if fs is None or not isinstance(registry, dict):
        return []
    found: list[tuple[str, Callable[[], Any]]] = []
    for finalizer in list(registry):
        info = finalizer.peek()
        if info is None or info[0] is not fs or info[1] is not sync or len(info[2]) < 2:
            continue
        detached = finalizer.detach()
        if detached is not None:
            _, _, (_, close, *args), kwargs = detached
            found.append((getattr(close, "__name__", "finalizer"), functools.partial(close, *args, **kwargs)))
    return found


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The ``asv-remote-io`` thread: run ``loop`` until :meth:`RemoteFS.close` stops it,
    then close it here, on its own thread. A connection left open (one of a cancelled
    upload may still hold unsent bytes and wait for the peer to take them, or be closed
    without its last callback having run) is aborted and its socket closed before the
    loop closes: every transport on this loop is ours, and none is left to the garbage
    collector."""
    try:
        loop.run_forever()
    finally:
        try:
            for transport in list(getattr(loop, "_transports", {}).values()):
                # One closing with bytes unsent drops them and closes now; aborting one
                # already closed raises (it has let go of its loop): nothing to do there.
                with contextlib.suppress(Exception):
                    transport.abort()
            loop.run_until_complete(asyncio.sleep(0))  # their connection_lost: sockets closed
        except Exception as exc:
            log.debug("remote.close_failed", what="transports", error=describe(exc))
        finally:
            loop.close()
