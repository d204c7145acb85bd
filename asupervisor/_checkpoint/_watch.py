"""``watch_checkpoints``: each newly committed checkpoint, once, for sidecar evaluators.

An evaluator process (or task) follows a training's ``logdir``::

    async with asv.watch_checkpoints("runs/exp1", timeout=3600) as checkpoints:
        async for path in checkpoints:
            evaluate(path)        # tf.train.Checkpoint(...).restore(path)

Only committed checkpoints are seen: the watcher reads the ``checkpoint`` state file,
which names a checkpoint only after its files are complete and synced. A URL logdir
(``s3://``, ``gs://``, ...) is watched through its commit markers: each new committed
checkpoint is downloaded (verified against its marker) into a local directory, and its
local path is yielded; one that fails the check is skipped with a warning, once. Its files
are deleted at the first poll after the evaluator asked for the next one, so a day-long
watch keeps a few checkpoints on its disk, not all. The file is read on a short-lived
dedicated thread per poll (never on the event loop, and nothing is left running when the
loop over it is left early); time comes from an injectable clock.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import TracebackType

from .._core._clock import Clock, MonotonicClock
from .._core._handoff import LoopHandle
from .._core._threads import DedicatedThread
from .._exceptions import CheckpointError
from .._logging import describe, get_logger
from .store import PLAIN, names, open_remote_tier, open_store, state_file

__all__ = ["CheckpointWatcher", "watch_checkpoints"]

log = get_logger(__name__)


def _prune(done: list[str]) -> None:
    """Delete the files of downloaded checkpoints the evaluator is done with."""
    for prefix in done:
        for path in names.checkpoint_files(Path(prefix)):
            try:
                path.unlink()
            except OSError as exc:  # kept: the next poll does not retry, the disk keeps it
                log.warning("watch.prune_failed", path=str(path), error=describe(exc))


def _committed_remote(
    url: str, local: Path, after_step: int, done: list[str], damaged: set[tuple[str, float]]
) -> list[str]:
    """The remote's committed checkpoints newer than ``after_step``, oldest first, each
    downloaded into ``local``; their local paths. The downloads in ``done`` (yielded
    before the evaluator asked for the next one) are deleted first. A checkpoint whose
    bytes do not match its marker is skipped, logged once, and added to ``damaged`` (by
    name and commit time: a new upload under its name is tried again)."""
    _prune(done)
    tier = open_remote_tier(url, local, basename=None, keep_policy=None, owner=False)
    try:
        tier.open()
        store = open_store(local, PLAIN)  # the download's commit: plain file calls
        newer = [m for _, m in tier.committed() if m.step > after_step]
        fetched = []
        for marker in sorted(newer, key=lambda m: m.step):
            key = (marker.name, marker.committed_at)
            if key in damaged:
                continue
            try:
                fetched.append(str(tier.fetch(store, marker)))
            except CheckpointError as exc:  # its bytes are not what was committed
                damaged.add(key)
                log.warning("watch.checkpoint_damaged", logdir=url, checkpoint=marker.name, problem=str(exc))
        return fetched
    finally:
        tier.close()


def _committed(logdir: Path) -> list[str]:
    """Committed checkpoint prefixes named in the state file, oldest first (absolute)."""
    state = state_file.read_state(logdir)
    if state is None:
        return []
    out = []
    for rel in state.paths:
        path = Path(rel) if os.path.isabs(rel) else logdir / rel
        if Path(f"{path}.index").exists():
            out.append(str(path))
    return out


class CheckpointWatcher:
    """Async iterator over newly committed checkpoints of one directory.

    Create it with :func:`watch_checkpoints`. Also an async context manager, for
    symmetry with other resources; it holds nothing between polls.
    """

    def __init__(
        self,
        logdir: Path | str,
        *,
        timeout: float | None,
        interval_secs: float,
        clock: Clock | None,
        local_dir: Path | None = None,
    ) -> None:
        self.logdir = logdir
        self.local_dir = local_dir
        self.timeout = timeout
        self.interval_secs = interval_secs
        self._clock = clock
        self._seen_step = -1
        self._seen: set[str] = set()
        self._pending: list[str] = []
        self._done: list[str] = []  # a URL logdir's downloads yielded before the last one
        self._damaged: set[tuple[str, float]] = set()  # a URL logdir's checkpoints that failed their checksum
        self._yielded: str | None = None

    def __aiter__(self) -> CheckpointWatcher:
        return self

    async def __aenter__(self) -> CheckpointWatcher:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def _poll(self) -> list[str]:
        thread = DedicatedThread("asv-watch-checkpoints", LoopHandle())
        thread.start()
        try:
            if self.local_dir is not None:  # a URL logdir
                done, self._done = self._done, []
                remote: list[str] = await thread.call(
                    _committed_remote, str(self.logdir), self.local_dir, self._seen_step, done, self._damaged
                )
                return remote
            committed: list[str] = await thread.call(_committed, self.logdir)
            return committed
        finally:
            await thread.aclose()

    async def __anext__(self) -> str:
        """The next checkpoint committed after the last one yielded.

        Raises:
            StopAsyncIteration: ``timeout`` seconds passed without a new checkpoint.
        """
        clock = self._clock = self._clock or MonotonicClock()
        deadline = math.inf if self.timeout is None else clock.now() + self.timeout
        while not self._pending:
            for path in await self._poll():
                step = names.step_of(os.path.basename(path))
                if path in self._seen or (step is not None and step <= self._seen_step):
                    continue
                self._pending.append(path)
            if self._pending:
                break
            now = clock.now()
            if now >= deadline:
                log.info("watch.timeout", logdir=str(self.logdir), timeout_secs=self.timeout)
                raise StopAsyncIteration
            await clock.sleep_until(min(deadline, now + self.interval_secs))
        path = self._pending.pop(0)
        if self.local_dir is not None and self._yielded is not None:
            self._done.append(self._yielded)  # asking for the next one: done with the last
        self._yielded = path
        self._seen.add(path)
        step = names.step_of(os.path.basename(path))
        if step is not None:
            self._seen_step = max(self._seen_step, step)
        log.info("watch.checkpoint", path=path, step=step)
        return path


def watch_checkpoints(
    logdir: str | os.PathLike[str],
    *,
    timeout: float | None = None,
    interval_secs: float = 1.0,
    clock: Clock | None = None,
    local_dir: str | os.PathLike[str] | None = None,
) -> CheckpointWatcher:
    """Yield each newly committed checkpoint path in ``logdir`` once, oldest first.

    The first iteration yields the checkpoints already committed (those the state file
    still lists), then waits for new ones, checking every ``interval_secs``.

    Args:
        logdir: the training's log directory (it may not exist yet).
        timeout: stop after this many seconds without a new checkpoint; ``None`` waits
            forever.
        interval_secs: seconds between checks of the state file.
        clock: time source (tests pass a manual clock).
        local_dir: for a URL logdir, where its checkpoints are downloaded (default:
            under ``$XDG_CACHE_HOME/asupervisor``, apart from a training's own). A
            yielded checkpoint's files stay until the one after it is asked for.

    Returns:
        An async iterator of checkpoint path prefixes, each restorable with
        ``tf.train.Checkpoint(...).restore(path)`` (local paths, for a URL logdir too).

    Raises:
        ValueError: ``timeout`` or ``interval_secs`` is negative or not a number, or
            ``logdir`` is a file.
    """
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0):
        raise ValueError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
    if (
        isinstance(interval_secs, bool)
        or not isinstance(interval_secs, (int, float))
        or not (interval_secs > 0 and math.isfinite(interval_secs))
    ):
        raise ValueError(f"interval_secs must be a positive number of seconds, got {interval_secs!r}")
    from .store import check_url, default_local_dir, is_url

    if is_url(logdir):
        url = check_url(str(logdir))
        local = Path(local_dir) if local_dir is not None else default_local_dir(url, "watch")
        return CheckpointWatcher(url, timeout=timeout, interval_secs=float(interval_secs), clock=clock, local_dir=local)
    if local_dir is not None:
        raise ValueError(f"local_dir={str(local_dir)!r} is for URL logdirs; logdir {str(logdir)!r} is local")
    path = Path(logdir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"logdir {str(path)!r} exists and is not a directory")
    return CheckpointWatcher(path, timeout=timeout, interval_secs=float(interval_secs), clock=clock)
