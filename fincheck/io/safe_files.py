"""Opening a file fincheck writes: never through a link of any kind, never into something that
is not a plain file of its own.

Every file fincheck writes goes through this module (tests/test_safe_files.py holds the rest of
the product to it):

- `replaced_file` / `write_text` / `write_bytes`: a whole output (a report, a record, a JSONL
  rewritten): built under a fresh name created exclusively in the folder (opened once, without
  following a link), then renamed onto PATH. A rename replaces the name, so a link or hard link
  planted at PATH is replaced, never written through; a crash or a full disk leaves PATH as it
  was (old or absent), never half-written.
- `open_own_file`: a file appended to or locked in place (a log, a cache, a lock): no symbolic
  link is followed (O_NOFOLLOW), a FIFO or device is refused without blocking on it
  (O_NONBLOCK), and what was opened must be a regular file with a single link, so a hard link
  to someone else's file is never written through.
- `claimed_output_file`: a new output named by an option (`detect --out`), built under
  PATH.partial, held by one writer (an advisory lock), and moved to PATH only when complete and
  only if PATH still does not exist.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from fincheck.errors import FincheckError


def open_own_file(path: str | Path, flags: int, what: str = "") -> int:
    """`os.open(path, flags)` for writing, refused unless the result is a regular file with one
    link (checked on the opened descriptor, so nothing can be swapped in between)."""
    path = Path(path)
    folder = _open_folder(path.parent, what)
    try:
        flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(path.name, flags, 0o644, dir_fd=folder)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # link, FIFO, folder
            raise FincheckError(_not_own(path, what, "a link, a FIFO or a folder")) from None
        raise
    finally:
        os.close(folder)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        kind = "a hard-linked file" if stat.S_ISREG(info.st_mode) else "no regular file"
        raise FincheckError(_not_own(path, what, kind))
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def read_regular_bytes(path: str | Path) -> bytes:
    """The bytes of a regular file (`open_regular_file`: a FIFO is one line, never a wait)."""
    with open(open_regular_file(path), "rb") as f:
        return f.read()


def open_regular_file(path: str | Path) -> int:
    """A descriptor for reading `path`, refused in one line unless it is a regular file (a link
    to one is followed): a FIFO would wait for a writer forever, a device never ends. Checked
    on the opened descriptor; opening a FIFO this way does not wait."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FincheckError(
            f"{path}: not a regular file (a FIFO, a device or a folder); give a file"
        )
    os.set_blocking(fd, True)
    return fd


def _not_own(path: Path, what: str, kind: str) -> str:
    return (
        f"{what + ' ' if what else ''}{path}: {kind}; fincheck writes only plain files of its "
        "own, never through a link (another file would be written). Remove it or choose another "
        "path (nothing was written through it)"
    )


# Output folders this process claimed (`fincheck.io.out_lock`), as given: inside one, no link is
# followed on the way to a file, whatever was planted after the claim (a subfolder swapped for
# a link); the way to the claimed folder itself is the user's, links and all.
_CLAIMED: list[Path] = []


def hold_claimed_folder(folder: str | Path) -> None:
    _CLAIMED.append(Path(os.path.abspath(folder)))


def _open_folder(folder: Path, what: str) -> int:
    """The folder a file is written into, opened once (the file is made in the folder that was
    opened, whatever its path names meanwhile). Inside a claimed folder it is reached one
    component at a time without following a link: a subfolder swapped for a link after the
    claim is refused."""
    folder = Path(os.path.abspath(folder))
    inside = [r for r in _CLAIMED if r == folder or r in folder.parents]
    root = max(inside, key=lambda r: len(r.parts)) if inside else folder
    below = folder.relative_to(root).parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    no_link = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    for depth, part in enumerate(below, start=1):
        try:
            step = os.open(part, no_link, dir_fd=fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                where = root.joinpath(*below[:depth])
                raise FincheckError(_not_own(where, what, "a link or no folder")) from None
            raise
        finally:
            os.close(fd)
        fd = step
    return fd


@contextlib.contextmanager
def replaced_file(path: str | Path, what: str = "", *, binary: bool = False) -> Iterator[IO]:
    """A file written whole or not at all: the block writes a new file, made exclusively under a
    fresh name beside PATH (so it is a regular file with one link, fincheck's), which is then
    renamed onto PATH (replacing what was there, a planted link included, never writing
    through it). On any error, a kill excepted, the new file is removed and PATH is untouched."""
    path = Path(path)
    folder = _open_folder(path.parent, what)
    tmp = f".{path.name}.{secrets.token_hex(4)}{TEMPORARY_SUFFIX}"
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o644, dir_fd=folder)
        try:
            opened = (
                os.fdopen(fd, "wb")
                if binary
                else os.fdopen(fd, "w", encoding="utf-8", newline="\n")
            )
            with opened as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            if stat.S_ISDIR(_lstat_mode(path.name, folder)):
                raise FincheckError(_not_own(path, what, "a folder"))
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=folder)
            raise
    finally:
        os.close(folder)


# Written into every output folder fincheck claims (`out_lock.claim_out_dir`), holding the kind
# of command that writes it.
OWN_MARKER = ".fincheck-out"
KINDS = ("prepare", "train", "eval", "merge")


