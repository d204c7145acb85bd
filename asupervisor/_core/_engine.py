"""What the engine's own pieces see of the session: the :class:`Engine` protocol.

The step loop (:mod:`._steps`), the step-error semantics (:mod:`._step_errors`) and the
session handle (:mod:`._session`) work on the running session through this protocol,
which :class:`~._runtime.Runtime` implements, so none of them imports ``_runtime`` (no
import circle, type-only ones included). Features never use it: they see
:class:`~._abc.SessionContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ._abc import SessionContext

if TYPE_CHECKING:
    from ._abc import EngineConfig
    from ._divergence import DivergenceWatch, RollbackCounts
    from ._epochs import EpochCounter
    from ._goodput import TimeAccount
    from ._parts import PartRunner
    from ._release import Retired
    from ._stop import StopControl
    from ._watchdog import Beat

__all__ = ["Engine", "HookCalls", "StepBodies", "StepErrorHandling"]


class HookCalls(Protocol):
    """What the step loop uses of ``HookRunner``."""

    per_step: bool

    def run_step(
        self,
        control: StopControl,
        session: Any,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        step_done: Callable[[Any], int],
    ) -> Any:
        """One step with hooks around it."""
        ...


class StepErrorHandling(Protocol):
    """What the step loop and the session use of ``StepErrors``."""

    recovering: bool

    def note(self, exc: BaseException, *, recoverable: bool = True) -> None:
        """On the step thread: a step raised ``exc``."""
        ...

    def step_fn_failed(self, exc: BaseException) -> None:
        """On the step thread: a ``run_step_fn`` step function raised ``exc`` itself."""
        ...

    async def recover(self, exc: BaseException) -> bool:
        """On the loop: restore and return whether to retry the step."""
        ...

    def step_failed(self, exc: BaseException) -> bool:
        """On the loop: stop after ``exc``; whether it was the end of the data."""
        ...

    async def restore_latest(self) -> str | None:
        """On the loop: restore the latest checkpoint; its path or ``None``."""
        ...


class StepBodies(Protocol):
    """What the session uses of ``Steps``."""

    run_one: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]

    def run_loop(
        self,
        fn: Callable[..., Any],
        data: Iterable[Any] | None,
        max_steps: int | None,
        halt: Any,
        checkpoint_iterator: bool | None = None,
        epochs: int | None = None,
        on_epoch_end: Callable[[int], Any] | None = None,
        watch: DivergenceWatch | None = None,
    ) -> tuple[int, str | None]:
        """On the step thread: ``run_loop``'s loop."""
        ...


class Engine(SessionContext, Protocol):
    """The running session as the engine's pieces see it (``Runtime`` implements it)."""

    step: int
    closed: bool
    control: StopControl
    last_output: Any
    max_steps: int | None
    spent_iterators: list[Any]
    #: ended passes' iterators, dropped off the step thread (:mod:`._release`)
    retired: Retired
    epoch_counter: EpochCounter
    state: Any
    #: the divergence watch of the ``run_loop`` running now (every snapshot asks it first)
    divergence: DivergenceWatch | None
    #: what divergence rollbacks cost this session
    rollbacks: RollbackCounts
    times: TimeAccount
    #: the hang watchdog's slot of the step loop (:class:`~._watchdog.Beat`)
    beat: Beat
    #: ``Session.fit`` running: a loop ending for its epochs does not stop the session
    fit_continues: bool
    #: the stop reason of a body that completes now (``"epochs"`` after such a loop)
    completed_reason: str | None

    @property
    def config(self) -> EngineConfig:
        """The supervisor's settings."""
        ...

    @property
    def parts(self) -> PartRunner:
        """The session's parts, by phase."""
        ...

    def sample_metrics(self) -> None:
        """On the step thread: read the last step's scalars for ``status().metrics``."""
        ...

    @property
    def hooks(self) -> HookCalls:
        """The per-step hooks."""
        ...

    @property
    def errors(self) -> StepErrorHandling:
        """The step-error semantics."""
        ...

    @property
    def steps(self) -> StepBodies:
        """The step bodies."""
        ...

    @property
    def session(self) -> Any:
        """The ``Session`` handed to the body."""
        ...

    def make_iterator(
        self, data: Iterable[Any], checkpoint_iterator: bool | None = None, *, fresh: bool = False
    ) -> Any:
        """On the step thread: an iterator over ``data`` (``fresh``: a new pass, not the
        one this session's last ``run_loop`` over ``data`` left off)."""
        ...

    def wake_step_thread(self) -> None:
        """Release waits for input on the step thread."""
        ...

    @property
    def running(self) -> bool:
        """Whether the session's services run (start-up over, the stop not begun)."""
        ...

    def start_soon(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """On the loop, while running: run ``fn()`` in the session's task group."""
        ...

    def stop_wait_secs(self) -> float:
        """How long a stop may wait for the step thread now (a notice's deadline may be nearer)."""
        ...
