"""The step loop of one session, built once when the session starts.

:class:`Steps` runs on the step thread: one counted step (``sess.run``,
``StepContext.run_with_hooks``) and ``run_loop``'s whole loop. Whether hooks run around
each step is decided once, when the session is entered (``run_one`` is the hooked or the
plain body), so a plain step pays for no hook check. After each step the parts' step
trigger (``PartRunner.next_trigger_step``, a precomputed step number) is compared, and
only when it is reached does a part run (the checkpoint part's snapshot). At every step
boundary of ``run_loop`` the loop checks the stop flag, its own halt flag, boundary jobs
(snapshots, summaries) and ``max_steps``. Each step's call and each wait for the next
batch are timed into the session's :class:`~._goodput.TimeAccount`, in plain floats
(two ``perf_counter`` reads a step, one without data; the clock is read again only after
the rare work at a boundary): the goodput ledger's figures.

An error raised by a step goes to :mod:`._step_errors` (kept, state marked suspect, or
recovery for ``AbortedError``/``UnavailableError``); the end of the data is a clean stop.
With ``on_divergence`` (:mod:`._divergence`) each step's loss is kept for the watch before
the hooks' ``after_run`` (which may save), and a leg ends at the boundary where a
divergence was found, leaving it in ``watch.found`` for the session to roll back.
This module must never touch the event loop nor block it: it runs on the step thread.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .._tf import is_end_of_data
from ._divergence import SnapshotRefused

if TYPE_CHECKING:
    from ._divergence import DivergenceWatch
    from ._engine import Engine

__all__ = ["Halt", "Steps"]


class Halt:
    """Tells one running ``run_loop`` to end at the next step boundary; the loop leaves
    the number of steps it ran in ``steps_run`` and sets ``finished`` when it ended
    without an error."""

    __slots__ = ("_wake", "finished", "halted", "steps_run")

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        self.halted = False
        self.steps_run = 0
        self.finished = False
        self._wake = wake

    def set(self) -> None:
        """Any thread: end the loop at the next boundary (and release a wait for input)."""
        self.halted = True
        if self._wake is not None:  # release a wait for input (a queue runner's)
            self._wake()


class Steps:
    """The step bodies of one session (see the module docstring)."""

    def __init__(self, rt: Engine) -> None:
        self._rt = rt
        #: one counted step with hooks around it: ``run_one(fn, args, kwargs)``
        self.run_one: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any] = (
            self._run_one_hooked if rt.hooks.per_step else self._run_one_plain
        )

    def _count(self, results: Any) -> int:
        rt = self._rt
        rt.last_output = results
        rt.step += 1
        return rt.step

    def _run_one_plain(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        rt = self._rt
        thread = rt.step_thread
        if thread.has_boundary_jobs:
            thread.run_boundary_jobs()
        times = rt.times
        if times.first_step_at is None:
            times.begin_steps()
            rt.beat.ident = threading.get_ident()
        t0 = time.perf_counter()
        beat = rt.beat
        beat.at = t0  # the watchdog's: a step in flight since t0
        try:
            results = fn(*args, **kwargs)
        except Exception as exc:
            beat.at = 0.0
            rt.errors.note(exc)
            raise
        beat.at = 0.0
        times.step_done(time.perf_counter() - t0)
        rt.last_output = results
        rt.step += 1
        parts = rt.parts
        if rt.step >= parts.next_trigger_step:
            parts.fire(rt, rt.step)
        return results

    def _run_one_hooked(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        rt = self._rt
        thread = rt.step_thread
        if thread.has_boundary_jobs:
            thread.run_boundary_jobs()
        times = rt.times
        if times.first_step_at is None:
            times.begin_steps()
            rt.beat.ident = threading.get_ident()
        t0 = time.perf_counter()
        beat = rt.beat
        beat.at = t0  # the watchdog's: a step in flight since t0
        try:
            results = rt.hooks.run_step(rt.control, rt.session, fn, args, kwargs, self._count)
        except Exception as exc:
            beat.at = 0.0
            rt.errors.note(exc)
            raise
        beat.at = 0.0
        times.step_done(time.perf_counter() - t0)
        parts = rt.parts
        if rt.step >= parts.next_trigger_step:
            parts.fire(rt, rt.step)
        return results

    def run_loop(
        self,
        fn: Callable[..., Any],
        data: Iterable[Any] | None,
        max_steps: int | None,
        halt: Halt,
        checkpoint_iterator: bool | None = None,
        epochs: int | None = None,
        on_epoch_end: Callable[[int], Any] | None = None,
        watch: DivergenceWatch | None = None,
    ) -> tuple[int, str | None]:
        """On the step thread: the step loop of ``Session.run_loop``.

        With ``epochs``, the end of ``data`` ends a pass (:mod:`._epochs`): the epoch
        count goes up, ``on_epoch_end(epoch)`` runs, a new iterator begins the next pass,
        and the loop ends once ``epochs`` passes are complete (reason ``"epochs"``).

        With ``watch``, it is installed (``rt.divergence``: every snapshot reads the losses
        not read yet), each step's loss goes to it, a rollback's skipped batches are
        dropped at its ``skip_at`` step, and the loop ends at the boundary where a
        divergence was found (``watch.found``; the reason is then ``None``). When the
        loop ends otherwise, the losses not read yet are judged first.

        Returns ``(steps run, stop reason or None)``.
        """
        rt = self._rt
        control = rt.control
        boundary = rt.step_thread._boundary
        run_boundary = rt.step_thread.run_boundary_jobs
        hooks = rt.hooks
        per_step = hooks.per_step
        session = rt.session
        count: Callable[[Any], int] = self._count
        parts = rt.parts
        if watch is not None:
            rt.divergence = watch
            count = self._watched_count(watch)
            per_step = True  # the loss goes to the watch before any after_run (which may save)
        n = 0
        reason: str | None = None
        iterator = None
        restarted = False  # the epoch position went back to the start: a new pass
        if epochs is not None:
            restarted = rt.epoch_counter.attach(rt.state, rt.step)
            if rt.epoch_counter.epoch >= epochs:  # a resumed run that had finished its epochs
                halt.finished = True
                return 0, "epochs"
        if data is not None:
            try:
                iterator = rt.make_iterator(data, checkpoint_iterator, fresh=restarted)
            except Exception as exc:
                # No step ran: the state is sound (the final checkpoint is still taken),
                # but the error stops the session.
                if not is_end_of_data(exc):
                    control.record_error(exc)
                raise
        rt.max_steps = max_steps
        counter = rt.epoch_counter
        times = rt.times  # where the time goes: plain floats, added to on this thread only
        perf = time.perf_counter
        times.begin_steps()
        beat = rt.beat  # the watchdog's slot: a step (> 0) or a wait for data (< 0) since
        beat.first = times.steps  # this loop's first step and wait: the unlearned deadline
        beat.ident = threading.get_ident()
        fresh = False  # whether the iterator began its pass in this leg
        epoch_end = math.inf  # the step that completes the pass, when its length is known
        if epochs is not None:
            counter.epochs = epochs
            counter.learn_size(data)
            epoch_end = counter.end_step()
        t = perf()  # when the last step (or the work at its boundary) ended
        try:
            while not (control.stopping or halt.halted):
                if boundary:
                    run_boundary()
                    if control.stopping:  # a boundary job stopped the session: no more steps
                        break
                    t = perf()
                if watch is not None and watch.found is not None:  # found by a read or a snapshot
                    break
                if max_steps is not None and rt.step >= max_steps:
                    reason = "max_steps"
                    break
                if iterator is None:
                    t1 = beat.at = t
                    if per_step:
                        hooks.run_step(control, session, fn, (), {}, count)
                    else:
                        rt.last_output = fn()
                        rt.step += 1
                else:
                    if watch is not None and rt.step == watch.skip_at:
                        watch.skip(iterator)  # a rollback's skipped window
                    beat.at = -t
                    try:
                        batch = next(iterator)
                    except Exception as exc:
                        beat.at = 0.0
                        if epochs is None or data is None or not is_end_of_data(exc):
                            raise
                        # A pass of unknown length ends here, at the boundary after its
                        # last step (after a checkpoint that step may have had).
                        iterator, fresh, reason = self._end_epoch(
                            data, iterator, fresh, epochs, on_epoch_end, checkpoint_iterator
                        )
                        epoch_end = counter.end_step()
                        if reason is not None:
                            break
                        t = perf()
                        continue
                    t1 = beat.at = perf()
                    times.input_wait += t1 - t
                    if rt.closed:  # the session ended while this thread waited for the batch
                        break  # (its stop could not wait): no step after the session's end
                    if per_step:
                        hooks.run_step(control, session, fn, (batch,), {}, count)
                    else:
                        rt.last_output = fn(batch)
                        rt.step += 1
                t = perf()
                beat.at = 0.0
                took = t - t1
                if not n and times.first_step_secs is None:
                    times.first_step_secs = took
                times.productive += took
                times.steps += 1
                n += 1
                if rt.step >= epoch_end:
                    # A pass of known length ends with its last step, before the parts'
                    # trigger: a checkpoint of this step holds the epoch's end (its
                    # on_epoch_end done), and a resumed run does not do it again.
                    iterator, fresh, reason = self._end_epoch(
                        data,  # type: ignore[arg-type]  # epochs: data and epochs are given
                        iterator,
                        fresh,
                        epochs,  # type: ignore[arg-type]
                        on_epoch_end,
                        checkpoint_iterator,
                    )
                    epoch_end = counter.end_step()
                    if rt.step >= parts.next_trigger_step:
                        parts.fire(rt, rt.step)
                    if reason is not None:
                        break
                    t = perf()
                elif rt.step >= parts.next_trigger_step:  # the per-step path: one comparison more
                    parts.fire(rt, rt.step)
                    t = perf()
        except Exception as exc:
            if isinstance(exc, SnapshotRefused) and watch is not None and watch.found is not None:
                pass  # a hook's save refused the diverged state: the session rolls back
            elif not is_end_of_data(exc):
                rt.errors.note(exc)
                raise
            else:
                reason = "end_of_data"
        finally:
            beat.at = 0.0  # (a step that raised)
            halt.steps_run = n  # read by run_loop when this leg fails and is recovered
            rt.max_steps = None
            counter.epochs = None
            rt.sync_global_step()
            if n:
                rt.sample_metrics()  # a status read after run_loop shows its last step
            if iterator is not None:
                rt.spent_iterators.append(iterator)
        if watch is not None:
            reason = self._judge_rest(watch, reason)
        halt.finished = True  # ended at a step boundary, without an error
        return n, reason

    def _watched_count(self, watch: DivergenceWatch) -> Callable[[Any], int]:
        """``_count`` that also gives the step's loss to ``watch``."""
        rt = self._rt

        def count(results: Any) -> int:
            rt.last_output = results
            rt.step += 1
            watch.keep(rt.step, results)
            return rt.step

        return count

    def _judge_rest(self, watch: DivergenceWatch, reason: str | None) -> str | None:
        """As a watched leg ends: judge the losses not read yet; a divergence found is the
        leg's end (reason ``None``: the session rolls back), else the watch goes."""
        rt = self._rt
        if watch.found is None:
            try:
                watch.check()
            except Exception as exc:
                rt.errors.note(exc)
                raise
        if watch.found is not None:
            return None
        rt.divergence = None
        return reason

    def _end_epoch(
        self,
        data: Iterable[Any],
        iterator: Any,
        fresh: bool,
        epochs: int,
        on_epoch_end: Callable[[int], Any] | None,
        checkpoint_iterator: bool | None,
    ) -> tuple[Any, bool, str | None]:
        """On the step thread, when ``iterator`` has ended a pass: begin the next pass with
        a new iterator (also after the last pass, so that a checkpoint holds the position
        of the pass to come and a resumed run given more epochs goes on from it), count
        the epoch, call ``on_epoch_end``. Returns ``(iterator, fresh, reason)``;
        ``reason`` is ``"epochs"`` once ``epochs`` passes are complete, ``"end_of_data"``
        when a whole pass yielded nothing. The ended pass's iterator is destroyed off this
        thread (:mod:`._release`): that may wait for its background work."""
        rt = self._rt
        counter = rt.epoch_counter
        done = rt.step - counter.first_step
        if done == 0 and fresh:  # a new pass yielded nothing: the data cannot be iterated again
            return iterator, fresh, "end_of_data"
        # The next pass's iterator comes first, so that a checkpoint ``on_epoch_end`` takes
        # holds the epoch count and the position (its start) of the pass to come.
        ended, iterator = iterator, rt.make_iterator(data, checkpoint_iterator, fresh=True)
        rt.retired.add(ended)
        if done:  # (a resumed pass may end at once: its position was at the end)
            if counter.steps_per_epoch is None and fresh:  # a whole pass seen: its length
                counter.steps_per_epoch = done
            epoch = counter.epoch
            counter.begin(epoch + 1, rt.step)
            if on_epoch_end is not None:
                on_epoch_end(epoch)
        else:
            counter.begin(counter.epoch, rt.step)
        return iterator, True, ("epochs" if counter.epoch >= epochs else None)
