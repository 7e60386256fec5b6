"""Words fincheck did not write (a library's error, an endpoint's reply), put into one of its
own messages: redacted first, then made one line and shortened. In the other order a held
secret that a cut or a collapsed space splits is no longer the value `redact` looks for, and
its first part is printed (an endpoint's 400 echoing its key past the 300th character)."""

from __future__ import annotations

import contextlib
import errno
import logging
import sys
from collections.abc import Iterator

from fincheck.errors import FincheckError, UsageError, free_on_disk, wrapped_os_error
from fincheck.io.secrets import redact


def show_progress_lines(line_format: str) -> None:
    """fincheck's own log lines from INFO up on stderr, a library's only from WARNING up. With
    the root logger at INFO, whatever a library logs there was printed too: torch's cache
    statistics, at exit after an interrupt during its import, followed "interrupted"."""
    logging.basicConfig(level=logging.WARNING, format=line_format)
    logging.getLogger("fincheck").setLevel(logging.INFO)


def shortened(text: str, limit: int = 300) -> str:
    """`text` redacted, on one line, at most `limit` characters."""
    text = " ".join(redact(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(error: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, redacted and shortened: library errors span
    paragraphs."""
    return shortened(str(error), limit) or type(error).__name__


@contextlib.contextmanager
def library_errors_as_one_line(subject: str, what_to_do: str) -> Iterator[None]:
    """At a load or setup boundary (a base, an adapter, PEFT, attention): any library error
    becomes one FincheckError, "SUBJECT: what failed (its class and words); WHAT_TO_DO". An OS
    error (a full disk, a missing file) is left to the commands' own file-error lines;
    `--debug` still shows the original traceback (chained)."""
    try:
        yield
    except (FincheckError, OSError):
        raise
    except Exception as e:
        raise FincheckError(f"{subject}: {type(e).__name__}: {one_line(e)}; {what_to_do}") from e


# What to do about a file system error, by errno (the path and the system's words come first).
_POINT = "point --out, FINCHECK_CACHE_DIR or HF_HOME at a"
_OS_HINTS = {
    errno.EACCES: f"not writable (or readable) by this user: {_POINT} folder you own",
    errno.EPERM: f"not permitted for this user: {_POINT} folder you own",
    errno.EROFS: f"a read-only file system: {_POINT} writable disk",
    errno.ENOTDIR: "a part of this path is a file, not a folder: choose another path",
    errno.EISDIR: "a folder where a file was expected: choose another path",
    errno.EEXIST: "a file is in the way of a folder of that name: choose another path",
    errno.ENOENT: "no such file or folder",
}


def os_error_line(e: OSError, rerun: str = "then rerun") -> str:
    """One line for a file system error: what, which path, what to do."""
    where = f" {e.filename}" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        disk = free_on_disk(e.filename) if e.filename else None
        free = f" ({disk[1]:.1f} GiB free on its disk)" if disk else ""
        return (
            f"out of disk space{' writing' + where if where else ''}{free}. Free some space or point "
            f"--out (and HF_HOME / FINCHECK_CACHE_DIR) at a disk with room, {rerun}."
        )
    what = e.strerror or type(e).__name__
    hint = _OS_HINTS.get(e.errno)
    return f"{what}:{where}" + (f" ({hint})" if hint else "")


def error_line(e: Exception, rerun: str = "then rerun") -> tuple[str, int] | None:
    """(the one line, the exit code) a command prints for an error, redacted; None for an error
    whose traceback says more (no path to name: a socket's, a library's own). `rerun`: what a
    rerun after a full disk does. Every entry point (`fincheck`, `train/sft.py`) uses it."""
    import json

    import yaml

    if isinstance(e, FincheckError):
        return redact(str(e)), 2 if isinstance(e, UsageError) else 1
    if isinstance(e, (UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError)):
        # The readers of fincheck's own files name the file and line; this is a library's.
        what = {UnicodeDecodeError: "UTF-8 text", json.JSONDecodeError: "JSON"}.get(type(e), "YAML")
        return f"a file is damaged or not {what} ({shortened(str(e))}); --debug shows which", 1
    os_error = wrapped_os_error(e)  # an OSError, or one a library wrapped (safetensors)
    if os_error is None or (
        os_error.filename is None and os_error.errno not in (errno.ENOSPC, errno.EDQUOT)
    ):
        return None
    return redact(os_error_line(os_error, rerun)), 1


def check_command_line(argv: list[str]) -> None:
    """A command line is text: an argument holding bytes that are no UTF-8 (which Python carries
    as lone surrogates) is refused here, once, naming it, rather than deep in a writer."""
    for position, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "backslashreplace").decode()
            raise UsageError(
                f"argument {position} ({redact(shown)!r}) holds bytes that are not UTF-8 text: "
                "give file names and values in UTF-8"
            ) from None


def redacting_excepthook(kind: type[BaseException], value: BaseException, tb) -> None:
    """Python's report of an uncaught exception, with every secret the run held redacted: it is
    printed after `main` has put back the streams it redacts through."""
    import traceback

    sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))
