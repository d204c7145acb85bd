"""The goodput accounting with an injectable clock: one segment's causes
(``_core/_goodput.py``), the run's totals carried across restarts, and the ledger file
(``_goodput/_ledger.py``). No session, no TensorFlow: figures are set by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from asupervisor._core._goodput import TimeAccount, disrupted, process_start_time
from asupervisor._goodput._ledger import Totals, read_ledger, remove_leftovers, resume, write_ledger


class Clock:
    """``perf`` (seconds from 0) and the wall clock (``1000 + perf``), moved by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def perf(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1000.0 + self.t


def account(clock: Clock) -> TimeAccount:
    """A segment that started 5 s before the clock's 0 (the process's start)."""
    return TimeAccount(995.0, clock=clock.wall, perf=clock.perf)


def test_a_segment_is_split_into_productive_time_and_causes_that_add_up_to_its_wall_time() -> None:
    """Start-up to the first step less the restore is ``training_prep``; the first step's
    time above the mean step is ``program_startup``; the waits for data, the snapshots,
    recorded causes, and steps recorded lost (their mean time moved out of productive
    time) are counted where they belong; ``other`` is the rest."""
    clock = Clock()
    times = account(clock)
    times.restore += 1.0
    clock.t = 2.0
    times.begin_steps()
    times.step_done(3.0)  # the first step traces and compiles
    for _ in range(4):
        times.step_done(1.0)
    times.input_wait += 0.5
    times.record("unproductive_checkpoint_save_time", 0.25)
    times.record("hang", 2.0)
    times.record("divergence_rollback", steps=1)
    clock.t = 20.0
    seg = times.segment("max_steps")
    assert seg.wall_secs == 25.0 and seg.steps == 4
    assert seg.productive_secs == pytest.approx(4.0)  # 7 s of steps, less 2 of compiling and 1 rolled back
    assert dict(seg.badput) == pytest.approx(
        {
            "training_prep": 6.0,
            "program_startup": 2.0,
            "data_loading_sync": 0.5,
            "unproductive_checkpoint_save_time": 0.25,
            "unproductive_checkpoint_restore_time": 1.0,
            "hang": 2.0,
            "divergence_rollback": 1.0,
            "other": 8.25,
        }
    )
    assert seg.productive_secs + sum(seg.badput.values()) == pytest.approx(seg.wall_secs)


def test_before_the_first_step_everything_but_the_restore_and_a_save_is_training_prep() -> None:
    """A segment still starting: its wall time so far is preparation, the restore and a
    start-up checkpoint's snapshot; once the first step starts, preparation stops growing."""
    clock = Clock()
    times = account(clock)
    times.restore += 0.5
    times.record("unproductive_checkpoint_save_time", 0.25)
    clock.t = 3.0
    expected = {
        "training_prep": 7.25,
        "unproductive_checkpoint_save_time": 0.25,
        "unproductive_checkpoint_restore_time": 0.5,
    }
    assert times.segment().productive_secs == 0 and dict(times.segment().badput) == expected
    times.begin_steps()
    clock.t = 4.0
    assert times.segment().badput["training_prep"] == 7.25


@pytest.mark.parametrize(
    ("reason", "preemption"),
    [("signal:SIGTERM", 2.5), ("preempted:gce", 2.5), ("max_steps", None), ("signal:SIGINT", None)],
)
def test_the_wind_down_after_a_signal_or_notice_is_preemption_stop(reason: str, preemption: float | None) -> None:
    """From the stop request on, what no other cause counted (here 4 s less a step and the
    final snapshot) is ``preemption_stop`` when a scheduler's signal or a notice stopped
    the training; after a completion or a Ctrl-C it stays ``other``."""
    clock = Clock()
    times = account(clock)
    times.begin_steps()
    clock.t = 20.0
    times.mark_stop()
    clock.t = 21.0
    times.step_done(1.0)  # the step in flight
    times.record("unproductive_checkpoint_save_time", 0.5)  # the final checkpoint's snapshot
    clock.t = 24.0
    seg = times.segment(reason)
    assert seg.badput.get("preemption_stop") == preemption
    assert seg.productive_secs + sum(seg.badput.values()) == pytest.approx(seg.wall_secs)


@pytest.mark.parametrize(
    ("args", "bad"),
    [(("Hang", 1.0), "'Hang'"), (("hang", -1.0), "-1.0"), (("hang", float("nan")), "nan"), (("other", 1.0), "'other'")],
)
def test_recording_bad_badput_is_a_value_error_naming_the_value(args: tuple[str, float], bad: str) -> None:
    """A cause that is not a lowercase name, negative or non-finite seconds, and ``other``
    (what nothing else counted) are refused, naming the value."""
    with pytest.raises(ValueError, match=bad):
        account(Clock()).record(*args)
    with pytest.raises(ValueError, match="-2"):
        account(Clock()).record("hang", steps=-2)


def test_a_restart_after_a_kill_counts_the_lost_time_and_the_redone_steps() -> None:
    """The previous segment was killed (it never wrote its end) after its ledger recorded
    step 25 at t=1010; the next starts at t=1013 from checkpoint 20: the 3 s between are
    ``infrastructure_recovery_from_disruption``, steps 21-25 are redone, and their time at
    the run's mean step time (0.4 s) moves from productive time to
    ``wasted_progress_from_disruption``."""
    before = Totals(
        first_started_at=1000.0,
        updated_at=1010.0,
        wall_secs=10.0,
        productive_secs=10.0,
        steps=25,
        step=25,
        segments=1,
    )
    base = resume(before, started_at=1013.0, restored_step=20)
    assert base.restarts == 1 and base.redone_steps == 5 and base.steps == 20
    assert base.wall_secs == 13.0 and base.productive_secs == pytest.approx(8.0)
    assert dict(base.badput) == pytest.approx(
        {"wasted_progress_from_disruption": 2.0, "infrastructure_recovery_from_disruption": 3.0}
    )
    clock = Clock()
    clock.t = 13.0
    times = TimeAccount(1013.0, clock=clock.wall, perf=clock.perf)
    times.begin_steps()
    times.step_done(0.4)
    clock.t = 15.0
    totals = base.add(times.segment(), step=21)
    assert totals.wall_secs == pytest.approx(15.0) and totals.first_started_at == 1000.0
    assert totals.productive_secs + sum(totals.badput.values()) == pytest.approx(totals.wall_secs)
    g = totals.goodput()
    assert g.goodput == pytest.approx(totals.productive_secs / 15.0) and g.restarts == 1


@pytest.mark.parametrize(
    ("ended", "counted"),
    [(None, True), ("signal:SIGTERM", True), ("error:OSError", True), ("max_steps", False), ("signal:SIGINT", False)],
)
def test_the_time_between_segments_counts_only_after_a_disruption(ended: str | None, counted: bool) -> None:
    """After a kill, a preemption or an error the time until the restart is badput; after a
    completed training or a person's Ctrl-C it is nobody's and not in the wall time."""
    before = Totals(first_started_at=1000.0, updated_at=1010.0, wall_secs=10.0, step=5, segments=1, ended=ended)
    base = resume(before, started_at=1100.0, restored_step=5)
    assert disrupted(ended) is counted
    assert base.wall_secs == (100.0 if counted else 10.0) and base.redone_steps == 0


def test_the_ledger_file_round_trips_and_a_damaged_one_is_an_error_naming_it(tmp_path: Path) -> None:
    """The file holds the totals (and the ratio for readers); what is not a ledger is a
    ``ValueError`` naming the file and what is wrong; a killed write's temporary file is
    removed by the next owner."""
    path = tmp_path / "asupervisor-goodput.json"
    assert read_ledger(path) is None
    totals = Totals(
        first_started_at=1.0,
        updated_at=2.0,
        wall_secs=4.0,
        productive_secs=3.0,
        steps=7,
        badput={"training_prep": 1.0},
        step=7,
        segments=1,
    )
    write_ledger(path, totals)
    assert read_ledger(path) == totals
    assert not list(tmp_path.glob("*.tmp*"))
    path.write_text(path.read_text().replace('"steps": 7', '"steps": -1'))
    with pytest.raises(ValueError, match=r"asupervisor-goodput\.json: steps must be an int >= 0, got -1"):
        read_ledger(path)
    path.write_text("{garbled")
    with pytest.raises(ValueError, match=r"asupervisor-goodput\.json"):
        read_ledger(path)
    leftover = tmp_path / "asupervisor-goodput.json.tmp123"  # a write killed midway
    leftover.write_text("{")
    remove_leftovers(path)
    assert not leftover.exists() and path.exists()


def test_the_process_start_time_is_before_now() -> None:
    """The process's start (Linux: ``/proc``) is a moment in the past of this process."""
    import time

    assert time.time() - 3600 * 24 < process_start_time() <= time.time()
