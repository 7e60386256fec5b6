"""Each command writes only inside its own kind of folder, one writer at a time, never through a
link.

- **Its own kind.** A folder fincheck claims is marked with the kind of command that writes it
  (`prepare`, `train`, `eval` -- eval, baseline and score share a folder -- and `merge`): a
  prepared-data folder is never written by eval, a training run never by prepare. A folder
  with no mark is claimed only when it is empty or holds nothing but the command's own outputs
  (an allow-list: the repository root, `/`, a home folder are refused, nothing of the user's is
  overwritten or mixed with).
- **No links.** A folder holding a symbolic link anywhere in it is refused: fincheck writes
  none, and a planted one (`report.md -> ~/.bashrc`) would make a write land outside it.
- **One writer.** The command holds an advisory `flock` on OUT/.fincheck.lock (opened without
  following a link) while it runs; the operating system releases it when the process ends,
  however it ends (a kill leaves no stale lock). A second writer is refused at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import IO

from fincheck.errors import FincheckError
from fincheck.io.safe_files import (
    KINDS,
    OWN_MARKER,
    folder_kind,
    hold_claimed_folder,
    is_temporary,
    open_own_file,
    refuse_inside_a_claimed_folder,
    write_text,
)

LOCK_FILE = ".fincheck.lock"
# What eval, baseline and score write at the top of their --out (score may share eval's).
EVAL_OUTPUTS = (LOCK_FILE, "predictions", "results.json", "report.md", "scored", "plots",
                "judge_cache.jsonl", "llm_cache.jsonl", "wandb", "eval_config.json",
                "eval_summary.json")  # fmt: skip


def claim_out_dir(
    out_dir: str | Path,
    flag: str,
    kind: str,
    own: Sequence[str] = (),
    marks: Sequence[str] = (),
) -> Path:
    """The output folder of a `kind` command, made if new. Refused when another kind of command
    wrote it, when it holds a link, or, unmarked, when it holds files fincheck did not write:
    fincheck's own is empty, marked `kind`, marked by one of `marks` (a file only this kind
    writes: a run's fincheck_run.json), or holding nothing but `own` (the command's outputs, or
    names matching `own`'s patterns, e.g. "checkpoint-*"): one familiar name (a report.md)
    beside the user's files proves nothing."""
    assert kind in KINDS, kind
    out = Path(out_dir)
    real = out.resolve()  # `new/../..` is its parent's parent, checked as such
    refuse_inside_a_claimed_folder(real, flag, kind)
    if real.is_dir():
        recorded = folder_kind(real)
        if recorded is not None and recorded != kind:
            raise FincheckError(
                f"{flag} {out} is a folder `fincheck {recorded}` writes; {kind} writes only "
                f"into its own kind of folder: choose another (nothing was written)"
            )
        entries = [p.name for p in real.iterdir()]
        marked = recorded == kind or any(m in entries for m in marks)
        others = [
            n
            for n in entries
            if n != OWN_MARKER and not is_temporary(n) and not any(fnmatch(n, p) for p in own)
        ]
        if others and not marked:
            shown = ", ".join(sorted(others)[:4]) + (", ..." if len(others) > 4 else "")
            raise FincheckError(
                f"{flag} {out} holds files fincheck did not write ({shown}): choose a new or "
                "empty folder (nothing in it is overwritten)"
            )
        # no link anywhere inside (the folder itself may be one: the user's); walked only once
        # the folder is fincheck's (`--out ~`)
        if link := next((p for p in real.rglob("*") if p.is_symlink()), None):
            raise FincheckError(
                f"{flag} {real}: {link.relative_to(real)} is a symbolic link; fincheck writes no "
                "links, and a write through it would land outside the folder. Remove it or "
                "choose another folder (nothing was written)"
            )
    out.mkdir(parents=True, exist_ok=True)
    hold_claimed_folder(out)  # no link followed inside it from now on
    if folder_kind(out) != kind:
        write_text(out / OWN_MARKER, kind + "\n", flag)
    return out


def lock_out_dir(out: Path, command: str) -> IO[str]:
    """Take OUT's writer lock for this process (released when the returned file is closed or
    the process ends); refuse at once if another process holds it."""
    fd = open_own_file(out / LOCK_FILE, os.O_RDWR | os.O_CREAT)  # no link of any kind
    f = os.fdopen(fd, "r+", encoding="utf-8")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = f.read().strip() or "another process"
        f.close()
        raise FincheckError(
            f"{out} is in use by {holder}: wait for it to finish, or write elsewhere"
        ) from None
    f.truncate()
    f.write(f"{command} (pid {os.getpid()})")
    f.flush()
    return f


@contextlib.contextmanager
def hold_out_dir(
    out_dir: str | Path,
    command: str,
    kind: str = "eval",
    own: Sequence[str] = EVAL_OUTPUTS,
    flag: str = "--out",
) -> Iterator[Path]:
    """Claim OUT for a `kind` command (`claim_out_dir`) and hold its writer lock while the block
    runs. A command that ends having written nothing (a bad option found late) leaves no lock
    file behind, nor the folder when it made it."""
    out = Path(out_dir)
    made = not out.exists()
    claim_out_dir(out, flag, kind, own)
    f = lock_out_dir(out, command)
    try:
        yield out
    finally:
        if {p.name for p in out.iterdir()} <= {LOCK_FILE, OWN_MARKER}:  # nothing written
            (out / LOCK_FILE).unlink()
            (out / OWN_MARKER).unlink(missing_ok=True)
            if made:
                out.rmdir()
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()
