"""`fincheck` console command: one subcommand per stage.

Each stage owns a small `commands.py` with `register(subparsers)`; heavy imports (torch,
transformers) happen inside the handlers so `fincheck --help` stays instant. A `FincheckError`
prints as one clean line (what happened, what to do); `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import signal
import sys

from fincheck import __version__
from fincheck.errors import UsageError
from fincheck.io.bounded_http import bound_hub_replies
from fincheck.io.config import close_flags
from fincheck.io.messages import check_command_line, error_line, redacting_excepthook
from fincheck.io.secrets import redacted_output

# Stage modules that contribute subcommands, in the order they appear in --help.
COMMAND_MODULES = (
    "fincheck.data_prep.commands",
    "fincheck.train.commands",
    "fincheck.eval.commands",
    "fincheck.eval.compare",
    "fincheck.serve.commands",
    "fincheck.commands.models",
)


# What a rerun after a full disk does, per command (a promise each command keeps).
RERUN_AFTER_FULL_DISK = {
    "prepare": "then rerun it: prepare starts over (no half-written file is left)",
    "eval": "then rerun: the predictions written are kept and only the rest is generated",
    "baseline": "then rerun: the predictions written are kept and LLM answers are cached",
    "score": "then rerun: judge answers already received are cached",
    "models": "then rerun: the parts already checked are kept",
}


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter  # descriptions and examples laid out as written
    parser = argparse.ArgumentParser(
        prog="fincheck",
        allow_abbrev=False,
        description=(
            "Train and evaluate compact hallucination detectors.\n\n"
            "Pipeline: fincheck prepare -> fincheck train -> fincheck eval -> fincheck score\n"
            "Run `fincheck <command> --help` for the options of each step."
        ),
        formatter_class=raw,
    )
    parser.add_argument("--version", action="version", version=f"fincheck {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    # each as this one; an option spelt in part is no abbreviation of another (`--api-key`
    # would be taken for `--api-key-env`, and its value for a variable's name)
    commands = functools.partial(argparse.ArgumentParser, formatter_class=raw, allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=commands)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    with redacted_output():  # every line the command prints, its usage errors' included
        argv = sys.argv[1:] if argv is None else argv
        parser = build_parser()
        try:
            check_command_line(argv)
        except UsageError as e:
            parser.error(str(e))
        args, extra = parser.parse_known_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        if extra and not getattr(args, "accepts_overrides", False):
            command = parser._subparsers._group_actions[0].choices[args.command]
            given = {arg.split("=", 1)[0] for arg in extra}
            moved = [
                hint for flag, hint in getattr(args, "moved_flags", {}).items() if flag in given
            ]
            command.error(
                f"unrecognized arguments: {close_flags(command, extra)}"
                + "".join(f"; {hint}" for hint in moved)
            )
        args.overrides = extra
        bound_hub_replies()  # every hub reply of the command read with bounds, whichever route
        return _run(args)


def _run(args) -> int:
    """The command, its errors as one line each (printed through the redacting streams)."""
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt as e:
        return _stopped(e, f"fincheck {args.command}")
    except Exception as e:
        rerun = RERUN_AFTER_FULL_DISK.get(args.command, "then rerun")
        if args.debug or (said := error_line(e, rerun)) is None:
            raise
        print(f"fincheck {args.command}: error: {said[0]}", file=sys.stderr)
        return said[1]


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, `timeout`, a scheduler) stops a command as Ctrl-C does, so what it
    records on its way out is written (the models an endpoint served an eval's predictions,
    the calls in flight given up); exit 143, a terminated process's code."""


def _stopped(e: KeyboardInterrupt, who: str) -> int:
    """One line for a command stopped by Ctrl-C (exit 130) or SIGTERM (exit 143)."""
    terminated = isinstance(e, Terminated)
    print(f"{who}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
    return 143 if terminated else 130


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def console() -> None:
    """The `fincheck` executable: `main`, then exit at once. Calls still in flight on worker
    threads (an endpoint that does not answer, after Ctrl-C or a stopped run) would otherwise
    hold the process at exit for their whole timeout; what the command wrote is flushed."""
    import os
    import threading

    sys.excepthook = redacting_excepthook  # a traceback (--debug) is printed after main returns
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # (one ignored by the caller stays so)
        signal.signal(signal.SIGTERM, _terminate)
    try:
        code = main()
    except BrokenPipeError:  # `fincheck models list | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        os._exit(0)
    except KeyboardInterrupt as e:  # before a command ran (while the parser was being built)
        code = _stopped(e, "fincheck")
    stuck = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if stuck:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
