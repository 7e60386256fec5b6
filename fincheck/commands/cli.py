"""`fincheck` console command: one subcommand per stage.

Each stage owns a small `commands.py` with `register(subparsers)`; heavy imports (torch,
transformers) happen inside the handlers so `fincheck --help` stays instant. A `FincheckError`
prints as one clean line (what happened, what to do); `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import errno
import functools
import importlib
import json
import os
import sys

import yaml

from fincheck import __version__
from fincheck.errors import FincheckError, UsageError, free_on_disk, wrapped_os_error
from fincheck.io.bounded_http import bound_hub_replies
from fincheck.io.config import close_flags
from fincheck.io.secrets import RedactingStream, redact

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
        description=(
            "Train and evaluate compact hallucination detectors.\n\n"
            "Pipeline: fincheck prepare -> fincheck train -> fincheck eval -> fincheck score\n"
            "Run `fincheck <command> --help` for the options of each step."
        ),
        formatter_class=raw,
    )
    parser.add_argument("--version", action="version", version=f"fincheck {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    commands = functools.partial(argparse.ArgumentParser, formatter_class=raw)  # each as this one
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=commands)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


# What to do about a file system error, by errno (the path and the system's words come first).
_OS_HINTS = {
    errno.EACCES: "not writable (or readable) by this user: point --out, FINCHECK_CACHE_DIR or "
    "HF_HOME at a folder you own",
    errno.EPERM: "not permitted for this user: point --out, FINCHECK_CACHE_DIR or HF_HOME at a "
    "folder you own",
    errno.EROFS: "a read-only file system: point --out, FINCHECK_CACHE_DIR or HF_HOME at a "
    "writable disk",
    errno.ENOTDIR: "a part of this path is a file, not a folder: choose another path",
    errno.EISDIR: "a folder where a file was expected: choose another path",
    errno.EEXIST: "a file is in the way of a folder of that name: choose another path",
    errno.ENOENT: "no such file or folder",
}


def free_space(path: str | os.PathLike) -> str:
    """ " (N GiB free on its disk)" for the disk that holds `path`, "" where the system cannot
    say."""
    disk = free_on_disk(path)
    return f" ({disk[1]:.1f} GiB free on its disk)" if disk else ""


def os_error_line(e: OSError, command: str) -> str:
    """One line for a file system error: what, which path, what to do."""
    where = f" {e.filename}" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        rerun = RERUN_AFTER_FULL_DISK.get(command, "then rerun")
        free = free_space(e.filename) if e.filename else ""
        return (
            f"out of disk space{' writing' + where if where else ''}{free}. Free some space or point "
            f"--out (and HF_HOME / FINCHECK_CACHE_DIR) at a disk with room, {rerun}."
        )
    what = e.strerror or type(e).__name__
    hint = _OS_HINTS.get(e.errno)
    return f"{what}:{where}" + (f" ({hint})" if hint else "")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if extra and not getattr(args, "accepts_overrides", False):
        command = parser._subparsers._group_actions[0].choices[args.command]
        given = {arg.split("=", 1)[0] for arg in extra}
        moved = [hint for flag, hint in getattr(args, "moved_flags", {}).items() if flag in given]
        command.error(
            f"unrecognized arguments: {close_flags(command, extra)}"
            + "".join(f"; {hint}" for hint in moved)
        )
    args.overrides = extra
    bound_hub_replies()  # every hub reply of the command read with bounds, whichever route
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    try:
        return _run(args)
    finally:
        sys.stdout, sys.stderr = streams


def _run(args) -> int:
    """The command, its errors as one line each (printed through the redacting streams)."""
    try:
        return int(args.func(args) or 0)
    except FincheckError as e:
        if args.debug:
            raise
        print(f"fincheck {args.command}: error: {redact(str(e))}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    except (UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as e:
        if args.debug:
            raise
        # The readers of fincheck's own files name the file and line; this is a library's.
        what = {UnicodeDecodeError: "UTF-8 text", json.JSONDecodeError: "JSON"}.get(type(e), "YAML")
        print(
            f"fincheck {args.command}: error: a file is damaged or not {what} "
            f"({redact(' '.join(str(e).split()))}); "
            "--debug shows which",
            file=sys.stderr,
        )
        return 1
    except Exception as e:
        os_error = wrapped_os_error(e)  # an OSError, or one a library wrapped (safetensors)
        if (
            args.debug
            or os_error is None
            or (os_error.filename is None and os_error.errno not in (errno.ENOSPC, errno.EDQUOT))
        ):
            raise  # no path to name (a socket, a library's own): the traceback says more
        line = os_error_line(os_error, args.command)
        print(f"fincheck {args.command}: error: {redact(line)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"fincheck {args.command}: interrupted", file=sys.stderr)
        return 130


def redacting_excepthook(kind: type[BaseException], value: BaseException, tb) -> None:
    """Python's report of an uncaught exception, with every secret the run held redacted: it is
    printed after `main` has put back the streams it redacts through."""
    import traceback

    sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))


def console() -> None:
    """The `fincheck` executable: `main`, then exit at once. Calls still in flight on worker
    threads (an endpoint that does not answer, after Ctrl-C or a stopped run) would otherwise
    hold the process at exit for their whole timeout; what the command wrote is flushed."""
    import os
    import threading

    sys.excepthook = redacting_excepthook  # a traceback (--debug) is printed after main returns
    try:
        code = main()
    except BrokenPipeError:  # `fincheck models list | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        os._exit(0)
    stuck = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if stuck:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
