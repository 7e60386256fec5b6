"""One writer per output folder: two commands appending to the same predictions files would
interleave and replace each other's lines (and each would report its own counts as the truth).

The lock is an advisory `flock` on OUT/.fincheck.lock, held while the command runs and released
by the operating system when the process ends, however it ends (a kill leaves no stale lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from fincheck.errors import FincheckError

LOCK_FILE = ".fincheck.lock"


@contextlib.contextmanager
def hold_out_dir(out_dir: str | Path, command: str) -> Iterator[None]:
    """Hold OUT for `command`; refuse at once if another process holds it. A command that ends
    having written nothing (a bad option found late) leaves no lock file behind, nor the folder
    when it made it."""
    out = Path(out_dir)
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    with (out / LOCK_FILE).open("a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise FincheckError(
                f"{out} is in use by {holder}: wait for it to finish, or use another --out"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{command} (pid {os.getpid()})")
        f.flush()
        try:
            yield
        finally:
            if [p.name for p in out.iterdir()] == [LOCK_FILE]:  # nothing written: leave no trace
                (out / LOCK_FILE).unlink()
                if made:
                    out.rmdir()
            fcntl.flock(f, fcntl.LOCK_UN)
