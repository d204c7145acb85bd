"""``asupervisor demo``: a real, resumable training run on built-in data.

Trains a small MLP to imitate a fixed random "teacher" network on 50,000 generated points
(deterministic, so nothing is downloaded): a regression whose loss keeps falling for
minutes on a 2-core machine, so TensorBoard's curves (``loss``, ``r2``, steps/sec) are
worth looking at. It runs under an ``asupervisor.Supervisor``: checkpoints and summaries
go to ``--logdir``; on a terminal the live progress display (``progress=True``) shows
step, loss, steps/sec and ETA in place, elsewhere a plain line is printed every few
seconds; Ctrl-C stops gracefully (with a final checkpoint), and running the command
again resumes from the last checkpoint::

    asupervisor demo --logdir runs/demo                      # 60,000 more steps each run
    asupervisor demo --logdir runs/demo --max-steps 200000   # up to global step 200,000

A front door (it imports TensorFlow, so only when the command runs); the process exits
with ``asv.exit_code`` (0 done, 130 after Ctrl-C, 143 after SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _import_tensorflow_quietly() -> Any:
    """Import TensorFlow with file descriptor 2 pointed at a temporary file.

    ``TF_CPP_MIN_LOG_LEVEL`` does not reach the lines TensorFlow's C++ libraries write
    while they load (absl's "All log messages before absl::InitializeLog()" notice, the
    CUDA probe on a machine without a GPU), so they are dropped here; if the import
    fails they are printed with the error.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    return tensorflow


tf = _import_tensorflow_quietly()

import anyio  # noqa: E402
import numpy as np  # noqa: E402

import asupervisor as asv  # noqa: E402
from asupervisor._logging import console_write  # noqa: E402


def teacher_data(n: int = 50_000, dim: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` Gaussian points and the outputs of a fixed random 3-layer tanh network on them."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim))
    w1, w2, w3 = rng.normal(size=(dim, 64)) / np.sqrt(dim), rng.normal(size=(64, 64)) / 8, rng.normal(size=(64, 1)) / 8
    y = np.tanh(2 * np.tanh(2 * np.tanh(2 * x @ w1) @ w2) @ w3)
    return x.astype("float32"), y.astype("float32")


def say(line: str) -> None:
    """Print a line of progress. When standard output is a pipe whose reader died
    (``demo.py | tee log`` and tee was killed), point it at ``os.devnull`` instead of
    failing, as Python's documentation advises: losing the output must not stop training
    (asupervisor's own log lines on stderr are dropped the same way). On the terminal of
    the live progress line, the line goes above it, as log lines do."""
    try:
        sys.stdout.flush()
        if console_write(sys.stdout, line):
            return
        if sys.stdout.isatty():  # from the line's start: over the terminal's echo of a late ^C
            line = "\r\x1b[K" + line
        print(line, flush=True)  # noqa: T201 - the demo's output
    except (BrokenPipeError, ValueError):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


async def main(args: argparse.Namespace) -> int:
    live = sys.stderr.isatty()  # a terminal: the display updates in place on stderr
    # the live line says what the info events would: warnings only (they go above it)
    asv.configure_logging(level="warning" if live else "info")
    tf.keras.utils.set_random_seed(0)
    x, y = teacher_data()
    variance = float(np.var(y))
    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(1024, seed=0, reshuffle_each_iteration=True)  # a small buffer: small checkpoints
        .repeat()
        .batch(args.batch_size)
    )
    model = tf.keras.Sequential(
        [
            tf.keras.Input((x.shape[1],)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(1),
        ]
    )
    optimizer = tf.keras.optimizers.Adam(1e-3)

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(batch: tuple[Any, Any]) -> dict[str, Any]:
        features, targets = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(features, training=True) - targets))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss, "r2": 1.0 - loss / variance}  # r2: the share of the variance explained

    sv = asv.Supervisor(
        args.logdir,
        state={"model": model, "optimizer": optimizer},
        save_model_secs=args.save_secs,
        save_summaries_secs=args.summary_secs,
        progress=live,
    )

    def progress() -> None:  # a sync looped service: runs on its own thread
        status = sv.status()
        rate = f"{status.steps_per_sec:.0f}" if status.steps_per_sec else "-"
        loss = status.metrics.get("loss")
        shown = f"  loss {loss:.4f}" if loss is not None else ""
        say(f"progress: step {status.global_step}/{target}  steps/sec {rate}{shown}")

    if not live:  # a pipe or a file: plain lines on stdout
        sv.loop(args.progress_secs, progress, name="progress")

    target: int | str = "?"
    async with sv.managed_session() as sess:
        start = sess.global_step
        if start:
            say(f"resumed at step {start}")
        goal: int = args.max_steps if args.max_steps is not None else start + args.steps
        target = goal
        await sess.run_loop(train_step, data=data, max_steps=goal)

    _exit_at_a_late_ctrl_c(sv)
    mse = float(np.mean((model(x, training=False).numpy() - y) ** 2))
    say(
        f"done: step {sv.global_step}, stop reason {sv.status().stop_reason}, "
        f"training-set loss {mse:.4f} (r2 {1 - mse / variance:.3f}), logdir {args.logdir}"
    )
    tensorboard = Path(sys.executable).parent / "tensorboard"
    say(f"curves: {tensorboard if tensorboard.exists() else 'tensorboard'} --logdir {args.logdir}")
    return asv.exit_code(sv.status())


_late_handler: Callable[[int, Any], None] | None = None  # the SIGINT handler once the session is over


def _exit_at_a_late_ctrl_c(sv: asv.Supervisor) -> None:
    """The session is over and the exit status known: a Ctrl-C now (the second one,
    usually, come after the stop finished, while the report is printed or TensorFlow
    tears down) says so in one line and exits at once with that status."""
    global _late_handler
    status = sv.status()
    code = asv.exit_code(status)
    last = status.last_checkpoint
    saved = f"the latest checkpoint is step {last.step}" if last is not None else "no checkpoint was saved"
    if (status.stop_reason or "").startswith("signal:"):
        text = f"second Ctrl-C: the stop had already finished; {saved}"
    else:
        text = f"Ctrl-C: training had already stopped ({status.stop_reason}); {saved}"

    def exit_now(signum: int, frame: Any) -> None:
        try:
            sys.stdout.flush()
            prefix = "\r\x1b[K" if sys.stderr.isatty() else ""  # over the terminal's ^C
            sys.stderr.write(prefix + text + "\n")
            sys.stderr.flush()
        except Exception:  # a dead stream: the exit status still says it
            pass
        os._exit(code)

    _late_handler = exit_now
    try:
        signal.signal(signal.SIGINT, exit_now)
    except ValueError:  # not the main thread: the application's signals
        _late_handler = None


def run(args: argparse.Namespace) -> int:
    """Run the demo; its exit status."""
    status: int = anyio.run(main, args, backend=args.backend)
    if _late_handler is not None:  # the event loop put its own handler back as it ended
        signal.signal(signal.SIGINT, _late_handler)
    return status
