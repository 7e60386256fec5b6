"""The one exception type the CLI turns into a clean message (no traceback unless --debug)."""

from __future__ import annotations

from pathlib import Path


class FincheckError(Exception):
    """A problem the user can fix: the message says what happened and what to do."""


class UsageError(FincheckError):
    """A command-line option with a bad value, or one the chosen mode does not read: exit 2,
    argparse's code for a usage error."""


class InvalidRecordError(FincheckError):
    """A raw data record that fails validation, located as `file:line: field: problem`."""

    def __init__(self, path: str, line: int, field: str, problem: str) -> None:
        self.path, self.line, self.field, self.problem = path, line, field, problem
        super().__init__(f"{path}:{line}: {field}: {problem}")


def wrapped_os_error(e: BaseException, path: object = None) -> OSError | None:
    """The `OSError` inside a library's own exception, or None. safetensors (Rust) reports a
    full disk as `SafetensorError("... No space left on device (os error 28)")`, not as an
    OSError: unwrapped, it is one line like any file system error, naming `path` if given."""
    import os
    import re

    if isinstance(e, OSError):
        return e
    found = re.search(r"\(os error (\d+)\)", str(e))
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code), None if path is None else str(path))


def free_on_disk(path: object) -> tuple[Path, float] | None:
    """(the nearest existing folder holding `path`, GiB free on its disk), for the messages
    about a full disk; None where the system cannot say."""
    import os
    import shutil

    where = Path(os.fsdecode(path)).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return where, shutil.disk_usage(where).free / 2**30
    except OSError:
        return None
