"""The runner of a session's parts: which part implements which phase, worked out once.

``PartRunner`` does for :class:`~._abc.SessionPart` what ``HookRunner`` does for hooks
(and trio's instrumentation for instruments): it keeps, per method, only the parts that
override it, so a phase nobody implements is an empty tuple. Phase order is the
engine's (:mod:`._runtime`), not the order of the list of parts; within one phase the
parts run in the order given (stock hooks first, then the features in the order the
assembly names them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .._logging import describe, get_logger
from ._abc import SessionPart

if TYPE_CHECKING:
    from ._abc import SessionContext
    from ._services import Service
    from ._status import QueueStatistics

__all__ = ["PartRunner"]

log = get_logger(__name__)


def _overrides(part: SessionPart, name: str) -> bool:
    return getattr(type(part), name) is not getattr(SessionPart, name)


class PartRunner:
    """The parts of one session, by phase (see the module docstring)."""

    def __init__(self, parts: Iterable[SessionPart]) -> None:
        self.parts = tuple(parts)

        def having(name: str) -> tuple[SessionPart, ...]:
            return tuple(p for p in self.parts if _overrides(p, name))

        self._starters = having("start")
        self._services = having("services")
        self._extras = having("extra_attributes")
        self._restorers = having("restore")
        self._settlers = having("settle")
        self._triggered = having("on_step")
        self._signal_takers = having("on_signal")
        self._iterators = having("iterator_for")
        self._finals = having("final")
        self._closers = having("aclose")
        self._releasers = having("release")
        self._enders = having("ended")
        #: step-thread callables run before any snapshot of the state
        self.before_snapshot: tuple[Callable[[], None], ...] = tuple(
            p.before_snapshot for p in having("before_snapshot")
        )
        #: the parts' ``scalars`` methods
        self.scalar_sources: tuple[Callable[[], Mapping[str, float]], ...] = tuple(p.scalars for p in having("scalars"))
        self._queues = having("queues")
        self._wakers = tuple(p.wake for p in having("wake"))
        #: the lowest step at which a part's ``on_step`` is due (``math.inf``: none)
        self.next_trigger_step: float = math.inf
        self._due: list[float] = [math.inf] * len(self._triggered)

    @property
    def can_restore(self) -> bool:
        """Whether a part can restore a saved state now (there is a checkpoint directory)."""
        return any(part.restorable for part in self._restorers)

    @property
    def has_finals(self) -> bool:
        """Whether a part implements the ``final`` phase."""
        return bool(self._finals)

    def start(self, ctx: SessionContext) -> None:
        """On the loop, as the session is entered: every part's ``start``."""
        for part in self._starters:
            part.start(ctx)

    def services(self, ctx: SessionContext) -> list[Service]:
        """The parts' services, in order."""
        return [service for part in self._services for service in part.services(ctx)]

    def extra_attributes(self, ctx: SessionContext) -> dict[Any, Callable[[], Any]]:
        """The capabilities the parts offer (a later part does not replace an earlier one)."""
        attributes: dict[Any, Callable[[], Any]] = {}
        for part in self._extras:
            for key, getter in part.extra_attributes(ctx).items():
                attributes.setdefault(key, getter)
        return attributes

    def restore(self, ctx: SessionContext, *, recovering: bool = False) -> str | None:
        """On the step thread: each restoring part in turn; the first path restored."""
        restored: str | None = None
        for part in self._restorers:
            path = part.restore(ctx, recovering=recovering)
            restored = restored or path
        return restored

    async def settle(self, ctx: SessionContext) -> None:
        """On the loop, before a recovery's restore."""
        for part in self._settlers:
            await part.settle(ctx)

    def arm(self, step: int) -> None:
        """On the step thread: ask every triggered part when it is due next."""
        self._due = [part.next_trigger(step) for part in self._triggered]
        self.next_trigger_step = min(self._due, default=math.inf)

    def fire(self, ctx: SessionContext, step: int) -> None:
        """On the step thread, once ``step >= next_trigger_step``: the due parts' ``on_step``."""
        for i, part in enumerate(self._triggered):
            if step >= self._due[i]:
                self._due[i] = part.next_trigger(step)
                part.on_step(ctx)
        self.next_trigger_step = min(self._due, default=math.inf)

    def take_signal(self, ctx: SessionContext, name: str) -> bool:
        """On the loop, at the first signal: whether a part took the stop over."""
        return any(part.on_signal(ctx, name) for part in self._signal_takers)

    def iterator_for(
        self, ctx: SessionContext, data: Any, checkpoint_iterator: bool | None, *, fresh: bool = False
    ) -> Iterator[Any] | None:
        """On the step thread: the first part's iterator over ``data``, or ``None``."""
        for part in self._iterators:
            iterator = part.iterator_for(ctx, data, checkpoint_iterator, fresh=fresh)
            if iterator is not None:
                return iterator
        return None

    def check_before_snapshot(self) -> None:
        """On the step thread: every ``before_snapshot``; raises what one raises."""
        for check in self.before_snapshot:
            check()

    def queues(self) -> dict[str, QueueStatistics]:
        """Every part's queue statistics."""
        return {name: stats for part in self._queues for name, stats in part.queues().items()}

    def wake(self) -> None:
        """Any thread: release step-thread waits (a stop, a halted ``run_loop``)."""
        for wake in self._wakers:
            wake()

    @property
    def releasers(self) -> tuple[SessionPart, ...]:
        """The parts with a ``release`` phase."""
        return self._releasers

    def release(self) -> None:
        """Every part's ``release`` (see :meth:`SessionPart.release`)."""
        for part in self._releasers:
            part.release()

    def ended(self) -> None:
        """Every part's ``ended`` (see :meth:`SessionPart.ended`); one failing does not
        keep the others from theirs (the failure is logged)."""
        for part in self._enders:
            try:
                part.ended()
            except Exception as exc:  # the session has ended: nothing left to fail
                log.error("session.part_end_failed", part=type(part).__name__, error=describe(exc))

    @property
    def finals(self) -> tuple[SessionPart, ...]:
        """The parts with a ``final`` phase, in order."""
        return self._finals

    @property
    def closers(self) -> tuple[SessionPart, ...]:
        """The parts with an ``aclose`` phase, in order."""
        return self._closers