def folder_kind(out: Path) -> str | None:
    """The kind a folder is marked with; None when unmarked (or marked by a fincheck that
    wrote an empty mark: then only its contents can say whose it is)."""
    marker = out / OWN_MARKER
    if marker.is_symlink() or not marker.is_file():
        return None
    kind = read_regular_bytes(marker).decode("utf-8", errors="replace").strip()
    return kind if kind in KINDS else None


def refuse_inside_a_claimed_folder(path: str | Path, flag: str, kind: str | None = None) -> None:
    """An output is never put inside a folder another kind of command claimed (a training run,
    prepared data): a file there is taken for one of the run's own, and a folder for one of its
    checkpoints or tasks. `kind`: the command's own kind, whose folders it may nest in."""
    for folder in Path(path).resolve().parents:
        claimed = folder_kind(folder)
        if claimed is not None and claimed != kind:
            raise FincheckError(
                f"{flag} {path} is inside {folder}, a folder `fincheck {claimed}` writes: "
                "choose a path outside it (nothing was written)"
            )


@contextlib.contextmanager
def new_folder(out: str | Path, what: str, flag: str = "--out") -> Iterator[Path]:
    """An output folder written whole or not at all: the block fills a fresh folder made beside
    OUT (mkdtemp: new, fincheck's own), which is renamed onto OUT when the block ends; on any
    error, and afterwards in any case, the fresh folder is removed. A kill or a full disk leaves
    no half-written OUT (a rerun just works), and two writers cannot mix: the second rename finds
    OUT taken and says so. OUT must be new or an empty folder (never a link, dangling or not);
    `what` names the writer, `flag` the option that named OUT."""
    out = Path(out)
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise FincheckError(f"{out}: not empty (or not a folder); pick a new {flag} folder")
    refuse_inside_a_claimed_folder(out, flag)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.{what}-", dir=out.parent))
    try:
        os.chmod(staging, 0o777 & ~_umask())  # a folder as any other, not mkdtemp's 0o700
        yield staging
        try:
            if out.is_dir() and not out.is_symlink():
                out.rmdir()  # empty (checked above); a writer that got there first fills it
            os.rename(staging, out)
        except OSError as e:
            raise FincheckError(
                f"{out}: another {what} wrote it meanwhile ({e.strerror}); nothing of this "
                f"{what} was kept"
            ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fresh_folder(path: str | Path, what: str = "") -> Path:
    """An empty folder of fincheck's own at PATH, inside a folder the command holds (a library's
    save goes there, to be moved out by `move_files_into`): what was at PATH (a leftover of a
    kill, or a planted link, which is removed, never followed) is gone first."""
    path = Path(path)
    folder = _open_folder(path.parent, what)
    try:
        mode = _lstat_mode(path.name, folder)
        if stat.S_ISDIR(mode):
            shutil.rmtree(path)  # refuses a link at PATH; walks its own tree without following
        elif mode:
            os.unlink(path.name, dir_fd=folder)
        os.mkdir(path.name, dir_fd=folder)
    finally:
        os.close(folder)
    return path


def refuse_foreign_entries(folder: str | Path, what: str) -> None:
    """A folder a library has just saved into (a `fresh_folder`) holds only folders and plain
    files of one name. Libraries open their files by name: an entry that is anything else was
    put there by another process while they saved, and what it points to may have been
    written; the save is not used."""
    if not stat.S_ISDIR(os.lstat(folder).st_mode):  # the folder itself swapped for a link
        raise FincheckError(_not_own(Path(folder), what, "a link or no folder"))

    def unlisted(error: OSError) -> None:  # a folder that cannot be listed is not clean
        raise FincheckError(
            f"{error.filename}: cannot be listed ({error.strerror}); {what} is not used"
        )

    for root, folders, files in os.walk(folder, onerror=unlisted):  # links listed, not followed
        for name in folders + files:
            info = os.lstat(os.path.join(root, name))
            mode = info.st_mode
            if stat.S_ISDIR(mode) or (stat.S_ISREG(mode) and info.st_nlink == 1):
                continue
            kind = "a link" if stat.S_ISLNK(mode) else "a hard-linked file or no plain file"
            raise FincheckError(
                f"{Path(root) / name}: {kind}, made while {what} was saved: another process "
                "writes into this folder, and what it points to may have been written; "
                f"{what} is not used. Stop the other writer, then run the command again"
            )


def move_files_into(staging: str | Path, folder: str | Path, what: str = "") -> None:
    """Each plain file a library saved into `staging` (a `fresh_folder`) renamed onto its name
    in `folder`: a link planted there is replaced, never written through; a folder there is
    refused, as is a staging folder holding anything but plain files (`refuse_foreign_entries`).
    `staging` is removed."""
    refuse_foreign_entries(staging, what)
    source, target = _open_folder(Path(staging), what), _open_folder(Path(folder), what)
    try:
        for name in sorted(os.listdir(source)):
            if not stat.S_ISREG(_lstat_mode(name, source)):
                raise FincheckError(_not_own(Path(staging) / name, what, "no plain file"))
            if stat.S_ISDIR(_lstat_mode(name, target)):
                raise FincheckError(_not_own(Path(folder) / name, what, "a folder"))
            os.replace(name, name, src_dir_fd=source, dst_dir_fd=target)
        parent = _open_folder(Path(staging).parent, what)
        try:
            os.rmdir(Path(staging).name, dir_fd=parent)
        finally:
            os.close(parent)
    finally:
        os.close(source)
        os.close(target)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


TEMPORARY_SUFFIX = ".tmp"
_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{8}\.tmp")


def is_temporary(name: str) -> bool:
    """A name `replaced_file` builds a file under (another process of the same command may be
    writing it right now, or a kill left it): never someone else's file."""
    return _TEMPORARY.fullmatch(name) is not None


def _lstat_mode(name: str, folder: int) -> int:
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return 0


def write_text(path: str | Path, text: str, what: str = "") -> None:
    """`replaced_file` for a text (UTF-8, '\\n' line endings)."""
    with replaced_file(path, what) as f:
        f.write(text)


def write_bytes(path: str | Path, data: bytes, what: str = "") -> None:
    with replaced_file(path, what, binary=True) as f:
        f.write(data)


def copy_file(source: str | Path, target: str | Path, what: str = "") -> None:
    """`replaced_file` holding a copy of `source`'s bytes (its metadata is not copied)."""
    with (
        open(open_regular_file(source), "rb") as src,
        replaced_file(target, what, binary=True) as f,
    ):
        shutil.copyfileobj(src, f, 1 << 20)


def read_own_bytes(path: str | Path, what: str = "") -> bytes:
    """The bytes of a file fincheck wrote and reads back (a cache), refused as `open_own_file`
    refuses (a FIFO would block the read for ever)."""
    fd = open_own_file(path, os.O_RDONLY, what)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def append_line(path: str | Path, line: str) -> None:
    """One line appended to an own file (made if missing): a log or cache shared by runs."""
    fd = open_own_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(line)


@contextlib.contextmanager
def claimed_output_file(path: str | Path, flag: str) -> Iterator[IO[str]]:
    """A new output file, written under PATH.partial and moved to PATH when the block ends
    without error. The partial file is locked by this process: a second writer of the same
    PATH is refused at once; one left by a killed run is taken over. PATH itself is never
    overwritten: if it appeared meanwhile, the finished output stays in PATH.partial."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise FincheckError(f"{flag} {path} exists; pick a new file (nothing is overwritten)")
    refuse_inside_a_claimed_folder(path, flag)
    partial = path.with_name(path.name + ".partial")
    fd = open_own_file(partial, os.O_RDWR | os.O_CREAT, flag)
    f = os.fdopen(fd, "r+", encoding="utf-8")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise _being_written(path, flag) from None
    done = False
    try:
        f.truncate()
        yield f
        f.flush()
        try:
            if _names_held_file(partial, fd):
                # never replaces (fails if PATH appeared meanwhile): links the file this
                # command holds, by a name checked to be its own
                os.link(partial, path, follow_symlinks=False)
            else:  # its name removed, or given to a link or another writer's file, meanwhile
                _copy_to_new_file(f, path, flag)
        except FileExistsError:
            kept = partial
            if not _names_held_file(partial, fd):  # kept under a name of its own
                kept = path.with_name(f"{path.name}.{os.getpid()}.partial")
                _copy_to_new_file(f, kept, flag)
            raise FincheckError(
                f"{flag} {path} appeared while this command ran; the output is kept in {kept}"
            ) from None
        done = True
    finally:
        if (done or f.tell() == 0) and _names_held_file(partial, fd):
            partial.unlink()  # only this command's own partial file, never another's
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


@contextlib.contextmanager
def one_writer(path: str | Path, flag: str) -> Iterator[None]:
    """One command at a time writes PATH (a pair of files named after it, as compare's): a
    lock file beside it, `.NAME.lock`, held for the block and removed after; a second writer
    is refused at once. A lock whose name was removed or replaced after it was opened guards
    nothing, and is refused too."""
    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    fd = open_own_file(lock, os.O_RDWR | os.O_CREAT, flag)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _names_held_file(lock, fd):
            raise BlockingIOError
    except BlockingIOError:
        os.close(fd)
        raise _being_written(path, flag) from None
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)  # while held: a writer that opened it since is refused
        os.close(fd)


def _copy_to_new_file(held: IO[str], path: Path, flag: str) -> None:
    """The whole content of an open file copied into a new file at PATH (FileExistsError if
    there is one)."""
    held.seek(0)
    out = open_own_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, flag)
    with os.fdopen(out, "w", encoding="utf-8") as copy:
        shutil.copyfileobj(held, copy)


def _being_written(path: Path, flag: str) -> FincheckError:
    return FincheckError(
        f"{flag} {path} is being written by another fincheck command: wait for it to finish, "
        "or write elsewhere"
    )


def _names_held_file(path: Path, fd: int) -> bool:
    """Whether PATH names the very file open as `fd` (not a link, not another file)."""
    try:
        named, held = os.lstat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
