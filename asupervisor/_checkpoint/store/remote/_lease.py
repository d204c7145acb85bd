"""One owner per URL logdir: a lease object, created with a conditional write.

Object stores have no locks; they do have create-only writes (S3's ``If-None-Match: *``,
GCS's ``ifGenerationMatch=0``; fsspec's ``pipe_file(..., mode="create")``). The leases
are numbered objects ``asupervisor.lease-<n>``: the newest is the current one. A training
takes the logdir by creating lease ``n + 1`` create-only, which one contender alone can
do, when lease ``n`` is released, expired (not renewed for ``ttl`` seconds), or held by
a dead process of this host; otherwise it is refused, naming the owner. The owner renews
its lease (overwrites its own object) every ``ttl / 4`` seconds and finds out there that
it lost it (a newer lease exists: it was presumed dead); at the end it marks it released.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from ...._exceptions import CheckpointError
from ...._logging import get_logger

__all__ = ["LEASE_PREFIX", "RemoteLease", "describe_lease"]

log = get_logger(__name__)

LEASE_PREFIX = "asupervisor.lease-"
#: seconds a lease lasts without renewal (``ASUPERVISOR_LEASE_SECS`` overrides it)
DEFAULT_TTL = 60.0


def _ttl() -> float:
    raw = os.environ.get("ASUPERVISOR_LEASE_SECS")
    if raw is None:
        return DEFAULT_TTL
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"ASUPERVISOR_LEASE_SECS must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"ASUPERVISOR_LEASE_SECS must be > 0, got {raw!r}")
    return value


def describe_lease(body: dict[str, Any], now: float) -> str:
    """``host h pid p, renewed 12 s ago`` for a log line or an error."""
    ago = now - float(body.get("renewed", 0))
    return f"host {body.get('host')} pid {body.get('pid')}, renewed {ago:.0f} s ago"


def _pid_dead_here(body: dict[str, Any]) -> bool:
    """Whether the lease ``body`` is held by a process of this host that no longer runs
    (a SIGKILLed training restarted on the same machine need not wait for the ttl).
    POSIX only: elsewhere ``os.kill(pid, 0)`` is no probe (on Windows it ends the process)."""
    if os.name != "posix":
        return False
    if body.get("host") != socket.gethostname():
        return False
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
    """

    def __init__(self, fs: Any, root: str, url: str, wall_clock: Callable[[], float] = time.time) -> None:
        self.fs = fs
        self.root = root
        self.url = url
        self.ttl = _ttl()
        self.wall_clock = wall_clock
        self.number: int | None = None
        self._me = {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid()}

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
                if self._live(body, now) and not _pid_dead_here(body):
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
                self.fs.pipe_file(self._path(current + 1), self._body(now), mode="create")
            except FileExistsError:
                continue
            self.number = current + 1
            for old in leases:  # history: only the newest matters
                self._remove(old)
            log.debug("remote.lease_taken", url=self.url, lease=self.number)
            return
        raise CheckpointError(f"logdir {self.url}: could not take its lease (other trainings keep starting)")

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
            CheckpointError: another training took the logdir over (this one was
                presumed dead): this one must stop writing it.
        """
        assert self.number is not None
        newest = self._leases()
        if newest and newest[-1] > self.number:
            body = self._read(newest[-1])
            self.number = None
            raise CheckpointError(
                f"logdir {self.url} was taken over by another training ({describe_lease(body, self.wall_clock())}) "
                "while this one was not renewing its lease in time; this training stops writing it"
            )
        self.fs.pipe_file(self._path(self.number), self._body(self.wall_clock()))

    def release(self) -> None:
        """Mark the lease released (the next training takes over at once); idempotent."""
        n, self.number = self.number, None
        if n is None:
            return
        newest = self._leases()
        if newest and newest[-1] == n:
            self.fs.pipe_file(self._path(n), self._body(self.wall_clock(), released=True))
