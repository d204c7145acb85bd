"""A training process for the signal tests with checkpoints (tests/core/test_signals.py).

    python signal_train.py BACKEND LOGDIR [--mb MB] [--vars N] [--debug] [--slow-init] [--app-handler]
                           [--signal-from-thread] [--stop-signals NAME,NAME...]

The state holds a ``big`` variable of ``MB`` megabytes, so a checkpoint takes a while to
write. With ``--slow-init`` the state is initialised by an ``init_fn`` that prints
``init`` and then takes a few seconds (a signal can arrive during start-up). Otherwise
the body takes a checkpoint with ``save_now()``, takes one more step, prints ``ready
<the saved step>`` and trains until a signal stops it. It prints ``step <global step>`` at the end. With ``--app-handler`` the program installs its own SIGINT/SIGTERM
handler first (as a web server does), which prints ``app-handler <NAME>``; after the
session it prints ``handler-restored <True|False>``. At the end it prints ``stop_reason=<reason> latest=<path or None>``
and exits with ``asv.exit_code``. With ``--signal-from-thread`` the step thread sends
SIGTERM to itself at step 20 (``pthread_kill``): the kernel's choice of a thread other
than the main one, made deterministic. ``--vars N`` adds N small variables to the state
(a walk the writer makes a batched read for, seconds of work at thousands); ``--debug``
logs debug events too. ``--stop-signals`` is the Supervisor's ``stop_signals`` (comma-separated).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import tensorflow as tf

import asupervisor as asv


async def main(args: argparse.Namespace) -> int:
    asv.configure_logging(level="debug" if args.debug else "info")  # events to stderr; stdout is for the test

    def app_handler(signum: int, frame: object) -> None:
        print(f"app-handler {signal.Signals(signum).name}", flush=True)

    if args.app_handler:
        signal.signal(signal.SIGINT, app_handler)
        signal.signal(signal.SIGTERM, app_handler)
    n = int(args.mb * (1 << 20) / 4)
    state = {"big": tf.Variable(tf.fill([n], 1.5)), "w": tf.Variable(0.0)}
    state.update({f"small{i}": tf.Variable(tf.zeros([4])) for i in range(args.vars)})

    def slow_init() -> None:
        print("init", flush=True)
        time.sleep(3)

    sv = asv.Supervisor(
        args.logdir,
        state=state,
        init_fn=slow_init if args.slow_init else None,
        save_model_secs=3600,
        save_summaries_secs=0,
        handle_signals=True,
        **({"stop_signals": args.stop_signals.split(",")} if args.stop_signals else {}),
    )

    def step() -> None:
        state["w"].assign_add(1.0)
        time.sleep(0.001)
        if args.signal_from_thread and sv.global_step == 20:  # on the step thread, not the main one
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    async with sv.managed_session() as sess:
        if not args.slow_init:
            for _ in range(5):
                await sess.run(step)
            info = await sv.save_now()
            await sess.run(step)  # one step past the saved one: a stop from now on has a final save to take
            print(f"ready {info.step}", flush=True)
        await sess.run_loop(step)
    if args.app_handler:
        restored = signal.getsignal(signal.SIGINT) is app_handler and signal.getsignal(signal.SIGTERM) is app_handler
        print(f"handler-restored {restored}", flush=True)
    print(f"step {sv.global_step}", flush=True)
    print(f"stop_reason={sv.status().stop_reason} latest={tf.train.latest_checkpoint(args.logdir)}", flush=True)
    return asv.exit_code(sv.status())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("backend")
    parser.add_argument("logdir")
    parser.add_argument("--mb", type=float, default=1.0)
    parser.add_argument("--vars", type=int, default=0)
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--slow-init", action="store_true")
    parser.add_argument("--app-handler", action="store_true")
    parser.add_argument("--signal-from-thread", action="store_true")
    parser.add_argument("--stop-signals", default="")
    ns = parser.parse_args()
    sys.exit(anyio.run(main, ns, backend=ns.backend))
