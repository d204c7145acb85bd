"""Exact resume and crash consistency with real processes killed by SIGKILL.

``resume_train.py`` (next to this file) trains a seeded model with a tf.data iterator,
momentum slots and a ``tf.random.Generator``, saving every few steps. Some runs are cold
``python resume_train.py`` processes; the many restarts between kills are forked from a
forkserver that has imported TensorFlow already (no TF op has run there), so that each
costs a fraction of a second instead of an import. Every check of what is on disk after a
kill uses plain TensorFlow only.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from _timing import scaled

pytestmark = pytest.mark.usefixtures("checkpoint_store")  # a promise test: both stores

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "resume_train.py"
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    "TF_CPP_MIN_LOG_LEVEL": "3",
}
TMP_MARKER = ".asv-tmp-"  # in the name of every file of a save in flight (see _checkpoint/store/_names.py)
SAVE_COUNTER = "save_counter/.ATTRIBUTES/VARIABLE_VALUE"  # counts saves: not training state

# slots of the ``events`` array a forked child reports through: the step it started at,
# its last step, the step of its last checkpoint.saved (-1: none yet), and how many it saved
START, STEP, SAVED, SAVES = 0, 1, 2, 3


def _import_resume_train() -> Any:
    sys.path.insert(0, str(HERE))
    try:
        import resume_train
    finally:
        sys.path.remove(str(HERE))
    return resume_train


@contextlib.contextmanager
def _cold(logdir: Path, steps: int, save_steps: int, out: Path) -> Iterator[subprocess.Popen[str]]:
    """A cold ``python resume_train.py`` process (``START``/``STEP`` lines and logs on
    stdout), killed on the way out if it still runs (a failed test)."""
    args = [sys.executable, str(SCRIPT), str(logdir), str(steps), str(save_steps), "64", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@contextlib.contextmanager
def _forkserver() -> Iterator[Any]:
    """A multiprocessing context whose children fork from a server that imported TensorFlow."""
    sys.path.insert(0, str(HERE))  # the server imports resume_train (it takes sys.path when it starts)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tensorflow", "asupervisor", "resume_train"])
    try:
        yield ctx
    finally:
        sys.path.remove(str(HERE))
        multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]


def _child(logdir: str, steps: int, save_steps: int, width: int, events: Any, write_secs: Any, tracked: bool) -> None:
    """In a forked child: train, reporting ``START``, ``STEP`` and the ``checkpoint.saved``
    log events (step, and the write's duration) in the shared ``events`` / ``write_secs``."""
    import logging

    import resume_train

    class OnSaved(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            event: MutableMapping[str, Any] = getattr(record, "event_dict", {})
            if event.get("event") == "checkpoint.saved":  # logged once committed
                write_secs.value = event["secs"]
                events[SAVED] = event["step"]
                events[SAVES] += 1

    def report(kind: str, step: int) -> None:
        events[START if kind == "START" else STEP] = step

    logger = logging.getLogger("asupervisor")
    logger.addHandler(OnSaved())
    logger.setLevel(logging.INFO)
    logger.propagate = False
    resume_train.train(logdir, steps, save_steps, width, report=report, tracked_data=tracked)


@contextlib.contextmanager
def _forked(ctx: Any, logdir: Path, steps: int, save_steps: int, width: int, tracked: bool) -> Iterator[Any]:
    """Start :func:`_child`; yields the process, its ``events`` and its ``write_secs``
    (and kills the process on the way out if it still runs: a failed test)."""
    events = ctx.Array("q", [-1, -1, -1, 0], lock=False)
    write_secs = ctx.Value("d", -1.0, lock=False)
    proc = ctx.Process(target=_child, args=(str(logdir), steps, save_steps, width, events, write_secs, tracked))
    proc.start()
    try:
        yield proc, events, write_secs
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()


def _wait(proc: Any, until: Callable[[], bool], what: str) -> None:
    """Poll ``until()`` while the child runs (it must not die on its own meanwhile)."""
    deadline = time.monotonic() + scaled(60)
    while not until():
        assert proc.is_alive(), f"the training process exited on its own (code {proc.exitcode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within 60 s"
        time.sleep(0.001)


def _kill(proc: Any) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert proc.exitcode == -signal.SIGKILL, f"the training process had exited on its own (code {proc.exitcode})"


def _latest_step(logdir: Path) -> int | None:
    """The step of ``tf.train.latest_checkpoint(logdir)`` (plain TF), ``None`` if there is none."""
    latest = tf.train.latest_checkpoint(str(logdir))
    if latest is None:
        return None
    match = re.fullmatch(r".*-(\d+)", latest)
    assert match, latest
    return int(match.group(1))


def _writing(logdir: Path) -> bool:
    """Whether a save is in flight (or was, when its writer was killed)."""
    return any(TMP_MARKER in name for name in os.listdir(logdir))


class _PlainRestore:
    """Restores checkpoints of ``resume_train``'s model with plain TensorFlow only.

    The model is built once; every restore first fills each variable with a value no
    checkpoint holds (NaN, or -1 for integers), so a variable the restore skipped shows.
    """

    def __init__(self, width: int, tracked_data: bool) -> None:
        resume_train = _import_resume_train()
        self.state, self.data, _ = resume_train.build(width)
        self.global_step = tf.Variable(-1, dtype=tf.int64)
        self.variables = resume_train.variables(self.state, self.global_step)
        self.shapes = {key: tuple(v.shape) for key, v in self.variables.items()}
        self.tracked_data = tracked_data

    def restore(self, path: str) -> dict[str, np.ndarray]:
        """``tf.train.Checkpoint(...).restore(path)``; returns every restored variable by
        key and, when the iterator is in the checkpoint, the next three batches it yields."""
        for v in self.variables.values():
            v.assign(tf.fill(v.shape, tf.constant(np.nan if v.dtype.is_floating else -1, v.dtype)))
        reader = tf.train.load_checkpoint(path)
        dtypes = reader.get_variable_to_dtype_map()
        iterator = iter(self.data)
        # the start-up checkpoint of an initialised state is taken before run_loop has
        # created the iterator (restoring it leaves a new iterator at the start, as it was)
        has_iterator = "asv_data_iterator/.ATTRIBUTES/ITERATOR_STATE" in dtypes
        expected = self.tracked_data and not (path.endswith("-0") and not has_iterator)
        assert has_iterator == expected, f"{path} holds {sorted(dtypes)}"
        pipeline = tf.Variable("", dtype=tf.string)  # the description of the pipeline it belongs to
        extra = {"asv_data_iterator": iterator, "asv_data_pipeline": pipeline} if has_iterator else {}
        ckpt = tf.train.Checkpoint(**self.state, global_step=self.global_step, **extra)
        ckpt.restore(path).assert_consumed()
        assert not has_iterator or pipeline.numpy().decode().startswith("TensorSlice"), pipeline
        values = {key: v.numpy() for key, v in self.variables.items()}
        plain = {k for k, dtype in dtypes.items() if dtype != tf.variant}
        plain -= {"_CHECKPOINTABLE_OBJECT_GRAPH", SAVE_COUNTER, "asv_data_pipeline/.ATTRIBUTES/VARIABLE_VALUE"}
        assert plain == set(values), f"{path} holds {sorted(plain)}"
        for key, value in values.items():
            assert value.shape == self.shapes[key], (path, key, value.shape)
            if value.dtype.kind == "f":
                assert np.isfinite(value).all(), (path, key)
            assert reader.get_tensor(key).tobytes() == value.tobytes(), (path, key)  # CRC-checked read
        assert values["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == int(path.rsplit("-", 1)[1])
        if self.tracked_data:
            for i in range(3):
                x, y = next(iterator)
                values[f"batch {i} x"], values[f"batch {i} y"] = x.numpy(), y.numpy()
        return values


# These three run many child processes: ~40 s each alone on 2 shared cores, above the
#: ``ASV_TEST_THOROUGH=1``: the SIGKILL series below at their full length (about twice
#: the kills; what the suite runs by default keeps ``make test`` within its time)
THOROUGH = os.environ.get("ASV_TEST_THOROUGH") == "1"


# default timeout; 300 s leaves room for a loaded CI machine and still catches a hang.
@pytest.mark.timeout(300)
def test_killed_and_resumed_training_is_bitwise_equal(tmp_path: Path, checkpoint_store: str) -> None:
    """A training SIGKILLed at random moments and restarted, each restart resuming from
    the latest checkpoint on disk, ends bitwise equal to an uninterrupted one: every
    variable, the optimizer slots, the generator, and the iterator's position. (Fewer
    kills on the plain store, whose commit protocol is the fast store's and whose restarts
    are slower: the suite's time.)"""
    kills = {("fast", True): 30, ("fast", False): 4, ("plain", True): 8, ("plain", False): 2}[
        checkpoint_store, THOROUGH
    ]
    steps, save_steps = 600, 7
    rng = random.Random(1234)
    logdir = tmp_path / "killed"
    latest: int | None = None
    starts: list[int] = []
    with _cold(tmp_path / "straight", steps, save_steps, tmp_path / "straight.npz") as straight:
        with _forkserver() as ctx:
            for i in range(kills):
                with _forked(ctx, logdir, steps, save_steps, 64, True) as (proc, events, _):
                    _wait(proc, lambda: events[START] >= 0, "START")
                    starts.append(events[START])
                    # where it resumed: the latest committed checkpoint right after the kill
                    assert starts[-1] == (latest or 0), f"restart {i} started at {starts[-1]}, latest was {latest}"
                    # after 0, 1 or 2 checkpoints of its own, a few steps and a moment
                    saves = rng.choice((0, 1, 1, 2)) if starts[-1] < steps - 150 else 0  # never the end
                    _wait(proc, lambda: events[SAVES] >= saves and events[STEP] > 0, f"{saves} saves")
                    # never past the end: a child that finishes before its kill is no kill
                    kill_at = min(events[STEP] + rng.randint(0, 10), steps - 100)
                    _wait(proc, lambda: events[STEP] >= kill_at, f"step {kill_at}")
                    time.sleep(rng.uniform(0, 0.01))
                    _kill(proc)
                step = _latest_step(logdir)
                assert step is None or step >= (latest or 0), f"the latest checkpoint went back from {latest} to {step}"
                latest = step
                if latest is not None and latest >= steps - 100:
                    break  # a restart this close to the end could finish before its kill
        assert latest is not None and sum(s > 0 for s in starts) >= kills // 2, f"restarts started at {starts}"
        with _cold(logdir, steps, save_steps, tmp_path / "killed.npz") as last:  # a cold process finishes it
            out, _ = last.communicate(timeout=scaled(120))
        assert last.returncode == 0 and f"DONE {steps}" in out
        assert re.findall(r"^START (\d+)$", out, re.M) == [str(latest)]
        out, _ = straight.communicate(timeout=scaled(120))
    assert straight.returncode == 0 and f"DONE {steps}" in out
    assert re.findall(r"^START (\d+)$", out, re.M) == ["0"]
    # the state in memory when each session stopped ...
    a, b = np.load(tmp_path / "straight.npz"), np.load(tmp_path / "killed.npz")
    assert sorted(a.files) == sorted(b.files) and len(a.files) == 6
    for key in a.files:
        assert a[key].tobytes() == b[key].tobytes(), key
    # ... and in the final checkpoints, iterator included
    plain = _PlainRestore(64, tracked_data=True)
    paths = [tf.train.latest_checkpoint(str(tmp_path / d)) for d in ("straight", "killed")]
    assert all(p is not None and p.endswith(f"-{steps}") for p in paths), paths
    first, second = (plain.restore(p) for p in paths if p is not None)
    assert first.keys() == second.keys()
    for key in first:
        assert first[key].tobytes() == second[key].tobytes(), key


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "tracked_data",
    [
        pytest.param(True, id="with-iterator"),  # a variant tensor: our bundle + SaveV2's, merged
        pytest.param(False, id="plain-tensors"),  # all written by asupervisor's bundle writer
    ]
    if THOROUGH
    else [pytest.param(None, id="paired")],  # the fast store with the iterator, the plain without
)
def test_crash_consistency_under_repeated_sigkill(
    tmp_path: Path, tracked_data: bool | None, checkpoint_store: str
) -> None:
    """Five SIGKILLs (two dozen with ``ASV_TEST_THOROUGH=1``) at random instants, during
    saves of 40 MB and between them, never leave a latest checkpoint that plain TensorFlow cannot restore in full, nor one
    older than the last the process reported saved, nor older than after the kill before
    (fewer on the plain store). A tracked data iterator on the fast store, none on the
    plain one (both on each with ``ASV_TEST_THOROUGH=1``)."""
    if tracked_data is None:
        tracked_data = checkpoint_store == "fast"
    width = 300_000  # w1 16 x 300k, w2 300k x 1: 20.4 MB of float32, 40.8 MB with the momentum slots
    kills = {("fast", True): 24, ("fast", False): 5, ("plain", True): 12, ("plain", False): 4}[
        checkpoint_store, THOROUGH
    ]
    save_steps = 3
    rng = random.Random(99)
    plain = _PlainRestore(width, tracked_data)
    logdir = tmp_path / "run"
    steps: list[int] = []
    mid_write = 0  # kills that left a save in flight (its temporary files)
    typical_write = 0.1  # secs of the last write a child reported
    with _forkserver() as ctx:
        for i in range(kills):
            with _forked(ctx, logdir, 10**9, save_steps, width, tracked_data) as (proc, events, write_secs):
                # running: restored (or initialised and its start-up checkpoint committed), stepping
                _wait(proc, lambda: events[STEP] > events[START] >= 0 and (i > 0 or events[SAVES] > 0), "first step")
                time.sleep(rng.uniform(0, 0.3))
                if i % 3 == 1:  # while a save is being written, at a random point of it
                    _wait(proc, lambda: _writing(logdir), "save in flight")
                    time.sleep(rng.uniform(0, typical_write / 2))
                elif i % 3 == 2:  # between two saves, once this run committed one (progress
                    # across kills, however slow the saves are on a loaded machine)
                    _wait(proc, lambda: events[SAVED] > events[START], "a save after the restore")
                    _wait(proc, lambda: not _writing(logdir), "moment without a save in flight")
                else:  # anywhere
                    time.sleep(rng.uniform(0, 0.2))
                reported = events[SAVED]
                _kill(proc)
            typical_write = write_secs.value if write_secs.value > 0 else typical_write
            mid_write += _writing(logdir)
            latest = tf.train.latest_checkpoint(str(logdir))
            assert latest is not None
            step = int(plain.restore(latest)["global_step/.ATTRIBUTES/VARIABLE_VALUE"])
            assert step >= reported, f"kill {i + 1}: latest is step {step}, step {reported} was reported saved"
            assert not steps or step >= steps[-1], f"kill {i + 1}: the latest went back from {steps[-1]} to {step}"
            steps.append(step)
            state_text = (logdir / "checkpoint").read_text()
            assert TMP_MARKER not in state_text and str(tmp_path) not in state_text
    assert steps[-1] > steps[0]  # training went on across kills
    # both phases were hit (a third of the kills aims at each; most hit, so this floor holds)
    assert mid_write >= kills // 6 and kills - mid_write >= kills // 6, f"{mid_write} of {kills} kills mid-write"
    # what the start-up of a next run cleans up leaves only the checkpoints the state file
    # names, complete: nothing a kill cut short (a commit, a deletion) stays behind unnamed
    from asupervisor._checkpoint.store import _commit, _names, _state_file

    _commit.clean_leftovers(logdir)
    state = _state_file.read_state(logdir)
    assert state is not None
    on_disk = {m.group(1) for n in os.listdir(logdir) if (m := re.match(r"(model\.ckpt-\d+)\.", n))}
    assert on_disk == set(state.paths), f"unnamed: {sorted(on_disk - set(state.paths))}"
    assert all(_names.missing_files(logdir / name) is None for name in state.paths)
