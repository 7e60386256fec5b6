"""One writer per output folder: two commands appending to the same predictions files would
interleave and replace each other's lines (and each would report its own counts as the truth).

The lock is an advisory `flock` on OUT/.fincheck.lock, held while the command runs and released
by the operating system when the process ends, however it ends (a kill leaves no stale lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Sequence
from fnmatch import fnmatch
from pathlib import Path

from fincheck.errors import FincheckError

LOCK_FILE = ".fincheck.lock"
# Written into every output folder fincheck claims: a folder with neither this nor what the
# command itself writes there is someone else's, and is never written into.
OWN_MARKER = ".fincheck-out"
# What eval, baseline and score write at the top of their --out (score may share eval's).
EVAL_OUTPUTS = (LOCK_FILE, "predictions", "results.json", "report.md", "scored", "plots",
                "judge_cache.jsonl", "llm_cache.jsonl", "wandb")  # fmt: skip


def claim_out_dir(
    out_dir: str | Path, flag: str, own: Sequence[str] = (), marks: Sequence[str] = ()
) -> Path:
    """The output folder, made if new, refused when it holds files fincheck did not write (the
    repository root, `/`, a home folder): an allow-list, so nothing of the user's is
    overwritten or mixed with. Fincheck's own: empty, marked by an earlier claim or by one of
    `marks` (a file only fincheck writes: a run's fincheck_run.json), or holding nothing but
    `own` (the command's own outputs, or names matching `own`'s patterns, e.g. "checkpoint-*"):
    one familiar name (a report.md, a README.md) beside the user's files proves nothing."""
    out = Path(out_dir)
    real = out.resolve()  # `new/../..` is its parent's parent, checked as such
    if real.is_dir():
        entries = [p.name for p in real.iterdir()]
        marked = OWN_MARKER in entries or any(m in entries for m in marks)
        others = [n for n in entries if not any(fnmatch(n, pat) for pat in own)]
        if others and not marked:
            shown = ", ".join(sorted(others)[:4]) + (", ..." if len(others) > 4 else "")
            raise FincheckError(
                f"{flag} {out} holds files fincheck did not write ({shown}): choose a new or "
                "empty folder (nothing in it is overwritten)"
            )
    out.mkdir(parents=True, exist_ok=True)
    (out / OWN_MARKER).touch()
    return out


@contextlib.contextmanager
def hold_out_dir(out_dir: str | Path, command: str) -> Iterator[None]:
    """Hold OUT for `command` (claimed first: `claim_out_dir`); refuse at once if another process
    holds it. A command that ends having written nothing (a bad option found late) leaves no
    lock file behind, nor the folder when it made it."""
    out = Path(out_dir)
    made = not out.exists()
    claim_out_dir(out, "--out", EVAL_OUTPUTS)
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
            if {p.name for p in out.iterdir()} <= {LOCK_FILE, OWN_MARKER}:  # nothing written
                (out / LOCK_FILE).unlink()
                (out / OWN_MARKER).unlink(missing_ok=True)
                if made:
                    out.rmdir()
            fcntl.flock(f, fcntl.LOCK_UN)
