"""The file system of a URL logdir, with an event loop of the session's own, and a bound
on every wait for it.

fsspec's asynchronous implementations (``s3fs``, ``gcsfs``, ``adlfs``) run their
coroutines on a loop in a background thread; by default a process-wide one that is never
joined. :class:`RemoteFS` gives the file system a loop on a thread of its own
(``asv-remote-io``) and :meth:`RemoteFS.close` closes the HTTP sessions on it, stops it and
joins it, so that no thread outlives ``managed_session()``. Synchronous implementations
(``memory://``, ``file://``) need no loop.

Every call the remote tier makes goes through :class:`RemoteFS`'s own methods
(``ls``, ``cat_file``, ``pipe_file``, ``rm_file``, ``get_file``, ``put_file``): the
calling thread waits for the coroutine in slices of 0.1 s, and between them asks the
:class:`Bound` it runs under (``with io.bounded(Bound(...))``) whether it waited too long
in all (``total``) or without progress (``idle``: a call answered, a part of a file
sent): then the call is cancelled on the loop and :class:`StorageUnreachableError` is
raised. The libraries' own connect and read timeouts and retries stay as they are
(s3fs: 5 s, 15 s, five tries of botocore's); the bound is what makes the sum finite.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ...._exceptions import StorageUnreachableError
from ...._logging import describe, get_logger

__all__ = ["Bound", "RemoteFS"]

log = get_logger(__name__)


class Bound:
    """How long the calls of a piece of remote work may wait (see the module docstring).

    Args:
        what: the work, for the error (``"the start's checks"``).
        total: seconds the whole work may take (``None``: no limit).
        idle: seconds it may go without progress (``None``: no limit).
        stall: after this many seconds without progress, ``on_stall(True)`` is called
            once (the work goes on); at the next progress, ``on_stall(False)``.
        until: the seconds left before the work must have ended, asked anew each time
            (a moving deadline: the lease's expiry, pushed on by each renewal).
        clock: the time source (monotonic seconds).
    """

    def __init__(
        self,
        what: str,
        *,
        total: float | None = None,
        idle: float | None = None,
        stall: float | None = None,
        on_stall: Callable[[bool], None] | None = None,
        until: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.total = total
        self.idle = idle
        self.stall = stall
        self.on_stall = on_stall
        self.until = until
        self.clock = clock
        self.started = self.last_progress = clock()
        self.stalled = False

    def progress(self) -> None:
        """Something answered (any thread)."""
        self.last_progress = self.clock()
        if self.stalled:
            self.stalled = False
            if self.on_stall is not None:
                self.on_stall(False)

    def check(self, url: str) -> None:
        """Raise if the work waited too long; report a stall once.

        Raises:
            StorageUnreachableError: naming ``url``, the work and the bound.
        """
        now = self.clock()
        if self.total is not None and now - self.started > self.total:
            raise StorageUnreachableError(
                f"{url} is unreachable: {self.what} got no answer within {self.total:g} s "
                "(ASUPERVISOR_REMOTE_TIMEOUT_SECS); check the endpoint, the network and the credentials"
            )
        if self.until is not None and self.until() <= 0:
            raise StorageUnreachableError(
                f"{url}: {self.what} did not finish in time; it was cut (it is retried once the remote answers)"
            )
        quiet = now - self.last_progress
        if self.stall is not None and not self.stalled and quiet > self.stall:
            self.stalled = True
            if self.on_stall is not None:
                self.on_stall(True)
        if self.idle is not None and quiet > self.idle:
            raise StorageUnreachableError(
                f"{url} is unreachable: {self.what} made no progress for {self.idle:g} s "
                "(ASUPERVISOR_REMOTE_TIMEOUT_SECS)"
            )


def _progress_callback(bounds: list[Bound]) -> Any:
    """An fsspec callback that counts each part sent or received as progress, for every
    bound the call runs under."""
    from fsspec.callbacks import Callback

    class _Progress(Callback):  # type: ignore[misc]
        def call(self, *args: Any, **kwargs: Any) -> None:
            for bound in bounds:
                bound.progress()

    return _Progress()


def create_only(fs: Any, path: str, value: bytes) -> None:
    """Write ``value`` at ``path`` only if no object is there: the one conditional write
    (the lease's create; ``fs`` an fsspec file system or a :class:`RemoteFS`).

    fsspec's ``pipe_file(..., mode="create")``, which each backend maps onto its own
    precondition: S3 (s3fs) ``If-None-Match: *``, GCS (gcsfs) ``ifGenerationMatch=0``,
    Azure (adlfs) ``If-None-Match: *``; the local and memory file systems an exclusive
    create. What each guarantees, checked by ``tests/remote/`` per backend: S3 (moto) and
    Azure (Azurite) refuse a second create; the GCS emulator ignores the precondition
    (a strict xfail: real GCS honours it).

    Raises:
        FileExistsError: an object is there already (another writer created it first).
    """
    fs.pipe_file(path, value, mode="create")


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
        self._local = threading.local()
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

    # -- bounded calls (any thread but the loop's) --------------------------------------

    @contextlib.contextmanager
    def bounded(self, bound: Bound) -> Iterator[Bound]:
        """The calls this thread makes in the block wait no longer than ``bound`` says."""
        stack = self._bounds()
        stack.append(bound)
        try:
            yield bound
        finally:
            stack.remove(bound)

    def _bounds(self) -> list[Bound]:
        stack: list[Bound] | None = getattr(self._local, "bounds", None)
        if stack is None:
            stack = self._local.bounds = []
        return stack

    def _call(self, name: str, *args: Any, check: Callable[[], None] | None = None, **kwargs: Any) -> Any:
        """``fs.<name>(*args, **kwargs)``, waited for under this thread's bounds."""
        if self._loop is None:  # a synchronous implementation (memory://): no network
            if check is not None:
                check()
            return getattr(self.fs, name)(*args, **kwargs)
        return self._wait(getattr(self.fs, "_" + name)(*args, **kwargs), check)

    def _wait(self, coro: Any, check: Callable[[], None] | None = None, timeout: float | None = None) -> Any:
        """Run ``coro`` on the loop and wait for it under this thread's bounds (and
        ``timeout`` seconds, when given: then ``TimeoutError``); what ``check`` raises
        cancels it and propagates."""
        loop = self._loop
        assert loop is not None
        bounds = list(self._bounds())
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        ends = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                try:
                    result = future.result(timeout=0.1)
                except concurrent.futures.TimeoutError:
                    if check is not None:
                        check()
                    for bound in bounds:
                        bound.check(self.url)
                    if ends is not None and time.monotonic() > ends:
                        raise TimeoutError(f"{self.url}: no answer within {timeout:g} s") from None
                else:
                    break
        except BaseException:
            future.cancel()
            raise
        for bound in bounds:
            bound.progress()
        return result

    def ls(self, path: str, detail: bool = True) -> Any:
        """``fs.ls``, bounded."""
        return self._call("ls", path, detail=detail)

    def invalidate_cache(self, path: str | None = None) -> None:
        """``fs.invalidate_cache`` (no network)."""
        self.fs.invalidate_cache(path)

    def cat_file(self, path: str) -> bytes:
        """``fs.cat_file``, bounded."""
        return bytes(self._call("cat_file", path))

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite") -> None:
        """``fs.pipe_file``, bounded (``mode="create"``: :func:`create_only`'s)."""
        if mode == "overwrite":
            self._call("pipe_file", path, value)
        else:
            self._call("pipe_file", path, value, mode=mode)

    def rm_file(self, path: str) -> None:
        """``fs.rm_file``, bounded."""
        self._call("rm_file", path)

    def get_file(self, remote: str, local: str) -> None:
        """Download ``remote`` to ``local``, bounded (each part received is progress)."""
        self._call("get_file", remote, local, callback=_progress_callback(list(self._bounds())))

    def put_file(
        self, local: str, remote: str, check: Callable[[], None] | None = None, *, abort_cut: bool = True
    ) -> None:
        """Upload ``local`` to ``remote`` as the implementation does best (multipart, in
        parallel where it can), bounded (each part sent is progress); ``check`` is called
        every 0.1 s meanwhile, and what it raises cancels the upload in flight (an
        asynchronous implementation's coroutine is cancelled mid-file) and propagates.
        A cut upload's multipart upload is aborted (S3 keeps, and bills, the parts of one
        that is neither completed nor aborted; s3fs aborts only on an error, not on a
        cancellation), unless ``abort_cut`` is false (the caller does it, fenced)."""
        if self._loop is None:
            self._call("put_file", local, remote, check=check)
            return
        callback = _progress_callback(list(self._bounds()))
        try:
            self._call("put_file", local, remote, check=check, callback=callback)
        except BaseException:
            if abort_cut:
                self.abort_cut(remote)
            raise

    def abort_cut(self, remote: str) -> None:
        """After a cancelled upload: abort the multipart upload it left. Best effort, S3 only."""
        try:
            self.abort_multipart(remote, exact=True, timeout=10)
        except Exception as exc:  # the next start, and an S3 lifecycle rule, are the backstops
            log.debug("remote.abort_failed", path=remote, error=describe(exc))

    def abort_multipart(self, prefix: str, *, exact: bool = False, timeout: float = 30) -> list[str]:
        """Abort the multipart uploads in progress under ``prefix`` (a path: bucket and key
        prefix; ``exact``: that key only); the keys aborted. S3 only (elsewhere: none, an
        interrupted resumable upload expires by itself)."""
        fs, loop = self.fs, self._loop
        if loop is None or not hasattr(fs, "_call_s3") or not hasattr(fs, "_abort_mpu"):
            return []

        async def abort() -> list[str]:
            bucket, key, _ = fs.split_path(prefix)
            if not exact and key:
                key = key.rstrip("/") + "/"  # the logdir's objects, not a sibling's
            aborted: list[str] = []
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key}
            while True:
                page = await fs._call_s3("list_multipart_uploads", **kwargs)
                for upload in page.get("Uploads", []) or []:
                    if upload.get("Key") == key or not exact:
                        await fs._abort_mpu(bucket, upload["Key"], upload["UploadId"])
                        aborted.append(str(upload["Key"]))
                if not page.get("IsTruncated"):
                    return aborted
                kwargs["KeyMarker"] = page.get("NextKeyMarker")
                kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker")

        aborted: list[str] = self._wait(abort(), timeout=timeout)
        return aborted

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
