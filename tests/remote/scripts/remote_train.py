"""A training into a URL logdir for the remote field tests.

Usage: ``remote_train.py URL LOCAL_DIR MAX_STEPS SAVE_STEPS MB [GRACE_SECS]``. The state is
``MB`` megabytes of float32 plus a random generator, stepped deterministically
(:func:`state_of` / :func:`step`), so a resumed run ends bitwise where an uninterrupted one
does. Saves every ``SAVE_STEPS``; SIGTERM/SIGINT stop it gracefully. On stdout:
``started <step>`` once running, ``done <step> <sha256 of the state>`` at the end; log
events on stderr. Exits with ``asv.exit_code``, also when the session fails (a refused
start, a lost lease, storage unreachable): then nothing more on stdout, the error on
stderr.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import anyio
import tensorflow as tf

import asupervisor as asv


def state_of(mb: float) -> dict[str, Any]:
    """The state: ``mb`` MB of weights (seeded) and a seeded generator."""
    tf.keras.utils.set_random_seed(3)
    n = max(1, int(mb * (1 << 20) / 4 / 1024))
    return {"w": tf.Variable(tf.random.normal([n, 1024]), name="w"), "gen": tf.random.Generator.from_seed(11)}


def step(state: dict[str, Any]) -> None:
    """One deterministic step."""
    state["w"].assign_add(state["gen"].normal(state["w"].shape) * 0.01)


def digest(state: dict[str, Any]) -> str:
    """The state's weights, hashed."""
    return hashlib.sha256(state["w"].numpy().tobytes()).hexdigest()


async def main() -> None:
    url, local, max_steps, save_steps, mb = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        float(sys.argv[5]),
    )
    grace = float(sys.argv[6]) if len(sys.argv) > 6 else 60.0
    asv.configure_logging()  # events to stderr; stdout is for the test
    state = state_of(mb)
    sv = asv.Supervisor(
        url,
        local_dir=local,
        state=state,
        save_model_steps=save_steps,
        save_model_secs=0,
        save_summaries_secs=0,
        stop_grace_secs=grace,
    )
    try:
        async with sv.managed_session() as sess:
            print(f"started {sv.global_step}", flush=True)
            await sess.run_loop(lambda: step(state), max_steps=max_steps)
    except Exception as exc:  # its exit status says which (an error is never 0)
        print(f"remote_train: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(asv.exit_code(sv.status()) or 1)
    print(f"done {sv.global_step} {digest(state)}", flush=True)
    sys.exit(asv.exit_code(sv.status()))


if __name__ == "__main__":
    anyio.run(main)
