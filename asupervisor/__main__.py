"""The ``asupervisor`` command (also ``python -m asupervisor``).

* ``asupervisor demo [--logdir ... --steps ... --backend ...]`` — a real, resumable
  training on built-in data (what ``make demo`` runs); exits with ``asv.exit_code``.
* ``asupervisor inspect LOGDIR [--json]`` — what is in a log directory: each checkpoint
  (step, time, size, whether it loads, which is the latest), leftovers of interrupted
  saves, a damaged state file, the last value of each scalar summary. Exits 1 when the
  directory is missing, a checkpoint does not load or the state file is damaged.
* ``asupervisor verify-resume [--kills N --steps N ...] SCRIPT [ARGS]`` — runs a
  training script to its end, then again with SIGKILLs and restarts, and compares the
  final states bitwise; exits 0 when they match, 1 when not (naming the first value that
  differs and the likely cause), 2 when the script cannot be verified.

TensorFlow is imported only once a command runs, after its start-up noise is silenced.
An error of the library (a logdir that cannot be used, a URL nothing serves, a checkpoint
of another model) ends the command with one line on standard error and status 1;
``--debug`` shows its traceback instead. A Ctrl-C before a session (while TensorFlow
loads) is one line, ``asupervisor demo: interrupted``, and status 130, like a Ctrl-C
inside it (after the session, the demo says what it stopped at).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (``sys.argv[1:]`` by default); its exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads
    parser = argparse.ArgumentParser(prog="asupervisor", description="asupervisor: supervised TensorFlow 2 training")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="on an error, show its traceback, not one line")
    demo = commands.add_parser("demo", parents=[common], help="train a small model, resumably, on built-in data")
    inspect = commands.add_parser(
        "inspect", parents=[common], help="show the checkpoints and summaries of a log directory"
    )
    inspect.add_argument("logdir", help="the training's log directory")
    inspect.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    verify = commands.add_parser(
        "verify-resume",
        parents=[common],
        help="kill a training script at random moments, resume it, compare with an uninterrupted run",
    )
    _demo_arguments(demo)
    _verify_arguments(verify)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own usage, not the top level's
        {"demo": demo, "inspect": inspect, "verify-resume": verify}[args.command].error(
            f"unrecognized arguments: {' '.join(unknown)}"
        )
    from ._exceptions import SupervisorError

    if not args.debug:
        from ._logging import reported_by_caller

        reported_by_caller("session.start_failed")  # the one line below says it
    try:
        if args.command == "demo":
            from . import _demo

            code = _demo.run(args)
            if argv is None:  # the command itself, not a caller in Python: exit now, so a
                # late Ctrl-C finds the demo's handler, not the interpreter's teardown
                # (which puts the default back and dies of the signal, status -2)
                from ._core._exit import exit_now

                exit_now(code)
            return code
        if args.command == "verify-resume":  # its runs import TensorFlow; it does only to compare
            from . import _verify

            return _verify.run(args)
        if not args.debug:
            _import_tensorflow_quietly()
        from . import _inspect

        return _inspect.run(args.logdir, as_json=args.json)
    except KeyboardInterrupt:  # Ctrl-C outside a session (loading TensorFlow, the demo's last report)
        print(f"asupervisor {args.command}: interrupted", file=sys.stderr)  # noqa: T201
        return 130
    except (SupervisorError, ValueError, OSError) as exc:  # bad input or a logdir that cannot be used
        if args.debug:
            raise
        message = " ".join(str(exc).split()) or "(no message)"
        print(  # noqa: T201
            f"asupervisor {args.command}: {type(exc).__name__}: {message} (--debug shows the traceback)",
            file=sys.stderr,
        )
        return 1


def _import_tensorflow_quietly() -> None:
    """Import TensorFlow with file descriptor 2 pointed at ``/dev/null``: its native
    start-up lines (absl's "All log messages before absl::InitializeLog()", CUDA's probing
    on a machine without a GPU) are written there before any log level applies, and a
    report has no use for them. An import error still raises, once stderr is back."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to save: nothing to hide either
        return
    try:
        with open(os.devnull, "w") as null:
            sys.stderr.flush()
            os.dup2(null.fileno(), 2)
            try:
                import tensorflow  # noqa: F401
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _count(least: int) -> Callable[[str], int]:
    """An argparse type: an int of at least ``least`` (checked before anything is written)."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
        if number < least:
            raise argparse.ArgumentTypeError(f"expected a number >= {least}, got {value!r}")
        return number

    return parse


def _positive_secs(value: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        secs = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not 0 < secs < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value!r}")
    return secs


def _secs_or_auto(value: str) -> float | str:
    """``--save-secs``: a number of seconds or ``auto``."""
    if value == "auto":
        return value
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds or 'auto', got {value!r}") from None


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's command-line options."""
    parser.add_argument("--logdir", default="runs/demo")
    parser.add_argument("--max-steps", type=_count(0), default=None, help="stop at this global step")
    parser.add_argument("--steps", type=_count(1), default=60_000, help="without --max-steps: steps to run now")
    parser.add_argument("--batch-size", type=_count(1), default=64)
    parser.add_argument(
        "--save-secs",
        type=_secs_or_auto,
        default=5.0,
        help="seconds between checkpoints, or 'auto': as often as costs training under 2%% (5)",
    )
    parser.add_argument("--summary-secs", type=_positive_secs, default=2.0)
    parser.add_argument("--progress-secs", type=_positive_secs, default=2.0)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")


def _verify_arguments(parser: argparse.ArgumentParser) -> None:
    """verify-resume's command-line options (before SCRIPT; what follows it is the script's)."""
    parser.add_argument("--kills", type=_count(0), default=3, help="SIGKILLs before a run may end (3)")
    parser.add_argument("--steps", type=_count(1), default=None, help="stop every run at this global step")
    parser.add_argument(
        "--save-steps", type=_count(1), default=None, help="a checkpoint every N steps too (default: steps/8)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments (0)")
    parser.add_argument("--timeout", type=_positive_secs, default=600.0, help="seconds a run may take (600)")
    parser.add_argument(
        "--no-control",
        dest="control",
        action="store_false",
        help="on a difference, do not run the script once more without kills (tells non-determinism apart)",
    )
    parser.add_argument("--workdir", default=None, help="an empty directory for the runs (default: a temporary one)")
    parser.add_argument("script", help="the training script, run as python SCRIPT ARGS")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments; {logdir} is replaced by each run's")


if __name__ == "__main__":
    sys.exit(main())
