"""One owner per URL logdir: a lease object, created with a conditional write.

Object stores have no locks; they do have create-only writes (S3's ``If-None-Match: *``,
GCS's ``ifGenerationMatch=0``; fsspec's ``pipe_file(..., mode="create")``). The leases
are numbered objects ``asupervisor.lease-<n>``: the newest is the current one. A training
takes the logdir by creating lease ``n + 1`` create-only, which one contender alone can
do, when lease ``n`` is released, expired (not renewed for ``ttl`` seconds), its own
(the same owner id: a create whose answer was lost, or a restart that kept the id in
its local directory), or held by a process of this host that is gone (:func:`_gone_here`);
otherwise it is refused, naming the owner. The owner renews its lease (overwrites its
own object) every ``ttl / 4`` seconds; at the end it marks it released.

Fencing: before each write to the remote the owner calls :meth:`RemoteLease.check`,
which lists the leases and raises :class:`LeaseLostError` once a newer lease exists (it
was presumed dead while cut off); from then on every check raises, and the training
writes nothing more there. An owner whose own renewals failed for longer than the ttl
renews (re-checking) before it writes again.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from ...._exceptions import CheckpointError, LeaseLostError
from ...._logging import get_logger
from ._io import create_only
from ._settings import lease_secs

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

__all__ = ["LEASE_PREFIX", "RemoteLease", "describe_lease"]

log = get_logger(__name__)

LEASE_PREFIX = "asupervisor.lease-"
#: the share of the ttl after its last renewal in which an owner's write must end
_HELD_SHARE = 0.8


def describe_lease(body: dict[str, Any], now: float) -> str:
    """``host h pid p, renewed 12 s ago`` for a log line or an error."""
    ago = now - float(body.get("renewed", 0))
    return f"host {body.get('host')} pid {body.get('pid')}, renewed {ago:.0f} s ago"


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _pidns() -> str | None:
    """This process's pid namespace (``/proc/self/ns/pid``'s inode), or ``None``."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def _lock_free(path: str) -> bool:
    """Whether the local owner lock file ``path`` exists here and nobody holds it (its
    holder, whatever its pid namespace, is gone: the kernel dropped its ``flock``)."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held (or no locks here): it may be alive
    finally:
        os.close(fd)  # the probe's lock, if taken, goes with it
    return True


def _gone_here(body: dict[str, Any], own_lock: str | None) -> bool:
    """Whether the lease ``body`` is held by a process of this host that no longer runs
    (a SIGKILLed training restarted on the same machine, or in a restarted container,
    need not wait for the ttl). Same host name, then any of: the machine rebooted since
    (its boot id differs); the holder's local owner lock is ours now, or free; the holder
    ran in this pid namespace and its pid is gone. POSIX only: elsewhere
    ``os.kill(pid, 0)`` is no probe (on Windows it ends the process)."""
    if os.name != "posix" or body.get("host") != socket.gethostname():
        return False
    boot = _read_text("/proc/sys/kernel/random/boot_id")
    if boot is not None and body.get("boot") not in (None, boot):
        return True
    lock = body.get("lock")
    if isinstance(lock, str) and lock:
        if own_lock is not None and os.path.realpath(lock) == os.path.realpath(own_lock):
            return True  # this training holds that lock now: its holder is gone
        if _lock_free(lock):
            return True
    pidns = _pidns()
    if body.get("pidns") is not None and body.get("pidns") != pidns:
        return False  # another pid namespace: its pid means nothing here
    try:
        os.kill(int(body.get("pid", 0)), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):
        return False
    return False  # alive


class RemoteLease:
    """The lease of one URL logdir (see the module docstring).

    Args:
        fs: the fsspec file system.
        root: the logdir's path on it.
        url: the logdir's URL (for messages).
        wall_clock: the time source of lease times.
        owner_id: this owner's id (kept in the local tier, so that a restart is the same
            owner); ``None``: a new one.
        own_lock: the local owner lock this training holds (``None``: none), recorded in
            the lease so that a restart of this host can tell its holder is gone.
    """

    def __init__(
        self,
        fs: Any,
        root: str,
        url: str,
        wall_clock: Callable[[], float] = time.time,
        *,
        owner_id: str | None = None,
        own_lock: str | None = None,
    ) -> None:
        self.fs = fs
        self.root = root
        self.url = url
        self.ttl = lease_secs()
        self.wall_clock = wall_clock
        self.number: int | None = None
        #: why this training may no longer write the remote (``None``: it may)
        self.lost: str | None = None
        self.own_lock = own_lock
        self._renewed_at = 0.0  # wall clock of the last write of our lease that answered
        self._me: dict[str, Any] = {
            "owner": owner_id or uuid.uuid4().hex,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pidns": _pidns(),
            "boot": _read_text("/proc/sys/kernel/random/boot_id"),
            "lock": own_lock,
        }

    def held_for(self) -> float:
        """Seconds this training may still write as the holder, by its own clock: until
        ``0.8 x ttl`` after its last renewal that answered (a contender takes over only
        ``ttl`` after it, by its clock: the rest is room for clock skew). A write still in
        flight then is cut (:class:`._io.Bound`'s ``until``), so that none lands after a
        takeover."""
        return self._renewed_at + _HELD_SHARE * self.ttl - self.wall_clock()

    @property
    def owner_id(self) -> str:
        """This owner's id (in the lease object as ``owner``)."""
        return str(self._me["owner"])

    def _path(self, n: int) -> str:
        return f"{self.root}/{LEASE_PREFIX}{n:08d}"

    def _leases(self) -> list[int]:
        self.fs.invalidate_cache(self.root)
        try:
            names = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            base = str(name).rstrip("/").rsplit("/", 1)[-1]
            if base.startswith(LEASE_PREFIX) and base[len(LEASE_PREFIX) :].isdigit():
                out.append(int(base[len(LEASE_PREFIX) :]))
        return sorted(out)

    def _read(self, n: int) -> dict[str, Any]:
        try:
            body: Any = json.loads(self.fs.cat_file(self._path(n)))
        except FileNotFoundError:
            return {"released": True}
        except ValueError:
            return {}  # damaged: treated as expired
        return body if isinstance(body, dict) else {}

    def _body(self, now: float, *, released: bool = False) -> bytes:
        return json.dumps({**self._me, "renewed": now, "ttl": self.ttl, "released": released}).encode()

    def acquire(self) -> None:
        """Take the logdir, or raise naming its owner.

        Raises:
            CheckpointError: another live training holds the lease.
        """
        for _ in range(5):  # a contender may create the next lease first: look again
            leases = self._leases()
            current = leases[-1] if leases else 0
            now = self.wall_clock()
            if current:
                body = self._read(current)
                if body.get("owner") == self.owner_id and not body.get("released"):
                    self._adopt(current, leases)  # ours: an answer that was lost, or a restart
                    return
                if self._live(body, now) and not _gone_here(body, self.own_lock):
                    expires = float(body.get("renewed", 0) or 0) + self._ttl_of(body) - now
                    raise CheckpointError(
                        f"logdir {self.url} is in use by another training ({describe_lease(body, now)}; "
                        f"lease {self._path(current)}, expires in {max(0.0, expires):.0f} s): "
                        "two trainings in one logdir would overwrite each other's checkpoints; stop that one "
                        "or give this training another logdir"
                    )
                if not body.get("released"):
                    log.warning("remote.lease_taken_over", url=self.url, previous=describe_lease(body, now))
            try:
                create_only(self.fs, self._path(current + 1), self._body(now))
            except FileExistsError:
                continue  # another contender's, or ours whose answer was lost: the next look tells
            except Exception:
                # no answer (a timeout, a dropped connection, a conflict): the write may have
                # landed all the same; if the object is ours, the lease is
                if self._read(current + 1).get("owner") != self.owner_id:
                    raise
            self._renewed_at = now
            self._adopt(current + 1, leases, write=False)
            return
        raise CheckpointError(f"logdir {self.url}: could not take its lease (other trainings keep starting)")

    def _adopt(self, n: int, leases: list[int], *, write: bool = True) -> None:
        """Lease ``n`` is ours: keep its number (renewed now unless just written) and
        remove the older ones (history: only the newest matters)."""
        if write:
            now = self.wall_clock()
            self.fs.pipe_file(self._path(n), self._body(now))
            self._renewed_at = now
        self.number = n
        self.lost = None
        for old in leases:
            if old < n:
                self._remove(old)
        log.debug("remote.lease_taken", url=self.url, lease=n, owner=self.owner_id)

    def _remove(self, n: int) -> None:
        try:
            self.fs.rm_file(self._path(n))
        except FileNotFoundError:
            pass

    def _ttl_of(self, body: dict[str, Any]) -> float:
        return float(body.get("ttl", self.ttl) or self.ttl)

    def _live(self, body: dict[str, Any], now: float) -> bool:
        """Whether the lease ``body`` is held: not released, renewed within its ttl."""
        return not body.get("released") and now - float(body.get("renewed", 0) or 0) < self._ttl_of(body)

    def holder(self) -> str | None:
        """Who holds the lease now, or ``None`` (none, released or expired)."""
        leases = self._leases()
        if not leases:
            return None
        body = self._read(leases[-1])
        now = self.wall_clock()
        return describe_lease(body, now) if self._live(body, now) else None

    def renew(self) -> None:
        """Renew the lease (the renewal service, every ``ttl / 4`` seconds).

        Raises:
            LeaseLostError: another training took the logdir over (this one was
                presumed dead): this one must stop writing it.
        """
        self.check(renewing=True)
        now = self.wall_clock()
        assert self.number is not None
        self.fs.pipe_file(self._path(self.number), self._body(now))
        self._renewed_at = now

    def check(self, *, renewing: bool = False) -> None:
        """The fence, just before a write to the remote: whether this training still holds
        the lease (the newest lease object is its own). An owner whose renewals failed
        for so long that a write could no longer end in time (:meth:`held_for`) renews
        first.

        Raises:
            LeaseLostError: the lease is lost (now or before): write nothing.
        """
        if self.lost is not None:
            raise LeaseLostError(self.lost)
        if self.number is None:
            raise LeaseLostError(f"logdir {self.url}: this training holds no lease; it writes nothing there")
        newest = self._leases()
        if not newest or newest[-1] != self.number:
            body = self._read(newest[-1]) if newest else {}
            who = describe_lease(body, self.wall_clock()) if body else "its lease object is gone"
            self.lost = (
                f"logdir {self.url} was taken over by another training ({who}) while this one could not "
                "renew its lease in time; this training stops writing it and keeps its local checkpoints"
            )
            self.number = None
            raise LeaseLostError(self.lost)
        if not renewing and self.held_for() <= 0:
            self.renew()  # (nearly) expired by our clock, yet nobody took it: make it ours again first

    def release(self) -> None:
        """Mark the lease released (the next training takes over at once); idempotent."""
        n, self.number = self.number, None
        if n is None or self.lost is not None:
            return
        newest = self._leases()
        if newest and newest[-1] == n:
            self.fs.pipe_file(self._path(n), self._body(self.wall_clock(), released=True))
